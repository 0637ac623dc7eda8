// NetApprox v1model: ATP header sanity checks (NetApproxIngress.validation).
//
// Runs first in ingress, on every packet not from the CPU. Sets `malformed` and the drop reason
// (MALFORMED_* in shared/define.p4) of the FIRST failed check, in hostlib.wire.decode's order:
//   truncated    UDP on an ATP port without a complete ATP header (parser: PacketTooShort)
//   bad_version  version != 2 (ATP_VERSION)
//   bad_type     type not in 1..6
//   bad_flags    a flag bit ATP_FLAGS_RESERVED names (none in version 2)
//   bad_tlr      tlr > 0x8000
//   bad_index    pkt_cnt == 0 or pkt_idx >= pkt_cnt
//   truncated    UDP length shorter than 8 + 32 + atp.length (the payload the header announces)
// Packets that are not UDP on an ATP port are never malformed here. No tables: nothing to program.
#ifndef NETAPPROX_V1MODEL_VALIDATION_P4
#define NETAPPROX_V1MODEL_VALIDATION_P4

control AtpValidation(in parsed_headers_t hdr, out bool malformed, out drop_reason_t reason) {
    apply {
        malformed = false;
        reason = MALFORMED_TRUNCATED;
        if (hdr.atp.isValid()) {
            if (hdr.atp.version != ATP_VERSION) {
                malformed = true;
                reason = MALFORMED_BAD_VERSION;
            } else if (hdr.atp.type == 0 || hdr.atp.type > ATP_TYPE_MAX) {
                malformed = true;
                reason = MALFORMED_BAD_TYPE;
            } else if ((hdr.atp.flags & ATP_FLAGS_RESERVED) != 0) {
                malformed = true;
                reason = MALFORMED_BAD_FLAGS;
            } else if (hdr.atp.tlr > ATP_TLR_ONE) {
                malformed = true;
                reason = MALFORMED_BAD_TLR;
            } else if (hdr.atp.pkt_cnt == 0 || hdr.atp.pkt_idx >= hdr.atp.pkt_cnt) {
                malformed = true;
                reason = MALFORMED_BAD_INDEX;
            } else if ((bit<32>)hdr.udp.length
                       < (bit<32>)(UDP_HEADER_BYTES + ATP_HEADER_BYTES) + (bit<32>)hdr.atp.length) {
                malformed = true;
                reason = MALFORMED_TRUNCATED;
            }
        } else if (hdr.udp.isValid()
                   && (hdr.udp.dst_port == ATP_PORT || hdr.udp.dst_port == ATP_REPORT_DST_PORT
                       || hdr.udp.src_port == ATP_PORT)) {
            // The parser wanted an ATP header here and the packet ended first.
            malformed = true;
            reason = MALFORMED_TRUNCATED;
        }
    }
}

#endif  // NETAPPROX_V1MODEL_VALIDATION_P4
