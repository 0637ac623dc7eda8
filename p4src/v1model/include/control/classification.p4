// NetApprox v1model: choose the logical queue (NetApproxIngress.classification).
//
// Runs in ingress after forwarding, on packets that will be forwarded. Sets local_md.qid, in this
// order (docs/architecture.md, logical tables 1-5):
//   not approximate (non-ATP, ATP without APPROX, any ATP type but DATA, DATA not sent to the ATP port)
//                 -> queue_by_class (ternary ip_proto, l4_dport); miss: queue 0
//   approximate   -> tlr == 1.0 (surplus, ATP_TLR_ONE): queue 7 (QUEUE_LOWEST), no table applies
//                 -> queue_by_job (exact job_id, direct counter job_packets); hit wins
//                 -> queue_by_tag (range priority, ternary deadline_us), only when TAGGED; hit wins
//                 -> queue_by_tlr (range tlr); miss: queue 7 (QUEUE_LOWEST)
//                 -> guard: a table that put approximate traffic in queue 0 is overruled (queue 1), and the
//                    packet counted in queue0_guard_packets
// The controller never needs to write default actions: misses are handled here.
// deadline_us is ternary, not range: Tofino range keys are at most 20 bits wide (bf-p4c rejects the 32-bit
// slack), so the controller writes a CadentFlow deadline range as its prefixes (controller.model.prefix_split),
// one entry each with the rule's priority; the ranges the P4Info, the reference model and the kernel switch
// see are unchanged.
#ifndef NETAPPROX_V1MODEL_CLASSIFICATION_P4
#define NETAPPROX_V1MODEL_CLASSIFICATION_P4

control Classification(in parsed_headers_t hdr, inout local_metadata_t local_md) {
    direct_counter(CounterType.packets) job_packets;
    // Approximate packets the tables put in logical queue 0, which is reserved for non-approximate traffic.
    counter<bit<1>>(QUEUE0_GUARD_COUNTER_SIZE, CounterType.packets) queue0_guard_packets;

    action set_queue(logical_queue_t qid) {
        local_md.qid = qid;
    }

    // queue_by_job's own action, as in the TNA program (where only an action of the table that owns
    // the DirectCounter may count): both programs then share one P4Info. The direct counter counts hits.
    action set_job_queue(logical_queue_t qid) {
        local_md.qid = qid;
    }

    table queue_by_class {
        key = {
            local_md.ip_proto : ternary @name("ip_proto");
            local_md.l4_dport : ternary @name("l4_dport");
        }
        actions = {
            set_queue;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = QUEUE_BY_CLASS_TABLE_SIZE;
    }

    table queue_by_job {
        key = {
            hdr.atp.job_id : exact @name("job_id");
        }
        actions = {
            set_job_queue;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        counters = job_packets;
        size = QUEUE_BY_JOB_TABLE_SIZE;
    }

    table queue_by_tag {
        key = {
            hdr.atp.priority : range @name("priority");
            hdr.atp.deadline_us : ternary @name("deadline_us");
        }
        actions = {
            set_queue;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = QUEUE_BY_TAG_TABLE_SIZE;
    }

    table queue_by_tlr {
        key = {
            hdr.atp.tlr : range @name("tlr");
        }
        actions = {
            set_queue;
            @defaultonly NoAction;
        }
        const default_action = NoAction();
        size = QUEUE_BY_TLR_TABLE_SIZE;
    }

    apply {
        // Approximate: ATP DATA with APPROX sent to the ATP port (DATA on the report port is not, as in
        // controller/reference.py and the kernel switch).
        if (hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_DATA && hdr.udp.dst_port == ATP_UDP_PORT
                && (hdr.atp.flags & ATP_FLAG_APPROX) != 0) {
            local_md.qid = QUEUE_LOWEST;
            // Surplus: TLR 1.0 marks a packet its sender does not need (a message beyond what the MSR
            // requires, or an MSR-0 group): the lowest queue, whatever the job's entry says.
            // (Two ifs: Tofino applies a table only in an 'if' of its own.)
            if (hdr.atp.tlr != ATP_TLR_ONE) {
                if (queue_by_job.apply().miss) {
                    bool tag_hit = false;
                    if ((hdr.atp.flags & ATP_FLAG_TAGGED) != 0) {
                        tag_hit = queue_by_tag.apply().hit;
                    }
                    if (!tag_hit) {
                        queue_by_tlr.apply();
                    }
                }
            }
            // Guard: approximate traffic never enters queue 0, whatever the tables say.
            if (local_md.qid == QUEUE_NON_APPROX) {
                local_md.qid = QUEUE_FIRST_APPROX;
                queue0_guard_packets.count(0);
            }
        } else {
            local_md.qid = QUEUE_NON_APPROX;
            queue_by_class.apply();
        }
    }
}

#endif  // NETAPPROX_V1MODEL_CLASSIFICATION_P4
