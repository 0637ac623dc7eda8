// NetApprox TNA: choose the logical queue (NetApproxIngress.classification). Same tables, keys, order
// and defaults as p4src/v1model/include/control/classification.p4; the result goes to
// ig_md.bridged.qid.
//
// Why queue_by_job has an action of its own (in both programs, so they share one P4Info): a DirectCounter counts only in
// actions that call count(), and bf-p4c rejects such an action in a table that does not own the counter
// ("Direct Extern ... is used in action ... but not specified as a 'counters' property"). queue_by_job
// therefore has its own action, NetApproxIngress.classification.set_job_queue(qid), same parameter and
// effect. It cannot also be named set_queue: p4c rejects two actions with one control-plane name when
// it generates P4Info ("conflicting control plane name", DuplicateActionControlPlaneNameCheck).
// The v1model program declares the same action (docs/architecture.md).
#ifndef NETAPPROX_TNA_CLASSIFICATION_P4
#define NETAPPROX_TNA_CLASSIFICATION_P4

control Classification(in parsed_headers_t hdr, inout ingress_metadata_t ig_md) {
    DirectCounter<bit<64>>(CounterType_t.PACKETS) job_packets;
    // Approximate packets the tables put in logical queue 0, which is reserved for non-approximate traffic.
    Counter<bit<64>, bit<1>>(QUEUE0_GUARD_COUNTER_SIZE, CounterType_t.PACKETS) queue0_guard_packets;

    action set_queue(logical_queue_t qid) {
        ig_md.bridged.qid = qid;
    }

    action set_job_queue(logical_queue_t qid) {
        ig_md.bridged.qid = qid;
        job_packets.count();
    }

    table queue_by_class {
        key = {
            ig_md.ip_proto : ternary @name("ip_proto");
            ig_md.l4_dport : ternary @name("l4_dport");
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
            ig_md.bridged.qid = QUEUE_LOWEST;
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
            if (ig_md.bridged.qid == QUEUE_NON_APPROX) {
                ig_md.bridged.qid = QUEUE_FIRST_APPROX;
                queue0_guard_packets.count(0);
            }
        } else {
            ig_md.bridged.qid = QUEUE_NON_APPROX;
            queue_by_class.apply();
        }
    }
}

#endif  // NETAPPROX_TNA_CLASSIFICATION_P4
