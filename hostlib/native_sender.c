/* AtpSender in C: hostlib/sender.py with hostlib/recovery.py, hostlib/rate.py and hostlib/scheduler.py,
 * function for function (the Python names are given where they help). Construction reads the JobSpec and the
 * AtpConfig through Python; everything per packet, ACK and timer runs here. */
#include <math.h>
#include <string.h>

#include "native_atp.h"

enum { M_ACTIVE, M_DAMAGED, M_REPAIRING, M_DELIVERED };
enum { P_UNSENT, P_IN_FLIGHT, P_ACKED, P_LOST };
enum { S_SENDING, S_CLOSING, S_DONE, S_FAILED };
enum { MODE_ADAPTIVE, MODE_PAPER, MODE_FIXTLR, MODE_BASE };

#define MAX_SLACK_US (ATP_NO_DEADLINE - 1)
#define FIN_RETRY_MIN_S 0.02
#define K_TIME_THRESHOLD (9.0 / 8.0)
#define LATE_ACK_MEMORY 16384

/* --- growable helpers ---------------------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = n;
    return 0;
}

/* --- SentPacket and an ordered map seq -> packet (collections.OrderedDict semantics) ------------------ */

typedef struct {
    uint32_t seq, msg_id, pkt_idx, size;
    int32_t group_id; /* -1: None (control packet) */
    uint8_t retx;
    double sent_time;
} SentPkt;

typedef struct {
    SentPkt p;
    int32_t prev, next;
} PNode;

typedef struct {
    PNode *nodes;
    size_t ncap;
    int32_t free_head, head, tail;
    Py_ssize_t len;
    int32_t *slots;
    uint32_t mask; /* slots: mask + 1 entries, at most half full */
} PMap;

static inline uint32_t hseq(uint32_t s) { return s * 2654435761u; }

static int pmap_init(PMap *m) {
    memset(m, 0, sizeof *m);
    m->free_head = m->head = m->tail = -1;
    m->mask = 63;
    m->slots = malloc(64 * sizeof(int32_t));
    if (m->slots == NULL)
        return -1;
    memset(m->slots, 0xff, 64 * sizeof(int32_t));
    return 0;
}

static void pmap_free(PMap *m) {
    free(m->nodes);
    free(m->slots);
    m->nodes = NULL;
    m->slots = NULL;
}

static int32_t pmap_find(const PMap *m, uint32_t seq) {
    uint32_t i = hseq(seq) & m->mask;
    for (;;) {
        int32_t k = m->slots[i];
        if (k < 0)
            return -1;
        if (m->nodes[k].p.seq == seq)
            return k;
        i = (i + 1) & m->mask;
    }
}

static void slot_put(int32_t *slots, uint32_t mask, const PNode *nodes, int32_t k) {
    uint32_t i = hseq(nodes[k].p.seq) & mask;
    while (slots[i] >= 0)
        i = (i + 1) & mask;
    slots[i] = k;
}

