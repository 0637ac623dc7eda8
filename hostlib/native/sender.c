/* The ATP sender's protocol (sender.h; hostlib/sender.py is the specification, the Python names are given where
 * they help): what it sends and when, what an ACK, DONE or RETRY does to it, epochs, completion and the close. */
#include <math.h>
#include <string.h>

#include "sender.h"

#define MAX_SLACK_US (ATP_NO_DEADLINE - 1)
#define FIN_RETRY_MIN_S 0.02

int sender_reject(Sender *s, const char *reason) { return counter_add(s->rejected, reason, 1); }

/* --- sequence numbers ----------------------------------------------------------------------------------- */

/* _next_seq: the next sequence number, recording what it carries */
static int next_seq(Sender *s, uint32_t msg_id, uint32_t idx, uint32_t *seq) {
    if (ARRAY_PUSH(&s->sent_msg, msg_id, 1024) != 0 || ARRAY_PUSH(&s->sent_idx, (uint16_t)idx, 1024) != 0)
        return -1;
    *seq = s->seq;
    s->seq = s->seq + 1;
    return 0;
}

/* _carried: whether this sender used ``seq``, and for which (msg_id, pkt_idx) */
int sender_carried(Sender *s, uint32_t seq, uint32_t *msg_id, uint32_t *idx) {
    uint32_t off = seq - s->isn;
    if (off >= s->sent_msg.n)
        return 0;
    *msg_id = s->sent_msg.v[off];
    *idx = s->sent_idx.v[off];
    return 1;
}

/* --- what to send next ----------------------------------------------------------------------------------- */

double sender_epoch_length(const Sender *s) {
    if (s->has_epoch_s)
        return s->epoch_s;
    return s->min_epoch_s < s->recovery.srtt ? s->recovery.srtt : s->min_epoch_s;
}

static inline int is_control(uint32_t msg_id) {
    return msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID || msg_id == ECHO_MSG_ID || msg_id == MSR_MSG_ID;
}

/* the offset of the next sequence number from the ISN */

/* _granted_first: the next sequence number is in the first window */
static inline int granted_first(const Sender *s) { return sender_next_off(s) < s->free_until; }

/* _granted: in the first window, or below the receiver's grant */
static inline int granted(const Sender *s) {
    uint32_t off = sender_next_off(s);
    return off < s->free_until || (int64_t)off < s->grant;
}

/* _window_open: whether a data packet may leave now (control packets always may): within the ``adaptive`` window,
 * and below the receiver's grant when it sends grants (or in the first window, or as a probe); with
 * grant_overrides_window a granted packet beyond the first window needs no room in the window */
static inline int window_open(Sender *s, uint32_t msg_id) {
    if (is_control(msg_id))
        return 1;
    if (s->grant >= 0) {
        uint32_t off = sender_next_off(s);
        if (off >= s->free_until && (int64_t)off < s->grant && s->grant_overrides)
            return 1;
        if (!(granted(s) || s->probe))
            return 0;
    }
    return !s->adaptive || (double)s->recovery.in_flight.len < s->rate.window;
}

/* _surplus: ``adaptive``: the group (index gi) reaches its required count without the next new message (what is
 * on its way discounted by the group's measured loss; repairs count only while nothing holds them back) */
static int surplus_group(Sender *s, size_t gi) {
    Group *g = &s->groups[gi];
    double est = 0.0;
    if (!rate_loss_estimate(&s->rate, gi, &est))
        est = 0.0;
    int64_t repairing = s->grant < 0 && s->surplus_on ? g->repairing : 0;
    double on_the_way = (double)(g->started + repairing) * (1.0 - est);
    return (double)g->delivered + on_the_way >= (double)g->required;
}

/* _starts_surplus: the next new packet of ``m`` would be surplus */
static int starts_surplus(Sender *s, const Msg *m) {
    if (!(m->state == M_ACTIVE && (m->next_new == 0 || m->surplus)))
        return 0;
    return s->adaptive && s->groups[m->group].approx && surplus_group(s, m->group);
}

/* _holds_surplus: surplus is held back (``surplus`` off, or scheduled beyond the first window; ``early`` only) */
static inline int holds_surplus(const Sender *s) {
    return s->completion_early && (!s->surplus_on || (s->grant >= 0 && !granted_first(s)));
}

static inline Py_ssize_t payload_len(Sender *s, uint32_t msg_id, uint32_t idx) {
    if (msg_id == ANNOUNCE_MSG_ID || msg_id == ECHO_MSG_ID)
        return ANNOUNCE_PREFIX_LEN + PyBytes_GET_SIZE(s->announce[idx]);
    if (msg_id == FIN_MSG_ID)
        return 0;
    if (msg_id == MSR_MSG_ID)
        return MSR_CHANGE_LEN;
    Msg *m = &s->msgs[msg_id];
    Py_ssize_t len = PyBytes_GET_SIZE(m->data);
    if (len == 0)
        return 0;
    Py_ssize_t rest = len - (Py_ssize_t)idx * s->max_payload;
    return rest < s->max_payload ? rest : s->max_payload;
}

int sender_ctl_append(Sender *s, uint32_t msg_id, uint32_t idx) {
    return RING_PUSH(&s->ctl, ((CtlItem){msg_id, idx}), 8);
}

/* _queue_msr_change: the group's latest change goes out (once queued) */
int sender_queue_msr_change(Sender *s, size_t gi) {
    if (s->msr_queued[gi])
        return 0;
    s->msr_queued[gi] = 1;
    return sender_ctl_append(s, MSR_MSG_ID, (uint32_t)gi);
}

/* the MSR change sequence number ``seq`` carried, taken off the list: 1, or 0 when there is none */
int sender_msr_sent_take(Sender *s, uint32_t seq, MsrSent *out) {
    for (size_t k = 0; k < s->msr_sent.n; k++)
        if (s->msr_sent.v[k].seq == seq) {
            *out = s->msr_sent.v[k];
            s->msr_sent.v[k] = s->msr_sent.v[--s->msr_sent.n];
            return 1;
        }
    return 0;
}

/* _peek: the next (msg_id, idx) to send: 1, or 0 when there is none, -1 on error. ``plan`` (_peek(now) rather than
 * _peek(None)): a damaged message smaller than the next new one is repaired first (adaptive, MRDF). */
