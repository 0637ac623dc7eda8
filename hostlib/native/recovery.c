/* Loss detection and accounting (recovery.h; hostlib/recovery.py is the specification). */
#include <Python.h>
#include <math.h>

#include "recovery.h"

#define K_TIME_THRESHOLD (9.0 / 8.0)
#define LATE_ACK_MEMORY 16384
#define LATE_WALK 64 /* recovery.py's _LATE_WALK */
#define REORDER_PERSIST 16       /* recovery.py REORDER_PERSIST */


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
#define LOSS_MEMORY 64.0    /* recovery.py _LOSS_MEMORY */
#define LOSS_MIN_SAMPLES 1.0 /* recovery.py _LOSS_MIN_SAMPLES */

/* recovery.py loss (rate.py LossEstimate) */
static void loss_on_acked(Recovery *r, int late) {
    if (late && r->loss_lost >= 1.0)
        r->loss_lost -= 1.0;
    r->loss_acked += 1.0;
    if (r->loss_acked + r->loss_lost > LOSS_MEMORY) {
        r->loss_acked *= 0.5;
        r->loss_lost *= 0.5;
    }
}

static void loss_on_lost(Recovery *r) {
    r->loss_lost += 1.0;
    if (r->loss_acked + r->loss_lost > LOSS_MEMORY) {
        r->loss_acked *= 0.5;
        r->loss_lost *= 0.5;
    }
}

/* recovery.py answers (rate.py LossEstimate, no late acknowledgements) */
static void answers_on(Recovery *r, int answered) {
    if (answered)
        r->answers_acked += 1.0;
    else
        r->answers_lost += 1.0;
    if (r->answers_acked + r->answers_lost > LOSS_MEMORY) {
        r->answers_acked *= 0.5;
        r->answers_lost *= 0.5;
    }
}

double recovery_answer_loss(const Recovery *r) {
    double n = r->answers_acked + r->answers_lost;
    return r->missed_answers && n >= LOSS_MIN_SAMPLES ? r->answers_lost / n : 0.0;
}

/* loss.value: 1 and *out, or 0 for None */
static int loss_value(const Recovery *r, double *out) {
    double n = r->loss_acked + r->loss_lost;
    if (!(n >= LOSS_MIN_SAMPLES))
        return 0;
    *out = r->loss_lost / n;
    return 1;
}

int recovery_unanswered(const Recovery *r) { return !r->has_rtt_sample && r->tail_backoff >= MAX_TAIL_BACKOFF; }

int recovery_queued(const Recovery *r) {
    double a = r->min_rtt / 4, b = r->min_loss_timeout_s / 5;
    return r->latest_rtt - r->min_rtt > (a > b ? a : b);
}

