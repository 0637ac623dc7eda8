// NetApprox TNA: ECN marking (NetApproxEgress.ecn). Same contract as
// p4src/v1model/include/control/ecn.p4, except that eg_intr_md.enq_qdepth counts 80-byte cells
// (Tofino 1), so the controller converts its packet threshold (docs/dataplane.md). The
// depth >= threshold test is a 20-bit subtraction whose top bit is the sign.
#ifndef NETAPPROX_TNA_ECN_P4
#define NETAPPROX_TNA_ECN_P4

control Ecn(inout parsed_headers_t hdr, in logical_queue_t qid, in queue_depth_t enq_qdepth) {
    bit<20> depth_minus_threshold = 0;   // bit 19 clear <=> enq_qdepth >= threshold

    action mark_ecn(queue_depth_t threshold) {
        depth_minus_threshold = (bit<20>)enq_qdepth - (bit<20>)threshold;
    }

    table ecn_thresholds {
        key = {
            qid : exact @name("qid");
        }
        actions = {
            mark_ecn;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = ECN_THRESHOLDS_TABLE_SIZE;
    }

    apply {
        if (hdr.ipv4.isValid() && (hdr.ipv4.ecn == ECN_ECT0 || hdr.ipv4.ecn == ECN_ECT1)) {
            if (ecn_thresholds.apply().hit && depth_minus_threshold[19:19] == 0) {
                hdr.ipv4.ecn = ECN_CE;
            }
        }
    }
}

#endif  // NETAPPROX_TNA_ECN_P4