static int pmap_rehash(PMap *m, uint32_t nmask) {
    int32_t *ns = malloc(((size_t)nmask + 1) * sizeof(int32_t));
    if (ns == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(ns, 0xff, ((size_t)nmask + 1) * sizeof(int32_t));
    for (int32_t k = m->head; k >= 0; k = m->nodes[k].next)
        slot_put(ns, nmask, m->nodes, k);
    free(m->slots);
    m->slots = ns;
    m->mask = nmask;
    return 0;
}

/* m[seq] = p: appended at the end when new, replaced in place otherwise. */
static int pmap_set(PMap *m, const SentPkt *p) {
    int32_t k = pmap_find(m, p->seq);
    if (k >= 0) {
        m->nodes[k].p = *p;
        return 0;
    }
    if ((size_t)(m->len + 1) * 2 > (size_t)m->mask + 1 && pmap_rehash(m, m->mask * 2 + 1) != 0)
        return -1;
    if (m->free_head >= 0) {
        k = m->free_head;
        m->free_head = m->nodes[k].next;
    } else {
        size_t used = (size_t)m->len;
        /* no free node: every node is in use, so the next index is len */
        if (grow((void **)&m->nodes, &m->ncap, used + 1, sizeof(PNode)) != 0)
            return -1;
        k = (int32_t)used;
    }
    m->nodes[k].p = *p;
    m->nodes[k].prev = m->tail;
    m->nodes[k].next = -1;
    if (m->tail >= 0)
        m->nodes[m->tail].next = k;
    else
        m->head = k;
    m->tail = k;
    m->len++;
    slot_put(m->slots, m->mask, m->nodes, k);
    return 0;
}

/* Remove node k (its slot too), backward-shift deletion. */
static void pmap_remove(PMap *m, int32_t k) {
    uint32_t i = hseq(m->nodes[k].p.seq) & m->mask;
    while (m->slots[i] != k)
        i = (i + 1) & m->mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        int32_t o = m->slots[j];
        if (o < 0)
            break;
        uint32_t home = hseq(m->nodes[o].p.seq) & m->mask;
        /* o may move to i when its home is not in (i, j] (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->slots[i] = o;
            i = j;
        }
    }
    m->slots[i] = -1;
    PNode *n = &m->nodes[k];
    if (n->prev >= 0)
        m->nodes[n->prev].next = n->next;
    else
        m->head = n->next;
    if (n->next >= 0)
        m->nodes[n->next].prev = n->prev;
    else
        m->tail = n->prev;
    n->next = m->free_head;
    m->free_head = k;
    m->len--;
}

/* --- small containers ---------------------------------------------------------------------------------- */

typedef struct {
    uint32_t msg_id, idx;
} CtlItem;

typedef struct {
    uint8_t a;
    uint32_t r; /* retries */
    int64_t b;
    uint32_t msg_id;
} SchedEntry;

static inline int sched_less(const SchedEntry *x, const SchedEntry *y) {
    if (x->a != y->a)
        return x->a < y->a;
    if (x->r != y->r)
        return x->r < y->r;
    if (x->b != y->b)
        return x->b < y->b;
    return x->msg_id < y->msg_id;
}

typedef struct {
    int64_t remaining;
    uint32_t msg_id;
} IdleEntry;

static inline int idle_less(const IdleEntry *x, const IdleEntry *y) {
    if (x->remaining != y->remaining)
        return x->remaining < y->remaining;
    return x->msg_id < y->msg_id;
}

#define HEAP_PUSH(arr, n, item, less)                     \
    do {                                                  \
        size_t _i = (n)++;                                \
        (arr)[_i] = (item);                               \
        while (_i > 0) {                                  \
            size_t _p = (_i - 1) / 2;                     \
            if (!less(&(arr)[_i], &(arr)[_p]))            \
                break;                                    \
            __typeof__(item) _t = (arr)[_i];              \
            (arr)[_i] = (arr)[_p];                        \
            (arr)[_p] = _t;                               \
            _i = _p;                                      \
        }                                                 \
    } while (0)

#define HEAP_POP(arr, n, less)                                                   \
    do {                                                                         \
        (arr)[0] = (arr)[--(n)];                                                 \
        size_t _i = 0;                                                           \
        for (;;) {                                                               \
            size_t _l = 2 * _i + 1, _r = _l + 1, _m = _i;                        \
            if (_l < (n) && less(&(arr)[_l], &(arr)[_m]))                        \
                _m = _l;                                                         \
            if (_r < (n) && less(&(arr)[_r], &(arr)[_m]))                        \
                _m = _r;                                                         \
            if (_m == _i)                                                        \
                break;                                                           \
            __typeof__((arr)[0]) _t = (arr)[_i];                                 \
            (arr)[_i] = (arr)[_m];                                               \
            (arr)[_m] = _t;                                                      \
            _i = _m;                                                             \
        }                                                                        \
    } while (0)

/* --- messages and groups ------------------------------------------------------------------------------- */

typedef struct {
    PyObject *data; /* bytes */
    int64_t remaining;
    uint32_t cnt, next_new, acked;
    uint64_t pkt_base; /* first entry in Sender.pkt_state */
    uint16_t *lost;    /* deque of lost packet indexes (ring), NULL until the first loss */
    uint32_t lost_head, lost_len, lost_cap;
    uint32_t group; /* index into Sender.groups */
    uint8_t state;
    uint8_t tagged, priority, weight, has_deadline;
    double deadline_s;
    uint8_t key_valid, key_a; /* the scheduler's current key of this message */
    uint32_t key_r;
    int64_t key_b;
    uint32_t retries; /* retransmissions lost again (repair rotation) */
    uint8_t surplus;  /* started as surplus and not needed since */
} Msg;

typedef struct {
    long long group_id;
    double msr;
    int64_t total, required, budget;
    int approx, fixed_tlr;
    double tlr;
    int64_t delivered, active, started, damaged, repairing;
    IdleEntry *idle;
    size_t nidle, idle_cap;
    int64_t packets_sent, retransmissions, report_seq, ece;
    uint32_t qcount[256];
    uint8_t qorder[256];
    int nq;
    /* rate.EpochCounts of the current epoch */
    int64_t ep_sent, ep_acked, ep_lost;
    /* rate.LossEstimate (adaptive) */
    int has_est;
    double est_acked, est_lost;
} Group;

typedef struct {
    PyObject_HEAD
    PyObject *job, *config, *peer, *summary, *failure;
    int state, mode, adaptive, mrdf, repairs_last, completion_early, message_events;
    long long job_id;
    /* config */
    double max_rate_bps, gain, initial_rtt_s, min_epoch_s, epoch_s, min_loss_timeout_s, idle_timeout_s,
        fin_timeout_s, pacing_gain;
    int has_epoch_s;
    long long max_payload, overhead, packet_size, reorder_threshold, loss_memory, min_samples;
    int queue_packets[8];
    /* messages and groups */
    Msg *msgs;
    size_t nmsgs;
    uint8_t *pkt_state;
    Group *groups;
    size_t ngroups;
    int64_t unsent_open;
    /* scheduler (scheduler.Scheduler) */
    SchedEntry *sched;
    size_t nsched, sched_cap;
    /* announce and control queue */
    PyObject **announce; /* bytes, one per part */
    size_t nannounce;
    uint8_t *announce_acked;
    CtlItem *ctl;
    size_t ctl_head, ctl_len, ctl_cap;
    /* recovery.LossRecovery */
    double srtt, rttvar, latest_rtt, min_rtt;
    int has_rtt_sample;
    int64_t largest_acked;
    PMap in_flight, declared_lost;
    int64_t packets_acked, packets_lost, late_acks;
    int64_t lost_reorder, lost_time, lost_tail; /* LossRecovery.lost_by */
    /* rate.RateController / rate.WindowController */
    double rate_bps, packet_bits;
    double w_mean_packet_bits, w_window, w_max_window, w_min_window, w_cap, w_rtt, w_epoch_acked_bits,
        w_delivery_rate_bps;
    long long w_header_bytes;
    int w_cap_known, w_queue, w_slow_start;
    int64_t w_recover_until, w_largest_acked, w_cuts;
    /* rate.TokenBucket */
    double b_burst, b_tokens, b_stamp;
    double pacing_train_s;
    long long burst_packets;
    int path_queue; /* queue byte of the last data ACK, -1 before the first */
    /* timing */
    uint32_t seq;
    long long epoch;
    int started;
    double start_time, epoch_end, last_progress;
    int has_completed_at, has_fin_next;
    double completed_at, fin_next, fin_deadline;
    /* DONE parts */
    PyObject *done_parts; /* dict pkt_idx -> list of ids */
    long long done_cnt;   /* -1: None */
    /* counters */
    long long packets_sent, packets_surplus, retransmissions;
    PyObject *rejected; /* collections.Counter by reason */
    /* admission and what answers may echo */
    PyObject *token;    /* bytes, or NULL before the first RETRY */
    PyObject *admission_key; /* bytes or None */
    double hello_next;
    uint32_t isn;
    uint32_t *sent_msg; /* per sequence number used (seq - isn): the msg_id and pkt_idx it carried */
    uint16_t *sent_idx;
    size_t nsent, sent_cap;
    /* events */
    PyObject **ev;
    size_t ev_head, ev_len, ev_cap;
    /* scratch */
    SentPkt *acked_buf, *late_buf, *lost_buf, *lost2_buf;
    size_t acked_cap, late_cap, lost_cap, lost2_cap;
    /* socket I/O */
    SendBatch batch;
    RecvRing ring;
    int peer_ok;
    NetAddr peer_addr;
} Sender;

/* ============================== events ============================== */

static int push_event(Sender *s, PyObject *ev) {
    if (ev == NULL)
        return -1;
    if (s->ev_len == s->ev_cap) {
        size_t ncap = s->ev_cap ? s->ev_cap * 2 : 64;
        PyObject **n = malloc(ncap * sizeof(PyObject *));
        if (n == NULL) {
            Py_DECREF(ev);
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < s->ev_len; i++)
            n[i] = s->ev[(s->ev_head + i) % s->ev_cap];
        free(s->ev);
        s->ev = n;
        s->ev_cap = ncap;
        s->ev_head = 0;
    }
    s->ev[(s->ev_head + s->ev_len) % s->ev_cap] = ev;
    s->ev_len++;
    return 0;
}

/* ============================== scheduler.Scheduler ============================== */

/* scheduling_key: (a, retries, b, msg_id) covers the four key shapes of scheduler.py */
static int sched_update(Sender *s, uint32_t msg_id, int64_t remaining, int repair, uint32_t retries) {
    uint8_t a;
    int64_t b;
    if (s->mrdf) {
        a = s->repairs_last ? (uint8_t)repair : 0;
        b = remaining;
    } else {
        a = s->repairs_last ? (uint8_t)repair : (uint8_t)!repair;
        b = 0;
    }
    Msg *m = &s->msgs[msg_id];
    if (m->key_valid && m->key_a == a && m->key_r == retries && m->key_b == b)
        return 0;
    m->key_valid = 1;
    m->key_a = a;
    m->key_r = retries;
    m->key_b = b;
    if (grow((void **)&s->sched, &s->sched_cap, s->nsched + 1, sizeof(SchedEntry)) != 0)
        return -1;
    SchedEntry e = {a, retries, b, msg_id};
    HEAP_PUSH(s->sched, s->nsched, e, sched_less);
    return 0;
}

static inline void sched_remove(Sender *s, uint32_t msg_id) { s->msgs[msg_id].key_valid = 0; }

static int64_t sched_peek(Sender *s) {
    while (s->nsched) {
        SchedEntry *e = &s->sched[0];
        Msg *m = &s->msgs[e->msg_id];
        if (m->key_valid && m->key_a == e->a && m->key_r == e->r && m->key_b == e->b)
            return e->msg_id;
        HEAP_POP(s->sched, s->nsched, sched_less);
    }
    return -1;
}

/* ============================== rate.py ============================== */

static int group_index(Sender *s, long long gid) {
    size_t lo = 0, hi = s->ngroups;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->groups[mid].group_id < gid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < s->ngroups && s->groups[lo].group_id == gid) ? (int)lo : -1;
}

/* LossEstimate */
static void est_on_acked(Sender *s, Group *g, int late) {
    if (late && g->est_lost >= 1.0)
        g->est_lost -= 1.0;
    g->est_acked += 1.0;
    if (g->est_acked + g->est_lost > (double)s->loss_memory) {
        g->est_acked *= 0.5;
        g->est_lost *= 0.5;
    }
}

static void est_on_lost(Sender *s, Group *g) {
    g->est_lost += 1.0;
    if (g->est_acked + g->est_lost > (double)s->loss_memory) {
        g->est_acked *= 0.5;
        g->est_lost *= 0.5;
    }
}

/* LossEstimate.value; returns 0 for None */
static int est_value(Sender *s, Group *g, double *out) {
    if (!g->has_est)
        return 0;
    double n = g->est_acked + g->est_lost;
    if (!(n >= (double)s->min_samples))
        return 0;
    *out = g->est_lost / n;
    return 1;
}

static double counts_loss(const Group *g) {
    int64_t known = g->ep_acked + g->ep_lost;
    return known ? (double)g->ep_lost / (double)known : 0.0;
}

/* listener hooks (LossRecovery -> rate controller); gid -1 = None */
static void rate_on_sent(Sender *s, int32_t gid, uint32_t size) {
    if (gid < 0)
        return;
    Group *g = &s->groups[group_index(s, gid)];
    g->ep_sent++;
    if (s->adaptive)
        s->w_mean_packet_bits += 0.05 * ((double)(((long long)size + s->w_header_bytes) * 8) - s->w_mean_packet_bits);
}

static void rate_on_acked(Sender *s, int32_t gid, uint32_t size, int late) {
    if (gid < 0)
        return;
    Group *g = &s->groups[group_index(s, gid)];
    g->ep_acked++;
    if (s->adaptive) {
        g->has_est = 1;
        est_on_acked(s, g, late);
        s->w_epoch_acked_bits += (double)(((long long)size + s->w_header_bytes) * 8);
    }
}

static void rate_on_lost(Sender *s, int32_t gid) {
    if (gid < 0)
        return;
    Group *g = &s->groups[group_index(s, gid)];
    g->ep_lost++;
    if (s->adaptive) {
        g->has_est = 1;
        est_on_lost(s, g);
    }
}

/* WindowController.on_path */
static void window_on_path(Sender *s, int queue, double rtt) {
    s->w_queue = queue;
    s->w_rtt = rtt;
    int size = queue < 8 ? s->queue_packets[queue] : 0;
    if (size > 0) {
        double bdp = s->w_rtt < INFINITY ? ceil(s->max_rate_bps * s->w_rtt / s->w_mean_packet_bits) : 1.0;
        /* the queue holds ``size`` MTUs of bytes: in packets of the size being sent */
        double packets = (double)size * s->packet_bits / s->w_mean_packet_bits;
        double want = packets + (bdp > 1.0 ? bdp : 1.0);
        s->w_cap = want < s->w_max_window ? want : s->w_max_window;
        s->w_cap_known = 1;
        if (s->w_window > s->w_cap)
            s->w_window = s->w_cap;
    } else if (s->w_cap_known) {
        s->w_cap_known = 0;
        s->w_cap = s->w_max_window;
    }
}

/* WindowController.on_ack */
static void window_on_ack(Sender *s, int64_t seq) {
    if (seq > s->w_largest_acked)
        s->w_largest_acked = seq;
    if (seq < s->w_recover_until)
        return;
    double w = s->w_window;
    if (s->w_slow_start) {
        w += 1.0;
    } else {
        /* eq. 3's increase as a window: gain x the pipe per RTT, at least one packet (rate.py) */
        double step = 1.0;
        if (s->w_cap_known && s->gain * s->w_cap > 1.0)
            step = s->gain * s->w_cap;
        w += step / w;
        if (!s->w_cap_known && w > s->w_cap)
            s->w_cap += 1.0 / w;
    }
    s->w_window = w < s->w_cap ? w : s->w_cap;
}

/* WindowController.on_loss over the groups flagged in ``touched`` */
static void window_on_loss(Sender *s, const uint8_t *touched) {
    if (s->w_largest_acked < s->w_recover_until)
        return;
    int have_worst = 0;
    double worst = 0.0;
    for (size_t i = 0; i < s->ngroups; i++) {
        if (!touched[i])
            continue;
        double est;
        if (est_value(s, &s->groups[i], &est) && est > s->groups[i].tlr + 1e-9 && (!have_worst || est > worst)) {
            worst = est;
            have_worst = 1;
        }
    }
    if (have_worst) {
        double w = s->w_window * (1.0 - worst / 2.0);
        s->w_window = s->w_min_window < w ? w : s->w_min_window;
    } else if (!s->w_cap_known) {
        double c = s->w_window * 0.8;
        s->w_cap = 2.0 < c ? c : 2.0;
        double w = s->w_window < s->w_cap ? s->w_window : s->w_cap;
        s->w_window = s->w_min_window < w ? w : s->w_min_window;
    } else {
        return;
    }
    s->w_slow_start = 0;
    s->w_recover_until = s->seq;
    s->w_cuts++;
}

/* RateController.end_epoch (the counts are read by the caller before they are reset) */
static void ratectl_end_epoch(Sender *s, double rtt_s) {
    if (s->mode == MODE_BASE)
        return;
    int any_active = 0, have_over = 0;
    double worst = 0.0;
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        if (g->ep_sent <= 0)
            continue;
        any_active = 1;
        double loss = counts_loss(g);
        if (!(loss == 0.0 || loss < g->tlr - 1e-9)) {
            if (!have_over || loss > worst)
                worst = loss;
            have_over = 1;
        }
    }
    if (any_active) {
        if (!have_over)
            s->rate_bps = (1 - s->gain) * s->rate_bps + s->gain * s->max_rate_bps;
        else
            s->rate_bps = s->rate_bps * (1 - worst / 2);
    }
    double rmin = s->packet_bits / rtt_s;
    if (!(rmin < s->max_rate_bps))
        rmin = s->max_rate_bps;
    double r = s->rate_bps;
    if (rmin > r)
        r = rmin;
    s->rate_bps = s->max_rate_bps < r ? s->max_rate_bps : r;
}