static int peek(Sender *s, int plan, uint32_t *msg_id, uint32_t *idx) {
    while (!RING_EMPTY(&s->ctl)) {
        CtlItem c = RING_FRONT(&s->ctl);
        if (c.msg_id == ANNOUNCE_MSG_ID && s->announce_acked[c.idx]) {
            RING_POP(&s->ctl);
            continue;
        }
        if (c.msg_id == MSR_MSG_ID && s->msr_acked[c.idx] >= s->msr_latest[c.idx]) {
            RING_POP(&s->ctl);
            s->msr_queued[c.idx] = 0;
            continue;
        }
        *msg_id = c.msg_id;
        *idx = c.idx;
        return 1;
    }
    if (s->state != S_SENDING)
        return 0;
    for (;;) {
        int64_t id = sched_peek(&s->sched);
        if (id < 0)
            return 0;
        Msg *m = &s->msgs[id];
        if (m->state == M_REPAIRING && m->lost.v != NULL) {
            while (!RING_EMPTY(&m->lost) && s->pkt_state[m->pkt_base + RING_FRONT(&m->lost)] != P_LOST)
                RING_POP(&m->lost);
            if (!RING_EMPTY(&m->lost)) {
                *msg_id = (uint32_t)id;
                *idx = RING_FRONT(&m->lost);
                return 1;
            }
        }
        if ((m->state == M_ACTIVE || m->state == M_REPAIRING) && m->next_new < m->cnt) {
            Group *g = &s->groups[m->group];
            if (plan && m->state == M_ACTIVE && m->next_new == 0 && g->idle.n && s->adaptive && s->sched.mrdf) {
                int64_t before = g->repairing;
                if (sender_plan_repairs(s, g) != 0)
                    return -1;
                if (g->repairing != before)
                    continue;
            }
            if (starts_surplus(s, m) && holds_surplus(s)) { /* parked until a loss makes its group short again */
                sched_remove(&s->sched, (uint32_t)id);
                if (ARRAY_PUSH(&g->parked, (uint32_t)id, 16) != 0)
                    return -1;
                continue;
            }
            *msg_id = (uint32_t)id;
            *idx = m->next_new;
            return 1;
        }
        sched_remove(&s->sched, (uint32_t)id);
    }
}

/* _take: packet ``idx`` of message ``id`` leaves now: whether it is a retransmission, whether it is surplus
 * (decided when a message starts) */
static void take(Sender *s, uint32_t id, uint32_t idx, int *retx, int *surplus) {
    Msg *m = &s->msgs[id];
    Group *g = &s->groups[m->group];
    uint8_t *ps = &s->pkt_state[m->pkt_base + idx];
    *retx = *ps != P_UNSENT;
    *surplus = 0;
    if (*retx) {
        RING_POP(&m->lost);
    } else {
        if (m->state == M_ACTIVE && (m->next_new == 0 || m->surplus)) {
            *surplus = starts_surplus(s, m);
            if (!*surplus)
                g->started++; /* the message is needed from now on */
            m->surplus = (uint8_t)*surplus;
        }
        m->next_new++;
        if (m->next_new == m->cnt)
            s->unsent_open--;
    }
    *ps = P_IN_FLIGHT;
    g->packets_sent++;
    if (*surplus)
        s->packets_surplus++;
}

static inline int same_tags(const Msg *a, const Msg *b) {
    if (a->tagged != b->tagged)
        return 0;
    if (!a->tagged)
        return 1;
    return a->priority == b->priority && a->weight == b->weight && a->has_deadline == b->has_deadline &&
           (!a->has_deadline || a->deadline_s == b->deadline_s);
}

/* config.job_rank: (job_id x 2654435761 >> 7) mod levels, one level less per promote_s of the job's age, >= 0 */
static long long job_rank(uint32_t job_id, long long levels, double age_s, double promote_s) {
    long long rank = (long long)((((uint64_t)job_id * 2654435761u) >> 7) % (uint64_t)levels);
    if (promote_s > 0 && age_s > 0) {
        double steps = age_s / promote_s;
        rank = steps >= (double)rank ? 0 : rank - (long long)steps;
    }
    return rank;
}

/* _data_datagram's header fields: flags, tags, group, TLR (``low``: TLR 1.0, the lowest queue), counts */
static void data_header(Sender *s, const Msg *m, AtpHeader *h, int retx, int low, unsigned count, Py_ssize_t plen,
                        double now) {
    const Group *g = &s->groups[m->group];
    uint8_t flags = (g->approx ? F_APPROX : 0) | (retx ? F_RETX : 0);
    if (m->tagged) {
        flags |= F_TAGGED;
        h->priority = m->priority;
        h->weight = m->weight;
        if (m->has_deadline) {
            double slack = s->start_time + m->deadline_s - now;
            double us = slack * 1e6;
            long long v;
            if (!(us < (double)MAX_SLACK_US))
                v = MAX_SLACK_US;
            else
                v = (long long)us; /* int() truncates towards zero */
            if (v < 0)
                v = 0;
            h->deadline_us = (uint32_t)v;
        }
    } else if (g->approx && s->rank_levels > 0) { /* a rank between jobs: config.job_rank */
        flags |= F_TAGGED;
        h->weight = 1;
        h->priority = (uint8_t)job_rank((uint32_t)s->job_id, s->rank_levels, now - s->start_time, s->rank_promote_s);
    }
    h->flags = flags;
    h->group_id = (uint16_t)g->group_id;
    h->tlr = low ? ATP_TLR_ONE : atp_q15(s->tlr[m->group]);
    h->pkt_cnt = (uint16_t)m->cnt;
    h->count = (uint8_t)count;
    h->length = (uint16_t)plen;
}

/* _emit: writes the datagram of (msg_id, idx) into s->scratch; its length in *len. With packing, the messages the
 * scheduler serves next go into the same packet as records (_pack). */
