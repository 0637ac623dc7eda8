// NetApprox TNA parsers and deparsers.
//
// Ingress parses what the v1model parser parses (see p4src/v1model/include/parser.p4) and verifies the
// IPv4 checksum over the fixed 20 bytes (NetApproxIngress uses the result only when ihl == 5: options are
// not parsed). Checksum updates are incremental, so headers with options need no parsing either: each
// parser subtracts the old checksum and the one 16-bit word its pipeline may change (ingress: TTL and
// protocol; egress: version, ihl, dscp and ECN) and keeps the residual (Checksum.get()); its deparser adds
// the word as it leaves (Checksum.update), the idiom of the SDE's tna_checksum example. Errors: Tofino's ingress parser hands packets with parser errors to the pipeline
// (instead of dropping them) because NetApproxIngress reads ig_intr_md_from_prsr.parser_err; a UDP
// packet on an ATP port that ends inside the ATP header arrives with udp valid and atp invalid and is
// counted as MALFORMED_TRUNCATED.
// Egress re-parses the same headers behind the bridged metadata; no checksum check there.
// A REPORT punted to the CPU and a packet-out leave with their checksum unchanged (their words did not change).
#ifndef NETAPPROX_TNA_PARSER_P4
#define NETAPPROX_TNA_PARSER_P4

parser NetApproxIngressParser(packet_in pkt,
                              out parsed_headers_t hdr,
                              out ingress_metadata_t ig_md,
                              out ingress_intrinsic_metadata_t ig_intr_md) {
    Checksum() ipv4_checksum;
    Checksum() ipv4_residual;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        ig_md.l4_dport = 0;
        ig_md.l4_sport = 0;             // the ECMP flow hash reads 0 when neither TCP nor UDP was parsed
        ig_md.ip_proto = 0;
        ig_md.ipv4_checksum_err = false;
        ig_md.ipv4_residual = 0;
        ig_md.drop = false;
        ig_md.ttl_expired = false;
        transition select(ig_intr_md.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        ipv4_checksum.add(hdr.ipv4);
        // Tofino's parser checksum unit writes true here when the header checksum is WRONG (the
        // convention of Intel's switch.p4 and the TNA examples: `checksum_err = verify()`).
        ig_md.ipv4_checksum_err = ipv4_checksum.verify();
        ipv4_residual.subtract({hdr.ipv4.hdr_checksum});
        ipv4_residual.subtract({hdr.ipv4.ttl, hdr.ipv4.protocol});
        ig_md.ipv4_residual = ipv4_residual.get();
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IP_PROTO_UDP): parse_udp;
            (5, 0, IP_PROTO_TCP): parse_tcp;
            default: accept;
        }
    }

    state parse_tcp {
        pkt.extract(hdr.tcp);
        transition accept;
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (ATP_PORT, _): parse_atp;
            (ATP_REPORT_DST_PORT, _): parse_atp;
            (_, ATP_PORT): parse_atp;
            default: accept;
        }
    }

    state parse_atp {
        pkt.extract(hdr.atp);
        transition accept;
    }
}

control NetApproxIngressDeparser(packet_out pkt,
                                 inout parsed_headers_t hdr,
                                 in ingress_metadata_t ig_md,
                                 in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        // The TTL decrement (forwarding), added back to the residual of the ingress parser.
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({hdr.ipv4.ttl, hdr.ipv4.protocol, ig_md.ipv4_residual});
        }
        pkt.emit(ig_md.bridged);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.tcp);
        pkt.emit(hdr.atp);
    }
}

parser NetApproxEgressParser(packet_in pkt,
                             out parsed_headers_t hdr,
                             out egress_metadata_t eg_md,
                             out egress_intrinsic_metadata_t eg_intr_md) {
    Checksum() ipv4_residual;

    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(eg_md.bridged);
        eg_md.ipv4_residual = 0;
        transition parse_ethernet;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        ipv4_residual.subtract({hdr.ipv4.hdr_checksum});
        ipv4_residual.subtract({hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn});
        eg_md.ipv4_residual = ipv4_residual.get();
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IP_PROTO_UDP): parse_udp;
            (5, 0, IP_PROTO_TCP): parse_tcp;
            default: accept;
        }
    }

    state parse_tcp {
        pkt.extract(hdr.tcp);
        transition accept;
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (ATP_PORT, _): parse_atp;
            (ATP_REPORT_DST_PORT, _): parse_atp;
            (_, ATP_PORT): parse_atp;
            default: accept;
        }
    }

    state parse_atp {
        pkt.extract(hdr.atp);
        transition accept;
    }
}

control NetApproxEgressDeparser(packet_out pkt,
                                inout parsed_headers_t hdr,
                                in egress_metadata_t eg_md,
                                in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        // ECN marking (ecn), added back to the residual of the egress parser.
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update(
                {hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, eg_md.ipv4_residual});
        }
        pkt.emit(hdr.packet_in);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.tcp);
        pkt.emit(hdr.atp);
    }
}

#endif  // NETAPPROX_TNA_PARSER_P4
