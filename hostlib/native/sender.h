/* The ATP sender in C (hostlib/sender.py is the specification, function for function): its state, and the
 * protocol the Python type (sender_type.c) drives. Scheduling, loss recovery and rate control are objects of
 * their own (scheduler.h, recovery.h, rate.h), as in Python. */
#ifndef NETAPPROX_SENDER_H
#define NETAPPROX_SENDER_H

#include "buf.h"
#include "events.h"
#include "netio.h"
#include "py.h"
#include "rate.h"
#include "recovery.h"
#include "scheduler.h"
#include "wire.h"

enum { M_ACTIVE, M_DAMAGED, M_REPAIRING, M_DELIVERED };  /* message states */
enum { P_UNSENT, P_IN_FLIGHT, P_ACKED, P_LOST };          /* packet states */
enum { S_SENDING, S_CLOSING, S_DONE, S_FAILED };          /* SenderState */
enum { MODE_ADAPTIVE, MODE_PAPER, MODE_FIXTLR, MODE_BASE }; /* AtpConfig.mode */

/* control queue entry: announce part 0 once more, carrying the token an ACK brought (sender._ECHO) */
#define ECHO_MSG_ID 0xFFFFFFFDu

typedef struct {
    PyObject *data; /* bytes */
    int64_t remaining;
    uint32_t cnt, next_new, acked;
    uint64_t pkt_base;                /* first entry in Sender.pkt_state */
    RING(uint16_t, uint32_t) lost;    /* lost packet indexes (lost_pkts), no memory until the first loss */
    uint32_t group;                   /* index into Sender.groups */
    uint8_t state;
    uint8_t tagged, priority, weight, has_deadline;
    double deadline_s;
    uint32_t retries; /* retransmissions lost again (repair rotation) */
    uint8_t surplus;  /* started as surplus and not needed since */
} Msg;

/* a damaged message that may be picked for repair: (remaining, msg_id) with MRDF, else (0, msg_id) */
typedef struct {
    int64_t remaining;
    uint32_t msg_id;
} IdleEntry;

typedef struct {
    long long group_id;
    double msr;
    int64_t total, required, budget;
    int approx, fixed_tlr;
    int64_t delivered, active, started, damaged, repairing;
    ARRAY(IdleEntry) idle; /* heap */
    ARRAY(uint32_t) parked; /* messages held back as surplus, until a loss (sender._Group.parked) */
    int64_t packets_sent, retransmissions, report_seq, ece;
    uint32_t qcount[256]; /* this epoch's ACKs by queue byte, in the order the bytes first came (qorder) */
    uint8_t qorder[256];
    int nq;
} Group;

typedef struct {
    uint32_t msg_id, idx;
} CtlItem;

/* an MSR change in flight (sender._msr_sent) */
typedef struct {
    uint32_t seq, gi, change;
} MsrSent;

typedef struct {
    PyObject_HEAD
    PyObject *job, *config, *peer, *summary, *failure;
    int state, mode, adaptive, completion_early, message_events;
    long long job_id;
    /* config */
    double min_epoch_s, epoch_s, idle_timeout_s, fin_timeout_s, pacing_train_s;
    int has_epoch_s;
    long long max_payload, overhead, packet_size, burst_packets;
    long long first_window; /* AtpConfig.first_window */
    int pack, surplus_on, first_low; /* AtpConfig.pack_messages, surplus, first_window_low */
    int grant_overrides; /* AtpConfig.grant_overrides_window */
    long long rank_levels;  /* AtpConfig.job_rank_levels (0: off) */
    double rank_promote_s;  /* AtpConfig.job_rank_promote_s */
    int queue_packets[8];
    /* messages and groups (by index, ascending group id) */
    Msg *msgs;
    size_t nmsgs;
    uint8_t *pkt_state;
    Group *groups;
    double *tlr; /* per group */
    size_t ngroups;
    int64_t unsent_open; /* ACTIVE/REPAIRING messages with never-sent packets */
    Scheduler sched;
    RateCtl rate;
    Recovery recovery;
    TokenBucket bucket;
    int path_queue; /* queue byte of the last data ACK, -1 before the first */
    /* the announce and the control queue (announce parts, FINs) */
    PyObject **announce; /* bytes, one per part */
    size_t nannounce;
    uint8_t *announce_acked;
    RING(CtlItem, size_t) ctl;
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
    /* admission, grants, and what answers may echo */
    PyObject *token;         /* bytes: the admission token held (from a RETRY or an ACK), or NULL */
    PyObject *new_token;     /* bytes: the address-validation token of the receiver's NEW_TOKEN, or NULL */
    PyObject *admission_key; /* bytes or None */
    int admitted;            /* an ACK came: the receiver holds the job */
    long long retries_received;
    double echo_next;        /* earliest time the token may be echoed again */
    int token_pending;       /* the last ACK carried a token: the receiver still waits for the echo */
    uint32_t free_until;     /* sequence numbers (offsets from the ISN) below this are the first window */
    int64_t grant;           /* offset from the ISN below which the receiver lets this sender send; -1: None */
    int64_t grant_top;       /* offset of the newest packet a grant echoed (a granted packet past it that is
                                declared lost gives its place back); -1: none */
    int probe;               /* scheduled and out of grant, the tail timed out: one packet may probe */
    ARRAY(uint32_t) more_ids; /* the messages packed behind the first of each packed packet (SentPkt.more_off) */
    uint8_t *scratch;        /* one datagram being built (packing decides its length) */
    uint32_t isn;
    ARRAY(uint32_t) sent_msg; /* per sequence number used (seq - isn): the msg_id and pkt_idx it carried */
    ARRAY(uint16_t) sent_idx;
    EventQueue ev;
    /* live MSR changes (set_msr; sender._msr_*), per group index */
    uint32_t msr_changes;  /* changes made so far */
    uint32_t *msr_latest;  /* number of the group's latest change (0: none) */
    uint32_t *msr_acked;   /* highest change of the group the receiver acknowledged */
    uint8_t *msr_queued;   /* the group has an MSR change in the control queue */
    ARRAY(MsrSent) msr_sent;
    /* socket I/O */
    SendBatch batch;
    RecvRing ring;
    int peer_ok;
    NetAddr peer_addr;
} Sender;