/* over 100 lines: sender.py's _emit in its order (header, packed records, pacing, accounting) */
static int emit(Sender *s, uint32_t msg_id, uint32_t idx, double now, size_t *len) {
    uint8_t *out = s->scratch;
    uint32_t seq;
    if (msg_id == ECHO_MSG_ID) { /* announce part 0 again, with the token (its ACK validates like any announce's) */
        RING_POP(&s->ctl);
        if (next_seq(s, ANNOUNCE_MSG_ID, 0, &seq) != 0)
            return -1;
        s->packets_sent++;
        SentPkt p = {.seq = seq, .msg_id = ANNOUNCE_MSG_ID, .pkt_idx = 0,
                     .size = (uint32_t)payload_len(s, ANNOUNCE_MSG_ID, 0), .group_id = -1, .sent_time = now};
        if (recovery_on_sent(&s->recovery, &p) != 0)
            return -1;
        *len = (size_t)(ATP_HEADER_LEN + p.size);
        return sender_announce_datagram(s, 0, seq, out);
    }
    if (next_seq(s, msg_id, msg_id == MSR_MSG_ID ? 0 : idx, &seq) != 0)
        return -1;
    s->packets_sent++;
    if (msg_id == MSR_MSG_ID) { /* idx: the group index */
        RING_POP(&s->ctl);
        s->msr_queued[idx] = 0;
        MsrSent ms = {seq, idx, s->msr_latest[idx]};
        if (ARRAY_PUSH(&s->msr_sent, ms, 4) != 0)
            return -1;
        SentPkt p = {.seq = seq, .msg_id = msg_id, .pkt_idx = 0, .size = MSR_CHANGE_LEN, .group_id = -1,
                     .sent_time = now};
        if (recovery_on_sent(&s->recovery, &p) != 0)
            return -1;
        AtpHeader mh = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET,
                        .job_id = (uint32_t)s->job_id, .msg_id = msg_id, .group_id = (uint16_t)s->groups[idx].group_id,
                        .pkt_cnt = 1, .seq = seq, .deadline_us = ATP_NO_DEADLINE, .count = 1,
                        .length = MSR_CHANGE_LEN};
        atp_encode(out, &mh);
        uint8_t *b = out + ATP_HEADER_LEN;
        uint32_t ch = ms.change;
        uint16_t q = atp_q15(s->groups[idx].msr);
        b[0] = (uint8_t)(ch >> 24), b[1] = (uint8_t)(ch >> 16), b[2] = (uint8_t)(ch >> 8), b[3] = (uint8_t)ch;
        b[4] = (uint8_t)(q >> 8), b[5] = (uint8_t)q;
        *len = ATP_HEADER_LEN + MSR_CHANGE_LEN;
        return 0;
    }
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = msg_id, .pkt_idx = (uint16_t)idx, .seq = seq, .deadline_us = ATP_NO_DEADLINE,
                   .count = 1};
    if (msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID) {
        RING_POP(&s->ctl);
        if (msg_id == ANNOUNCE_MSG_ID) {
            SentPkt p = {.seq = seq, .msg_id = msg_id, .pkt_idx = idx, .size = (uint32_t)payload_len(s, msg_id, idx),
                         .group_id = -1, .sent_time = now};
            if (recovery_on_sent(&s->recovery, &p) != 0)
                return -1;
            *len = (size_t)(ATP_HEADER_LEN + p.size);
            return sender_announce_datagram(s, idx, seq, out);
        }
        double tt = recovery_tail_timeout(&s->recovery);
        s->fin_next = now + (FIN_RETRY_MIN_S < tt ? tt : FIN_RETRY_MIN_S);
        s->has_fin_next = 1;
        h.pkt_cnt = 1;
        h.length = 0;
        atp_encode(out, &h);
        *len = ATP_HEADER_LEN;
        return 0;
    }
    uint32_t off = seq - s->isn;
    int first = off < s->free_until; /* in the first window (unscheduled) */
    if (s->grant >= 0 && !first && (int64_t)off >= s->grant)
        s->probe = 0; /* beyond the grant: the one probe a tail timeout allows */
    Msg *m = &s->msgs[msg_id];
    Group *g = &s->groups[m->group];
    int retx, surplus;
    take(s, msg_id, idx, &retx, &surplus);
    Py_ssize_t plen = payload_len(s, msg_id, idx);
    uint8_t *body = out + ATP_HEADER_LEN;
    uint32_t more_off = (uint32_t)s->more_ids.n;
    unsigned count = 1;
    if (s->pack && m->cnt == 1) { /* _pack */
        long long room = s->max_payload - ATP_RECORD_HEADER_LEN - plen;
        uint8_t *rec = body + ATP_RECORD_HEADER_LEN + plen; /* records behind the first one's */
        while (room >= ATP_RECORD_HEADER_LEN && count < ATP_MAX_PACKED) {
            uint32_t nid, nidx;
            int got = peek(s, 1, &nid, &nidx);
            if (got < 0)
                return -1;
            if (!got || nid >= s->nmsgs)
                break; /* nothing, or a control message (announce, FIN, echo) is due first */
            Msg *n = &s->msgs[nid];
            Py_ssize_t nlen = PyBytes_GET_SIZE(n->data);
            if (n->cnt != 1 || n->group != m->group || !same_tags(n, m) || nlen + ATP_RECORD_HEADER_LEN > room ||
                starts_surplus(s, n) != surplus)
                break;
            int r, unused;
            take(s, nid, 0, &r, &unused);
            retx |= r;
            if (ARRAY_PUSH(&s->more_ids, nid, 64) != 0)
                return -1;
            put32(rec, nid);
            put16(rec + 4, (uint16_t)nlen);
            memcpy(rec + ATP_RECORD_HEADER_LEN, PyBytes_AS_STRING(n->data), (size_t)nlen);
            rec += ATP_RECORD_HEADER_LEN + nlen;
            room -= ATP_RECORD_HEADER_LEN + nlen;
            count++;
        }
        if (count > 1) {
            put32(body, msg_id);
            put16(body + 4, (uint16_t)plen);
            if (plen)
                memcpy(body + ATP_RECORD_HEADER_LEN, PyBytes_AS_STRING(m->data), (size_t)plen);
            plen = rec - body;
        }
    }
    if (count == 1 && plen)
        memcpy(body, PyBytes_AS_STRING(m->data) + (Py_ssize_t)idx * s->max_payload, (size_t)plen);
    if (retx) { /* a packet that carries a retransmitted message (packed with new ones, perhaps) */
        s->retransmissions++;
        g->retransmissions++;
    }
    /* surplus packets are not counted by rate control (group None): their loss in the lowest queue is expected */
    SentPkt p = {.seq = seq, .msg_id = msg_id, .pkt_idx = idx, .size = (uint32_t)plen,
                 .group_id = surplus ? -1 : (int32_t)g->group_id, .retx = (uint8_t)retx, .first = (uint8_t)first,
                 .more_n = (uint16_t)(count - 1), .more_off = count > 1 ? more_off : 0, .sent_time = now};
    if (recovery_on_sent(&s->recovery, &p) != 0)
        return -1;
    int low = surplus || (first && s->first_low && g->approx); /* the lowest queue (TLR 1.0) */
    data_header(s, m, &h, retx, low, count, plen, now);
    atp_encode(out, &h);
    *len = (size_t)(ATP_HEADER_LEN + plen);
    return 0;
}

