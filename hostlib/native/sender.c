/* The ATP sender's protocol (sender.h; hostlib/sender.py is the specification, the Python names are given where
 * they help): what it sends and when, what an ACK, DONE or RETRY does to it, epochs, completion and the close. */
#include <math.h>
#include <string.h>

#include "sender.h"

#define MAX_SLACK_US (ATP_NO_DEADLINE - 1)
#define FIN_RETRY_MIN_S 0.02

static int reject(Sender *s, const char *reason) { return counter_add(s->rejected, reason, 1); }

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
static int carried(Sender *s, uint32_t seq, uint32_t *msg_id, uint32_t *idx) {
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

/* _window_open: ``adaptive``: whether a data packet may leave now (control packets always may) */
static inline int window_open(Sender *s, uint32_t msg_id) {
    return !s->adaptive || msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID ||
           (double)s->recovery.in_flight.len < s->rate.window;
}

static inline Py_ssize_t payload_len(Sender *s, uint32_t msg_id, uint32_t idx) {
    if (msg_id == ANNOUNCE_MSG_ID)
        return ANNOUNCE_PREFIX_LEN + PyBytes_GET_SIZE(s->announce[idx]);
    if (msg_id == FIN_MSG_ID)
        return 0;
    Msg *m = &s->msgs[msg_id];
    Py_ssize_t len = PyBytes_GET_SIZE(m->data);
    if (len == 0)
        return 0;
    Py_ssize_t rest = len - (Py_ssize_t)idx * s->max_payload;
    return rest < s->max_payload ? rest : s->max_payload;
}

static int ctl_append(Sender *s, uint32_t msg_id, uint32_t idx) {
    return RING_PUSH(&s->ctl, ((CtlItem){msg_id, idx}), 8);
}

/* _peek: the next (msg_id, idx) to send; 0 when there is none. */
static int peek(Sender *s, uint32_t *msg_id, uint32_t *idx) {
    while (!RING_EMPTY(&s->ctl)) {
        CtlItem c = RING_FRONT(&s->ctl);
        if (c.msg_id == ANNOUNCE_MSG_ID && s->announce_acked[c.idx]) {
            RING_POP(&s->ctl);
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
            *msg_id = (uint32_t)id;
            *idx = m->next_new;
            return 1;
        }
        sched_remove(&s->sched, (uint32_t)id);
    }
}

/* _announce_datagram: announce part ``idx`` (token | auth | chunk) into ``out`` */
static int announce_datagram(Sender *s, uint32_t idx, uint32_t seq, uint8_t *out) {
    PyObject *chunk = s->announce[idx];
    Py_ssize_t clen = PyBytes_GET_SIZE(chunk);
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = ANNOUNCE_MSG_ID, .pkt_idx = (uint16_t)idx, .pkt_cnt = (uint16_t)s->nannounce, .seq = seq,
                   .deadline_us = ATP_NO_DEADLINE, .length = (uint16_t)(ANNOUNCE_PREFIX_LEN + clen)};
    atp_encode(out, &h);
    uint8_t *p = out + ATP_HEADER_LEN;
    if (s->admission_key == Py_None) {
        if (s->token != NULL)
            memcpy(p, PyBytes_AS_STRING(s->token), ATP_TOKEN_LEN);
        else
            memset(p, 0, ATP_TOKEN_LEN);
        memset(p + ATP_TOKEN_LEN, 0, ATP_AUTH_LEN);
        memcpy(p + ANNOUNCE_PREFIX_LEN, PyBytes_AS_STRING(chunk), (size_t)clen);
        return 0;
    }
    /* signed under the admission key: control.encode_announce_part (HMAC-SHA256) */
    PyObject *token = s->token, *zero = NULL;
    if (token == NULL && (token = zero = PyBytes_FromStringAndSize(NULL, ATP_TOKEN_LEN)) != NULL)
        memset(PyBytes_AS_STRING(zero), 0, ATP_TOKEN_LEN);
    PyObject *kw = token == NULL ? NULL : Py_BuildValue("{s:L,s:I,s:n,s:O,s:O}", "job_id", s->job_id, "pkt_idx",
                                                        (unsigned)idx, "pkt_cnt", (Py_ssize_t)s->nannounce,
                                                        "token", token, "key", s->admission_key);
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, chunk);
    PyObject *payload = args == NULL ? NULL : PyObject_Call(R.encode_announce_part, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_XDECREF(zero);
    if (payload == NULL)
        return -1;
    int rc = 0;
    if (!PyBytes_Check(payload) || PyBytes_GET_SIZE(payload) != ANNOUNCE_PREFIX_LEN + clen) {
        PyErr_SetString(PyExc_RuntimeError, "control.encode_announce_part returned an unexpected payload");
        rc = -1;
    } else {
        memcpy(p, PyBytes_AS_STRING(payload), (size_t)(ANNOUNCE_PREFIX_LEN + clen));
    }
    Py_DECREF(payload);
    return rc;
}

