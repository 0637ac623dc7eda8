/* The ATP receiver in C (hostlib/receiver.py is the specification, function for function): its state, and the
 * protocol the Python type (receiver_type.c) drives. Per packet: decode, job and source checks, the group index,
 * duplicate suppression (the chunked delivered bitmap), reassembly, the memory budget, delivery, ACK coalescing.
 * Who gets a job slot and memory is admission.h's; rare paths keep Python objects: admission tokens
 * (admission.TokenMinter), the announce's signature check and the manifest decode (control.announce_auth,
 * control.Manifest.decode). */
#ifndef NETAPPROX_RECEIVER_H
#define NETAPPROX_RECEIVER_H

#include "admission.h"
#include "buf.h"
#include "events.h"
#include "map.h"
#include "netio.h"
#include "py.h"
#include "wire.h"

#define MAX_SACK_RANGES 64
#define CHUNK_SHIFT 10
#define CHUNK_BITS (1 << CHUNK_SHIFT)
#define CHUNK_RAW (CHUNK_BITS / 8)

/* the budget's charges, read from hostlib/receiver.py when the first receiver is made (receiver.JOB_BYTES, ...) */
extern long long JOB_BYTES, CHUNK_BYTES, PARTIAL_BYTES, PACKET_BYTES, MANIFEST_BYTES, MANIFEST_BYTES_PER_BYTE,
    MANIFEST_BYTES_PER_GROUP, DONE_BYTES_PER_PART, OUT_BYTES, OUT_QUEUE_SHARE, REPLY_FACTOR;

/* one packet of an incomplete message, in arrival order */
typedef struct {
    uint16_t idx;
    PyObject *data; /* its payload (bytes) */
} Piece;

/* _Partial: an incomplete multi-packet message */
typedef struct {
    uint32_t cnt;
    int64_t nbytes;
    uint8_t *have; /* cnt bits */
    ARRAY(Piece) pieces;
} Partial;

/* a group of the job's manifest, with its delivery count and (MSR = 1: in id order) its cursor */
typedef struct {
    uint16_t group_id;
    double msr;
    uint32_t count;
    uint32_t *firsts, *lasts; /* the group's id ranges */
    uint32_t nranges;
    int ordered;
    uint32_t ri, nxt; /* cursor (ordered groups) */
    int64_t delivered;
    int64_t required; /* messages the MSR needs */
    uint32_t msr_change; /* number of the last MSR change applied (0: none) */
} MGroup;

/* _Job; starts with what the slot table reads (source, progressed, progress_at) */
typedef struct Job {
    SlotHolder slot;
    uint32_t job_id;
    PyObject *peer;
    NetAddr peer_na;
    int peer_has_na;
    double first_at, last_at;
    PyObject *manifest; /* control.Manifest or NULL */
    uint32_t total;
    PyObject *vector_len;
    MGroup *groups;
    size_t ngroups;
    uint32_t *ix_first, *ix_last; /* the manifest's GroupIndex: every range in id order, its group */
    uint16_t *ix_group;
    size_t nix;
    PyObject *announce_parts; /* dict idx -> bytes */
    long announce_cnt;        /* -1: None */
    U32Map partial;           /* msg_id -> Partial* */
    U32Map chunks;            /* delivered bitmap: chunk index -> uint8_t[CHUNK_RAW] */
    PyObject *held;           /* dict msg_id -> bytes */
    uint32_t seq_first[MAX_SACK_RANGES + 1], seq_last[MAX_SACK_RANGES + 1];
    int nseq;
    int64_t packets, duplicates, charged;
    PyObject *done_datagrams; /* list of bytes or NULL */
    int finished;
    double finished_at;
    PyObject *rejected; /* str or NULL */
    PyObject *coll;     /* collect_messages: this job's dict in Receiver.collected, or NULL */
    int pending;        /* ACK coalescing: the newest packet not yet acknowledged */
    AtpHeader pending_h;
    int pending_ce;
    long pending_count;
    int64_t rx_bytes, tx_bytes; /* bytes its sender sent us, reply bytes sent for it (REPLY_FACTOR) */
    size_t done_next;           /* the DONE part a repeated FIN resends first */
    int validated;              /* 0 while a job admitted without a token waits for its sender to echo ``token`` */
    PyObject *token;            /* that token (bytes), carried by every answer until then; NULL otherwise */
    /* receiver grants: the newest sequence number that arrived (and its packet, which a GRANT echoes), the grant
     * given, the packets the job may have in flight */
    int has_top, has_grant;
    uint32_t top, grant;
    AtpHeader echo;
    uint8_t grant_queue; /* the switch queue stamped on its newest needed (TLR < 1) packet; 0xFF: none */
    long long alloc;
    int64_t data_packets, records, trimmed, need_bytes, payload; /* need_packets' inputs */
    int grant_repeats; /* GRANTs repeated since the sender's last datagram (GRANT_REPEAT_RTTS) */
} Job;