/* _copy_candidate: the node (in recovery.in_flight) of the packet to send a copy of now, -1 for none.
 * ``have_next``/``next_msg``: what peek offers. */
static int32_t copy_candidate(Sender *s, int have_next, uint32_t next_msg) {
    if (!s->adaptive || s->state != S_SENDING || (have_next && is_control(next_msg)))
        return -1;
    long long want = recovery_copies(&s->recovery);
    if (want == 0)
        return -1;
    const PacketMap *f = &s->recovery.in_flight;
    int32_t ann = -1, data = -1;
    for (int32_t cur = f->head; cur >= 0; cur = f->nodes.v[cur].next) {
        const SentPkt *p = &f->nodes.v[cur].p;
        if (p->copy || (long long)p->copies >= want)
            continue;
        if (p->msg_id == ANNOUNCE_MSG_ID) {
            if (!s->announce_acked[p->pkt_idx] && (ann < 0 || p->copies < f->nodes.v[ann].p.copies))
                ann = cur;
        } else if (!have_next && p->group_id >= 0 && p->more_n == 0 && p->msg_id < s->nmsgs &&
                   (data < 0 || p->copies < f->nodes.v[data].p.copies) &&
                   s->pkt_state[s->msgs[p->msg_id].pkt_base + p->pkt_idx] == P_IN_FLIGHT) {
            data = cur;
        }
    }
    return ann >= 0 ? ann : data;
}

/* _emit_copy: the copy of in-flight node ``k`` into s->scratch; its length in *len */
static int emit_copy(Sender *s, int32_t k, double now, size_t *len) {
    SentPkt *o = &s->recovery.in_flight.nodes.v[k].p;
    o->copies++;
    uint32_t msg_id = o->msg_id, idx = o->pkt_idx, size = o->size; /* recovery_on_sent may move the nodes */
    uint8_t *out = s->scratch;
    uint32_t seq;
    if (next_seq(s, msg_id, idx, &seq) != 0)
        return -1;
    s->packets_sent++;
    if (msg_id == ANNOUNCE_MSG_ID) {
        SentPkt p = {.seq = seq, .msg_id = msg_id, .pkt_idx = idx, .size = size, .group_id = -1, .copy = 1,
                     .sent_time = now};
        if (recovery_on_sent(&s->recovery, &p) != 0)
            return -1;
        *len = (size_t)(ATP_HEADER_LEN + size);
        return sender_announce_datagram(s, idx, seq, out);
    }
    Msg *m = &s->msgs[msg_id];
    Group *g = &s->groups[m->group];
    Py_ssize_t plen = payload_len(s, msg_id, idx);
    if (plen)
        memcpy(out + ATP_HEADER_LEN, PyBytes_AS_STRING(m->data) + (Py_ssize_t)idx * s->max_payload, (size_t)plen);
    s->retransmissions++;
    g->retransmissions++;
    g->packets_sent++;
    SentPkt p = {.seq = seq, .msg_id = msg_id, .pkt_idx = idx, .size = (uint32_t)plen, .group_id = -1, .retx = 1,
                 .copy = 1, .sent_time = now};
    if (recovery_on_sent(&s->recovery, &p) != 0)
        return -1;
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = msg_id, .pkt_idx = (uint16_t)idx, .seq = seq, .deadline_us = ATP_NO_DEADLINE,
                   .count = 1};
    data_header(s, m, &h, 1, 1, 1, plen, now);
    atp_encode(out, &h);
    *len = (size_t)(ATP_HEADER_LEN + plen);
    return 0;
}

/* _start: the job starts at the first datagrams_to_send(), not at construction (which may be slow) */
static void start(Sender *s, double now) {
    s->started = 1;
    s->start_time = now;
    s->bucket.tokens = s->bucket.burst;
    s->bucket.stamp = now;
    s->epoch_end = now + sender_epoch_length(s);
    s->last_progress = now;
}

/* _burst_bytes: ``burst_packets`` full packets, or a train of ``pacing_train_s`` at ``rate_bps`` when that is
 * more, but never more than the queue stamped on the last data ACK holds (no train before the first data ACK) */
double sender_burst_bytes(const Sender *s, double rate_bps) {
    long long wire_max = s->packet_size + s->overhead;
    int q = s->path_queue;
    if (q < 0)
        return (double)(s->burst_packets * wire_max);
    double train = rate_bps * s->pacing_train_s / 8;
    if (q < 8 && s->queue_packets[q] > 0) {
        double cap = (double)((long long)s->queue_packets[q] * wire_max);
        if (cap < train)
            train = cap;
    }
    double base = (double)(s->burst_packets * wire_max);
    return train > base ? train : base;
}

/* The next datagram datagrams_to_send would produce: 1 with its (msg_id, idx) when the pacer allows it (its first
 * message's bytes; emit's length is charged), 2 with *copy (a node of recovery.in_flight) for a copy, 0 when there
 * is none, -1 on error. */
static int next_datagram(Sender *s, uint32_t *msg_id, uint32_t *idx, int32_t *copy) {
    int got = peek(s, 1, msg_id, idx);
    if (got < 0)
        return got;
    *copy = copy_candidate(s, got, *msg_id);
    if (*copy >= 0) {
        const SentPkt *p = &s->recovery.in_flight.nodes.v[*copy].p;
        if (!window_open(s, p->msg_id))
            return 0;
        return bucket_can_send(&s->bucket, (double)(ATP_HEADER_LEN + p->size + s->overhead)) ? 2 : 0;
    }
    if (got == 0 || !window_open(s, *msg_id))
        return 0;
    Py_ssize_t plen = payload_len(s, *msg_id, *idx);
    return bucket_can_send(&s->bucket, (double)(ATP_HEADER_LEN + plen + s->overhead));
}

int sender_produce(Sender *s, double now, Room room, void *ctx) {
    if (s->state != S_SENDING && s->state != S_CLOSING)
        return 0;
    if (!s->started)
        start(s, now);
    double rate = s->rate.rate_bps;
    s->bucket.burst = sender_burst_bytes(s, rate);
    bucket_refill(&s->bucket, rate, now);
    uint32_t msg_id, idx;
    int32_t copy;
    int got;
    while ((got = next_datagram(s, &msg_id, &idx, &copy)) > 0) {
        size_t len;
        if ((got == 2 ? emit_copy(s, copy, now, &len) : emit(s, msg_id, idx, now, &len)) != 0)
            return -1;
        s->bucket.tokens -= (double)(len + (size_t)s->overhead); /* a packed packet: all its bytes */
        uint8_t *buf = room(ctx, len);
        if (buf == NULL)
            return -1;
        memcpy(buf, s->scratch, len);
    }
    return got;
}