/* _surplus: ``adaptive``: the group (index gi) reaches its required count without the next new message (what is
 * on its way discounted by the group's measured loss) */
static int surplus_message(Sender *s, size_t gi) {
    Group *g = &s->groups[gi];
    double est = 0.0;
    if (!rate_loss_estimate(&s->rate, gi, &est))
        est = 0.0;
    double on_the_way = (double)(g->started + g->repairing) * (1.0 - est);
    return (double)g->delivered + on_the_way >= (double)g->required;
}

/* _emit: writes the datagram of (msg_id, idx) into ``out`` (HEADER_LEN + payload_len bytes). */
static int emit(Sender *s, uint32_t msg_id, uint32_t idx, double now, uint8_t *out) {
    uint32_t seq;
    if (next_seq(s, msg_id, idx, &seq) != 0)
        return -1;
    s->packets_sent++;
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = msg_id, .pkt_idx = (uint16_t)idx, .seq = seq, .deadline_us = ATP_NO_DEADLINE};
    if (msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID) {
        RING_POP(&s->ctl);
        if (msg_id == ANNOUNCE_MSG_ID) {
            SentPkt p = {seq, msg_id, idx, (uint32_t)payload_len(s, msg_id, idx), -1, 0, now};
            if (recovery_on_sent(&s->recovery, &p) != 0)
                return -1;
            return announce_datagram(s, idx, seq, out);
        }
        double tt = recovery_tail_timeout(&s->recovery);
        s->fin_next = now + (FIN_RETRY_MIN_S < tt ? tt : FIN_RETRY_MIN_S);
        s->has_fin_next = 1;
        h.pkt_cnt = 1;
        h.length = 0;
        atp_encode(out, &h);
        return 0;
    }
    Msg *m = &s->msgs[msg_id];
    Group *g = &s->groups[m->group];
    Py_ssize_t plen = payload_len(s, msg_id, idx);
    uint8_t *ps = &s->pkt_state[m->pkt_base + idx];
    int retx = *ps != P_UNSENT;
    int surplus = 0;
    if (retx) {
        RING_POP(&m->lost);
        s->retransmissions++;
        g->retransmissions++;
    } else {
        if (m->state == M_ACTIVE && (m->next_new == 0 || m->surplus)) {
            surplus = s->adaptive && g->approx && surplus_message(s, m->group);
            if (!surplus)
                g->started++; /* the message is needed from now on */
            m->surplus = (uint8_t)surplus;
        }
        m->next_new++;
        if (m->next_new == m->cnt)
            s->unsent_open--;
    }
    *ps = P_IN_FLIGHT;
    g->packets_sent++;
    if (surplus)
        s->packets_surplus++;
    uint8_t flags = (g->approx ? F_APPROX : 0) | (retx ? F_RETX : 0);
    if (m->tagged) {
        flags |= F_TAGGED;
        h.priority = m->priority;
        h.weight = m->weight;
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
            h.deadline_us = (uint32_t)v;
        }
    }
    /* surplus packets are not counted by rate control (group None): their loss in the lowest queue is expected */
    SentPkt p = {seq, msg_id, idx, (uint32_t)plen, surplus ? -1 : (int32_t)g->group_id, (uint8_t)retx, now};
    if (recovery_on_sent(&s->recovery, &p) != 0)
        return -1;
    h.flags = flags;
    h.group_id = (uint16_t)g->group_id;
    h.tlr = surplus ? ATP_TLR_ONE : atp_q15(s->tlr[m->group]);
    h.pkt_cnt = (uint16_t)m->cnt;
    h.length = (uint16_t)plen;
    atp_encode(out, &h);
    if (plen)
        memcpy(out + ATP_HEADER_LEN, PyBytes_AS_STRING(m->data) + (Py_ssize_t)idx * s->max_payload, (size_t)plen);
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