/* TokenBucket */
static void bucket_refill(Sender *s, double rate_bps, double now) {
    if (now > s->b_stamp) {
        double t = s->b_tokens + (now - s->b_stamp) * rate_bps / 8;
        s->b_tokens = s->b_burst < t ? s->b_burst : t;
        s->b_stamp = now;
    }
}

static inline int bucket_can_send(Sender *s, double size) { return s->b_tokens >= size - 1e-6; }

static double bucket_ready_at(Sender *s, double size, double rate_bps) {
    double missing = size - s->b_tokens;
    if (missing <= 0)
        return s->b_stamp;
    return s->b_stamp + missing * 8 / rate_bps;
}

/* ============================== recovery.LossRecovery ============================== */

static inline double tail_timeout(Sender *s) {
    double a = s->min_loss_timeout_s, b = 2 * s->srtt, c = s->srtt + 4 * s->rttvar;
    double m = a;
    if (b > m)
        m = b;
    if (c > m)
        m = c;
    return m;
}

static inline double time_threshold(Sender *s) {
    double r = s->srtt;
    if (s->latest_rtt > r)
        r = s->latest_rtt;
    double t = K_TIME_THRESHOLD * r;
    return t > 1e-3 ? t : 1e-3;
}

static void update_rtt(Sender *s, double sample) {
    if (!(sample > 1e-6))
        sample = 1e-6;
    s->latest_rtt = sample;
    if (sample < s->min_rtt)
        s->min_rtt = sample;
    if (!s->has_rtt_sample) {
        s->srtt = sample;
        s->rttvar = sample / 2;
        s->has_rtt_sample = 1;
    } else {
        s->rttvar = 0.75 * s->rttvar + 0.25 * fabs(s->srtt - sample);
        s->srtt = 0.875 * s->srtt + 0.125 * sample;
    }
}

static int loss_deadline(Sender *s, double *out) {
    if (s->in_flight.len == 0)
        return 0;
    SentPkt *o = &s->in_flight.nodes[s->in_flight.head].p;
    if ((int64_t)o->seq < s->largest_acked)
        *out = o->sent_time + time_threshold(s);
    else
        *out = o->sent_time + tail_timeout(s);
    return 1;
}

static int on_packet_sent(Sender *s, const SentPkt *p) {
    if (pmap_set(&s->in_flight, p) != 0)
        return -1;
    rate_on_sent(s, p->group_id, p->size);
    return 0;
}

static int push_pkt(SentPkt **buf, size_t *cap, size_t *n, const SentPkt *p) {
    if (grow((void **)buf, cap, *n + 1, sizeof(SentPkt)) != 0)
        return -1;
    (*buf)[(*n)++] = *p;
    return 0;
}

/* LossRecovery._account */
static int account(Sender *s, const SentPkt *acked, size_t na, const SentPkt *late, size_t nl, const SentPkt *lost,
                   size_t nlost) {
    for (size_t i = 0; i < na; i++) {
        s->packets_acked++;
        rate_on_acked(s, acked[i].group_id, acked[i].size, 0);
    }
    for (size_t i = 0; i < nl; i++) {
        s->packets_acked++;
        rate_on_acked(s, late[i].group_id, late[i].size, 1);
    }
    for (size_t i = 0; i < nlost; i++) {
        s->packets_lost++;
        if (pmap_set(&s->declared_lost, &lost[i]) != 0)
            return -1;
        if (s->declared_lost.len > LATE_ACK_MEMORY)
            pmap_remove(&s->declared_lost, s->declared_lost.head);
        rate_on_lost(s, lost[i].group_id);
    }
    return 0;
}

/* LossRecovery.on_ack_received: fills acked_buf (newly acked, then late) and lost_buf; returns -1 on error. */
static int recovery_on_ack(Sender *s, uint32_t seq, const SackBlock *blocks, int nblocks, double now, size_t *n_acked,
                           size_t *n_lost) {
    size_t na = 0, nl = 0, nlost = 0;
    int32_t k = pmap_find(&s->in_flight, seq);
    if (k >= 0) {
        SentPkt p = s->in_flight.nodes[k].p;
        pmap_remove(&s->in_flight, k);
        update_rtt(s, now - p.sent_time);
        if (push_pkt(&s->acked_buf, &s->acked_cap, &na, &p) != 0)
            return -1;
    } else {
        int32_t d = pmap_find(&s->declared_lost, seq);
        if (d >= 0) {
            SentPkt p = s->declared_lost.nodes[d].p;
            pmap_remove(&s->declared_lost, d);
            s->late_acks++;
            if (push_pkt(&s->late_buf, &s->late_cap, &nl, &p) != 0)
                return -1;
        }
    }
    int64_t largest = seq;
    for (int i = 0; i < nblocks; i++)
        if ((int64_t)blocks[i].last > largest)
            largest = blocks[i].last;
    if (largest > s->largest_acked)
        s->largest_acked = largest;
    for (int i = 0; i < nblocks; i++) {
        if ((int64_t)blocks[i].last - (int64_t)blocks[i].first < 64) {
            for (int64_t q = blocks[i].first; q <= (int64_t)blocks[i].last; q++) {
                int32_t d = pmap_find(&s->declared_lost, (uint32_t)q);
                if (d >= 0) {
                    SentPkt p = s->declared_lost.nodes[d].p;
                    pmap_remove(&s->declared_lost, d);
                    s->late_acks++;
                    if (push_pkt(&s->late_buf, &s->late_cap, &nl, &p) != 0)
                        return -1;
                }
            }
        }
    }
    double thr = time_threshold(s);
    int32_t cur = s->in_flight.head;
    while (cur >= 0) {
        PNode *node = &s->in_flight.nodes[cur];
        int32_t next = node->next;
        int64_t q = node->p.seq;
        if (q > s->largest_acked)
            break;
        int covered = 0;
        for (int i = 0; i < nblocks; i++)
            if (blocks[i].first <= q && q <= (int64_t)blocks[i].last) {
                covered = 1;
                break;
            }
        if (covered) {
            SentPkt p = node->p;
            pmap_remove(&s->in_flight, cur);
            if (push_pkt(&s->acked_buf, &s->acked_cap, &na, &p) != 0)
                return -1;
        } else if (s->largest_acked - q >= s->reorder_threshold || now - node->p.sent_time >= thr) {
            if (s->largest_acked - q >= s->reorder_threshold)
                s->lost_reorder++;
            else
                s->lost_time++;
            SentPkt p = node->p;
            pmap_remove(&s->in_flight, cur);
            if (push_pkt(&s->lost_buf, &s->lost_cap, &nlost, &p) != 0)
                return -1;
        }
        cur = next;
    }
    if (account(s, s->acked_buf, na, s->late_buf, nl, s->lost_buf, nlost) != 0)
        return -1;
    /* the sender sees acked + late_acked */
    if (grow((void **)&s->acked_buf, &s->acked_cap, na + nl, sizeof(SentPkt)) != 0)
        return -1;
    if (nl)
        memcpy(s->acked_buf + na, s->late_buf, nl * sizeof(SentPkt));
    *n_acked = na + nl;
    *n_lost = nlost;
    return 0;
}

/* LossRecovery.detect_lost into lost_buf */
static int recovery_detect_lost(Sender *s, double now, size_t *n_lost) {
    size_t n = 0;
    double tail = tail_timeout(s), thr = time_threshold(s);
    while (s->in_flight.len) {
        int32_t h = s->in_flight.head;
        SentPkt p = s->in_flight.nodes[h].p;
        int later_acked = (int64_t)p.seq < s->largest_acked;
        double limit = later_acked ? thr : tail;
        if (now < p.sent_time + limit)
            break;
        pmap_remove(&s->in_flight, h);
        if (later_acked)
            s->lost_time++;
        else
            s->lost_tail++;
        if (push_pkt(&s->lost_buf, &s->lost_cap, &n, &p) != 0)
            return -1;
    }
    if (account(s, NULL, 0, NULL, 0, s->lost_buf, n) != 0)
        return -1;
    *n_lost = n;
    return 0;
}

/* ============================== the sender ============================== */

static inline double epoch_length(Sender *s) {
    if (s->has_epoch_s)
        return s->epoch_s;
    return s->min_epoch_s < s->srtt ? s->srtt : s->min_epoch_s;
}

static inline int window_open(Sender *s, uint32_t msg_id) {
    return !s->adaptive || msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID ||
           (double)s->in_flight.len < s->w_window;
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

static inline uint32_t lost_front(Msg *m) { return m->lost[m->lost_head]; }
static inline void lost_popleft(Msg *m) {
    m->lost_head = (m->lost_head + 1) % m->lost_cap;
    m->lost_len--;
}

static int lost_append(Msg *m, uint32_t idx) {
    if (m->lost == NULL || m->lost_len == m->lost_cap) {
        uint32_t ncap = m->lost_cap ? m->lost_cap * 2 : (m->cnt < 4 ? 4 : m->cnt);
        uint16_t *n = malloc(ncap * sizeof(uint16_t));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (uint32_t i = 0; i < m->lost_len; i++)
            n[i] = m->lost[(m->lost_head + i) % m->lost_cap];
        free(m->lost);
        m->lost = n;
        m->lost_cap = ncap;
        m->lost_head = 0;
    }
    m->lost[(m->lost_head + m->lost_len) % m->lost_cap] = (uint16_t)idx;
    m->lost_len++;
    return 0;
}

/* _peek: the next (msg_id, idx) to send; 0 when there is none. */
static int peek(Sender *s, uint32_t *msg_id, uint32_t *idx) {
    while (s->ctl_len) {
        CtlItem *c = &s->ctl[s->ctl_head];
        if (c->msg_id == ANNOUNCE_MSG_ID && s->announce_acked[c->idx]) {
            s->ctl_head = (s->ctl_head + 1) % s->ctl_cap;
            s->ctl_len--;
            continue;
        }
        *msg_id = c->msg_id;
        *idx = c->idx;
        return 1;
    }
    if (s->state != S_SENDING)
        return 0;
    for (;;) {
        int64_t id = sched_peek(s);
        if (id < 0)
            return 0;
        Msg *m = &s->msgs[id];
        if (m->state == M_REPAIRING && m->lost != NULL) {
            while (m->lost_len && s->pkt_state[m->pkt_base + lost_front(m)] != P_LOST)
                lost_popleft(m);
            if (m->lost_len) {
                *msg_id = (uint32_t)id;
                *idx = lost_front(m);
                return 1;
            }
        }
        if ((m->state == M_ACTIVE || m->state == M_REPAIRING) && m->next_new < m->cnt) {
            *msg_id = (uint32_t)id;
            *idx = m->next_new;
            return 1;
        }
        sched_remove(s, (uint32_t)id);
    }
}

static int ctl_append(Sender *s, uint32_t msg_id, uint32_t idx) {
    if (s->ctl_len == s->ctl_cap) {
        size_t ncap = s->ctl_cap ? s->ctl_cap * 2 : 8;
        CtlItem *n = malloc(ncap * sizeof(CtlItem));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < s->ctl_len; i++)
            n[i] = s->ctl[(s->ctl_head + i) % s->ctl_cap];
        free(s->ctl);
        s->ctl = n;
        s->ctl_cap = ncap;
        s->ctl_head = 0;
    }
    s->ctl[(s->ctl_head + s->ctl_len) % s->ctl_cap] = (CtlItem){msg_id, idx};
    s->ctl_len++;
    return 0;
}