int sender_timer_at(Sender *s, double *out) {
    if (!s->started) {
        *out = s->start_time;
        return 0;
    }
    if (s->state == S_SENDING) {
        double t = s->epoch_end, x = s->last_progress + s->idle_timeout_s;
        if (x < t)
            t = x;
        if (recovery_loss_deadline(&s->recovery, &x) && x < t)
            t = x;
        uint32_t msg_id, idx;
        int got = peek(s, 0, &msg_id, &idx);
        if (got < 0)
            got = 0;
        int32_t copy = copy_candidate(s, got, msg_id);
        if (copy >= 0) {
            const SentPkt *p = &s->recovery.in_flight.nodes.v[copy].p;
            if (window_open(s, p->msg_id)) {
                x = bucket_ready_at(&s->bucket, (double)(ATP_HEADER_LEN + p->size + s->overhead), s->rate.rate_bps);
                if (x < t)
                    t = x;
            }
        } else if (got > 0 && window_open(s, msg_id)) {
            double size = (double)(ATP_HEADER_LEN + payload_len(s, msg_id, idx) + s->overhead);
            x = bucket_ready_at(&s->bucket, size, s->rate.rate_bps);
            if (x < t)
                t = x;
        }
        *out = t;
        return 0;
    }
    if (s->state == S_CLOSING) {
        double t = s->fin_deadline;
        if (s->has_fin_next && s->fin_next < t)
            t = s->fin_next;
        uint32_t msg_id, idx;
        if (peek(s, 0, &msg_id, &idx) > 0) { /* the FIN, or an echo of the token */
            double size = (double)(ATP_HEADER_LEN + payload_len(s, msg_id, idx) + s->overhead);
            double x = bucket_ready_at(&s->bucket, size, s->rate.rate_bps);
            if (x < t)
                t = x;
        }
        *out = t;
        return 0;
    }
    return 1;
}

/* --- epochs, completion, close ------------------------------------------------------------------------------ */

static PyObject *queues_dict(Group *g) {
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < g->nq; i++) {
        PyObject *k = PyLong_FromLong(g->qorder[i]), *v = PyLong_FromUnsignedLong(g->qcount[g->qorder[i]]);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

/* _Group.next_tlr: eq. 1, ((1 - MSR)·N - lost) / (N - delivered), clamped to [0, 1] */
double sender_next_tlr(const Group *g) {
    if (g->fixed_tlr)
        return 1.0 - g->msr;
    int64_t left = g->total - g->delivered;
    if (left <= 0)
        return 1.0;
    double x = ((1.0 - g->msr) * (double)g->total - (double)(g->damaged + g->repairing)) / (double)left;
    if (!(x > 0.0))
        x = 0.0;
    return x < 1.0 ? x : 1.0;
}

static int end_epoch(Sender *s, double now) {
    double srtt = s->recovery.srtt, rate;
    RateCtl *rc = &s->rate;
    if (s->adaptive) {
        window_end_epoch(rc, sender_epoch_length(s));
        double r = rc->window * rc->mean_packet_bits / (srtt > 1e-6 ? srtt : 1e-6);
        rate = rc->max_rate_bps < r ? rc->max_rate_bps : r;
    } else {
        ratectl_end_epoch(rc, s->tlr, srtt);
        rate = rc->rate_bps;
    }
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        const EpochCounts *c = &rc->epoch[i];
        s->tlr[i] = sender_next_tlr(g);
        double loss = counts_loss(c);
        if (s->adaptive) {
            /* the loss over the group's recent packets whose fate is known, the estimate the window reacts to */
            double est;
            if (rate_loss_estimate(rc, i, &est))
                loss = est;
        }
        PyObject *kw = Py_BuildValue(
            "{s:L,s:d,s:L,s:d,s:d,s:d,s:L,s:L,s:N,s:L}", "epoch", s->epoch, "time", now - s->start_time, "group_id",
            g->group_id, "tlr", s->tlr[i], "rate_bps", rate, "loss", loss, "sent", (long long)c->sent, "acked",
            (long long)c->acked, "queues", queues_dict(g), "ece", (long long)g->ece);
        if (kw == NULL)
            return -1;
        PyObject *ev = PyObject_Call(R.EpochEnded, R.empty_tuple, kw);
        Py_DECREF(kw);
        if (events_push(&s->ev, ev) != 0)
            return -1;
        memset(g->qcount, 0, sizeof g->qcount);
        g->nq = 0;
        g->ece = 0;
        g->report_seq++;
        double kbps = rate / 1000;
        long long rk = kbps >= 4294967295.0 ? 4294967295LL : (long long)kbps;
        kw = Py_BuildValue("{s:L,s:L,s:L,s:d,s:d,s:d,s:L,s:L,s:L,s:L,s:L}", "job_id", s->job_id, "group_id",
                           g->group_id, "seq", (long long)g->report_seq, "tlr", s->tlr[i], "loss", loss, "msr", g->msr,
                           "rate_kbps", rk, "total", (long long)g->total, "delivered", (long long)g->delivered, "lost",
                           (long long)(g->damaged + g->repairing), "epoch", s->epoch);
        if (kw == NULL)
            return -1;
        PyObject *rep = PyObject_Call(R.Report, R.empty_tuple, kw);
        Py_DECREF(kw);
        if (rep == NULL)
            return -1;
        ev = PyObject_CallOneArg(R.ReportReady, rep);
        Py_DECREF(rep);
        if (events_push(&s->ev, ev) != 0)
            return -1;
    }
    rate_reset_epoch(rc);
    s->epoch++;
    s->epoch_end = now + sender_epoch_length(s);
    return 0;
}

/* _queue_fin: the FIN, as many copies as the answers' loss needs (recovery_fin_copies) */
static int queue_fin(Sender *s) {
    for (long long i = recovery_fin_copies(&s->recovery); i > 0; i--)
        if (sender_ctl_append(s, FIN_MSG_ID, 0) != 0)
            return -1;
    s->has_fin_next = 0; /* set when the FIN actually leaves */
    return 0;
}

