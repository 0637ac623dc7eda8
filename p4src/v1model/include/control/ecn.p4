// NetApprox v1model: ECN marking (NetApproxEgress.ecn).
//
// Runs in egress on every forwarded packet. ecn_thresholds (exact on the logical queue) gives the
// queue depth at which to mark; an ECN-capable IPv4 packet (ECT(0) or ECT(1)) whose queue held at
// least `threshold` packets when it was enqueued (standard_metadata.enq_qdepth, per BMv2 priority
// queue) leaves with ECN = CE. Not-ECT and CE packets are never changed. No entry: no marking.
// The IPv4 checksum is recomputed in NetApproxComputeChecksum.
#ifndef NETAPPROX_V1MODEL_ECN_P4
#define NETAPPROX_V1MODEL_ECN_P4

control Ecn(inout parsed_headers_t hdr, in logical_queue_t qid, in queue_depth_t enq_qdepth) {
    queue_depth_t mark_threshold = 0;

    action mark_ecn(queue_depth_t threshold) {
        mark_threshold = threshold;
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
            if (ecn_thresholds.apply().hit && enq_qdepth >= mark_threshold) {
                hdr.ipv4.ecn = ECN_CE;
            }
        }
    }
}

#endif  // NETAPPROX_V1MODEL_ECN_P4
