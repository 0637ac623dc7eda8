// NetApprox TNA: ATP header sanity checks (NetApproxIngress.validation).
//
// Same checks, order and reasons as p4src/v1model/include/control/validation.p4, with one more in front:
// ipv4_checksum_bad (the caller's IPv4 header checksum test) gives DROPPED_IPV4_CHECKSUM whatever the ATP
// checks say, as v1model's override after validation does; tested here as the first link of the chain it
// costs no stage of its own (docs/dataplane.md, Tofino stages). Tofino gateways
// compare a few bytes of fields with constants (range comparisons on at most 12 bits); the
// field-to-field comparisons (pkt_idx < pkt_cnt, UDP length against 40 + atp.length) are computed as
// saturating subtractions tested against constants, and tlr > 1.0 as bit tests.
#ifndef NETAPPROX_TNA_VALIDATION_P4
#define NETAPPROX_TNA_VALIDATION_P4

control AtpValidation(in parsed_headers_t hdr, in bool ipv4_checksum_bad, out bool malformed, out drop_reason_t reason) {
    bit<16> idx_room;           // pkt_cnt - pkt_idx, saturated at 0: 0 <=> pkt_idx >= pkt_cnt
    // udp.length < 8 + 32 + atp.length <=> udp.length - atp.length, saturated at 0, < 40: exact for every 16-bit
    // value (nothing saturates upwards), as v1model's 32-bit comparison.
    bit<16> beyond_payload;     // udp.length - atp.length, saturated at 0

    // The arithmetic runs in actions of keyless tables, ahead of the gateways that test its results: the
    // compiler would otherwise fold it back into the conditions, which a gateway cannot evaluate. One
    // operation per result: a Tofino ALU instruction has two operands.
    @hidden action differences() {
        idx_room = hdr.atp.pkt_cnt |-| hdr.atp.pkt_idx;
        beyond_payload = hdr.udp.length |-| hdr.atp.length;
    }
    @hidden table compute_differences {
        actions = { differences; }
        const default_action = differences();
        size = 1;
    }

    apply {
        malformed = false;
        reason = MALFORMED_TRUNCATED;
        compute_differences.apply();
        if (ipv4_checksum_bad) {
            malformed = true;
            reason = DROPPED_IPV4_CHECKSUM;
        } else if (hdr.atp.isValid()) {
            // Each check sets one bit first, then one chain over the bits picks the first reason: a Tofino
            // gateway takes a few bytes of input, and an else-if chain accumulates its conditions' fields.
            bit<1> bad_version = 0;
            bit<1> bad_type = 0;
            bit<1> bad_flags = 0;
            bit<1> bad_tlr = 0;
            bit<1> bad_index = 0;
            bit<1> truncated = 0;
            if (hdr.atp.version != ATP_VERSION) {
                bad_version = 1;
            }
            if (hdr.atp.type == 0 || hdr.atp.type > ATP_TYPE_MAX) {
                bad_type = 1;
            }
            if ((hdr.atp.flags & ATP_FLAGS_RESERVED) != 0) {
                bad_flags = 1;
            }
            if (hdr.atp.tlr[15:15] == 1 && hdr.atp.tlr[14:0] != 0) {  // tlr > ATP_TLR_ONE (0x8000)
                bad_tlr = 1;
            }
            if (idx_room == 0) {  // also pkt_cnt == 0
                bad_index = 1;
            }
            // < 40 as a 6-bit compare: a gateway's range compare takes a few bits only.
            if (beyond_payload[15:6] == 0 && beyond_payload[5:0] < (bit<6>)(UDP_HEADER_BYTES + ATP_HEADER_BYTES)) {
                truncated = 1;
            }
            if (bad_version == 1) {
                malformed = true;
                reason = MALFORMED_BAD_VERSION;
            } else if (bad_type == 1) {
                malformed = true;
                reason = MALFORMED_BAD_TYPE;
            } else if (bad_flags == 1) {
                malformed = true;
                reason = MALFORMED_BAD_FLAGS;
            } else if (bad_tlr == 1) {
                malformed = true;
                reason = MALFORMED_BAD_TLR;
            } else if (bad_index == 1) {
                malformed = true;
                reason = MALFORMED_BAD_INDEX;
            } else if (truncated == 1) {
                malformed = true;
                reason = MALFORMED_TRUNCATED;
            }
        } else if (hdr.udp.isValid()
                   && (hdr.udp.dst_port == ATP_PORT || hdr.udp.dst_port == ATP_REPORT_DST_PORT
                       || hdr.udp.src_port == ATP_PORT)) {
            malformed = true;
            reason = MALFORMED_TRUNCATED;
        }
    }
}

#endif  // NETAPPROX_TNA_VALIDATION_P4