static int check_complete(Sender *s, double now) {
    if (s->state != S_SENDING)
        return 0;
    for (size_t i = 0; i < s->ngroups; i++)
        if (s->groups[i].delivered < s->groups[i].required)
            return 0;
    for (size_t i = 0; i < s->nannounce; i++)
        if (!s->announce_acked[i])
            return 0;
    if (!s->completion_early && s->unsent_open > 0)
        return 0;
    s->completed_at = now;
    s->has_completed_at = 1;
    s->state = S_CLOSING;
    s->fin_deadline = now + s->fin_timeout_s;
    return queue_fin(s);
}

int sender_set_msr(Sender *s, size_t gi, double msr, int64_t required, double now) {
    Group *g = &s->groups[gi];
    s->msr_latest[gi] = ++s->msr_changes;
    g->msr = msr;
    g->required = required;
    g->budget = g->total - required;
    s->tlr[gi] = sender_next_tlr(g);
    for (size_t k = 0; k < g->parked.n; k++) { /* the group may now be short: what was held back is offered again */
        uint32_t pid = g->parked.v[k];
        Msg *p = &s->msgs[pid];
        if (p->state == M_ACTIVE && p->next_new < p->cnt && sched_update(&s->sched, pid, p->remaining, 0, p->retries))
            return -1;
    }
    g->parked.n = 0;
    if (sender_queue_msr_change(s, gi) != 0 || sender_plan_repairs(s, g) != 0)
        return -1;
    return check_complete(s, now);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* _finish; ``lost`` (sorted, unique) NULL means the sender's own view */
static int finish(Sender *s, double now, int confirmed, uint32_t *lost, size_t nlost) {
    uint32_t *own = NULL;
    if (lost == NULL) {
        own = malloc((s->nmsgs ? s->nmsgs : 1) * sizeof(uint32_t));
        if (own == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        nlost = 0;
        for (size_t i = 0; i < s->nmsgs; i++)
            if (s->msgs[i].state != M_DELIVERED)
                own[nlost++] = (uint32_t)i;
        lost = own;
    }
    int64_t *per = calloc(s->ngroups ? s->ngroups : 1, sizeof(int64_t));
    PyObject *groups = PyTuple_New((Py_ssize_t)s->ngroups), *lost_ids = PyTuple_New((Py_ssize_t)nlost);
    int rc = -1;
    if (per == NULL || groups == NULL || lost_ids == NULL) {
        if (per == NULL)
            PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < nlost; i++) {
        per[s->msgs[lost[i]].group]++;
        PyObject *v = PyLong_FromUnsignedLong(lost[i]);
        if (v == NULL)
            goto out;
        PyTuple_SET_ITEM(lost_ids, (Py_ssize_t)i, v);
    }
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        PyObject *kw = Py_BuildValue("{s:L,s:d,s:L,s:L,s:L,s:L,s:d,s:L,s:L}", "group_id", g->group_id, "msr", g->msr,
                                     "total", (long long)g->total, "required", (long long)g->required, "delivered",
                                     (long long)(g->total - per[i]), "lost", (long long)per[i], "final_tlr", s->tlr[i],
                                     "packets_sent", (long long)g->packets_sent, "retransmissions",
                                     (long long)g->retransmissions);
        if (kw == NULL)
            goto out;
        PyObject *gs = PyObject_Call(R.GroupSummary, R.empty_tuple, kw);
        Py_DECREF(kw);
        if (gs == NULL)
            goto out;
        PyTuple_SET_ITEM(groups, (Py_ssize_t)i, gs);
    }
    double completed = s->has_completed_at ? s->completed_at : now;
    PyObject *mode = PyObject_GetAttrString(s->config, "mode"), *completion = PyObject_GetAttrString(s->config, "completion");
    if (mode == NULL || completion == NULL) {
        Py_XDECREF(mode);
        Py_XDECREF(completion);
        goto out;
    }
    const Recovery *r = &s->recovery;
    PyObject *lost_by = Py_BuildValue("{s:L,s:L,s:L,s:L}", "reorder", (long long)r->lost_reorder, "time",
                                      (long long)r->lost_time, "tail", (long long)r->lost_tail, "trim",
                                      (long long)r->lost_trim);
    PyObject *kw = lost_by == NULL ? NULL : Py_BuildValue(
        "{s:L,s:N,s:O,s:N,s:d,s:d,s:O,s:O,s:O,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:N,s:L,s:N,s:L}", "job_id", s->job_id, "mode", mode,
        "mrdf", s->sched.mrdf ? Py_True : Py_False, "completion", completion, "jct_s", completed - s->start_time,
        "closed_s", now - s->start_time, "receiver_confirmed", confirmed ? Py_True : Py_False, "groups", groups,
        "lost_ids", lost_ids, "packets_sent", s->packets_sent, "packets_acked", (long long)r->packets_acked,
        "packets_lost", (long long)r->packets_lost, "retransmissions", s->retransmissions, "epochs", s->epoch,
        "final_rate_bps", s->rate.rate_bps, "srtt_s", r->srtt, "losses_found_by", lost_by, "packets_surplus",
        s->packets_surplus, "rejected", PyDict_Copy(s->rejected), "spurious_losses",
        (long long)r->spurious_losses);
    if (kw == NULL)
        goto out;
    PyObject *summary = PyObject_Call(R.SendSummary, R.empty_tuple, kw);
    Py_DECREF(kw);
    if (summary == NULL)
        goto out;
    Py_XSETREF(s->summary, summary);
    s->state = S_DONE;
    Py_INCREF(summary);
    rc = events_push(&s->ev, PyObject_CallOneArg(R.JobCompleted, summary));
    Py_DECREF(summary);
out:
    Py_XDECREF(groups);
    Py_XDECREF(lost_ids);
    free(per);
    free(own);
    return rc;
}

static int fail(Sender *s, PyObject *reason) {
    s->state = S_FAILED;
    Py_INCREF(reason);
    Py_XSETREF(s->failure, reason);
    return events_push(&s->ev, PyObject_CallOneArg(R.JobFailed, reason));
}

/* --- what arrives --------------------------------------------------------------------------------------------- */

static int on_ack(Sender *s, const AtpHeader *h, const SackBlock *blocks, int nblocks, double now) {
    s->last_progress = now;
    if (h->msg_id == FIN_MSG_ID)
        return 0;
    int trimmed = (h->flags & F_TRIM) != 0; /* the packet arrived without its payload: lost, no timer */
    if (!is_control(h->msg_id) && !trimmed) {
        s->path_queue = h->queue;
        int gi = rate_group_index(&s->rate, h->group_id);
        if (gi >= 0) {
            Group *g = &s->groups[gi];
            if (g->qcount[h->queue]++ == 0)
                g->qorder[g->nq++] = h->queue;
            if (h->flags & F_ECE)
                g->ece++;
        }
    }
    Recovery *r = &s->recovery;
    if (recovery_on_ack(r, h->seq, blocks, nblocks, now, trimmed) != 0)
        return -1;
    if (s->state != S_SENDING) { /* keep counting deliveries while closing; losses no longer matter */
        for (size_t i = 0; i < r->acked.n; i++)
            if (sender_on_packet_acked(s, &r->acked.v[i]) != 0)
                return -1;
        return 0;
    }
    if (s->adaptive && !trimmed)
        window_on_path(&s->rate, h->queue, r->min_rtt + s->pacing_train_s);
    double delivery = recovery_delivery(r);
    for (size_t i = 0; i < r->acked.n; i++) {
        if (sender_on_packet_acked(s, &r->acked.v[i]) != 0)
            return -1;
        if (s->adaptive && r->acked.v[i].group_id >= 0)
            window_on_ack(&s->rate, r->acked.v[i].seq, delivery);
    }
    if (sender_on_lost(s, r->lost.v, r->lost.n) != 0)
        return -1;
    return check_complete(s, now);
}

static int on_done(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now) {
    if (s->state != S_CLOSING)
        return sender_reject(s, "done_before_fin");
    uint32_t cm, ci;
    if (!sender_carried(s, h->seq, &cm, &ci) || cm != FIN_MSG_ID || ci != 0)
        return sender_reject(s, "done_unsent_seq");
    /* wire.decode_done_payload: n ranges (first, end), non-empty, ascending, disjoint */
    if (len < 4)
        return sender_reject(s, "malformed");
    uint32_t n = get32(payload);
    if (len != 4 + 8 * (size_t)n)
        return sender_reject(s, "malformed");
    uint32_t prev_end = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t first = get32(payload + 4 + 8 * i), end = get32(payload + 8 + 8 * i);
        if (!(prev_end <= first && first < end))
            return sender_reject(s, "malformed");
        prev_end = end;
    }
    if (s->done_cnt >= 0 && h->pkt_cnt != s->done_cnt)
        PyDict_Clear(s->done_parts);
    s->done_cnt = h->pkt_cnt;
    PyObject *ranges = PyBytes_FromStringAndSize((const char *)payload + 4, (Py_ssize_t)(8 * (size_t)n));
    PyObject *key = ranges == NULL ? NULL : PyLong_FromLong(h->pkt_idx);
    int rc = key == NULL ? -1 : PyDict_SetItem(s->done_parts, key, ranges);
    Py_XDECREF(key);
    Py_XDECREF(ranges);
    if (rc != 0)
        return -1;
    if (PyDict_GET_SIZE(s->done_parts) != s->done_cnt)
        return 0;
    /* every part's ranges, sorted, merged and clipped to the job's own ids: O(n + ranges) */
    size_t nr = 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(s->done_parts, &pos, &k, &v))
        nr += (size_t)PyBytes_GET_SIZE(v) / 8;
    uint64_t *rs = malloc((nr ? nr : 1) * sizeof(uint64_t)); /* first << 32 | end, sorted as (first, end) */
    if (rs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t m = 0;
    pos = 0;
    while (PyDict_Next(s->done_parts, &pos, &k, &v)) {
        const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(v);
        for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(v) / 8; i++)
            rs[m++] = (uint64_t)get32(b + 8 * i) << 32 | get32(b + 8 * i + 4);
    }
    qsort(rs, m, sizeof(uint64_t), cmp_u64);
    uint32_t *all = malloc((s->nmsgs ? s->nmsgs : 1) * sizeof(uint32_t));
    if (all == NULL) {
        free(rs);
        PyErr_NoMemory();
        return -1;
    }
    size_t u = 0;
    for (size_t i = 0; i < m; i++) {
        uint64_t first = rs[i] >> 32, end = rs[i] & 0xFFFFFFFFu;
        if (u > 0 && first < (uint64_t)all[u - 1] + 1)
            first = (uint64_t)all[u - 1] + 1;
        if (end > s->nmsgs)
            end = s->nmsgs;
        for (uint64_t id = first; id < end; id++)
            all[u++] = (uint32_t)id;
    }
    free(rs);
    rc = finish(s, now, 1, all, u);
    free(all);
    return rc;
}

