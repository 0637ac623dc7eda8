// NetApprox v1model parser, checksum controls and deparser.
//
// Parses packet_out (only on CPU_PORT), Ethernet, IPv4 (its fixed 20 bytes; options are left in the
// payload and such a packet's L4 header is not parsed; first fragment only for L4), UDP, TCP and the ATP
// header. A UDP packet is ATP when its destination port is ATP_PORT or
// ATP_REPORT_DST_PORT, or its source port is ATP_PORT (docs/wire-format.md, Transport).
//
// Errors: BMv2 does not drop on a parser error; the packet reaches ingress with
// standard_metadata.parser_error set and the headers extracted so far valid. A UDP packet on an ATP
// port that is too short for the 32-byte ATP header therefore arrives with udp valid and atp invalid
// (error.PacketTooShort), and NetApproxIngress drops and counts it as MALFORMED_TRUNCATED.
#ifndef NETAPPROX_V1MODEL_PARSER_P4
#define NETAPPROX_V1MODEL_PARSER_P4

parser NetApproxParser(packet_in packet,
                       out parsed_headers_t hdr,
                       inout local_metadata_t local_md,
                       inout standard_metadata_t standard_md) {
    state start {
        transition select(standard_md.ingress_port) {
            CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        packet.extract(hdr.packet_out);
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        local_md.ipv4_tos_word = hdr.ipv4.version ++ hdr.ipv4.ihl ++ hdr.ipv4.dscp ++ hdr.ipv4.ecn;
        local_md.ipv4_ttl_word = hdr.ipv4.ttl ++ hdr.ipv4.protocol;
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IP_PROTO_UDP): parse_udp;
            (5, 0, IP_PROTO_TCP): parse_tcp;
            default: accept;
        }
    }

    state parse_tcp {
        packet.extract(hdr.tcp);
        transition accept;
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dst_port, hdr.udp.src_port) {
            (ATP_PORT, _): parse_atp;
            (ATP_REPORT_DST_PORT, _): parse_atp;
            (_, ATP_PORT): parse_atp;
            default: accept;
        }
    }

    state parse_atp {
        packet.extract(hdr.atp);
        transition accept;
    }
}

// Verifies the IPv4 header checksum of headers without options (ihl == 5, the only ones parsed whole); a
// mismatch sets standard_metadata.checksum_error, which NetApproxIngress counts (DROPPED_IPV4_CHECKSUM) and
// drops. A header with options is not verified here (a wrong checksum stays wrong: NetApproxEgress updates
// it incrementally, and the receiving host drops it).
control NetApproxVerifyChecksum(inout parsed_headers_t hdr, inout local_metadata_t local_md) {
    apply {
        verify_checksum(hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

// Recomputes the IPv4 header checksum after the TTL decrement (ingress) and ECN marking (egress), for
// headers without options; NetApproxEgress updates headers with options incrementally.
// The UDP checksum of rewritten ATP DATA packets is zeroed in egress instead (see NetApproxEgress).
control NetApproxComputeChecksum(inout parsed_headers_t hdr, inout local_metadata_t local_md) {
    apply {
        update_checksum(hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control NetApproxDeparser(packet_out packet, in parsed_headers_t hdr) {
    apply {
        packet.emit(hdr.packet_in);
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.tcp);
        packet.emit(hdr.atp);
    }
}

#endif  // NETAPPROX_V1MODEL_PARSER_P4