static int reject(Sender *s, const char *reason) { return counter_add(s->rejected, reason, 1); }

/* _next_seq: the next sequence number, recording what it carries */
static int next_seq(Sender *s, uint32_t msg_id, uint32_t idx, uint32_t *seq) {
    if (s->nsent == s->sent_cap) {
        size_t n = s->sent_cap ? s->sent_cap * 2 : 1024;
        uint32_t *m = realloc(s->sent_msg, n * sizeof(uint32_t));
        if (m == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->sent_msg = m;
        uint16_t *i = realloc(s->sent_idx, n * sizeof(uint16_t));
        if (i == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->sent_idx = i;
        s->sent_cap = n;
    }
    s->sent_msg[s->nsent] = msg_id;
    s->sent_idx[s->nsent] = (uint16_t)idx;
    s->nsent++;
    *seq = s->seq;
    s->seq = s->seq + 1;
    return 0;
}

/* _carried: whether this sender used ``seq``, and for which (msg_id, pkt_idx) */
static int carried(Sender *s, uint32_t seq, uint32_t *msg_id, uint32_t *idx) {
    uint32_t off = seq - s->isn;
    if (off >= s->nsent)
        return 0;
    *msg_id = s->sent_msg[off];
    *idx = s->sent_idx[off];
    return 1;
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

/* _emit: writes the datagram of (msg_id, idx) into ``out`` (HEADER_LEN + payload_len bytes). */
static int emit(Sender *s, uint32_t msg_id, uint32_t idx, double now, uint8_t *out) {
    uint32_t seq;
    if (next_seq(s, msg_id, idx, &seq) != 0)
        return -1;
    s->packets_sent++;
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = msg_id, .pkt_idx = (uint16_t)idx, .seq = seq, .deadline_us = ATP_NO_DEADLINE};
    if (msg_id == ANNOUNCE_MSG_ID || msg_id == FIN_MSG_ID) {
        s->ctl_head = (s->ctl_head + 1) % s->ctl_cap;
        s->ctl_len--;
        if (msg_id == ANNOUNCE_MSG_ID) {
            SentPkt p = {seq, msg_id, idx, (uint32_t)payload_len(s, msg_id, idx), -1, 0, now};
            if (on_packet_sent(s, &p) != 0)
                return -1;
            return announce_datagram(s, idx, seq, out);
        }
        double tt = tail_timeout(s);
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
        lost_popleft(m);
        s->retransmissions++;
        g->retransmissions++;
    } else {
        if (m->state == M_ACTIVE && (m->next_new == 0 || m->surplus)) {
            /* _surplus: the group reaches its required count without this message (what is on its way
               discounted by the group's measured loss) */
            if (s->adaptive && g->approx) {
                double est = 0.0;
                if (!est_value(s, g, &est))
                    est = 0.0;
                double on_the_way = (double)(g->started + g->repairing) * (1.0 - est);
                surplus = (double)g->delivered + on_the_way >= (double)g->required;
            }
            if (!surplus)
                g->started++;
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
    if (on_packet_sent(s, &p) != 0)
        return -1;
    h.flags = flags;
    h.group_id = (uint16_t)g->group_id;
    h.tlr = surplus ? ATP_TLR_ONE : atp_q15(g->tlr);
    h.pkt_cnt = (uint16_t)m->cnt;
    h.length = (uint16_t)plen;
    atp_encode(out, &h);
    if (plen)
        memcpy(out + ATP_HEADER_LEN, PyBytes_AS_STRING(m->data) + (Py_ssize_t)idx * s->max_payload, (size_t)plen);
    return 0;
}

static void start(Sender *s, double now) {
    s->started = 1;
    s->start_time = now;
    s->b_tokens = s->b_burst;
    s->b_stamp = now;
    s->epoch_end = now + epoch_length(s);
    s->last_progress = now;
}

/* --- acknowledgements and loss --------------------------------------------------------------------- */

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
        if (s->mrdf && (m->state == M_ACTIVE || m->state == M_REPAIRING))
            return sched_update(s, p->msg_id, m->remaining, m->state == M_REPAIRING, m->retries);
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
    sched_remove(s, p->msg_id);
    if (s->message_events) {
        static const char *const names[] = {"msg_id", "group_id", NULL};
        PyObject *vals[] = {PyLong_FromUnsignedLong(p->msg_id), PyLong_FromLongLong(g->group_id)};
        return push_event(s, make_frozen(R.MessageAcked, names, vals));
    }
    return 0;
}

/* _repair */
static int repair(Sender *s, Group *g, uint32_t msg_id) {
    Msg *m = &s->msgs[msg_id];
    m->state = M_REPAIRING;
    g->damaged--;
    g->repairing++;
    if (m->next_new < m->cnt)
        s->unsent_open++;
    return sched_update(s, msg_id, m->remaining, 1, m->retries);
}

/* _plan_repairs */
static int plan_repairs(Sender *s, Group *g) {
    while (g->damaged > g->budget && g->nidle) {
        uint32_t msg_id = g->idle[0].msg_id;
        HEAP_POP(g->idle, g->nidle, idle_less);
        if (s->msgs[msg_id].state == M_DAMAGED && repair(s, g, msg_id) != 0)
            return -1;
    }
    if (!(s->adaptive && s->mrdf))
        return 0;
    /* adaptive with MRDF: also repair a damaged message with less left than what would be served next */
    while (g->nidle) {
        uint32_t msg_id = g->idle[0].msg_id;
        Msg *m = &s->msgs[msg_id];
        if (m->state != M_DAMAGED) {
            HEAP_POP(g->idle, g->nidle, idle_less);
            continue;
        }
        int64_t top = sched_peek(s);
        if (top < 0 || !(m->remaining < s->msgs[top].remaining))
            return 0;
        HEAP_POP(g->idle, g->nidle, idle_less);
        if (repair(s, g, msg_id) != 0)
            return -1;
    }
    return 0;
}

/* _on_lost over ``lost`` */
static int on_lost(Sender *s, const SentPkt *lost, size_t n) {
    uint8_t touched_stack[64];
    uint8_t *touched = s->ngroups <= 64 ? touched_stack : calloc(s->ngroups, 1);
    if (touched == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(touched, 0, s->ngroups <= 64 ? sizeof touched_stack : 0);
    if (s->adaptive && n) {
        int any = 0;
        for (size_t i = 0; i < n; i++)
            if (lost[i].group_id >= 0) {
                touched[group_index(s, lost[i].group_id)] = 1;
                any = 1;
            }
        if (any)
            window_on_loss(s, touched);
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
            continue;
        *ps = P_LOST;
        if (lost_append(m, p->pkt_idx) != 0) {
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
            sched_remove(s, p->msg_id);
            IdleEntry e = {s->mrdf ? m->remaining : 0, p->msg_id};
            if (grow((void **)&g->idle, &g->idle_cap, g->nidle + 1, sizeof(IdleEntry)) != 0) {
                rc = -1;
                break;
            }
            HEAP_PUSH(g->idle, g->nidle, e, idle_less);
            touched[m->group] = 1;
        } else if (m->state == M_REPAIRING) {
            if (p->retx)
                m->retries++;
            rc = sched_update(s, p->msg_id, m->remaining, 1, m->retries);
        }
    }
    for (size_t i = 0; i < s->ngroups && rc == 0; i++)
        if (touched[i])
            rc = plan_repairs(s, &s->groups[i]);
    if (touched != touched_stack)
        free(touched);
    return rc;
}

/* --- epochs, completion, close ----------------------------------------------------------------------- */

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

static double next_tlr(Group *g) {
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
    double srtt = s->srtt, rate;
    if (s->adaptive) {
        double duration = epoch_length(s);
        if (duration > 0)
            s->w_delivery_rate_bps = s->w_epoch_acked_bits / duration;
        s->w_epoch_acked_bits = 0.0;
        double r = s->w_window * s->w_mean_packet_bits / (srtt > 1e-6 ? srtt : 1e-6);
        rate = s->max_rate_bps < r ? s->max_rate_bps : r;
    } else {
        ratectl_end_epoch(s, srtt);
        rate = s->rate_bps;
    }
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        g->tlr = next_tlr(g);
        double loss = counts_loss(g);
        if (s->adaptive) {
            double est;
            if (est_value(s, g, &est))
                loss = est;
        }
        PyObject *kw = Py_BuildValue(
            "{s:L,s:d,s:L,s:d,s:d,s:d,s:L,s:L,s:N,s:L}", "epoch", s->epoch, "time", now - s->start_time, "group_id",
            g->group_id, "tlr", g->tlr, "rate_bps", rate, "loss", loss, "sent", (long long)g->ep_sent, "acked",
            (long long)g->ep_acked, "queues", queues_dict(g), "ece", (long long)g->ece);
        if (kw == NULL)
            return -1;
        PyObject *ev = PyObject_Call(R.EpochEnded, R.empty_tuple, kw);
        Py_DECREF(kw);
        if (push_event(s, ev) != 0)
            return -1;
        memset(g->qcount, 0, sizeof g->qcount);
        g->nq = 0;
        g->ece = 0;
        g->report_seq++;
        double kbps = rate / 1000;
        long long rk = kbps >= 4294967295.0 ? 4294967295LL : (long long)kbps;
        kw = Py_BuildValue("{s:L,s:L,s:L,s:d,s:d,s:d,s:L,s:L,s:L,s:L,s:L}", "job_id", s->job_id, "group_id",
                           g->group_id, "seq", (long long)g->report_seq, "tlr", g->tlr, "loss", loss, "msr", g->msr,
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
        if (push_event(s, ev) != 0)
            return -1;
        g->ep_sent = g->ep_acked = g->ep_lost = 0;
    }
    s->epoch++;
    s->epoch_end = now + epoch_length(s);
    return 0;
}

static void queue_fin(Sender *s) {
    ctl_append(s, FIN_MSG_ID, 0);
    s->has_fin_next = 0;
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
    if (ctl_append(s, FIN_MSG_ID, 0) != 0)
        return -1;
    s->has_fin_next = 0;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
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
                                     (long long)(g->total - per[i]), "lost", (long long)per[i], "final_tlr", g->tlr,
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
    PyObject *lost_by = Py_BuildValue("{s:L,s:L,s:L}", "reorder", (long long)s->lost_reorder, "time",
                                      (long long)s->lost_time, "tail", (long long)s->lost_tail);
    PyObject *kw = lost_by == NULL ? NULL : Py_BuildValue(
        "{s:L,s:N,s:O,s:N,s:d,s:d,s:O,s:O,s:O,s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:N,s:L,s:N}", "job_id", s->job_id, "mode", mode,
        "mrdf", s->mrdf ? Py_True : Py_False, "completion", completion, "jct_s", completed - s->start_time, "closed_s",
        now - s->start_time, "receiver_confirmed", confirmed ? Py_True : Py_False, "groups", groups, "lost_ids",
        lost_ids, "packets_sent", s->packets_sent, "packets_acked", (long long)s->packets_acked, "packets_lost",
        (long long)s->packets_lost, "retransmissions", s->retransmissions, "epochs", s->epoch, "final_rate_bps",
        s->rate_bps, "srtt_s", s->srtt, "losses_found_by", lost_by, "packets_surplus", s->packets_surplus, "rejected",
        PyDict_Copy(s->rejected));
    if (kw == NULL)
        goto out;
    PyObject *summary = PyObject_Call(R.SendSummary, R.empty_tuple, kw);
    Py_DECREF(kw);
    if (summary == NULL)
        goto out;
    Py_XSETREF(s->summary, summary);
    s->state = S_DONE;
    Py_INCREF(summary);
    rc = push_event(s, PyObject_CallOneArg(R.JobCompleted, summary));
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
    return push_event(s, PyObject_CallOneArg(R.JobFailed, reason));
}

static int on_ack(Sender *s, const AtpHeader *h, const SackBlock *blocks, int nblocks, double now) {
    s->last_progress = now;
    if (h->msg_id == FIN_MSG_ID)
        return 0;
    int gi = group_index(s, h->group_id);
    if (h->msg_id != ANNOUNCE_MSG_ID)
        s->path_queue = h->queue;
    if (gi >= 0 && h->msg_id != ANNOUNCE_MSG_ID) {
        Group *g = &s->groups[gi];
        if (g->qcount[h->queue]++ == 0)
            g->qorder[g->nq++] = h->queue;
        if (h->flags & F_ECE)
            g->ece++;
    }
    size_t na, nl;
    if (recovery_on_ack(s, h->seq, blocks, nblocks, now, &na, &nl) != 0)
        return -1;
    if (s->state != S_SENDING) {
        for (size_t i = 0; i < na; i++)
            if (on_packet_acked(s, &s->acked_buf[i]) != 0)
                return -1;
        return 0;
    }
    if (s->adaptive)
        window_on_path(s, h->queue, s->min_rtt + s->pacing_train_s);
    for (size_t i = 0; i < na; i++) {
        if (on_packet_acked(s, &s->acked_buf[i]) != 0)
            return -1;
        if (s->adaptive && s->acked_buf[i].group_id >= 0)
            window_on_ack(s, s->acked_buf[i].seq);
    }
    /* lost_buf is reused by detect_lost: keep this ACK's losses apart while they are handled */
    if (grow((void **)&s->lost2_buf, &s->lost2_cap, nl, sizeof(SentPkt)) != 0)
        return -1;
    if (nl)
        memcpy(s->lost2_buf, s->lost_buf, nl * sizeof(SentPkt));
    if (on_lost(s, s->lost2_buf, nl) != 0)
        return -1;
    return check_complete(s, now);
}

static int on_done(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now) {
    if (s->state != S_CLOSING)
        return reject(s, "done_before_fin");
    uint32_t cm, ci;
    if (!carried(s, h->seq, &cm, &ci) || cm != FIN_MSG_ID || ci != 0)
        return reject(s, "done_unsent_seq");
    if (len < 4)
        return reject(s, "malformed");
    uint32_t n = get32(payload);
    if (len != 4 + 4 * (size_t)n)
        return reject(s, "malformed");
    if (s->done_cnt >= 0 && h->pkt_cnt != s->done_cnt)
        PyDict_Clear(s->done_parts);
    s->done_cnt = h->pkt_cnt;
    PyObject *ids = PyList_New(n);
    if (ids == NULL)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(get32(payload + 4 + 4 * i));
        if (v == NULL) {
            Py_DECREF(ids);
            return -1;
        }
        PyList_SET_ITEM(ids, i, v);
    }
    PyObject *key = PyLong_FromLong(h->pkt_idx);
    int rc = key == NULL ? -1 : PyDict_SetItem(s->done_parts, key, ids);
    Py_XDECREF(key);
    Py_DECREF(ids);
    if (rc != 0)
        return -1;
    if (PyDict_GET_SIZE(s->done_parts) != s->done_cnt)
        return 0;
    size_t total = 0;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(s->done_parts, &pos, &k, &v))
        total += (size_t)PyList_GET_SIZE(v);
    uint32_t *all = malloc((total ? total : 1) * sizeof(uint32_t));
    if (all == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t m = 0;
    pos = 0;
    while (PyDict_Next(s->done_parts, &pos, &k, &v))
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
            unsigned long id = PyLong_AsUnsignedLong(PyList_GET_ITEM(v, i));
            if (id < s->nmsgs)
                all[m++] = (uint32_t)id;
        }
    qsort(all, m, sizeof(uint32_t), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < m; i++)
        if (u == 0 || all[u - 1] != all[i])
            all[u++] = all[i];
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
        if (!(a <= b && b < s->nsent))
            return "ack_unsent_seq";
    }
    return NULL;
}

/* _on_retry: a token from the receiver */
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
        s->epoch_end = now + epoch_length(s);
        s->last_progress = now;
    }
    return 0;
}