/* The next datagram datagrams_to_send would produce, its tokens taken: its (msg_id, idx, length), or 0. */
static int next_datagram(Sender *s, uint32_t *msg_id, uint32_t *idx, size_t *len) {
    if (!peek(s, msg_id, idx))
        return 0;
    if (!window_open(s, *msg_id))
        return 0;
    Py_ssize_t plen = payload_len(s, *msg_id, *idx);
    double size = (double)(ATP_HEADER_LEN + plen + s->overhead);
    if (!bucket_can_send(&s->bucket, size))
        return 0;
    s->bucket.tokens -= size;
    *len = (size_t)(ATP_HEADER_LEN + plen);
    return 1;
}

int sender_produce(Sender *s, double now, Room room, void *ctx) {
    if (s->state != S_SENDING && s->state != S_CLOSING)
        return 0;
    if (!s->started)
        start(s, now);
    if (s->token == NULL) {
        /* _hello: before admission, announce part 0 without a token, repeated like the FIN until a RETRY */
        if (now < s->hello_next)
            return 0;
        uint32_t seq;
        if (next_seq(s, ANNOUNCE_MSG_ID, 0, &seq) != 0)
            return -1;
        s->packets_sent++;
        double tt = recovery_tail_timeout(&s->recovery);
        s->hello_next = now + (FIN_RETRY_MIN_S < tt ? tt : FIN_RETRY_MIN_S);
        uint8_t *buf = room(ctx, (size_t)(ATP_HEADER_LEN + payload_len(s, ANNOUNCE_MSG_ID, 0)));
        return buf == NULL ? -1 : announce_datagram(s, 0, seq, buf);
    }
    double rate = s->rate.rate_bps;
    s->bucket.burst = sender_burst_bytes(s, rate);
    bucket_refill(&s->bucket, rate, now);
    uint32_t msg_id, idx;
    size_t len;
    while (next_datagram(s, &msg_id, &idx, &len)) {
        uint8_t *buf = room(ctx, len);
        if (buf == NULL || emit(s, msg_id, idx, now, buf) != 0)
            return -1;
    }
    return 0;
}

