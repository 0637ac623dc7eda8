/* Rate control, the adaptive window and pacing (rate.h; hostlib/rate.py is the specification: the same floating
 * point expressions in the same order). */
#include <Python.h>
#include <math.h>
#include <string.h>

#include "rate.h"

int rate_init(RateCtl *rc, const long long *gids, size_t ngroups) {
    size_t n = ngroups ? ngroups : 1;
    rc->ngroups = ngroups;
    rc->gids = malloc(n * sizeof(long long));
    rc->epoch = calloc(n, sizeof(EpochCounts));
    rc->loss = calloc(n, sizeof(LossEstimate));
    if (rc->gids == NULL || rc->epoch == NULL || rc->loss == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (ngroups)
        memcpy(rc->gids, gids, ngroups * sizeof(long long));
    return 0;
}

void rate_free(RateCtl *rc) {
    free(rc->gids);
    free(rc->epoch);
    free(rc->loss);
    rc->gids = NULL;
    rc->epoch = NULL;
    rc->loss = NULL;
}

int rate_group_index(const RateCtl *rc, long long gid) {
    size_t lo = 0, hi = rc->ngroups;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rc->gids[mid] < gid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < rc->ngroups && rc->gids[lo] == gid) ? (int)lo : -1;
}

/* --- LossEstimate ------------------------------------------------------------------------------------------ */

static void est_on_acked(const RateCtl *rc, LossEstimate *e, int late) {
    if (late && e->lost >= 1.0)
        e->lost -= 1.0;
    e->acked += 1.0;
    if (e->acked + e->lost > (double)rc->loss_memory) {
        e->acked *= 0.5;
        e->lost *= 0.5;
    }
}

static void est_on_lost(const RateCtl *rc, LossEstimate *e) {
    e->lost += 1.0;
    if (e->acked + e->lost > (double)rc->loss_memory) {
        e->acked *= 0.5;
        e->lost *= 0.5;
    }
}

int rate_loss_estimate(const RateCtl *rc, size_t gi, double *out) {
    const LossEstimate *e = &rc->loss[gi];
    if (!e->present)
        return 0;
    double n = e->acked + e->lost;
    if (!(n >= (double)rc->min_samples))
        return 0;
    *out = e->lost / n;
    return 1;
}

/* --- the listener hooks --------------------------------------------------------------------------------------- */

void rate_on_sent(RateCtl *rc, int32_t gid, uint32_t size) {
    if (gid < 0)
        return;
    rc->epoch[rate_group_index(rc, gid)].sent++;
    if (rc->adaptive) /* typical wire size of a data packet, for the BDP in packets */
        rc->mean_packet_bits += 0.05 * ((double)(((long long)size + rc->header_bytes) * 8) - rc->mean_packet_bits);
}

void rate_on_acked(RateCtl *rc, int32_t gid, uint32_t size, int late) {
    if (gid < 0)
        return;
    int gi = rate_group_index(rc, gid);
    rc->epoch[gi].acked++;
    if (rc->adaptive) {
        rc->loss[gi].present = 1;
        est_on_acked(rc, &rc->loss[gi], late);
        rc->epoch_acked_bits += (double)(((long long)size + rc->header_bytes) * 8);
    }
}

void rate_on_lost(RateCtl *rc, int32_t gid) {
    if (gid < 0)
        return;
    int gi = rate_group_index(rc, gid);
    rc->epoch[gi].lost++;
    if (rc->adaptive) {
        rc->loss[gi].present = 1;
        est_on_lost(rc, &rc->loss[gi]);
    }
}

void rate_reset_epoch(RateCtl *rc) { memset(rc->epoch, 0, rc->ngroups * sizeof(EpochCounts)); }

/* --- RateController ------------------------------------------------------------------------------------------- */

