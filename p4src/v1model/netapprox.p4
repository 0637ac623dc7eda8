// NetApprox data plane for BMv2 simple_switch_grpc (v1model).
//
// Run: simple_switch_grpc -i 1@<veth> ... --thrift-port 9090 build/v1model/bmv2.json -- --priority-queues 8 --cpu-port 255
//      (--priority-queues and --cpu-port are target options: they go after "--")
// P4Info names are the contract of docs/architecture.md; p4src/tna/netapprox.p4 has the same ones.
// Pipeline (docs/dataplane.md):
//   ingress: packet-out -> validation (malformed: drop + count) -> REPORT: report_meter per ingress port,
//            then packet-in to the controller -> forwarding (routes_v4, ECMP, TTL) -> classification (logical
//            queue, queue-0 guard) -> enqueued_packets -> standard_metadata.priority = 7 - qid
//   egress:  packet-in header on CPU_PORT | transmitted_packets -> ecn -> ATP DATA queue byte
//            -> IPv4 checksum: IHL 5 recomputed (NetApproxComputeChecksum), options updated incrementally
#include "define_v1model.p4"
#include "include/parser.p4"
#include "include/control/validation.p4"
#include "include/control/forwarding.p4"
#include "include/control/classification.p4"
#include "include/control/ecn.p4"

control NetApproxIngress(inout parsed_headers_t hdr,
                         inout local_metadata_t local_md,
                         inout standard_metadata_t standard_md) {
    // Packets and bytes per (egress port, logical queue) handed to the traffic manager, index
    // port * 8 + qid. Minus transmitted_packets: the tail drops of that queue.
    counter<port_queue_index_t>(PORT_QUEUE_COUNTER_SIZE, CounterType.packets_and_bytes) enqueued_packets;
    // Packets dropped per reason (MALFORMED_* / DROPPED_* in shared/define.p4).
    counter<drop_reason_t>(MALFORMED_COUNTER_SIZE, CounterType.packets) malformed_packets;
    // Rate of REPORTs punted to the controller, one cell per ingress port (packets/s and burst set by the
    // controller as P4Runtime MeterEntry, cir = pir). Over it (yellow or red) a REPORT is dropped and counted
    // (DROPPED_REPORT_RATE); an unconfigured cell is green.
    meter<PortId_t>(REPORT_METER_SIZE, MeterType.packets) report_meter;

    AtpValidation() validation;
    Forwarding() forwarding;
    Classification() classification;

    apply {
        local_md.ingress_port = standard_md.ingress_port;
        if (hdr.packet_out.isValid()) {
            // From the controller: out of the requested port, unchanged, in the top queue.
            standard_md.egress_spec = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            local_md.from_cpu = true;
            local_md.qid = QUEUE_NON_APPROX;
            standard_md.priority = BMV2_PRIORITY_OF(QUEUE_NON_APPROX);
        } else {
            bool malformed;
            drop_reason_t reason;
            validation.apply(hdr, malformed, reason);
            if (standard_md.checksum_error == 1) {
                malformed = true;
                reason = DROPPED_IPV4_CHECKSUM;
            }
            if (malformed) {
                malformed_packets.count(reason);
                mark_to_drop(standard_md);
            } else if (hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_REPORT) {
                // Sender report: to the controller as packet-in (within its port's rate), never forwarded.
                bit<8> color;
                report_meter.execute_meter(standard_md.ingress_port, color);
                if (color != METER_GREEN) {
                    malformed_packets.count(DROPPED_REPORT_RATE);
                    mark_to_drop(standard_md);
                } else {
                    standard_md.egress_spec = CPU_PORT;
                    local_md.to_cpu = true;
                    local_md.qid = QUEUE_NON_APPROX;
                    standard_md.priority = BMV2_PRIORITY_OF(QUEUE_NON_APPROX);
                }
            } else if (!hdr.ipv4.isValid() || hdr.ipv4.version != 4 || hdr.ipv4.ihl < 5
                       || standard_md.parser_error != error.NoError) {
                // Not IPv4, a malformed IPv4 header (another version, IHL < 5), or a parser error outside the
                // ATP header (e.g. a short TCP header).
                mark_to_drop(standard_md);
            } else {
                local_md.ip_proto = hdr.ipv4.protocol;
                if (hdr.udp.isValid()) {
                    local_md.l4_dport = hdr.udp.dst_port;
                    local_md.l4_sport = hdr.udp.src_port;
                } else if (hdr.tcp.isValid()) {
                    local_md.l4_dport = hdr.tcp.dst_port;
                    local_md.l4_sport = hdr.tcp.src_port;
                }
                forwarding.apply(hdr, local_md, standard_md);
                if (local_md.drop) {
                    if (local_md.ttl_expired) {
                        malformed_packets.count(DROPPED_TTL_EXPIRED);
                    }
                    mark_to_drop(standard_md);
                } else {
                    classification.apply(hdr, local_md);
                    enqueued_packets.count(standard_md.egress_spec ++ local_md.qid);
                    standard_md.priority = BMV2_PRIORITY_OF(local_md.qid);
                }
            }
        }
    }
}

control NetApproxEgress(inout parsed_headers_t hdr,
                        inout local_metadata_t local_md,
                        inout standard_metadata_t standard_md) {
    // Packets and bytes per (egress port, logical queue) that left the queue, index port * 8 + qid.
    counter<port_queue_index_t>(PORT_QUEUE_COUNTER_SIZE, CounterType.packets_and_bytes) transmitted_packets;

    Ecn() ecn;

    apply {
        if (standard_md.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = local_md.ingress_port;
            hdr.packet_in._pad = 0;
        } else if (!local_md.from_cpu) {
            transmitted_packets.count(standard_md.egress_port ++ local_md.qid);
            ecn.apply(hdr, local_md.qid, standard_md.enq_qdepth);
            if (hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_DATA) {
                // Stamp the chosen logical queue. The UDP checksum would now be wrong; zero means
                // "no checksum" for UDP over IPv4 (RFC 768), so zero it rather than update it.
                hdr.atp.queue = (bit<8>)local_md.qid;
                hdr.udp.checksum = 0;
            }
            if (hdr.ipv4.isValid() && hdr.ipv4.ihl != 5) {
                // With options the header is not parsed whole, so NetApproxComputeChecksum cannot recompute
                // the checksum: update it for the two words this program may change (TTL, ECN).
                hdr.ipv4.hdr_checksum = csum16_update(hdr.ipv4.hdr_checksum,
                    local_md.ipv4_tos_word, hdr.ipv4.version ++ hdr.ipv4.ihl ++ hdr.ipv4.dscp ++ hdr.ipv4.ecn,
                    local_md.ipv4_ttl_word, hdr.ipv4.ttl ++ hdr.ipv4.protocol);
            }
        }
    }
}

V1Switch(NetApproxParser(),
         NetApproxVerifyChecksum(),
         NetApproxIngress(),
         NetApproxEgress(),
         NetApproxComputeChecksum(),
         NetApproxDeparser()) main;