/* Where a produced datagram of ``len`` bytes goes (a bytes object in a list, or a send batch); NULL with a
 * Python error set. */
typedef uint8_t *(*Room)(void *ctx, size_t len);

/* datagrams_to_send's loop: every datagram the sender may send now, each written where ``room`` says. */
int sender_produce(Sender *s, double now, Room room, void *ctx);
/* receive_datagram on raw bytes; ``from_peer``: whether the source is the peer (sender_from_peer_*). */
int sender_receive(Sender *s, const uint8_t *data, size_t len, int from_peer, double now);
int sender_handle_timer(Sender *s, double now);
/* AtpSender.set_msr after its checks: group index ``gi`` needs ``required`` of its messages from now on. */
int sender_set_msr(Sender *s, size_t gi, double msr, int64_t required, double now);
/* get_timer: 0 and *out, or 1 for None. */
int sender_timer_at(Sender *s, double *out);
/* _from_peer for a Python address (1, 0, or -1 with a Python error) and for a socket address (1 or 0). */
int sender_from_peer_py(Sender *s, PyObject *addr);
int sender_from_peer_na(Sender *s, const NetAddr *na);

/* What construction needs (sender_type.c reads the JobSpec and the AtpConfig, then calls these). */
double sender_epoch_length(const Sender *s);
double sender_burst_bytes(const Sender *s, double rate_bps);
/* The job announce (control.Manifest.encode), split into parts of at most max_payload bytes and queued. */
int sender_build_announce(Sender *s, PyObject *vector_len);

/* --- between the sender's files: sender.c (what to send, epochs, completion), sender_ack.c (acknowledgements and
 * losses), sender_announce.c (the announce, admission and address validation), sender_type.c (the Python type) --- */

/* sequence number offset from the ISN of the next packet */
static inline uint32_t sender_next_off(const Sender *s) { return s->seq - s->isn; }
/* a datagram rejected for ``reason`` (counted in ``rejected``): 0, or -1 with a Python error */
int sender_reject(Sender *s, const char *reason);
/* _carried: whether this sender used ``seq`` (1), and for which (msg_id, pkt_idx) */
int sender_carried(Sender *s, uint32_t seq, uint32_t *msg_id, uint32_t *idx);
/* the control queue: announce parts, FINs, echoes, MSR changes */
int sender_ctl_append(Sender *s, uint32_t msg_id, uint32_t idx);
int sender_queue_msr_change(Sender *s, size_t gi);
int sender_msr_sent_take(Sender *s, uint32_t seq, MsrSent *out);
double sender_next_tlr(const Group *g);
/* sender_type.c: _reset_transfer, the job from its start (a RETRY) */
int sender_reset_transfer(Sender *s);
/* sender_ack.c */
int sender_on_packet_acked(Sender *s, const SentPkt *p);
int sender_on_lost(Sender *s, const SentPkt *lost, size_t n);
int sender_plan_repairs(Sender *s, Group *g);
/* sender_announce.c */
int sender_announce_datagram(Sender *s, uint32_t idx, uint32_t seq, uint8_t *out);
int sender_on_new_token(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len);
int sender_on_retry(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now);
int sender_on_token(Sender *s, const uint8_t *token, double now);

#endif
