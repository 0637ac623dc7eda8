// NetApprox data plane for Tofino (TNA). Same P4Info names as p4src/v1model/netapprox.p4 (the contract
// of docs/architecture.md); differences are confined to this tree and listed in docs/dataplane.md.
//   ingress: packet-out -> validation (malformed: drop + count) -> REPORT: report_meter per ingress port,
//            then packet-in to the controller -> forwarding's decision (routes_v4, ECMP, TTL; computed beside
//            validation, used only here) -> classification (logical queue, queue-0 guard) -> enqueued_packets
//            and ig_intr_md_for_tm.qid = logical queue; bridged metadata carries it to egress. 9 of Tofino 1's
//            12 stages with the open back end (docs/dataplane.md, Tofino stages)
//   egress:  packet-in header on CPU_PORT | transmitted_packets -> ecn -> ATP DATA queue byte
//   IPv4 checksum: updated incrementally in both deparsers (TTL in ingress, ECN in egress) from residuals the
//            parsers compute, so headers with options are handled without parsing them (see parser.p4)
#include "define_tna.p4"
#include "include/parser.p4"
#include "include/control/validation.p4"
#include "include/control/forwarding.p4"
#include "include/control/classification.p4"
#include "include/control/ecn.p4"

control NetApproxIngress(inout parsed_headers_t hdr,
                         inout ingress_metadata_t ig_md,
                         in ingress_intrinsic_metadata_t ig_intr_md,
                         in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                         inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                         inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    // Packets and bytes per (egress port, logical queue) handed to the traffic manager, index
    // port * 8 + qid. Tofino's own drop counters are in tm.counter.queue.
    Counter<bit<64>, port_queue_index_t>(PORT_QUEUE_COUNTER_SIZE, CounterType_t.PACKETS_AND_BYTES)
        enqueued_packets;
    // Packets dropped per reason (MALFORMED_* / DROPPED_* in shared/define.p4).
    Counter<bit<64>, drop_reason_t>(MALFORMED_COUNTER_SIZE, CounterType_t.PACKETS) malformed_packets;
    // Rate of REPORTs punted to the controller, one cell per ingress port (set by the controller as P4Runtime
    // MeterEntry, cir = pir). Over it (yellow or red) a REPORT is dropped and counted (DROPPED_REPORT_RATE).
    Meter<PortId_t>(REPORT_METER_SIZE, MeterType_t.PACKETS) report_meter;

    AtpValidation() validation;
    Forwarding() forwarding;
    Classification() classification;

    // One action, so one stage, counts the packet and hands its queue to the traffic manager. Hidden: not
    // part of the control-plane contract (the P4Info stays the v1model program's).
    @hidden action enqueue() {
        enqueued_packets.count(ig_tm_md.ucast_egress_port ++ ig_md.bridged.qid);
        ig_tm_md.qid = TNA_QID_OF(ig_md.bridged.qid);
    }

    apply {
        ig_md.bridged.setValid();
        ig_md.bridged._pad0 = 0;
        ig_md.bridged._pad1 = 0;
        ig_md.bridged._pad2 = 0;
        ig_md.bridged.ingress_port = ig_intr_md.ingress_port;
        ig_md.bridged.qid = QUEUE_NON_APPROX;
        ig_md.bridged.from_cpu = 0;

        if (hdr.packet_out.isValid()) {
            ig_tm_md.ucast_egress_port = hdr.packet_out.egress_port;
            hdr.packet_out.setInvalid();
            ig_md.bridged.from_cpu = 1;
            ig_tm_md.qid = TNA_QID_OF(QUEUE_NON_APPROX);
        } else {
            bool malformed;
            drop_reason_t reason;
            // The IPv4 checksum, verified over the fixed 20 bytes, is only meaningful without options.
            validation.apply(hdr, ig_md.ipv4_checksum_err && hdr.ipv4.ihl == 5, malformed, reason);
            // Forwarding runs beside validation instead of after it (Tofino 1 has 12 stages): on every IPv4
            // packet that is not a REPORT, whose header it must leave as it came to the controller. A packet that
            // validation then finds malformed, or that is not forwardable IPv4 (below), is dropped whatever
            // forwarding wrote, and forwarding counts nothing itself, so what leaves and what is counted are the
            // v1model program's.
            if (hdr.ipv4.isValid() && !(hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_REPORT)) {
                ig_md.ip_proto = hdr.ipv4.protocol;
                if (hdr.udp.isValid()) {
                    ig_md.l4_dport = hdr.udp.dst_port;
                    ig_md.l4_sport = hdr.udp.src_port;
                } else if (hdr.tcp.isValid()) {
                    ig_md.l4_dport = hdr.tcp.dst_port;
                    ig_md.l4_sport = hdr.tcp.src_port;
                }
                forwarding.apply(hdr, ig_md, ig_tm_md);
            }
            if (malformed) {
                malformed_packets.count(reason);
                ig_dprsr_md.drop_ctl = 1;
            } else if (hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_REPORT) {
                if (report_meter.execute(ig_intr_md.ingress_port) != METER_GREEN) {
                    malformed_packets.count(DROPPED_REPORT_RATE);
                    ig_dprsr_md.drop_ctl = 1;
                } else {
                    ig_tm_md.ucast_egress_port = CPU_PORT;
                    ig_tm_md.qid = TNA_QID_OF(QUEUE_NON_APPROX);
                }
            } else if (!hdr.ipv4.isValid() || hdr.ipv4.version != 4 || hdr.ipv4.ihl < 5 || ig_prsr_md.parser_err != 0) {
                // Not IPv4, a malformed IPv4 header, or a parser error outside the ATP header (e.g. a short
                // TCP header).
                ig_dprsr_md.drop_ctl = 1;
            } else if (ig_md.drop) {
                if (ig_md.ttl_expired) {
                    malformed_packets.count(DROPPED_TTL_EXPIRED);
                }
                ig_dprsr_md.drop_ctl = 1;
            } else {
                classification.apply(hdr, ig_md);
                enqueue();
            }
        }
    }
}

control NetApproxEgress(inout parsed_headers_t hdr,
                        inout egress_metadata_t eg_md,
                        in egress_intrinsic_metadata_t eg_intr_md,
                        in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                        inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                        inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    Counter<bit<64>, port_queue_index_t>(PORT_QUEUE_COUNTER_SIZE, CounterType_t.PACKETS_AND_BYTES)
        transmitted_packets;

    Ecn() ecn;

    apply {
        if (eg_intr_md.egress_port == CPU_PORT) {
            hdr.packet_in.setValid();
            hdr.packet_in.ingress_port = eg_md.bridged.ingress_port;
            // _pad is not written: the port sits at another bit offset in the bridged header than in
            // packet_in, and a Tofino action cannot combine a rotated copy with a constant. The controller
            // reads only ingress_port.
        } else if (eg_md.bridged.from_cpu == 0) {
            transmitted_packets.count(eg_intr_md.egress_port ++ eg_md.bridged.qid);
            ecn.apply(hdr, eg_md.bridged.qid, eg_intr_md.enq_qdepth);
            if (hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_DATA) {
                // Same as v1model: stamp the logical queue, zero the UDP checksum (RFC 768).
                hdr.atp.queue = (bit<8>)eg_md.bridged.qid;
                hdr.udp.checksum = 0;
            }
        }
    }
}

Pipeline(NetApproxIngressParser(),
         NetApproxIngress(),
         NetApproxIngressDeparser(),
         NetApproxEgressParser(),
         NetApproxEgress(),
         NetApproxEgressDeparser()) pipe;

Switch(pipe) main;
