/* Loss detection and accounting for the sender (hostlib/recovery.py): RTT estimation, the packets in flight and
 * those declared lost (ordered by sequence number, as recovery.py's OrderedDicts), the packet, time and tail
 * thresholds. Its listener is the rate controller (rate.h), told about every packet sent, acknowledged or
 * lost, in recovery.py's order. */
#ifndef NETAPPROX_RECOVERY_H
#define NETAPPROX_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "map.h"
#include "rate.h"
#include "wire.h"

/* recovery.SentPacket */
typedef struct {
    uint32_t seq, msg_id, pkt_idx, size;
    int32_t group_id; /* -1: None (a control packet, or one rate control does not count) */
    uint8_t retx;
    uint8_t first;    /* sent in the job's first window (recovery.SentPacket.first) */
    uint8_t copy;     /* a copy of a packet in flight (SentPacket.copy) */
    uint8_t by_threshold; /* declared lost by the packet or time threshold (SentPacket.by_threshold) */
    uint32_t copies;  /* copies of this packet sent so far (SentPacket.copies) */
    uint16_t more_n;  /* a packed packet: the other messages it carried (SentPacket.more), ... */
    uint32_t more_off; /* ... at Sender.more_ids[more_off .. more_off + more_n) */
    double sent_time;
} SentPkt;

typedef ARRAY(SentPkt) SentPkts;

/* a node of a PacketMap: the packet, and its neighbours in the order of insertion (-1: none) */
struct PNode {
    SentPkt p;
    int32_t prev, next;
};

/* Packets by sequence number in the order they were added (collections.OrderedDict semantics). */
typedef struct {
    ARRAY(struct PNode) nodes; /* storage; free nodes chained through ``next`` from free_head */
    int32_t free_head, head, tail;
    size_t len;
    U32Map index; /* seq -> node index + 1 */
} PacketMap;

typedef struct {
    double srtt, rttvar, latest_rtt, min_rtt, min_loss_timeout_s;
    int has_rtt_sample;
    int tail_backoff; /* tail timeouts since the last acknowledgement (recovery.py tail_backoff) */
    double tail_at;   /* the last tail declaration or acknowledgement, the later (recovery.py _tail_at) */
    double loss_acked, loss_lost; /* recovery.py loss: the LossEstimate of the counted packets */
    double answers_acked, answers_lost; /* recovery.py answers: the LossEstimate of the receiver's answers */
    int64_t missed_answers;             /* recovery.py missed_answers */
    int every_overdue;            /* recovery.py every_overdue */
    long long spare_probes;       /* recovery.py spare_probes */
    int64_t largest_acked;
    long long reorder_threshold;
    int reordering;                   /* the path was seen reordering, or is known to (recovery.py reordering) */
    double reorder_window;            /* added to the time threshold (recovery.py reorder_window) */
    int adaptive_reorder;             /* AtpConfig.adaptive_reorder */
    int64_t spurious_losses;          /* recovery.py spurious_losses */
    int64_t threshold_losses;         /* recovery.py _threshold_losses */
    PacketMap in_flight, declared_lost;
    int64_t packets_acked, packets_lost, late_acks;
    int64_t lost_reorder, lost_time, lost_tail, lost_trim; /* LossRecovery.lost_by */
    SentPkts acked, late, lost;                 /* what the last on_ack / detect_lost found */
    RateCtl *rate;                              /* the listener */
} Recovery;

/* LossRecovery(initial_rtt_s=..., reorder_threshold=..., min_loss_timeout_s=..., adaptive_reorder=...,
 * path_reorders=..., listeners=[rate]): 0, or -1
 * (no Python error set: the caller reports the MemoryError). */
int recovery_init(Recovery *r, double initial_rtt_s, long long reorder_threshold, double min_loss_timeout_s,
                  int adaptive_reorder, int path_reorders, RateCtl *rate);
void recovery_free(Recovery *r);
double recovery_tail_timeout(const Recovery *r);
/* LossRecovery.time_threshold */
double recovery_time_threshold(const Recovery *r);
/* LossRecovery.queued(): the latest RTT sample shows a queue in the path. */
int recovery_queued(const Recovery *r);
/* LossRecovery.lossy(), probes(), copies(), delivery(), drain() */
int recovery_lossy(const Recovery *r);
long long recovery_probes(const Recovery *r);
long long recovery_copies(const Recovery *r);
/* LossRecovery.answer_loss(), fin_copies() */
double recovery_answer_loss(const Recovery *r);
long long recovery_fin_copies(const Recovery *r);
double recovery_delivery(const Recovery *r);
double recovery_drain(const Recovery *r);
/* LossRecovery.unanswered(): nothing ever acknowledged, the tail timeout backed off to its longest */
int recovery_unanswered(const Recovery *r);
/* loss_deadline(): 1 and *out, or 0 for None (nothing in flight). */
int recovery_loss_deadline(const Recovery *r, double *out);
/* on_packet_sent: 0, or -1 with MemoryError set. */
int recovery_on_sent(Recovery *r, const SentPkt *p);
/* on_ack_received: r->acked holds the newly acknowledged packets, then the late ones; r->lost the newly lost
 * (``trimmed``: packet ``seq`` first, lost). 0, or -1 with MemoryError set. */
int recovery_on_ack(Recovery *r, uint32_t seq, const SackBlock *blocks, int nblocks, double now, int trimmed);
/* detect_lost: r->lost. 0, or -1 with MemoryError set. */
int recovery_detect_lost(Recovery *r, double now);

#endif