int sender_timer_at(Sender *s, double *out) {
    if (!s->started) {
        *out = s->start_time;
        return 0;
    }
    if (s->token == NULL && s->state == S_SENDING) {
        double x = s->last_progress + s->idle_timeout_s;
        *out = s->hello_next < x ? s->hello_next : x;
        return 0;
    }
    if (s->state == S_SENDING) {
        double t = s->epoch_end, x = s->last_progress + s->idle_timeout_s;
        if (x < t)
            t = x;
        if (recovery_loss_deadline(&s->recovery, &x) && x < t)
            t = x;
        uint32_t msg_id, idx;
        if (peek(s, &msg_id, &idx) && window_open(s, msg_id)) {
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
        if (!RING_EMPTY(&s->ctl)) {
            double x = bucket_ready_at(&s->bucket, (double)(ATP_HEADER_LEN + s->overhead), s->rate.rate_bps);
            if (x < t)
                t = x;
        }
        *out = t;
        return 0;
    }
    return 1;
}

/* --- acknowledgements and loss ----------------------------------------------------------------------------- */

static int on_packet_acked(Sender *s, const SentPkt *p) {
    if (p->msg_id == ANNOUNCE_MSG_ID) {
        s->announce_acked[p->pkt_idx] = 1;
        return 0;
    }
    Msg *m = &s->msgs[p->msg_id];
    uint8_t *ps = &s->pkt_state[m->pkt_base + p->pkt_idx];
    if (*ps == P_ACKED)
        return 0;
    *ps = P_ACKED;
    m->acked++;
    m->remaining -= p->size;
    if (m->acked < m->cnt) {
        if (s->sched.mrdf && (m->state == M_ACTIVE || m->state == M_REPAIRING))
            return sched_update(&s->sched, p->msg_id, m->remaining, m->state == M_REPAIRING, m->retries);
        return 0;
    }
    Group *g = &s->groups[m->group];
    if (m->state == M_ACTIVE) {
        g->active--;
        g->started -= !m->surplus;
    } else if (m->state == M_DAMAGED)
        g->damaged--;
    else if (m->state == M_REPAIRING)
        g->repairing--;
    m->state = M_DELIVERED;
    g->delivered++;
    sched_remove(&s->sched, p->msg_id);
    if (s->message_events) {
        static const char *const names[] = {"msg_id", "group_id", NULL};
        PyObject *vals[] = {PyLong_FromUnsignedLong(p->msg_id), PyLong_FromLongLong(g->group_id)};
        return events_push(&s->ev, make_frozen(R.MessageAcked, names, vals));
    }
    return 0;
}

static inline int idle_less(const IdleEntry *x, const IdleEntry *y) {
    if (x->remaining != y->remaining)
        return x->remaining < y->remaining;
    return x->msg_id < y->msg_id;
}

/* _repair */
static int repair(Sender *s, Group *g, uint32_t msg_id) {
    Msg *m = &s->msgs[msg_id];
    m->state = M_REPAIRING;
    g->damaged--;
    g->repairing++;
    if (m->next_new < m->cnt)
        s->unsent_open++;
    return sched_update(&s->sched, msg_id, m->remaining, 1, m->retries);
}

/* _plan_repairs: repair damaged messages while the group has given up more than it can afford; ``adaptive`` with
 * MRDF also a damaged message with less left than what would be served next */
static int plan_repairs(Sender *s, Group *g) {
    while (g->damaged > g->budget && g->idle.n) {
        uint32_t msg_id = g->idle.v[0].msg_id;
        HEAP_POP(g->idle.v, g->idle.n, idle_less);
        if (s->msgs[msg_id].state == M_DAMAGED && repair(s, g, msg_id) != 0)
            return -1;
    }
    if (!(s->adaptive && s->sched.mrdf))
        return 0;
    while (g->idle.n) {
        uint32_t msg_id = g->idle.v[0].msg_id;
        Msg *m = &s->msgs[msg_id];
        if (m->state != M_DAMAGED) {
            HEAP_POP(g->idle.v, g->idle.n, idle_less);
            continue;
        }
        int64_t top = sched_peek(&s->sched);
        if (top < 0 || !(m->remaining < s->msgs[top].remaining))
            return 0;
        HEAP_POP(g->idle.v, g->idle.n, idle_less);
        if (repair(s, g, msg_id) != 0)
            return -1;
    }
    return 0;
}

/* The first size of a message's ring of lost packets: room for all its packets (a power of two, at least 4). */
static inline uint32_t lost_ring_size(uint32_t cnt) {
    uint32_t n = 4;
    while (n < cnt)
        n *= 2;
    return n;
}

/* _on_lost over ``lost`` */
static int on_lost(Sender *s, const SentPkt *lost, size_t n) {
    uint8_t touched_stack[64];
    uint8_t *touched = s->ngroups <= 64 ? touched_stack : calloc(s->ngroups, 1);
    if (touched == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(touched, 0, s->ngroups);
    if (s->adaptive && n) {
        int any = 0;
        for (size_t i = 0; i < n; i++)
            if (lost[i].group_id >= 0) {
                touched[rate_group_index(&s->rate, lost[i].group_id)] = 1;
                any = 1;
            }
        if (any)
            window_on_loss(&s->rate, touched, s->tlr, s->seq);
        memset(touched, 0, s->ngroups);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const SentPkt *p = &lost[i];
        if (p->msg_id == ANNOUNCE_MSG_ID) {
            if (!s->announce_acked[p->pkt_idx])
                rc = ctl_append(s, p->msg_id, p->pkt_idx);
            continue;
        }
        Msg *m = &s->msgs[p->msg_id];
        uint8_t *ps = &s->pkt_state[m->pkt_base + p->pkt_idx];
        if (*ps != P_IN_FLIGHT)
            continue; /* acknowledged meanwhile, or a newer copy is the one in flight */
        *ps = P_LOST;
        if (RING_PUSH(&m->lost, (uint16_t)p->pkt_idx, lost_ring_size(m->cnt)) != 0) {
            rc = -1;
            break;
        }
        Group *g = &s->groups[m->group];
        if (m->state == M_ACTIVE) {
            m->state = M_DAMAGED;
            g->active--;
            g->started -= !m->surplus;
            g->damaged++;
            if (m->next_new < m->cnt)
                s->unsent_open--;
            sched_remove(&s->sched, p->msg_id);
            IdleEntry e = {s->sched.mrdf ? m->remaining : 0, p->msg_id};
            if (ARRAY_RESERVE(&g->idle, g->idle.n + 1, 16) != 0) {
                rc = -1;
                break;
            }
            HEAP_PUSH(g->idle.v, g->idle.n, e, idle_less);
            touched[m->group] = 1;
        } else if (m->state == M_REPAIRING) {
            if (p->retx)
                m->retries++;
            rc = sched_update(&s->sched, p->msg_id, m->remaining, 1, m->retries);
        }
    }
    for (size_t i = 0; i < s->ngroups && rc == 0; i++)
        if (touched[i])
            rc = plan_repairs(s, &s->groups[i]);
    if (touched != touched_stack)
        free(touched);
    return rc;
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
static double next_tlr(const Group *g) {
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
        double r = rc->window * rc->packet_bits / (srtt > 1e-6 ? srtt : 1e-6);
        rate = rc->max_rate_bps < r ? rc->max_rate_bps : r;
    } else {
        ratectl_end_epoch(rc, s->tlr, srtt);
        rate = rc->rate_bps;
    }
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        const EpochCounts *c = &rc->epoch[i];
        s->tlr[i] = next_tlr(g);
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
    if (ctl_append(s, FIN_MSG_ID, 0) != 0) /* _queue_fin */
        return -1;
    s->has_fin_next = 0; /* set when the FIN actually leaves */
    return 0;
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
    PyObject *lost_by = Py_BuildValue("{s:L,s:L,s:L}", "reorder", (long long)r->lost_reorder, "time",
                                      (long long)r->lost_time, "tail", (long long)r->lost_tail);
    PyObject *kw = lost_by == NULL ? NULL : Py_BuildValue(
        "{s:L,s:N,s:O,s:N,s:d,s:d,s:O,s:O,s:O,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:N,s:L,s:N}", "job_id", s->job_id, "mode", mode,
        "mrdf", s->sched.mrdf ? Py_True : Py_False, "completion", completion, "jct_s", completed - s->start_time,
        "closed_s", now - s->start_time, "receiver_confirmed", confirmed ? Py_True : Py_False, "groups", groups,
        "lost_ids", lost_ids, "packets_sent", s->packets_sent, "packets_acked", (long long)r->packets_acked,
        "packets_lost", (long long)r->packets_lost, "retransmissions", s->retransmissions, "epochs", s->epoch,
        "final_rate_bps", s->rate.rate_bps, "srtt_s", r->srtt, "losses_found_by", lost_by, "packets_surplus",
        s->packets_surplus, "rejected", PyDict_Copy(s->rejected));
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
    int gi = rate_group_index(&s->rate, h->group_id);
    if (h->msg_id != ANNOUNCE_MSG_ID)
        s->path_queue = h->queue;
    if (gi >= 0 && h->msg_id != ANNOUNCE_MSG_ID) {
        Group *g = &s->groups[gi];
        if (g->qcount[h->queue]++ == 0)
            g->qorder[g->nq++] = h->queue;
        if (h->flags & F_ECE)
            g->ece++;
    }
    Recovery *r = &s->recovery;
    if (recovery_on_ack(r, h->seq, blocks, nblocks, now) != 0)
        return -1;
    if (s->state != S_SENDING) { /* keep counting deliveries while closing; losses no longer matter */
        for (size_t i = 0; i < r->acked.n; i++)
            if (on_packet_acked(s, &r->acked.v[i]) != 0)
                return -1;
        return 0;
    }
    if (s->adaptive)
        window_on_path(&s->rate, h->queue, r->min_rtt + s->pacing_train_s);
    for (size_t i = 0; i < r->acked.n; i++) {
        if (on_packet_acked(s, &r->acked.v[i]) != 0)
            return -1;
        if (s->adaptive && r->acked.v[i].group_id >= 0)
            window_on_ack(&s->rate, r->acked.v[i].seq);
    }
    if (on_lost(s, r->lost.v, r->lost.n) != 0)
        return -1;
    return check_complete(s, now);
}

static int on_done(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now) {
    if (s->state != S_CLOSING)
        return reject(s, "done_before_fin");
    uint32_t cm, ci;
    if (!carried(s, h->seq, &cm, &ci) || cm != FIN_MSG_ID || ci != 0)
        return reject(s, "done_unsent_seq");
    /* wire.decode_done_payload: n ranges (first, end), non-empty, ascending, disjoint */
    if (len < 4)
        return reject(s, "malformed");
    uint32_t n = get32(payload);
    if (len != 4 + 8 * (size_t)n)
        return reject(s, "malformed");
    uint32_t prev_end = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t first = get32(payload + 4 + 8 * i), end = get32(payload + 8 + 8 * i);
        if (!(prev_end <= first && first < end))
            return reject(s, "malformed");
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
    if (!carried(s, h->seq, &cm, &ci))
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

/* _on_retry: a token from the receiver (admitted, or a fresh token because the one held expired) */
static int on_retry(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now) {
    int all_acked = 1;
    for (size_t i = 0; i < s->nannounce; i++)
        if (!s->announce_acked[i])
            all_acked = 0;
    if (s->state != S_SENDING || all_acked)
        return reject(s, "retry_unexpected");
    uint32_t cm, ci;
    if (!carried(s, h->seq, &cm, &ci) || cm != ANNOUNCE_MSG_ID || ci != h->pkt_idx)
        return reject(s, "retry_unsent_seq");
    int zero = 1;
    for (size_t i = 0; i < len; i++)
        if (payload[i])
            zero = 0;
    if (len != ATP_TOKEN_LEN || zero)
        return reject(s, "malformed");
    PyObject *token = PyBytes_FromStringAndSize((const char *)payload, ATP_TOKEN_LEN);
    if (token == NULL)
        return -1;
    int first = s->token == NULL;
    Py_XSETREF(s->token, token);
    if (first) { /* the job starts now: data follows the announce */
        s->epoch_end = now + sender_epoch_length(s);
        s->last_progress = now;
    }
    return 0;
}

int sender_receive(Sender *s, const uint8_t *data, size_t len, int from_peer, double now) {
    if (!s->started)
        return reject(s, "before_start");
    if (!from_peer)
        return reject(s, "wrong_source");
    AtpHeader h;
    const char *reason;
    if (atp_decode(data, len, &h, &reason) != 0)
        return reject(s, "malformed");
    if (h.job_id != (uint32_t)s->job_id)
        return reject(s, "wrong_job");
    if (s->state == S_DONE || s->state == S_FAILED)
        return reject(s, "after_close");
    const uint8_t *payload = data + ATP_HEADER_LEN;
    if (h.type == PT_ACK) {
        SackBlock blocks[ATP_MAX_SACK_BLOCKS];
        int nb = atp_decode_ack(payload, h.length, blocks);
        if (nb < 0)
            return reject(s, "malformed");
        const char *why = ack_rejection(s, &h, blocks, nb);
        if (why != NULL)
            return reject(s, why);
        return on_ack(s, &h, blocks, nb, now);
    }
    if (h.type == PT_DONE)
        return on_done(s, &h, payload, h.length, now);
    if (h.type == PT_RETRY)
        return on_retry(s, &h, payload, h.length, now);
    return reject(s, "not_for_sender");
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

/* the failure when nothing is acknowledged for idle_timeout_s (``admission``: not even a RETRY came) */
static int fail_no_ack(Sender *s, int admission) {
    PyObject *peer = PyObject_Format(s->peer, NULL);
    PyObject *idle = PyObject_GetAttrString(s->config, "idle_timeout_s");
    PyObject *fmt = PyUnicode_FromString("g");
    PyObject *idle_s = (idle == NULL || fmt == NULL) ? NULL : PyObject_Format(idle, fmt);
    PyObject *reason = NULL;
    if (peer != NULL && idle_s != NULL) {
        if (admission)
            reason = PyUnicode_FromFormat("no acknowledgement from %U for %U s: no admission token for job %lld "
                                          "(receiver down, unreachable, out of job slots, or expecting an admission "
                                          "key?)", peer, idle_s, s->job_id);
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

int sender_handle_timer(Sender *s, double now) {
    if (!s->started)
        return 0;
    if (s->token == NULL && s->state == S_SENDING) {
        if (now >= s->last_progress + s->idle_timeout_s)
            return fail_no_ack(s, 1);
        return 0;
    }
    if (s->state == S_SENDING) {
        if (recovery_detect_lost(&s->recovery, now) != 0)
            return -1;
        if (on_lost(s, s->recovery.lost.v, s->recovery.lost.n) != 0)
            return -1;
        if (now >= s->epoch_end && end_epoch(s, now) != 0)
            return -1;
        if (now >= s->last_progress + s->idle_timeout_s)
            return fail_no_ack(s, 0);
        return check_complete(s, now);
    }
    if (s->state == S_CLOSING) {
        if (now >= s->fin_deadline)
            return finish(s, now, 0, NULL, 0);
        if (s->has_fin_next && now >= s->fin_next) {
            if (ctl_append(s, FIN_MSG_ID, 0) != 0) /* _queue_fin */
                return -1;
            s->has_fin_next = 0;
        }
    }
    return 0;
}

/* --- the announce ------------------------------------------------------------------------------------------------ */

/* Ranges of consecutive ids in ids[a .. b): how many, and (with ``out``) each as first:u32 last:u32. */
static size_t ranges(const uint32_t *ids, size_t a, size_t b, uint8_t *out) {
    size_t n = 0;
    for (size_t k = a; k < b; k++) {
        if (k != a && ids[k - 1] + 1 == ids[k])
            continue;
        size_t e = k;
        while (e + 1 < b && ids[e] + 1 == ids[e + 1])
            e++;
        if (out != NULL) {
            put32(out + 8 * n, ids[k]);
            put32(out + 8 * n + 4, ids[e]);
        }
        n++;
    }
    return n;
}

int sender_build_announce(Sender *s, PyObject *vector_len) {
    /* message ids per group, ascending: count per group, then fill */
    size_t ng = s->ngroups, n = s->nmsgs;
    size_t *count = calloc(ng ? ng : 1, sizeof(size_t)), *start_at = calloc(ng + 1, sizeof(size_t));
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    uint8_t *blob = NULL;
    int rc = -1;
    if (count == NULL || start_at == NULL || ids == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        count[s->msgs[i].group]++;
    for (size_t g = 0; g < ng; g++)
        start_at[g + 1] = start_at[g] + count[g];
    memset(count, 0, ng * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t g = s->msgs[i].group;
        ids[start_at[g] + count[g]++] = (uint32_t)i;
    }
    /* magic "ATPJ" | total:u32 | vector_len:u32 | n_groups:u16, then per group 12 bytes and 8 per range */
    size_t size = 14;
    for (size_t g = 0; g < ng; g++)
        size += 12 + 8 * ranges(ids, start_at[g], start_at[g + 1], NULL);
    blob = malloc(size);
    if (blob == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    memcpy(blob, "ATPJ", 4);
    put32(blob + 4, (uint32_t)n);
    uint32_t vlen = 0xFFFFFFFFu;
    if (vector_len != Py_None) {
        unsigned long v = PyLong_AsUnsignedLong(vector_len);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            goto out;
        vlen = (uint32_t)v;
    }
    put32(blob + 8, vlen);
    put16(blob + 12, (uint16_t)ng);
    size_t off = 14;
    for (size_t g = 0; g < ng; g++) {
        size_t nr = ranges(ids, start_at[g], start_at[g + 1], blob + off + 12);
        put16(blob + off, (uint16_t)s->groups[g].group_id);
        put16(blob + off + 2, atp_q15(s->groups[g].msr));
        put32(blob + off + 4, (uint32_t)(start_at[g + 1] - start_at[g]));
        put32(blob + off + 8, (uint32_t)nr);
        off += 12 + 8 * nr;
    }
    size_t mp = (size_t)s->max_payload;
    size_t parts = (size + mp - 1) / mp;
    if (parts == 0)
        parts = 1;
    if (parts > 0xFFFF) {
        config_error("job announce too large: split the job or give groups contiguous message ids");
        goto out;
    }
    s->announce = calloc(parts, sizeof(PyObject *));
    s->announce_acked = calloc(parts, 1);
    if (s->announce == NULL || s->announce_acked == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    s->nannounce = parts;
    for (size_t i = 0; i < parts; i++) {
        size_t a = i * mp, b = a + mp < size ? a + mp : size;
        s->announce[i] = PyBytes_FromStringAndSize((const char *)blob + a, (Py_ssize_t)(b - a));
        if (s->announce[i] == NULL)
            goto out;
        if (ctl_append(s, ANNOUNCE_MSG_ID, (uint32_t)i) != 0)
            goto out;
    }
    rc = 0;
out:
    free(count);
    free(start_at);
    free(ids);
    free(blob);
    return rc;
}
