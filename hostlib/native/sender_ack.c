/* The sender's acknowledgements and losses (sender.h; hostlib/sender.py is the specification): a packet
 * acknowledged or lost, what that does to its message and group, and the repairs it plans. */
#include <stdlib.h>
#include <string.h>

#include "sender.h"

/* --- acknowledgements and loss ----------------------------------------------------------------------------- */

/* _message_packet_acked: packet ``idx`` (``size`` payload bytes) of message ``id`` arrived */
static int message_packet_acked(Sender *s, uint32_t id, uint32_t idx, int64_t size) {
    Msg *m = &s->msgs[id];
    uint8_t *ps = &s->pkt_state[m->pkt_base + idx];
    if (*ps == P_ACKED)
        return 0;
    *ps = P_ACKED;
    m->acked++;
    m->remaining -= size;
    if (m->acked < m->cnt) {
        if (s->sched.mrdf && (m->state == M_ACTIVE || m->state == M_REPAIRING))
            return sched_update(&s->sched, id, m->remaining, m->state == M_REPAIRING, m->retries);
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
    sched_remove(&s->sched, id);
    if (s->message_events) {
        static const char *const names[] = {"msg_id", "group_id", NULL};
        PyObject *vals[] = {PyLong_FromUnsignedLong(id), PyLong_FromLongLong(g->group_id)};
        return events_push(&s->ev, make_frozen(R.MessageAcked, names, vals));
    }
    return 0;
}

int sender_on_packet_acked(Sender *s, const SentPkt *p) {
    if (p->msg_id == ANNOUNCE_MSG_ID) {
        s->announce_acked[p->pkt_idx] = 1;
        return 0;
    }
    if (p->msg_id == MSR_MSG_ID) {
        MsrSent ms;
        if (sender_msr_sent_take(s, p->seq, &ms) && ms.change > s->msr_acked[ms.gi])
            s->msr_acked[ms.gi] = ms.change;
        return 0;
    }
    if (p->more_n == 0)
        return message_packet_acked(s, p->msg_id, p->pkt_idx, p->size);
    /* a packed packet: each message whole, in its one packet */
    if (message_packet_acked(s, p->msg_id, 0, PyBytes_GET_SIZE(s->msgs[p->msg_id].data)) != 0)
        return -1;
    for (uint32_t k = 0; k < p->more_n; k++) {
        uint32_t id = s->more_ids.v[p->more_off + k];
        if (message_packet_acked(s, id, 0, PyBytes_GET_SIZE(s->msgs[id].data)) != 0)
            return -1;
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
int sender_plan_repairs(Sender *s, Group *g) {
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

/* _message_packet_lost: packet ``idx`` of message ``id`` was lost (``retx``: a retransmission) */
static int message_packet_lost(Sender *s, uint32_t id, uint32_t idx, int retx, uint8_t *touched) {
    Msg *m = &s->msgs[id];
    uint8_t *ps = &s->pkt_state[m->pkt_base + idx];
    if (*ps != P_IN_FLIGHT)
        return 0; /* acknowledged meanwhile, or a newer copy is the one in flight */
    *ps = P_LOST;
    if (RING_PUSH(&m->lost, (uint16_t)idx, lost_ring_size(m->cnt)) != 0)
        return -1;
    Group *g = &s->groups[m->group];
    for (size_t k = 0; k < g->parked.n; k++) { /* the group may fall short: what was held back is offered again */
        uint32_t pid = g->parked.v[k];
        Msg *p = &s->msgs[pid];
        if (p->state == M_ACTIVE && p->next_new < p->cnt && sched_update(&s->sched, pid, p->remaining, 0, p->retries))
            return -1;
    }
    g->parked.n = 0;
    if (m->state == M_ACTIVE) {
        m->state = M_DAMAGED;
        g->active--;
        g->started -= !m->surplus;
        g->damaged++;
        if (m->next_new < m->cnt)
            s->unsent_open--;
        sched_remove(&s->sched, id);
        IdleEntry e = {s->sched.mrdf ? m->remaining : 0, id};
        if (ARRAY_RESERVE(&g->idle, g->idle.n + 1, 16) != 0)
            return -1;
        HEAP_PUSH(g->idle.v, g->idle.n, e, idle_less);
        touched[m->group] = 1;
    } else if (m->state == M_REPAIRING) {
        if (retx)
            m->retries++;
        return sched_update(&s->sched, id, m->remaining, 1, m->retries);
    }
    return 0;
}

/* _on_lost over ``lost`` */
int sender_on_lost(Sender *s, const SentPkt *lost, size_t n) {
    if (s->grant >= 0) /* a granted packet lost past what the receiver had gives its place back */
        for (size_t i = 0; i < n; i++) {
            int64_t off = (uint32_t)(lost[i].seq - s->isn);
            if (off >= (int64_t)s->free_until && off < s->grant && off > s->grant_top)
                s->grant++;
        }
    uint8_t touched_stack[64];
    uint8_t *touched = s->ngroups <= 64 ? touched_stack : calloc(s->ngroups, 1);
    if (touched == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(touched, 0, s->ngroups);
    if (s->adaptive && n) {
        int any = 0, first = 1;
        for (size_t i = 0; i < n; i++)
            if (lost[i].group_id >= 0) {
                touched[rate_group_index(&s->rate, lost[i].group_id)] = 1;
                any = 1;
                first = first && lost[i].first;
            }
        if (any) /* losses of first windows that collided do not end the ramp (rate.h) */
            window_on_loss(&s->rate, touched, s->tlr, s->seq, first, recovery_queued(&s->recovery),
                           recovery_drain(&s->recovery));
        memset(touched, 0, s->ngroups);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const SentPkt *p = &lost[i];
        if (p->copy) /* the packet it copied is still in flight, or acknowledged */
            continue;
        if (p->msg_id == ANNOUNCE_MSG_ID) {
            if (!s->announce_acked[p->pkt_idx]) {
                rc = sender_ctl_append(s, p->msg_id, p->pkt_idx);
                if (rc == 0 && s->recovery.every_overdue) /* twice: no data is taken before it */
                    rc = sender_ctl_append(s, p->msg_id, p->pkt_idx);
            }
            continue;
        }
        if (p->msg_id == MSR_MSG_ID) {
            MsrSent ms;
            if (sender_msr_sent_take(s, p->seq, &ms) && ms.change == s->msr_latest[ms.gi] && s->msr_acked[ms.gi] < ms.change)
                rc = sender_queue_msr_change(s, ms.gi);
            continue;
        }
        rc = message_packet_lost(s, p->msg_id, p->pkt_idx, p->retx, touched);
        for (uint32_t k = 0; k < p->more_n && rc == 0; k++)
            rc = message_packet_lost(s, s->more_ids.v[p->more_off + k], 0, p->retx, touched);
    }
    for (size_t i = 0; i < s->ngroups && rc == 0; i++)
        if (touched[i])
            rc = sender_plan_repairs(s, &s->groups[i]);
    if (touched != touched_stack)
        free(touched);
    return rc;
}
