// NetApprox TNA: ATP header sanity checks (NetApproxIngress.validation).
//
// Same checks, order and reasons as p4src/v1model/include/control/validation.p4. Tofino gateways
// compare a field with a constant; the field-to-field comparisons (pkt_idx < pkt_cnt, UDP length
// against 40 + atp.length) are computed as a wider subtraction whose top bit is the sign.
#ifndef NETAPPROX_TNA_VALIDATION_P4
#define NETAPPROX_TNA_VALIDATION_P4

control AtpValidation(in parsed_headers_t hdr, out bool malformed, out drop_reason_t reason) {
    bit<17> idx_minus_cnt;      // bit 16 set <=> pkt_idx < pkt_cnt
    bit<18> need;               // 8 + 32 + atp.length
    bit<18> len_minus_need;     // bit 17 set <=> udp.length < need

    apply {
        malformed = false;
        reason = MALFORMED_TRUNCATED;
        idx_minus_cnt = (bit<17>)hdr.atp.pkt_idx - (bit<17>)hdr.atp.pkt_cnt;
        // One operation per assignment: a Tofino ALU instruction has two operands.
        need = (bit<18>)hdr.atp.length + (bit<18>)(UDP_HEADER_BYTES + ATP_HEADER_BYTES);
        len_minus_need = (bit<18>)hdr.udp.length - need;
        if (hdr.atp.isValid()) {
            if (hdr.atp.version != ATP_VERSION) {
                malformed = true;
                reason = MALFORMED_BAD_VERSION;
            } else if (hdr.atp.type == 0 || hdr.atp.type > ATP_TYPE_RETRY) {
                malformed = true;
                reason = MALFORMED_BAD_TYPE;
            } else if ((hdr.atp.flags & ATP_FLAGS_RESERVED) != 0) {
                malformed = true;
                reason = MALFORMED_BAD_FLAGS;
            } else if (hdr.atp.tlr > ATP_TLR_ONE) {
                malformed = true;
                reason = MALFORMED_BAD_TLR;
            } else if (hdr.atp.pkt_cnt == 0 || idx_minus_cnt[16:16] == 0) {
                malformed = true;
                reason = MALFORMED_BAD_INDEX;
            } else if (len_minus_need[17:17] == 1) {
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