int recovery_init(Recovery *r, double initial_rtt_s, long long reorder_threshold, double min_loss_timeout_s,
                  int adaptive_reorder, int path_reorders, RateCtl *rate) {
    r->reorder_threshold = reorder_threshold;
    r->reordering = adaptive_reorder && path_reorders;
    r->reorder_window = 0.0;
    r->adaptive_reorder = adaptive_reorder;
    r->spurious_losses = r->threshold_losses = 0;
    r->min_loss_timeout_s = min_loss_timeout_s;
    r->srtt = initial_rtt_s;
    r->rttvar = initial_rtt_s / 2;
    r->latest_rtt = initial_rtt_s;
    r->min_rtt = INFINITY;
    r->largest_acked = -1;
    r->tail_backoff = 0;
    r->tail_at = -INFINITY;
    r->loss_acked = r->loss_lost = 0.0;
    r->answers_acked = r->answers_lost = 0.0;
    r->missed_answers = 0;
    r->every_overdue = 0;
    r->spare_probes = 0;
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

static inline double time_threshold(const Recovery *r);

#define MAX_LOSS 0.95 /* recovery.py _MAX_LOSS */
#define MAX_COPIES 20 /* recovery.py _MAX_COPIES */
#define ACK_COVERS ATP_MAX_SACK_BLOCKS /* recovery.py ACK_COVERS */

int recovery_lossy(const Recovery *r) {
    double rate = 0.0;
    return r->has_rtt_sample && loss_value(r, &rate) && rate != 0.0 && !recovery_queued(r);
}

/* recovery.py _probes: probes() with the answers' loss rate a (0: the data's loss rate alone) */
static long long probes_at(const Recovery *r, double a) {
    double p = 0.0;
    int known = loss_value(r, &p);
    if ((!known && a == 0.0) || !r->has_rtt_sample)
        return 1;
    double arrive = (1.0 - (p < MAX_LOSS ? p : MAX_LOSS)) * (1.0 - (a < MAX_LOSS ? a : MAX_LOSS));
    double want = 1.0 / arrive, most = 1.0 / (1.0 - MAX_LOSS);
    return (long long)((want < most ? want : most) + 0.5);
}

long long recovery_probes(const Recovery *r) { return probes_at(r, recovery_answer_loss(r)); }

long long recovery_copies(const Recovery *r) {
    if (recovery_answer_loss(r) != 0.0) { /* answers die: the probes a tail timeout wanted go as copies too */
        long long data = recovery_lossy(r) ? probes_at(r, 0.0) - 1 + r->tail_backoff : 0;
        long long spare = r->spare_probes ? MAX_COPIES : 0;
        return data > spare ? data : spare;
    }
    if (!recovery_lossy(r))
        return r->spare_probes;
    return recovery_probes(r) - 1 + r->tail_backoff;
}

long long recovery_fin_copies(const Recovery *r) {
    return recovery_answer_loss(r) != 0.0 ? recovery_probes(r) : 1;
}

double recovery_delivery(const Recovery *r) {
    double p;
    if (!recovery_lossy(r) || !loss_value(r, &p))
        return 1.0;
    return 1.0 - (p < MAX_LOSS ? p : MAX_LOSS);
}

double recovery_drain(const Recovery *r) { return r->has_rtt_sample ? r->min_rtt / r->latest_rtt : 0.0; }

double recovery_tail_timeout(const Recovery *r) {
    if (recovery_probes(r) > 1) { /* most packets die: an ACK is late by the RTT's variation at most, no backoff */
        double m = r->min_loss_timeout_s, c = r->srtt + 4 * r->rttvar, t = time_threshold(r);
        if (c > m)
            m = c;
        if (t > m)
            m = t;
        return m;
    }
    double a = r->min_loss_timeout_s, b = 2 * r->srtt, c = r->srtt + 4 * r->rttvar, p = 0.0;
    double m = a;
    if (b > m)
        m = b;
    if (c > m)
        m = c;
    if (r->has_rtt_sample && loss_value(r, &p) && p != 0.0) /* packets die here: a silence is more loss */
        return m;
    return m * (double)(1 << (r->tail_backoff < MAX_TAIL_BACKOFF ? r->tail_backoff : MAX_TAIL_BACKOFF));
}

static inline double base_time_threshold(const Recovery *r) {
    double x = r->srtt;
    if (r->latest_rtt > x)
        x = r->latest_rtt;
    double t = K_TIME_THRESHOLD * x, floor = r->min_loss_timeout_s / 5;
    return t > floor ? t : floor;
}

/* 9/8 RTT (at least min_loss_timeout / 5) plus the reorder window */
static inline double time_threshold(const Recovery *r) { return base_time_threshold(r) + r->reorder_window; }

double recovery_time_threshold(const Recovery *r) { return time_threshold(r); }

/* recovery.py _reordered: a packet was acknowledged after one sent later: losses by time only, the reorder window
 * at least min RTT / 4 */
static void reordered(Recovery *r) {
    if (!r->adaptive_reorder || !r->has_rtt_sample)
        return;
    r->reordering = 1;
    double w = r->min_rtt / 4;
    if (r->srtt < w)
        w = r->srtt;
    if (w > r->reorder_window)
        r->reorder_window = w;
}

/* recovery.py _spurious: packet p, declared lost by a threshold, was acknowledged after all: the path reordered it;
 * the reorder window widens to how much later than the time threshold its ACK came (at most srtt). */
static void spurious(Recovery *r, const SentPkt *p, double now) {
    r->spurious_losses++;
    r->threshold_losses = 0;
    reordered(r);
    if (!r->reordering)
        return;
    double late = now - p->sent_time - base_time_threshold(r);
    if (late > r->reorder_window)
        r->reorder_window = late;
    if (r->srtt < r->reorder_window)
        r->reorder_window = r->srtt;
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
        if (r->reordering) /* known to reorder before any sample (path_reorders): the window opens now */
            reordered(r);
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
    if (p->copy && r->spare_probes && (!recovery_lossy(r) || recovery_answer_loss(r) != 0.0))
        r->spare_probes--;
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
    for (size_t i = 0; i < r->lost.n; i++) /* recovery.py _forget_reordering */
        r->threshold_losses += r->lost.v[i].by_threshold;
    if (r->threshold_losses >= REORDER_PERSIST) {
        r->threshold_losses = 0;
        r->reordering = 0;
        r->reorder_window = 0.0;
    }
    for (size_t i = 0; i < r->acked.n; i++) {
        r->packets_acked++;
        if (r->acked.v[i].group_id >= 0)
            loss_on_acked(r, 0);
        rate_on_acked(r->rate, r->acked.v[i].group_id, r->acked.v[i].size, 0);
    }
    for (size_t i = 0; i < r->late.n; i++) {
        r->packets_acked++;
        if (r->late.v[i].group_id >= 0)
            loss_on_acked(r, 1);
        rate_on_acked(r->rate, r->late.v[i].group_id, r->late.v[i].size, 1);
    }
    for (size_t i = 0; i < r->lost.n; i++) {
        r->packets_lost++;
        if (r->lost.v[i].group_id >= 0)
            loss_on_lost(r);
        if (pmap_set(&r->declared_lost, &r->lost.v[i]) != 0)
            return -1;
        if (r->declared_lost.len > LATE_ACK_MEMORY)
            pmap_remove(&r->declared_lost, r->declared_lost.head);
        rate_on_lost(r->rate, r->lost.v[i].group_id);
    }
    return 0;
}

/* recovery.py _late_in: the packets declared lost that block [first, last] acknowledges, to r->late, with at most
   LATE_WALK lookups (the block's numbers when it is short; else each packet remembered, oldest first, when few are;
   else the block's newest LATE_WALK) */
static int late_in(Recovery *r, int64_t first, int64_t last) {
    int32_t k;
    if (r->declared_lost.len == 0)
        return 0;
    if (last - first < LATE_WALK || r->declared_lost.len > LATE_WALK) {
        for (int64_t q = last - first < LATE_WALK ? first : last - LATE_WALK + 1; q <= last; q++)
            if ((k = pmap_find(&r->declared_lost, (uint32_t)q)) >= 0) {
                r->late_acks++;
                if (take(&r->declared_lost, k, &r->late) != 0)
                    return -1;
            }
        return 0;
    }
    for (int32_t cur = r->declared_lost.head; cur >= 0;) {
        int32_t next = r->declared_lost.nodes.v[cur].next;
        int64_t q = r->declared_lost.nodes.v[cur].p.seq;
        if (first <= q && q <= last) {
            r->late_acks++;
            if (take(&r->declared_lost, cur, &r->late) != 0)
                return -1;
        }
        cur = next;
    }
    return 0;
}

int recovery_on_ack(Recovery *r, uint32_t seq, const SackBlock *blocks, int nblocks, double now, int trimmed) {
    r->acked.n = r->late.n = r->lost.n = 0;
    int64_t prior_largest = r->largest_acked;
    int32_t k = pmap_find(&r->in_flight, seq);
    if (trimmed) {
        if (k >= 0) {
            r->lost_trim++;
            if (take(&r->in_flight, k, &r->lost) != 0)
                return -1;
        }
    } else if (k >= 0) {
        update_rtt(r, now - r->in_flight.nodes.v[k].p.sent_time);
        answers_on(r, 1);
        if (take(&r->in_flight, k, &r->acked) != 0)
            return -1;
        if ((int64_t)seq < prior_largest) /* it arrived after a packet sent later */
            reordered(r);
    } else if ((k = pmap_find(&r->declared_lost, seq)) >= 0) {
        r->late_acks++;
        answers_on(r, 1);
        if (take(&r->declared_lost, k, &r->late) != 0)
            return -1;
    }
    int64_t largest = seq;
    for (int i = 0; i < nblocks; i++)
        if ((int64_t)blocks[i].last > largest)
            largest = blocks[i].last;
    if (largest > r->largest_acked)
        r->largest_acked = largest;
    size_t echoed = r->late.n;
    for (int i = 0; i < nblocks; i++) /* late ACKs of packets already declared lost */
        if (late_in(r, blocks[i].first, blocks[i].last) != 0)
            return -1;
    for (size_t i = echoed; i < r->late.n; i++) { /* acknowledged by a block, not an ACK of their own */
        answers_on(r, 0);
        r->missed_answers += !r->late.v[i].by_threshold;
    }
    for (size_t i = 0; i < r->late.n; i++)
        if (r->late.v[i].by_threshold)
            spurious(r, &r->late.v[i], now);
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
        int by_packets = !r->reordering && r->largest_acked - q >= r->reorder_threshold;
        if (covered) {
            if (q < prior_largest) /* it arrived after a packet sent later */
                reordered(r);
            answers_on(r, 0);
            if (take(&r->in_flight, cur, &r->acked) != 0)
                return -1;
        } else if (by_packets || now - node->p.sent_time >= thr) {
            if (by_packets)
                r->lost_reorder++;
            else
                r->lost_time++;
            r->in_flight.nodes.v[cur].p.by_threshold = 1;
            if (take(&r->in_flight, cur, &r->lost) != 0)
                return -1;
        }
        cur = next;
    }
    if (r->acked.n + r->late.n > ACK_COVERS) /* more than one ACK's worth: an answer before it died */
        r->missed_answers++;
    if (r->acked.n || r->late.n) { /* progress: the tail timeout counts from now, at its base value */
        r->tail_backoff = 0;
        r->tail_at = now;
        r->spare_probes = 0;
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
    r->every_overdue = 0;
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
        r->in_flight.nodes.v[h].p.by_threshold = (uint8_t)later_acked;
        if (take(&r->in_flight, h, &r->lost) != 0)
            return -1;
        if (!later_acked && needed) { /* a probe */
            /* and more needed packets past it while the loss rate says one of them must arrive, the packets
             * between them, the announce parts past it; every overdue packet when nothing was ever answered */
            long long more = recovery_probes(r) - 1 + (r->has_rtt_sample ? r->tail_backoff : 0);
            int every = r->every_overdue = recovery_unanswered(r);
            for (int32_t cur = r->in_flight.head; cur >= 0;) {
                const struct PNode *node = &r->in_flight.nodes.v[cur];
                int32_t next = node->next;
                double at = node->p.sent_time > r->tail_at ? node->p.sent_time : r->tail_at;
                if (now >= at + tail && (node->p.msg_id == ANNOUNCE_MSG_ID || every || more > 0)) {
                    r->lost_tail++;
                    more -= node->p.group_id >= 0 && node->p.msg_id != ANNOUNCE_MSG_ID;
                    if (take(&r->in_flight, cur, &r->lost) != 0)
                        return -1;
                }
                cur = next;
            }
            r->spare_probes = more > 0 ? more : 0;
            r->tail_backoff++;
            r->tail_at = now;
            break;
        }
    }
    return account(r);
}