/* _ack_rejection: NULL when the ACK can be the receiver's answer to this sender, else the reason */
static const char *ack_rejection(Sender *s, const AtpHeader *h, const SackBlock *blocks, int nb) {
    uint32_t cm, ci;
    if (!sender_carried(s, h->seq, &cm, &ci))
        return "ack_unsent_seq";
    if (cm != h->msg_id || ci != h->pkt_idx)
        return "ack_mismatch";
    for (int i = 0; i < nb; i++) {
        uint32_t a = blocks[i].first - s->isn, b = blocks[i].last - s->isn;
        if (!(a <= b && b < s->sent_msg.n))
            return "ack_unsent_seq";
    }
    return NULL;
}

/* _on_grant: data may go up to (not including) sequence number ``grant``; grants only grow */
static int on_grant(Sender *s, uint32_t grant, uint32_t echo) {
    uint32_t off = grant - s->isn;
    if (off >= 1u << 31)
        return sender_reject(s, "grant_out_of_range");
    if (s->grant < 0 || (int64_t)off > s->grant)
        s->grant = off;
    if ((int64_t)(uint32_t)(echo - s->isn) > s->grant_top)
        s->grant_top = (uint32_t)(echo - s->isn);
    return 0;
}

int sender_receive(Sender *s, const uint8_t *data, size_t len, int from_peer, double now) {
    if (!s->started)
        return sender_reject(s, "before_start");
    if (!from_peer)
        return sender_reject(s, "wrong_source");
    AtpHeader h;
    const char *reason;
    if (atp_decode(data, len, &h, &reason) != 0)
        return sender_reject(s, "malformed");
    if (h.job_id != (uint32_t)s->job_id)
        return sender_reject(s, "wrong_job");
    if (s->state == S_DONE || s->state == S_FAILED)
        return sender_reject(s, "after_close");
    const uint8_t *payload = data + ATP_HEADER_LEN;
    if (h.type == PT_ACK || h.type == PT_GRANT) {
        SackBlock blocks[ATP_MAX_SACK_BLOCKS];
        int has_grant;
        uint32_t grant = 0;
        const uint8_t *token;
        int nb = atp_decode_ack_fields(payload, h.length, h.flags, blocks, &has_grant, &grant, &token);
        if (nb < 0)
            return sender_reject(s, "malformed");
        const char *why = ack_rejection(s, &h, blocks, nb);
        if (h.type == PT_GRANT && !has_grant)
            why = "malformed";
        if (why != NULL)
            return sender_reject(s, why);
        s->admitted = 1;
        if (h.type == PT_GRANT) {
            s->last_progress = now;
            return on_grant(s, grant, h.seq);
        }
        s->token_pending = token != NULL;
        if (token != NULL && sender_on_token(s, token, now) != 0)
            return -1;
        if (has_grant && on_grant(s, grant, h.seq) != 0)
            return -1;
        return on_ack(s, &h, blocks, nb, now);
    }
    if (h.type == PT_DONE)
        return on_done(s, &h, payload, h.length, now);
    if (h.type == PT_RETRY)
        return sender_on_retry(s, &h, payload, h.length, now);
    if (h.type == PT_NEW_TOKEN)
        return sender_on_new_token(s, &h, payload, h.length);
    return sender_reject(s, "not_for_sender");
}