/* receive_datagram on raw bytes; ``from_peer``: whether the source is the peer (the caller checks) */
static int receive(Sender *s, const uint8_t *data, size_t len, int from_peer, double now) {
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

/* _from_peer for a Python address: 1, 0, or -1 with a Python error */
static int from_peer_py(Sender *s, PyObject *addr) {
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

/* _from_peer for a socket address: the peer's address and port (an IPv6 flow label or scope never counts) */
static int from_peer_na(Sender *s, const NetAddr *na) {
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

/* the failure message when nothing is acknowledged (``admission``: not even a RETRY came) */
static PyObject *no_ack_reason(Sender *s, int admission) {
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
    return reason;
}

static int fail_no_ack(Sender *s, int admission) {
    PyObject *reason = no_ack_reason(s, admission);
    if (reason == NULL)
        return -1;
    int rc = fail(s, reason);
    Py_DECREF(reason);
    return rc;
}

static int handle_timer(Sender *s, double now) {
    if (!s->started)
        return 0;
    if (s->token == NULL && s->state == S_SENDING) {
        if (now >= s->last_progress + s->idle_timeout_s)
            return fail_no_ack(s, 1);
        return 0;
    }
    if (s->state == S_SENDING) {
        size_t n;
        if (recovery_detect_lost(s, now, &n) != 0)
            return -1;
        if (grow((void **)&s->lost2_buf, &s->lost2_cap, n, sizeof(SentPkt)) != 0)
            return -1;
        if (n)
            memcpy(s->lost2_buf, s->lost_buf, n * sizeof(SentPkt));
        if (on_lost(s, s->lost2_buf, n) != 0)
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
        if (s->has_fin_next && now >= s->fin_next)
            queue_fin(s);
    }
    return 0;
}

/* The next datagram datagrams_to_send would produce: its (msg_id, idx, length), or 0. */
static int next_datagram(Sender *s, uint32_t *msg_id, uint32_t *idx, size_t *len) {
    if (!peek(s, msg_id, idx))
        return 0;
    if (!window_open(s, *msg_id))
        return 0;
    Py_ssize_t plen = payload_len(s, *msg_id, *idx);
    double size = (double)(ATP_HEADER_LEN + plen + s->overhead);
    if (!bucket_can_send(s, size))
        return 0;
    s->b_tokens -= size;
    *len = (size_t)(ATP_HEADER_LEN + plen);
    return 1;
}

static inline double current_rate(Sender *s) { return s->rate_bps; }

/* _burst_bytes */
static double burst_bytes(Sender *s, double rate_bps) {
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

/* Where a produced datagram of ``len`` bytes goes (a bytes object in a list, or a send batch); NULL on error. */
typedef uint8_t *(*Room)(void *ctx, size_t len);

/* datagrams_to_send's loop: every datagram the sender may send now, each written where ``room`` says */
static int produce(Sender *s, double now, Room room, void *ctx) {
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
        double tt = tail_timeout(s);
        s->hello_next = now + (FIN_RETRY_MIN_S < tt ? tt : FIN_RETRY_MIN_S);
        uint8_t *buf = room(ctx, (size_t)(ATP_HEADER_LEN + payload_len(s, ANNOUNCE_MSG_ID, 0)));
        return buf == NULL ? -1 : announce_datagram(s, 0, seq, buf);
    }
    double rate = current_rate(s);
    s->b_burst = burst_bytes(s, rate);
    bucket_refill(s, rate, now);
    uint32_t msg_id, idx;
    size_t len;
    while (next_datagram(s, &msg_id, &idx, &len)) {
        uint8_t *buf = room(ctx, len);
        if (buf == NULL || emit(s, msg_id, idx, now, buf) != 0)
            return -1;
    }
    return 0;
}

/* ============================== Python type ============================== */

static void clear_events(Sender *s) {
    while (s->ev_len) {
        Py_DECREF(s->ev[s->ev_head]);
        s->ev_head = (s->ev_head + 1) % s->ev_cap;
        s->ev_len--;
    }
}

static void Sender_dealloc(Sender *s) {
    PyObject_GC_UnTrack(s);
    Py_CLEAR(s->job);
    Py_CLEAR(s->config);
    Py_CLEAR(s->peer);
    Py_CLEAR(s->summary);
    Py_CLEAR(s->failure);
    Py_CLEAR(s->done_parts);
    Py_CLEAR(s->rejected);
    Py_CLEAR(s->token);
    Py_CLEAR(s->admission_key);
    free(s->sent_msg);
    free(s->sent_idx);
    if (s->msgs) {
        for (size_t i = 0; i < s->nmsgs; i++) {
            Py_XDECREF(s->msgs[i].data);
            free(s->msgs[i].lost);
        }
        free(s->msgs);
    }
    if (s->groups) {
        for (size_t i = 0; i < s->ngroups; i++)
            free(s->groups[i].idle);
        free(s->groups);
    }
    if (s->announce) {
        for (size_t i = 0; i < s->nannounce; i++)
            Py_XDECREF(s->announce[i]);
        free(s->announce);
    }
    free(s->announce_acked);
    free(s->pkt_state);
    free(s->sched);
    free(s->ctl);
    pmap_free(&s->in_flight);
    pmap_free(&s->declared_lost);
    if (s->ev) {
        clear_events(s);
        free(s->ev);
    }
    free(s->acked_buf);
    free(s->late_buf);
    free(s->lost_buf);
    free(s->lost2_buf);
    batch_free(&s->batch);
    ring_free(&s->ring);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int Sender_traverse(Sender *s, visitproc visit, void *arg) {
    Py_VISIT(s->job);
    Py_VISIT(s->config);
    Py_VISIT(s->peer);
    Py_VISIT(s->summary);
    Py_VISIT(s->failure);
    Py_VISIT(s->done_parts);
    Py_VISIT(s->rejected);
    Py_VISIT(s->admission_key);
    for (size_t i = 0; i < s->ev_len; i++)
        Py_VISIT(s->ev[(s->ev_head + i) % s->ev_cap]);
    return 0;
}

static int config_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg != NULL) {
        PyErr_SetObject(R.ConfigError, msg);
        Py_DECREF(msg);
    }
    return -1;
}

/* The job announce (control.Manifest.encode), split into parts of at most max_payload bytes. */
static int build_announce(Sender *s, PyObject *vector_len) {
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
    /* size: head 14, per group 12 + 8 per range */
    size_t size = 14;
    for (size_t g = 0; g < ng; g++) {
        size_t ranges = 0;
        for (size_t k = start_at[g]; k < start_at[g + 1]; k++)
            if (k == start_at[g] || ids[k - 1] + 1 != ids[k])
                ranges++;
        size += 12 + 8 * ranges;
    }
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
        size_t ranges = 0;
        for (size_t k = start_at[g]; k < start_at[g + 1]; k++)
            if (k == start_at[g] || ids[k - 1] + 1 != ids[k])
                ranges++;
        put16(blob + off, (uint16_t)s->groups[g].group_id);
        put16(blob + off + 2, atp_q15(s->groups[g].msr));
        put32(blob + off + 4, (uint32_t)(start_at[g + 1] - start_at[g]));
        put32(blob + off + 8, (uint32_t)ranges);
        off += 12;
        for (size_t k = start_at[g]; k < start_at[g + 1]; k++) {
            if (k == start_at[g] || ids[k - 1] + 1 != ids[k]) {
                put32(blob + off, ids[k]);
                off += 4;
                size_t e = k;
                while (e + 1 < start_at[g + 1] && ids[e] + 1 == ids[e + 1])
                    e++;
                put32(blob + off, ids[e]);
                off += 4;
            }
        }
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

static int read_tags(PyObject *tags, Msg *m) {
    m->tagged = 0;
    m->has_deadline = 0;
    if (tags == Py_None)
        return 0;
    long long prio, weight;
    if (cfg_int(tags, "priority", &prio) != 0 || cfg_int(tags, "weight", &weight) != 0)
        return -1;
    double dl;
    int present;
    if (cfg_opt_double(tags, "deadline_s", &dl, &present) != 0)
        return -1;
    m->tagged = 1;
    m->priority = (uint8_t)prio;
    m->weight = (uint8_t)weight;
    m->has_deadline = (uint8_t)present;
    m->deadline_s = dl;
    return 0;
}

static int Sender_init(Sender *s, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"job", "config", "peer", "now", "message_events", "isn", NULL};
    PyObject *job, *config = NULL, *peer = Py_None, *isn = Py_None;
    double now;
    int message_events = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOdpO:AtpSender", kwlist, &job, &config, &peer, &now,
                                     &message_events, &isn))
        return -1;
    if (kwds == NULL || PyDict_GetItemString(kwds, "now") == NULL) {
        PyErr_SetString(PyExc_TypeError, "AtpSender() missing required keyword-only argument: 'now'");
        return -1;
    }
    if (s->job != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "AtpSender is already initialised");
        return -1;
    }
    if (config == NULL)
        config = R.default_config;
    Py_INCREF(job);
    s->job = job;
    Py_INCREF(config);
    s->config = config;
    Py_INCREF(peer);
    s->peer = peer;
    s->message_events = message_events;
    s->state = S_SENDING;
    s->start_time = now;
    s->done_cnt = -1;
    s->w_queue = -1;
    if (pmap_init(&s->in_flight) != 0 || pmap_init(&s->declared_lost) != 0 || batch_init(&s->batch) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    s->done_parts = PyDict_New();
    s->rejected = PyObject_CallNoArgs(R.Counter);
    if (s->done_parts == NULL || s->rejected == NULL)
        return -1;
    s->hello_next = now;
    /* config */
    PyObject *mode = PyObject_GetAttrString(config, "mode");
    if (mode == NULL)
        return -1;
    const char *ms = PyUnicode_AsUTF8(mode);
    if (ms == NULL) {
        Py_DECREF(mode);
        return -1;
    }
    s->mode = !strcmp(ms, "adaptive") ? MODE_ADAPTIVE : !strcmp(ms, "paper") ? MODE_PAPER
            : !strcmp(ms, "fixtlr") ? MODE_FIXTLR : !strcmp(ms, "base") ? MODE_BASE : -1;
    Py_DECREF(mode);
    if (s->mode < 0)
        return config_error("unknown mode");
    s->adaptive = s->mode == MODE_ADAPTIVE;
    PyObject *v = PyObject_GetAttrString(config, "mrdf");
    if (v == NULL)
        return -1;
    s->mrdf = PyObject_IsTrue(v);
    Py_DECREF(v);
    s->repairs_last = s->mode == MODE_BASE;
    v = PyObject_GetAttrString(config, "completion");
    if (v == NULL)
        return -1;
    s->completion_early = PyUnicode_CompareWithASCIIString(v, "all_sent") != 0;
    Py_DECREF(v);
    long long initial_window, max_window;
    double initial_rate;
    int has_initial_rate;
    if (cfg_double(config, "max_rate_bps", &s->max_rate_bps) || cfg_double(config, "gain", &s->gain) ||
        cfg_double(config, "initial_rtt_s", &s->initial_rtt_s) || cfg_double(config, "min_epoch_s", &s->min_epoch_s) ||
        cfg_opt_double(config, "epoch_s", &s->epoch_s, &s->has_epoch_s) ||
        cfg_double(config, "min_loss_timeout_s", &s->min_loss_timeout_s) ||
        cfg_double(config, "idle_timeout_s", &s->idle_timeout_s) ||
        cfg_double(config, "fin_timeout_s", &s->fin_timeout_s) ||
        cfg_opt_double(config, "initial_rate_bps", &initial_rate, &has_initial_rate) ||
        cfg_int(config, "max_payload", &s->max_payload) || cfg_int(config, "overhead_bytes", &s->overhead) ||
        cfg_int(config, "packet_size", &s->packet_size) ||
        cfg_int(config, "reorder_threshold", &s->reorder_threshold) ||
        cfg_int(config, "loss_memory", &s->loss_memory) || cfg_int(config, "loss_min_samples", &s->min_samples) ||
        cfg_int(config, "initial_window", &initial_window) || cfg_int(config, "max_window", &max_window) ||
        cfg_int(config, "burst_packets", &s->burst_packets) ||
        cfg_double(config, "pacing_train_s", &s->pacing_train_s) ||
        cfg_double(config, "pacing_gain", &s->pacing_gain))
        return -1;
    s->path_queue = -1;
    PyObject *qp = PyObject_GetAttrString(config, "queue_packets");
    if (qp == NULL)
        return -1;
    for (int i = 0; i < 8; i++) {
        PyObject *item = PySequence_GetItem(qp, i);
        if (item == NULL) {
            Py_DECREF(qp);
            return -1;
        }
        s->queue_packets[i] = (int)PyLong_AsLong(item);
        Py_DECREF(item);
    }
    Py_DECREF(qp);
    PyObject *job_id = PyObject_GetAttrString(job, "job_id");
    if (job_id == NULL)
        return -1;
    s->job_id = PyLong_AsLongLong(job_id);
    Py_DECREF(job_id);
    PyObject *vector_len = PyObject_GetAttrString(job, "vector_len");
    PyObject *messages = vector_len == NULL ? NULL : PyObject_GetAttrString(job, "messages");
    PyObject *job_tags = messages == NULL ? NULL : PyObject_GetAttrString(job, "tags");
    PyObject *fast = job_tags == NULL ? NULL : PySequence_Fast(messages, "job.messages must be a sequence");
    int rc = -1;
    PyObject *sizes = NULL;
    if (fast == NULL)
        goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    long long mp = s->max_payload;
    s->nmsgs = (size_t)n;
    s->msgs = calloc(n ? (size_t)n : 1, sizeof(Msg));
    if (s->msgs == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    /* groups: sorted ids of job.group_sizes() */
    sizes = PyObject_CallMethod(job, "group_sizes", NULL);
    if (sizes == NULL)
        goto out;
    PyObject *gids = PyDict_Keys(sizes);
    if (gids == NULL || PyList_Sort(gids) != 0) {
        Py_XDECREF(gids);
        goto out;
    }
    s->ngroups = (size_t)PyList_GET_SIZE(gids);
    s->groups = calloc(s->ngroups ? s->ngroups : 1, sizeof(Group));
    if (s->groups == NULL) {
        Py_DECREF(gids);
        PyErr_NoMemory();
        goto out;
    }
    int fixed = s->mode == MODE_FIXTLR || s->mode == MODE_BASE;
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        PyObject *gid = PyList_GET_ITEM(gids, (Py_ssize_t)i);
        g->group_id = PyLong_AsLongLong(gid);
        PyObject *total = PyDict_GetItem(sizes, gid);
        g->total = PyLong_AsLongLong(total);
        PyObject *msr = PyObject_CallMethod(job, "msr_of", "O", gid);
        if (msr == NULL) {
            Py_DECREF(gids);
            goto out;
        }
        g->msr = PyFloat_AsDouble(msr);
        PyObject *req = PyObject_CallFunctionObjArgs(R.required_messages, msr, total, NULL);
        Py_DECREF(msr);
        if (req == NULL) {
            Py_DECREF(gids);
            goto out;
        }
        g->required = PyLong_AsLongLong(req);
        Py_DECREF(req);
        g->budget = g->total - g->required;
        g->approx = g->msr < 1.0;
        g->fixed_tlr = fixed;
        g->tlr = 1.0 - g->msr;
        g->active = g->total;
    }
    Py_DECREF(gids);
    uint64_t total_pkts = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(fast, i);
        Msg *m = &s->msgs[i];
        PyObject *data = PyObject_GetAttrString(msg, "data");
        if (data == NULL)
            goto out;
        if (PyBytes_CheckExact(data)) {
            m->data = data;
        } else {
            m->data = PyBytes_FromObject(data);
            Py_DECREF(data);
            if (m->data == NULL)
                goto out;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(m->data);
        if (vector_len != Py_None && len > mp) {
            config_error("vector message %zd has %zd bytes but one packet carries %lld: build the job with "
                         "floats_per_message <= %lld", i, len, mp, mp - 8 >= 0 ? (mp - 8) / 4 : 0LL);
            goto out;
        }
        if (len > 0xFFFF * mp) {
            config_error("message %zd of %zd bytes needs more than 65535 packets", i, len);
            goto out;
        }
        long long gid;
        if (cfg_int(msg, "group_id", &gid) != 0)
            goto out;
        int gi = group_index(s, gid);
        m->group = (uint32_t)gi;
        long long cnt = (len + mp - 1) / mp;
        m->cnt = (uint32_t)(cnt < 1 ? 1 : cnt);
        m->remaining = len;
        m->state = M_ACTIVE;
        m->pkt_base = total_pkts;
        total_pkts += m->cnt;
        PyObject *tags = PyObject_GetAttrString(msg, "tags");
        if (tags == NULL)
            goto out;
        int truthy = PyObject_IsTrue(tags);
        rc = read_tags(truthy ? tags : job_tags, m);
        Py_DECREF(tags);
        if (truthy < 0 || rc != 0) {
            rc = -1;
            goto out;
        }
        rc = -1;
    }
    s->pkt_state = calloc(total_pkts ? total_pkts : 1, 1);
    if (s->pkt_state == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < s->nmsgs; i++)
        if (sched_update(s, (uint32_t)i, s->msgs[i].remaining, 0, 0) != 0)
            goto out;
    s->unsent_open = (int64_t)s->nmsgs;
    long long wire_max = s->packet_size + s->overhead;
    s->packet_bits = (double)(wire_max * 8);
    if (s->adaptive) {
        s->rate_bps = s->pacing_gain * s->max_rate_bps;
        s->w_header_bytes = ATP_HEADER_LEN + s->overhead;
        s->w_mean_packet_bits = s->packet_bits;
        s->w_window = (double)(initial_window < max_window ? initial_window : max_window);
        s->w_max_window = (double)max_window;
        s->w_min_window = 1.0;
        s->w_cap = (double)max_window;
        s->w_rtt = INFINITY;
        s->w_slow_start = 1;
        s->w_recover_until = -1;
        s->w_largest_acked = -1;
    } else {
        double initial = has_initial_rate && initial_rate != 0.0 ? initial_rate : s->max_rate_bps;
        s->rate_bps = s->mode == MODE_BASE ? s->max_rate_bps : initial;
    }
    s->srtt = s->initial_rtt_s;
    s->rttvar = s->initial_rtt_s / 2;
    s->latest_rtt = s->initial_rtt_s;
    s->min_rtt = INFINITY;
    s->largest_acked = -1;
    s->b_burst = burst_bytes(s, s->rate_bps);
    s->b_tokens = s->b_burst;
    s->b_stamp = now;
    s->epoch_end = now + epoch_length(s);
    s->last_progress = now;
    if (build_announce(s, vector_len) != 0)
        goto out;
    /* the first sequence number: random below 2^31 (secrets.randbelow, as the reference), or the caller's */
    PyObject *v_isn = isn;
    if (isn == Py_None)
        v_isn = PyObject_CallFunction(R.randbelow, "k", 1UL << 31);
    else
        Py_INCREF(v_isn);
    if (v_isn == NULL)
        goto out;
    unsigned long long n_isn = PyLong_AsUnsignedLongLong(v_isn);
    Py_DECREF(v_isn);
    if (PyErr_Occurred())
        goto out;
    if (n_isn > 0xFFFFFFFFULL) {
        config_error("isn %llu: must be 0..4294967295", n_isn);
        goto out;
    }
    s->isn = s->seq = (uint32_t)n_isn;
    s->admission_key = PyObject_GetAttrString(config, "admission_key");
    if (s->admission_key == NULL)
        goto out;
    rc = 0;
out:
    Py_XDECREF(sizes);
    Py_XDECREF(fast);
    Py_XDECREF(job_tags);
    Py_XDECREF(messages);
    Py_XDECREF(vector_len);
    return rc;
}

