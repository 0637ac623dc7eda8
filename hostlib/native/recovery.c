/* Loss detection and accounting (recovery.h; hostlib/recovery.py is the specification). */
#include <Python.h>
#include <math.h>

#include "recovery.h"

#define K_TIME_THRESHOLD (9.0 / 8.0)
#define LATE_ACK_MEMORY 16384

struct PNode {
    SentPkt p;
    int32_t prev, next;
};

/* --- PacketMap ---------------------------------------------------------------------------------------------- */

static int pmap_init(PacketMap *m) {
    m->free_head = m->head = m->tail = -1;
    m->len = 0;
    return map_init(&m->index);
}

static void pmap_free(PacketMap *m) {
    ARRAY_FREE(&m->nodes);
    map_free(&m->index);
}

static inline int32_t pmap_find(const PacketMap *m, uint32_t seq) { return (int32_t)map_get(&m->index, seq) - 1; }

/* m[seq] = p: appended at the end when new, replaced in place otherwise. */
static int pmap_set(PacketMap *m, const SentPkt *p) {
    int32_t k = pmap_find(m, p->seq);
    if (k >= 0) {
        m->nodes.v[k].p = *p;
        return 0;
    }
    if (m->free_head >= 0) {
        k = m->free_head;
        m->free_head = m->nodes.v[k].next;
    } else {
        if (ARRAY_RESERVE(&m->nodes, m->nodes.n + 1, 16) != 0)
            return -1;
        k = (int32_t)m->nodes.n++;
    }
    if (map_put(&m->index, p->seq, (uintptr_t)k + 1) != 0) {
        m->nodes.v[k].next = m->free_head;
        m->free_head = k;
        return -1;
    }
    struct PNode *n = &m->nodes.v[k];
    n->p = *p;
    n->prev = m->tail;
    n->next = -1;
    if (m->tail >= 0)
        m->nodes.v[m->tail].next = k;
    else
        m->head = k;
    m->tail = k;
    m->len++;
    return 0;
}

/* Remove node k. */
static void pmap_remove(PacketMap *m, int32_t k) {
    struct PNode *n = &m->nodes.v[k];
    map_del(&m->index, n->p.seq);
    if (n->prev >= 0)
        m->nodes.v[n->prev].next = n->next;
    else
        m->head = n->next;
    if (n->next >= 0)
        m->nodes.v[n->next].prev = n->prev;
    else
        m->tail = n->prev;
    n->next = m->free_head;
    m->free_head = k;
    m->len--;
}

/* --- LossRecovery ------------------------------------------------------------------------------------------- */

#define MAX_TAIL_BACKOFF 2 /* recovery.py _MAX_TAIL_BACKOFF */

int recovery_init(Recovery *r, double initial_rtt_s, long long reorder_threshold, double min_loss_timeout_s,
                  RateCtl *rate) {
    r->reorder_threshold = reorder_threshold;
    r->min_loss_timeout_s = min_loss_timeout_s;
    r->srtt = initial_rtt_s;
    r->rttvar = initial_rtt_s / 2;
    r->latest_rtt = initial_rtt_s;
    r->min_rtt = INFINITY;
    r->largest_acked = -1;
    r->tail_backoff = 0;
    r->tail_at = -INFINITY;
    r->rate = rate;
    return pmap_init(&r->in_flight) != 0 || pmap_init(&r->declared_lost) != 0 ? -1 : 0;
}

void recovery_free(Recovery *r) {
    pmap_free(&r->in_flight);
    pmap_free(&r->declared_lost);
    ARRAY_FREE(&r->acked);
    ARRAY_FREE(&r->late);
    ARRAY_FREE(&r->lost);
}

double recovery_tail_timeout(const Recovery *r) {
    double a = r->min_loss_timeout_s, b = 2 * r->srtt, c = r->srtt + 4 * r->rttvar;
    double m = a;
    if (b > m)
        m = b;
    if (c > m)
        m = c;
    return m * (double)(1 << (r->tail_backoff < MAX_TAIL_BACKOFF ? r->tail_backoff : MAX_TAIL_BACKOFF));
}

static inline double time_threshold(const Recovery *r) {
    double x = r->srtt;
    if (r->latest_rtt > x)
        x = r->latest_rtt;
    double t = K_TIME_THRESHOLD * x, floor = r->min_loss_timeout_s / 5;
    return t > floor ? t : floor;
}

static void update_rtt(Recovery *r, double sample) {
    if (!(sample > 1e-6))
        sample = 1e-6;
    r->latest_rtt = sample;
    if (sample < r->min_rtt)
        r->min_rtt = sample;
    if (!r->has_rtt_sample) {
        r->srtt = sample;
        r->rttvar = sample / 2;
        r->has_rtt_sample = 1;
    } else {
        r->rttvar = 0.75 * r->rttvar + 0.25 * fabs(r->srtt - sample);
        r->srtt = 0.875 * r->srtt + 0.125 * sample;
    }
}

int recovery_loss_deadline(const Recovery *r, double *out) {
    if (r->in_flight.len == 0)
        return 0;
    const SentPkt *o = &r->in_flight.nodes.v[r->in_flight.head].p;
    if ((int64_t)o->seq < r->largest_acked)
        *out = o->sent_time + time_threshold(r);
    else
        *out = (o->sent_time > r->tail_at ? o->sent_time : r->tail_at) + recovery_tail_timeout(r);
    return 1;
}

int recovery_on_sent(Recovery *r, const SentPkt *p) {
    if (pmap_set(&r->in_flight, p) != 0)
        return -1;
    rate_on_sent(r->rate, p->group_id, p->size);
    return 0;
}