int sender_from_peer_py(Sender *s, PyObject *addr) {
    PyObject *peer = s->peer;
    if (peer == Py_None)
        return 1;
    int eq = PyObject_RichCompareBool(addr, peer, Py_EQ);
    if (eq != 0)
        return eq;
    if (PyTuple_Check(addr) && PyTuple_Check(peer)) { /* IPv6 sockets add flow info and scope id */
        PyObject *a = PyTuple_GetSlice(addr, 0, 2), *b = PyTuple_GetSlice(peer, 0, 2);
        int r = (a == NULL || b == NULL) ? -1 : PyObject_RichCompareBool(a, b, Py_EQ);
        Py_XDECREF(a);
        Py_XDECREF(b);
        return r;
    }
    return 0;
}

int sender_from_peer_na(Sender *s, const NetAddr *na) {
    if (s->peer == Py_None)
        return 1;
    if (!s->peer_ok) {
        if (addr_from_py(s->peer, &s->peer_addr) != 0) {
            PyErr_Clear();
            return 0;
        }
        s->peer_ok = 1;
    }
    return netaddr_same_host_port(na, &s->peer_addr);
}

/* --- timers ----------------------------------------------------------------------------------------------------- */

/* the failure when nothing is acknowledged for idle_timeout_s (``admission``: the job was never admitted) */
static int fail_no_ack(Sender *s, int admission) {
    PyObject *peer = PyObject_Format(s->peer, NULL);
    PyObject *idle = PyObject_GetAttrString(s->config, "idle_timeout_s");
    PyObject *fmt = PyUnicode_FromString("g");
    PyObject *idle_s = (idle == NULL || fmt == NULL) ? NULL : PyObject_Format(idle, fmt);
    PyObject *reason = NULL;
    if (peer != NULL && idle_s != NULL) {
        if (admission)
            reason = PyUnicode_FromFormat("no acknowledgement from %U for %U s: job %lld was not admitted (receiver "
                                          "down, unreachable, out of job slots, or expecting an admission key?)",
                                          peer, idle_s, s->job_id);
        else
            reason = PyUnicode_FromFormat("no acknowledgement from %U for %U s (receiver down, unreachable, or "
                                          "rejecting job %lld?)", peer, idle_s, s->job_id);
    }
    Py_XDECREF(peer);
    Py_XDECREF(idle);
    Py_XDECREF(fmt);
    Py_XDECREF(idle_s);
    if (reason == NULL)
        return -1;
    int rc = fail(s, reason);
    Py_DECREF(reason);
    return rc;
}

/* _give_back_overdue: the tail timed out: every granted packet still in flight past the newest the receiver had when
 * it granted that is overdue (sent a time threshold ago, nothing acknowledged since) gives its place back, as a lost
 * one does (sender_on_lost): it died, or it arrived and the ACK that raised the grant by one for it was lost */
static void give_back_overdue(Sender *s, double now) {
    double thr = recovery_time_threshold(&s->recovery);
    for (int32_t cur = s->recovery.in_flight.head; cur >= 0;) {
        const struct PNode *node = &s->recovery.in_flight.nodes.v[cur];
        int64_t off = (uint32_t)(node->p.seq - s->isn);
        if (now - node->p.sent_time < thr)
            break;
        if (off >= (int64_t)s->free_until && off < s->grant && off > s->grant_top) {
            s->grant++;
            s->grant_top = off;
        }
        cur = node->next;
    }
}

int sender_handle_timer(Sender *s, double now) {
    if (!s->started)
        return 0;
    if (s->state == S_SENDING) {
        if (recovery_detect_lost(&s->recovery, now) != 0)
            return -1;
        if (sender_on_lost(s, s->recovery.lost.v, s->recovery.lost.n) != 0)
            return -1;
        int tail = 0; /* the tail timed out */
        for (size_t i = 0; i < s->recovery.lost.n && !tail; i++)
            tail = !s->recovery.lost.v[i].by_threshold;
        if (s->grant >= 0 && tail) {
            give_back_overdue(s, now);
            if (!granted(s))
                s->probe = 1; /* and the grant is still spent: one packet may go to ask for more */
        }
        if (s->recovery.lost.n && s->token_pending && now >= s->echo_next) {
            /* nothing acknowledged for a while and the receiver had not seen the echo: it may have been lost, and
             * an unvalidated job's data past its guarantee is not acknowledged (no ACK would ask again) */
            s->echo_next = now + s->recovery.srtt;
            if (sender_ctl_append(s, ECHO_MSG_ID, 0) != 0)
                return -1;
        }
        if (now >= s->epoch_end && end_epoch(s, now) != 0)
            return -1;
        if (now >= s->last_progress + s->idle_timeout_s)
            return fail_no_ack(s, !s->admitted);
        return check_complete(s, now);
    }
    if (s->state == S_CLOSING) {
        if (now >= s->fin_deadline)
            return finish(s, now, 0, NULL, 0);
        if (s->has_fin_next && now >= s->fin_next)
            return queue_fin(s);
    }
    return 0;
}