/* --- methods ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject *list, *peer;
} ListRoom;

static uint8_t *list_room(void *ctx, size_t len) {
    ListRoom *r = ctx;
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    PyObject *t = b == NULL ? NULL : PyTuple_Pack(2, b, r->peer);
    Py_XDECREF(b); /* the tuple holds it */
    if (t == NULL || PyList_Append(r->list, t) != 0) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_DECREF(t);
    return (uint8_t *)PyBytes_AS_STRING(b);
}

static PyObject *Sender_datagrams_to_send(Sender *s, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    ListRoom r = {PyList_New(0), s->peer};
    if (r.list == NULL)
        return NULL;
    if (produce(s, now, list_room, &r) != 0) {
        Py_DECREF(r.list);
        return NULL;
    }
    return r.list;
}

/* get_timer: 0 and *t, or 1 for None */
static int timer_at(Sender *s, double *out) {
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
        if (loss_deadline(s, &x) && x < t)
            t = x;
        uint32_t msg_id, idx;
        if (peek(s, &msg_id, &idx) && window_open(s, msg_id)) {
            double size = (double)(ATP_HEADER_LEN + payload_len(s, msg_id, idx) + s->overhead);
            x = bucket_ready_at(s, size, current_rate(s));
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
        if (s->ctl_len) {
            double x = bucket_ready_at(s, (double)(ATP_HEADER_LEN + s->overhead), current_rate(s));
            if (x < t)
                t = x;
        }
        *out = t;
        return 0;
    }
    return 1;
}