typedef ARRAY(Job *) JobList;

/* an outgoing datagram: ``len`` bytes at ``off`` of Receiver.obuf, to ``peer`` (and its socket address) */
typedef struct {
    size_t off;
    uint32_t len;
    PyObject *peer;
    NetAddr na;
    int has_na;
} OutItem;

#define RATE_PHASES 8       /* receiver.py's RATE_GAINS */
#define LOSS_GAIN_MAX 2.0    /* receiver.py's LOSS_GAIN_MAX */
#define GAP_CREDIT_MAX 64     /* receiver.py's GAP_CREDIT_MAX */
#define IDLE_FACTOR 2.0       /* receiver.py's IDLE_FACTOR */
#define GRANT_REPEAT_RTTS 2.0 /* receiver.py's GRANT_REPEAT_RTTS */
#define GRANT_REPEAT_DOUBLINGS 6 /* receiver.py's GRANT_REPEAT_DOUBLINGS */

/* receiver.py, DeliveryRate: a granting receiver not told its rate sizes its budget by the rate its link delivers */
typedef struct {
    int on, started;             /* on: this receiver estimates; started: last is set */
    int has_counted, has_at, has_quick;
    double window_s, last;       /* the window's length (arrival time), the newest arrival */
    double quick;                /* the shortest time per byte between two arrivals so far (has_quick) */
    double counted;              /* the newest instant whose time counted for the in-order pairs (has_counted) ... */
    double busy;                 /* ... their time and bytes in the window */
    long long bytes;
    double at;                   /* the newest instant whose time counted with the gaps (has_at) ... */
    double span;                 /* ... their time, the bytes with the gaps', and the bytes that arrived */
    long long sent, got;
    long long samples;           /* windows closed */
    double bps;                  /* the largest sample (the estimate), when samples > 0 */
    int phase;                   /* index into the gains */
    double loss;                 /* of what the last closed window's link carried, the share that did not arrive */
} DeliveryRate;

typedef struct {
    PyObject_HEAD
    PyObject *config, *accept_jobs, *malformed, *dropped, *admission, *tokens, *collected;
    PyObject *replies;       /* collections.Counter: amplification (receiver.py's ``replies``) */
    PyObject *manifest_rate; /* admission.SourceRate: manifest bytes decoded per source and second */
    long long max_messages, max_packets, max_payload, ack_every;
    double linger_s, idle_timeout_s, open_share;
    int tokens_mode;          /* admission_mode: 0 "open", 1 "tokens" */
    int granting, grant_dirty; /* AtpConfig.receiver_grants; the schedule must be recomputed */
    long long grant_budget;   /* packets in flight towards this receiver over all the jobs it grants */
    long long grant_cap;      /* AtpConfig.grant_window_max_packets (0: none): a budget that follows the rate */
    int grant_fixed;          /* AtpConfig.grant_window_packets is set: the budget does not follow the packet size */
    double bdp_bits;          /* max_rate_bps (DEFAULT_MAX_RATE_BPS when None) x initial_rtt_s */
    long long overhead_bytes; /* AtpConfig.overhead_bytes */
    long long data_packets, data_wire_bytes; /* DATA packets of admitted jobs that arrived whole, their wire bytes */
    DeliveryRate delivery;    /* not told its rate: the rate its DATA arrives at (receiver.py, DeliveryRate) */
    double rtt_s;             /* AtpConfig.initial_rtt_s: the delivery windows and the budget's time */
    long long trimmed;        /* DATA packets that arrived trimmed */
    PyObject *admission_key; /* bytes or None */
    long long jobs_seen, buffered, datagrams;
    int collect;
    JobList jobs; /* in the order they were admitted (the reference's dict order) */
    Job *last_job;
    JobList finished; /* finished jobs kept for repeated FINs, in the order they finished */
    JobList pending;  /* jobs with an ACK waiting, in the order their first packet arrived */
    SlotTable slots;
    MemoryBudget memory;
    ARRAY(uint8_t) obuf;
    ARRAY(OutItem) out;
    EventQueue ev;
    /* socket I/O */
    SendBatch batch;
    RecvRing ring;
} Receiver;

