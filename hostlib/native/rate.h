/* How fast the sender sends (hostlib/rate.py): the ``paper`` rate control (RateController, eq. 2/3), the
 * ``adaptive`` window (WindowController with its per-group LossEstimate), the per-group EpochCounts both keep,
 * and the pacing TokenBucket. The loss recovery tells it about packets through the rate_on_* hooks (its
 * listener); groups are addressed by id there and by index (ascending ids) everywhere else. */
#ifndef NETAPPROX_RATE_H
#define NETAPPROX_RATE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t sent, acked, lost;
} EpochCounts;

typedef struct {
    int present; /* the group has had a packet's fate counted (rate.py creates the estimate then) */
    double acked, lost;
} LossEstimate;

typedef struct {
    int adaptive; /* a WindowController; else a RateController */
    int fixed;    /* RateController(fixed=True): ``base`` mode, the rate stays at R_max */
    double max_rate_bps, gain, packet_bits;
    double rate_bps; /* the pacing rate */
    /* per group, by index; ``gids`` ascending */
    size_t ngroups;
    long long *gids;
    EpochCounts *epoch;
    LossEstimate *loss;
    long long loss_memory, min_samples;
    /* WindowController */
    double mean_packet_bits, window, max_window, min_window, cap, rtt, epoch_acked_bits, delivery_rate_bps;
    long long header_bytes;
    int cap_known, queue, slow_start;
    int64_t recover_until, largest_acked, cuts;
    int queue_packets[8];
} RateCtl;

/* The groups ``gids`` (ascending, copied): 0, or -1 with MemoryError set. The caller then sets the fields of
 * its controller as rate.py's constructors do. */
int rate_init(RateCtl *rc, const long long *gids, size_t ngroups);
void rate_free(RateCtl *rc);
/* Index of group ``gid``, -1 if the sender has no such group. */
int rate_group_index(const RateCtl *rc, long long gid);

/* LossRecovery's listener hooks (gid -1: a packet rate control does not count) */
void rate_on_sent(RateCtl *rc, int32_t gid, uint32_t size);
void rate_on_acked(RateCtl *rc, int32_t gid, uint32_t size, int late);
void rate_on_lost(RateCtl *rc, int32_t gid);

/* EpochCounts.loss */
static inline double counts_loss(const EpochCounts *c) {
    int64_t known = c->acked + c->lost;
    return known ? (double)c->lost / (double)known : 0.0;
}
/* WindowController.loss_rate of group index ``gi``: 1 and *out, or 0 for None. */
int rate_loss_estimate(const RateCtl *rc, size_t gi, double *out);
/* The epoch's counts start again (end_epoch's reset, after the sender has read them). */
void rate_reset_epoch(RateCtl *rc);

/* RateController.end_epoch with ``tlr`` by group index (the counts are read before rate_reset_epoch). */
void ratectl_end_epoch(RateCtl *rc, const double *tlr, double rtt_s);
/* WindowController.on_path, on_ack, on_loss (``touched``: group indexes with needed packets lost; ``first``: all
 * of them in the first window), end_epoch */
void window_on_path(RateCtl *rc, int queue, double rtt);
void window_on_ack(RateCtl *rc, int64_t seq, double delivery);
/* ``queued``: the path shows a queue (recovery_queued), a loss without one cuts nothing; ``drain``: the cut keeps
 * at least this share of the window (recovery_drain) */
void window_on_loss(RateCtl *rc, const uint8_t *touched, const double *tlr, int64_t next_seq, int first,
                    int queued, double drain);
void window_end_epoch(RateCtl *rc, double duration_s);

/* TokenBucket */
typedef struct {
    double burst, tokens, stamp;
} TokenBucket;

static inline void bucket_refill(TokenBucket *b, double rate_bps, double now) {
    if (now > b->stamp) {
        double t = b->tokens + (now - b->stamp) * rate_bps / 8;
        b->tokens = b->burst < t ? b->burst : t;
        b->stamp = now;
    }
}

static inline int bucket_can_send(const TokenBucket *b, double size) { return b->tokens >= size - 1e-6; }

static inline double bucket_ready_at(const TokenBucket *b, double size, double rate_bps) {
    double missing = size - b->tokens;
    if (missing <= 0)
        return b->stamp;
    return b->stamp + missing * 8 / rate_bps;
}

#endif