void ratectl_end_epoch(RateCtl *rc, const double *tlr, double rtt_s) {
    if (rc->fixed)
        return;
    int any_active = 0, have_over = 0;
    double worst = 0.0;
    for (size_t i = 0; i < rc->ngroups; i++) {
        const EpochCounts *c = &rc->epoch[i];
        if (c->sent <= 0)
            continue;
        any_active = 1;
        double loss = counts_loss(c);
        /* ρ < TLR with a tolerance, so that 1 - 9/10 counts as equal to a TLR of 0.1 */
        if (!(loss == 0.0 || loss < tlr[i] - 1e-9)) {
            if (!have_over || loss > worst)
                worst = loss;
            have_over = 1;
        }
    }
    if (any_active) {
        if (!have_over)
            rc->rate_bps = (1 - rc->gain) * rc->rate_bps + rc->gain * rc->max_rate_bps;
        else
            rc->rate_bps = rc->rate_bps * (1 - worst / 2);
    }
    double rmin = rc->packet_bits / rtt_s; /* R_min: one packet per RTT */
    if (!(rmin < rc->max_rate_bps))
        rmin = rc->max_rate_bps;
    double r = rc->rate_bps;
    if (rmin > r)
        r = rmin;
    rc->rate_bps = rc->max_rate_bps < r ? rc->max_rate_bps : r;
}

/* --- WindowController ----------------------------------------------------------------------------------------- */

void window_on_path(RateCtl *rc, int queue, double rtt) {
    rc->queue = queue;
    rc->rtt = rtt;
    int size = queue < 8 ? rc->queue_packets[queue] : 0;
    if (size > 0) {
        double bdp = rc->rtt < INFINITY ? ceil(rc->max_rate_bps * rc->rtt / rc->mean_packet_bits) : 1.0;
        /* the queue holds ``size`` MTUs of bytes: in packets of the size being sent */
        double packets = (double)size * rc->packet_bits / rc->mean_packet_bits;
        double want = packets + (bdp > 1.0 ? bdp : 1.0);
        rc->cap = want < rc->max_window ? want : rc->max_window;
        rc->cap_known = 1;
        if (rc->window > rc->cap)
            rc->window = rc->cap;
    } else if (rc->cap_known) {
        rc->cap_known = 0;
        rc->cap = rc->max_window;
    }
}

void window_on_ack(RateCtl *rc, int64_t seq, double delivery) {
    if (seq > rc->largest_acked)
        rc->largest_acked = seq;
    if (seq < rc->recover_until)
        return;
    double w = rc->window;
    if (rc->slow_start) {
        w += 1.0;
    } else {
        /* eq. 3's increase as a window: gain x the pipe per RTT, at least one packet (rate.py) */
        double step = 1.0;
        if (rc->cap_known && rc->gain * rc->cap > 1.0)
            step = rc->gain * rc->cap;
        w += step / w / delivery;
        if (!rc->cap_known && w > rc->cap)
            rc->cap += 1.0 / w;
    }
    rc->window = w < rc->cap ? w : rc->cap;
}

void window_on_loss(RateCtl *rc, const uint8_t *touched, const double *tlr, int64_t next_seq, int first,
                    int queued, double drain) {
    if (rc->largest_acked < rc->recover_until || !queued)
        return;
    int have_worst = 0;
    double worst = 0.0;
    for (size_t i = 0; i < rc->ngroups; i++) {
        if (!touched[i])
            continue;
        double est;
        if (rate_loss_estimate(rc, i, &est) && est > tlr[i] + 1e-9 && (!have_worst || est > worst)) {
            worst = est;
            have_worst = 1;
        }
    }
    if (have_worst) {
        double f = 1.0 - worst / 2.0;
        if (drain > f)
            f = drain;
        double w = rc->window * f;
        rc->window = rc->min_window < w ? w : rc->min_window;
    } else if (!rc->cap_known) {
        double c = rc->window * 0.8;
        rc->cap = 2.0 < c ? c : 2.0;
        double w = rc->window < rc->cap ? rc->window : rc->cap;
        rc->window = rc->min_window < w ? w : rc->min_window;
    } else {
        return;
    }
    rc->slow_start = rc->slow_start && first; /* first windows that collided do not end the ramp */
    rc->recover_until = next_seq;
    rc->cuts++;
}

void window_end_epoch(RateCtl *rc, double duration_s) {
    if (duration_s > 0)
        rc->delivery_rate_bps = rc->epoch_acked_bits / duration_s;
    rc->epoch_acked_bits = 0.0;
}