static PyObject *Sender_get_timer(Sender *s, PyObject *unused) {
    double t;
    if (timer_at(s, &t) != 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

static PyObject *Sender_handle_timer(Sender *s, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (handle_timer(s, now) != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Sender_receive_datagram(Sender *s, PyObject *args) {
    Py_buffer data;
    PyObject *addr;
    double now;
    if (!PyArg_ParseTuple(args, "y*Od:receive_datagram", &data, &addr, &now))
        return NULL;
    int from_peer = from_peer_py(s, addr);
    int rc = from_peer < 0 ? -1 : receive(s, data.buf, (size_t)data.len, from_peer, now);
    PyBuffer_Release(&data);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Sender_next_event(Sender *s, PyObject *unused) {
    if (!s->ev_len)
        Py_RETURN_NONE;
    PyObject *ev = s->ev[s->ev_head];
    s->ev_head = (s->ev_head + 1) % s->ev_cap;
    s->ev_len--;
    return ev;
}

static Group *group_arg(Sender *s, PyObject *arg) {
    long long gid = PyLong_AsLongLong(arg);
    if (gid == -1 && PyErr_Occurred())
        return NULL;
    int gi = group_index(s, gid);
    if (gi < 0) {
        PyErr_SetObject(PyExc_KeyError, arg);
        return NULL;
    }
    return &s->groups[gi];
}

static PyObject *Sender_tlr(Sender *s, PyObject *arg) {
    Group *g = group_arg(s, arg);
    return g == NULL ? NULL : PyFloat_FromDouble(g->tlr);
}

static PyObject *Sender_delivered(Sender *s, PyObject *arg) {
    Group *g = group_arg(s, arg);
    return g == NULL ? NULL : PyLong_FromLongLong(g->delivered);
}

/* --- socket fast path ---------------------------------------------------------------------------------- */

/* transmit: what datagrams_to_send(now) would return, straight to the socket; -1 with a Python error */
typedef struct {
    SendBatch *batch;
    int32_t dst;
} BatchRoom;

static uint8_t *batch_room(void *ctx, size_t len) {
    BatchRoom *r = ctx;
    uint8_t *p = batch_add(r->batch, (uint32_t)len, r->dst);
    if (p == NULL)
        PyErr_NoMemory();
    return p;
}

/* transmit: what datagrams_to_send(now) would return, straight to the socket; -1 with a Python error */
static Py_ssize_t transmit(Sender *s, int fd, double now) {
    if (!s->peer_ok) {
        if (addr_from_py(s->peer, &s->peer_addr) != 0)
            return -1;
        s->peer_ok = 1;
    }
    batch_clear(&s->batch);
    BatchRoom r = {&s->batch, batch_addr(&s->batch, &s->peer_addr)};
    if (r.dst < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (produce(s, now, batch_room, &r) != 0)
        return -1;
    return s->batch.n == 0 ? 0 : batch_flush(&s->batch, fd);
}

static PyObject *Sender_transmit(Sender *s, PyObject *args) {
    int fd;
    double now;
    if (!PyArg_ParseTuple(args, "id:transmit", &fd, &now))
        return NULL;
    Py_ssize_t sent = transmit(s, fd, now);
    return sent < 0 ? NULL : PyLong_FromSsize_t(sent);
}

static int sender_sink(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now) {
    Sender *s = core;
    return receive(s, data, len, from_peer_na(s, src), now);
}

static Py_ssize_t receive_from(Sender *s, int fd, double now) {
    return ring_receive(&s->ring, fd, s, sender_sink, now, 16);
}

static PyObject *Sender_receive_from(Sender *s, PyObject *args) {
    int fd;
    double now;
    if (!PyArg_ParseTuple(args, "id:receive_from", &fd, &now))
        return NULL;
    Py_ssize_t n = receive_from(s, fd, now);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

/* run: hostlib.api.send_job's loop in C, until an event is queued, the job is over, or ``until`` (monotonic) */
static PyObject *Sender_run(Sender *s, PyObject *args) {
    int fd;
    double until;
    if (!PyArg_ParseTuple(args, "id:run", &fd, &until))
        return NULL;
    for (;;) {
        double now = monotonic_now();
        if (transmit(s, fd, now) < 0)
            return NULL;
        if (s->ev_len || s->state == S_DONE || s->state == S_FAILED || now >= until)
            break;
        double t;
        int none = timer_at(s, &t);
        double wake = none || until < t ? until : t;
        /* pacing in trains: never wake sooner than a quantum after this wake-up (half the pacing train, at most
         * 200 µs), so that one wake-up sends what a quantum's worth of tokens allows (the bucket keeps the rest of
         * the train for lateness); nothing the core waits for is that urgent (loss timers >= 5 ms, epochs >= 2 ms) */
        double quantum = s->pacing_train_s / 2 < 200e-6 ? s->pacing_train_s / 2 : 200e-6;
        if (wake < now + quantum && now + quantum < until)
            wake = now + quantum;
        /* the next packet is due soon: sleep through arriving ACKs and read them in one batch afterwards */
        if (wait_fd(fd, wake, now, SHORT_WAIT_S) != 0)
            return NULL;
        now = monotonic_now();
        Py_ssize_t got = receive_from(s, fd, now);
        if (got < 0)
            return NULL;
        if (got > 0)
            none = timer_at(s, &t);
        if (!none && t <= now && handle_timer(s, now) != 0)
            return NULL;
        if (s->ev_len)
            break;
    }
    return PyLong_FromSize_t(s->ev_len);
}

static PyMethodDef Sender_methods[] = {
    {"run", (PyCFunction)Sender_run, METH_VARARGS,
     "run(fd, until) -> events: transmit, wait (1 ns timer slack: precise_timers), receive_from and handle_timer on "
     "the UDP socket fd until an event is queued, the job is over, or time.monotonic() reaches until. The GIL is "
     "released while it waits."},
    {"datagrams_to_send", (PyCFunction)Sender_datagrams_to_send, METH_O,
     "Datagrams the pacer allows now, as [(bytes, peer)]."},
    {"get_timer", (PyCFunction)Sender_get_timer, METH_NOARGS, "The next time handle_timer must run, or None."},
    {"handle_timer", (PyCFunction)Sender_handle_timer, METH_O, "handle_timer(now)"},
    {"receive_datagram", (PyCFunction)Sender_receive_datagram, METH_VARARGS, "receive_datagram(data, addr, now)"},
    {"next_event", (PyCFunction)Sender_next_event, METH_NOARGS, "The next event, or None."},
    {"tlr", (PyCFunction)Sender_tlr, METH_O, "tlr(group_id): the group's current TLR."},
    {"delivered", (PyCFunction)Sender_delivered, METH_O, "delivered(group_id): messages fully acknowledged."},
    {"transmit", (PyCFunction)Sender_transmit, METH_VARARGS,
     "transmit(fd, now) -> sent: what datagrams_to_send(now) returns, written straight to the UDP socket fd "
     "(GSO / sendmmsg)."},
    {"receive_from", (PyCFunction)Sender_receive_from, METH_VARARGS,
     "receive_from(fd, now) -> n: read every datagram the socket holds (recvmmsg, GRO) into receive_datagram."},
    {NULL, NULL, 0, NULL},
};

static PyObject *get_state(Sender *s, void *c) {
    PyObject *st = s->state == S_SENDING ? R.st_sending : s->state == S_CLOSING ? R.st_closing
                 : s->state == S_DONE ? R.st_done : R.st_failed;
    Py_INCREF(st);
    return st;
}

static PyObject *get_obj(PyObject *o) {
    if (o == NULL)
        Py_RETURN_NONE;
    Py_INCREF(o);
    return o;
}

static PyObject *get_job(Sender *s, void *c) { return get_obj(s->job); }
static PyObject *get_config(Sender *s, void *c) { return get_obj(s->config); }
static PyObject *get_peer(Sender *s, void *c) { return get_obj(s->peer); }
static PyObject *get_summary(Sender *s, void *c) { return get_obj(s->summary); }
static PyObject *get_failure(Sender *s, void *c) { return get_obj(s->failure); }
static PyObject *get_done(Sender *s, void *c) { return PyBool_FromLong(s->state == S_DONE || s->state == S_FAILED); }
static PyObject *get_adaptive(Sender *s, void *c) { return PyBool_FromLong(s->adaptive); }
static PyObject *get_start_time(Sender *s, void *c) { return PyFloat_FromDouble(s->start_time); }
static PyObject *get_epoch(Sender *s, void *c) { return PyLong_FromLongLong(s->epoch); }
static PyObject *get_packets_sent(Sender *s, void *c) { return PyLong_FromLongLong(s->packets_sent); }
static PyObject *get_retransmissions(Sender *s, void *c) { return PyLong_FromLongLong(s->retransmissions); }
static PyObject *get_ignored(Sender *s, void *c) {
    Py_ssize_t pos = 0, total = 0;
    PyObject *k, *v;
    while (PyDict_Next(s->rejected, &pos, &k, &v))
        total += PyLong_AsSsize_t(v);
    return PyLong_FromSsize_t(total);
}
static PyObject *get_rejected(Sender *s, void *c) { return get_obj(s->rejected); }
static PyObject *get_srtt(Sender *s, void *c) { return PyFloat_FromDouble(s->srtt); }
static PyObject *get_rate(Sender *s, void *c) { return PyFloat_FromDouble(s->rate_bps); }
static PyObject *get_in_flight(Sender *s, void *c) { return PyLong_FromSsize_t(s->in_flight.len); }

static PyObject *ns(PyObject *kw) {
    if (kw == NULL)
        return NULL;
    PyObject *o = PyObject_Call(R.SimpleNamespace, R.empty_tuple, kw);
    Py_DECREF(kw);
    return o;
}

/* read-only snapshots of the Python sender's ``window``, ``rate`` and ``recovery`` objects (their scalar state) */
static PyObject *get_window(Sender *s, void *c) {
    if (!s->adaptive)
        Py_RETURN_NONE;
    return ns(Py_BuildValue("{s:d,s:d,s:d,s:d,s:O,s:O,s:L,s:L,s:L,s:d,s:d,s:d}", "window", s->w_window, "cap",
                            s->w_cap, "max_window", s->w_max_window, "min_window", s->w_min_window, "cap_known",
                            s->w_cap_known ? Py_True : Py_False, "slow_start", s->w_slow_start ? Py_True : Py_False,
                            "cuts", (long long)s->w_cuts, "recover_until", (long long)s->w_recover_until,
                            "largest_acked", (long long)s->w_largest_acked, "rate_bps", s->rate_bps,
                            "mean_packet_bits", s->w_mean_packet_bits, "delivery_rate_bps", s->w_delivery_rate_bps));
}

static PyObject *get_rate_ns(Sender *s, void *c) {
    return ns(Py_BuildValue("{s:d,s:d}", "rate_bps", s->rate_bps, "max_rate_bps", s->max_rate_bps));
}

static PyObject *get_recovery(Sender *s, void *c) {
    return ns(Py_BuildValue("{s:d,s:d,s:d,s:d,s:O,s:L,s:L,s:L,s:L,s:n,s:{s:L,s:L,s:L}}", "srtt", s->srtt, "rttvar",
                            s->rttvar, "latest_rtt", s->latest_rtt, "min_rtt", s->min_rtt, "has_rtt_sample",
                            s->has_rtt_sample ? Py_True : Py_False, "largest_acked", (long long)s->largest_acked,
                            "packets_acked", (long long)s->packets_acked, "packets_lost", (long long)s->packets_lost,
                            "late_acks", (long long)s->late_acks, "packets_in_flight", s->in_flight.len, "lost_by",
                            "reorder", (long long)s->lost_reorder, "time", (long long)s->lost_time, "tail",
                            (long long)s->lost_tail));
}

static PyObject *get_surplus(Sender *s, void *c) { return PyLong_FromLongLong(s->packets_surplus); }

static PyGetSetDef Sender_getset[] = {
    {"window", (getter)get_window, NULL, "adaptive: a snapshot of the window controller's state, else None.", NULL},
    {"rate", (getter)get_rate_ns, NULL, "A snapshot of the pacing rate (rate_bps).", NULL},
    {"recovery", (getter)get_recovery, NULL, "A snapshot of the loss recovery's state (RTT, counts).", NULL},
    {"packets_surplus", (getter)get_surplus, NULL, "Packets sent as surplus.", NULL},
    {"job", (getter)get_job, NULL, "The JobSpec.", NULL},
    {"config", (getter)get_config, NULL, "The AtpConfig.", NULL},
    {"peer", (getter)get_peer, NULL, "The receiver address returned with every datagram.", NULL},
    {"state", (getter)get_state, NULL, "hostlib.sender.SenderState", NULL},
    {"summary", (getter)get_summary, NULL, "SendSummary once the job is done, else None.", NULL},
    {"failure", (getter)get_failure, NULL, "Why the sender gave up, or None.", NULL},
    {"done", (getter)get_done, NULL, "DONE or FAILED.", NULL},
    {"adaptive", (getter)get_adaptive, NULL, "mode == 'adaptive'.", NULL},
    {"start_time", (getter)get_start_time, NULL, "When the job's clock started.", NULL},
    {"epoch", (getter)get_epoch, NULL, "Epochs ended so far.", NULL},
    {"packets_sent", (getter)get_packets_sent, NULL, NULL, NULL},
    {"retransmissions", (getter)get_retransmissions, NULL, NULL, NULL},
    {"datagrams_ignored", (getter)get_ignored, NULL, "sum(rejected.values()).", NULL},
    {"rejected", (getter)get_rejected, NULL, "collections.Counter of datagrams ignored, by reason.", NULL},
    {"srtt_s", (getter)get_srtt, NULL, "Smoothed RTT (recovery.srtt).", NULL},
    {"rate_bps", (getter)get_rate, NULL, "Pacing rate (rate.rate_bps).", NULL},
    {"packets_in_flight", (getter)get_in_flight, NULL, "len(recovery.in_flight).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "netapprox.hostlib._native.AtpSender",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "AtpSender(job, *, config=AtpConfig(), peer=None, now, message_events=True): the C implementation "
              "of hostlib.sender.AtpSender.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_traverse = (traverseproc)Sender_traverse,
    .tp_methods = Sender_methods,
    .tp_getset = Sender_getset,
};