/* The packet of node k of ``m`` moves to ``out``. */
static int take(PacketMap *m, int32_t k, SentPkts *out) {
    SentPkt p = m->nodes.v[k].p;
    pmap_remove(m, k);
    return ARRAY_PUSH(out, p, 16);
}

/* LossRecovery._account: the counts, the packets declared lost remembered, and the listener told. */
static int account(Recovery *r) {
    for (size_t i = 0; i < r->acked.n; i++) {
        r->packets_acked++;
        rate_on_acked(r->rate, r->acked.v[i].group_id, r->acked.v[i].size, 0);
    }
    for (size_t i = 0; i < r->late.n; i++) {
        r->packets_acked++;
        rate_on_acked(r->rate, r->late.v[i].group_id, r->late.v[i].size, 1);
    }
    for (size_t i = 0; i < r->lost.n; i++) {
        r->packets_lost++;
        if (pmap_set(&r->declared_lost, &r->lost.v[i]) != 0)
            return -1;
        if (r->declared_lost.len > LATE_ACK_MEMORY)
            pmap_remove(&r->declared_lost, r->declared_lost.head);
        rate_on_lost(r->rate, r->lost.v[i].group_id);
    }
    return 0;
}

int recovery_on_ack(Recovery *r, uint32_t seq, const SackBlock *blocks, int nblocks, double now, int trimmed) {
    r->acked.n = r->late.n = r->lost.n = 0;
    int32_t k = pmap_find(&r->in_flight, seq);
    if (trimmed) {
        if (k >= 0) {
            r->lost_trim++;
            if (take(&r->in_flight, k, &r->lost) != 0)
                return -1;
        }
    } else if (k >= 0) {
        update_rtt(r, now - r->in_flight.nodes.v[k].p.sent_time);
        if (take(&r->in_flight, k, &r->acked) != 0)
            return -1;
    } else if ((k = pmap_find(&r->declared_lost, seq)) >= 0) {
        r->late_acks++;
        if (take(&r->declared_lost, k, &r->late) != 0)
            return -1;
    }
    int64_t largest = seq;
    for (int i = 0; i < nblocks; i++)
        if ((int64_t)blocks[i].last > largest)
            largest = blocks[i].last;
    if (largest > r->largest_acked)
        r->largest_acked = largest;
    for (int i = 0; i < nblocks; i++) /* late ACKs of packets already declared lost */
        if ((int64_t)blocks[i].last - (int64_t)blocks[i].first < 64)
            for (int64_t q = blocks[i].first; q <= (int64_t)blocks[i].last; q++)
                if ((k = pmap_find(&r->declared_lost, (uint32_t)q)) >= 0) {
                    r->late_acks++;
                    if (take(&r->declared_lost, k, &r->late) != 0)
                        return -1;
                }
    /* the oldest packets up to the largest acknowledged: covered ones are acked, far ones lost */
    double thr = time_threshold(r);
    for (int32_t cur = r->in_flight.head; cur >= 0;) {
        const struct PNode *node = &r->in_flight.nodes.v[cur];
        int32_t next = node->next;
        int64_t q = node->p.seq;
        if (q > r->largest_acked)
            break;
        int covered = 0;
        for (int i = 0; i < nblocks && !covered; i++)
            covered = blocks[i].first <= q && q <= (int64_t)blocks[i].last;
        if (covered) {
            if (take(&r->in_flight, cur, &r->acked) != 0)
                return -1;
        } else if (r->largest_acked - q >= r->reorder_threshold || now - node->p.sent_time >= thr) {
            if (r->largest_acked - q >= r->reorder_threshold)
                r->lost_reorder++;
            else
                r->lost_time++;
            if (take(&r->in_flight, cur, &r->lost) != 0)
                return -1;
        }
        cur = next;
    }
    if (r->acked.n || r->late.n) { /* progress: the tail timeout counts from now, at its base value */
        r->tail_backoff = 0;
        r->tail_at = now;
    }
    if (account(r) != 0)
        return -1;
    /* the sender sees acked + late_acked */
    if (ARRAY_RESERVE(&r->acked, r->acked.n + r->late.n, 16) != 0)
        return -1;
    memcpy(r->acked.v + r->acked.n, r->late.v, r->late.n * sizeof(SentPkt));
    r->acked.n += r->late.n;
    return 0;
}

int recovery_detect_lost(Recovery *r, double now) {
    r->acked.n = r->late.n = r->lost.n = 0;
    double tail = recovery_tail_timeout(r), thr = time_threshold(r);
    while (r->in_flight.len) {
        int32_t h = r->in_flight.head;
        const SentPkt *p = &r->in_flight.nodes.v[h].p;
        int later_acked = (int64_t)p->seq < r->largest_acked, needed = p->group_id >= 0;
        double since = later_acked || p->sent_time > r->tail_at ? p->sent_time : r->tail_at;
        if (now < since + (later_acked ? thr : tail)) /* the same expressions as loss_deadline() */
            break;
        if (later_acked)
            r->lost_time++;
        else
            r->lost_tail++;
        if (take(&r->in_flight, h, &r->lost) != 0)
            return -1;
        if (!later_acked && needed) { /* a probe: one needed packet per tail timeout */
            r->tail_backoff++;
            r->tail_at = now;
            /* and the announce parts past it: the receiver takes no data of the job without them */
            for (int32_t cur = r->in_flight.head; cur >= 0;) {
                const struct PNode *node = &r->in_flight.nodes.v[cur];
                int32_t next = node->next;
                if (node->p.msg_id == ANNOUNCE_MSG_ID && now >= node->p.sent_time + tail) {
                    r->lost_tail++;
                    if (take(&r->in_flight, cur, &r->lost) != 0)
                        return -1;
                }
                cur = next;
            }
            break;
        }
    }
    return account(r);
}