/* receive_datagram: ``addr`` the Python address, or NULL with ``na`` (from a socket; built only when needed) */
int receiver_receive(Receiver *r, const uint8_t *data, size_t len, PyObject *addr, const NetAddr *na, int ce,
                     double now);
/* Every waiting ACK into the outgoing datagrams (datagrams_to_send sends them now). */
int receiver_flush_acks(Receiver *r);
void receiver_out_clear(Receiver *r);
/* get_timer: 0 and *out, or 1 for None. */
int receiver_timer_at(Receiver *r, double *out);
int receiver_handle_timer(Receiver *r, double now);
Job *receiver_find_job(Receiver *r, uint32_t job_id);
void job_free(Job *job);

/* ---- shared by receiver.c (the data path, the FIN, forgetting jobs) and receiver_announce.c (admission, the
 * announce, address validation, MSR changes); receiver.py's private helpers of the same names ---- */

/* the receiver's counters (receiver.py's ``dropped``, ``malformed``, ``admission``, ``replies``) */
static inline int drop(Receiver *r, const char *reason) { return counter_add(r->dropped, reason, 1); }
static inline int malformed(Receiver *r, const char *reason) { return counter_add(r->malformed, reason, 1); }
static inline int count_admission(Receiver *r, const char *what) { return counter_add(r->admission, what, 1); }
static inline int count_replies(Receiver *r, const char *what, long long n) {
    return counter_add(r->replies, what, (Py_ssize_t)n);
}

/* --- the memory budget, per job ---------------------------------------------------------------------- */

static inline int holds_slot(Job *job) { return !job->finished; }
static inline int fits(Receiver *r, Job *job, long long n) {
    if (!job->validated && job->charged + n > r->memory.guarantee)
        return 0; /* an unvalidated job: its slot's guarantee at most, never the pool */
    return budget_fits(&r->memory, job->charged, holds_slot(job), n);
}

static inline void charge(Receiver *r, Job *job, long long n) {
    budget_charge(&r->memory, job->charged, holds_slot(job), n);
    job->charged += n;
}

/* _queue's check and the datagram it adds to the outgoing list (for ``peer``, not yet a job) */
int receiver_out_room(Receiver *r, uint32_t len);
uint8_t *receiver_out_add_to(Receiver *r, PyObject *peer, const NetAddr *na, uint32_t len);
/* _reply: room under the job's amplification bound for ``len`` more reply bytes, counted as ``what`` */
int receiver_reply_within(Receiver *r, Job *job, uint32_t len, const char *what, uint8_t **p);
int receiver_send_ack(Receiver *r, Job *job, const AtpHeader *h, int ce);
int receiver_duplicate(Receiver *r, Job *job, const AtpHeader *h, int ce);
/* memory for ``n`` more bytes of ``job``, forgetting finished jobs if need be: 1 fits, 0 not, -1 error */
int receiver_make_room(Receiver *r, Job *job, long long n);
int receiver_abandon(Receiver *r, Job *job, const char *reason);
int receiver_reject_job(Receiver *r, Job *job, PyObject *reason, double now);
/* admission.source_of: the host part of a Python address (new reference) */
PyObject *receiver_source_of(PyObject *addr);
Job *job_new(uint32_t job_id, PyObject *peer, const NetAddr *na, double now);
void job_note_seq(Job *job, uint32_t seq);
void job_free_manifest_arrays(Job *job);
void job_free_partial(Partial *p);
void job_free_group_index(Job *job);
void job_clear_partials(Job *job, int reuse); /* reuse: the map stays usable, empty */
void job_clear_chunks(Job *job, int reuse);

/* receiver_announce.c: the packets of admission and the announce, dispatched by receiver_receive */
int receiver_announce_chunk(Receiver *r, const AtpHeader *h, const uint8_t *payload);
int receiver_on_announce(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *chunk, Py_ssize_t clen,
                         double now, int echo);
int receiver_validate(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *token, double now);
int receiver_on_new_announce(Receiver *r, const AtpHeader *h, const uint8_t *payload, PyObject *addr,
                             const NetAddr *na, double now);
int receiver_on_msr_change(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload);

/* An announce part's token field (ATP_TOKEN_LEN bytes) is all zero: the sender holds no token. */
static inline int receiver_token_is_zero(const uint8_t *token) {
    for (int i = 0; i < ATP_TOKEN_LEN; i++)
        if (token[i])
            return 0;
    return 1;
}

#endif
