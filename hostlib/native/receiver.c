/* The ATP receiver's protocol (receiver.h; hostlib/receiver.py is the specification): admission of a job, its
 * data (duplicates, reassembly, in-order delivery of MSR = 1 groups, the memory budget), ACK coalescing, the FIN
 * and its DONE, forgetting jobs. */
#include <math.h>
#include <string.h>

#include "receiver.h"

long long JOB_BYTES, CHUNK_BYTES, PARTIAL_BYTES, PACKET_BYTES, MANIFEST_BYTES, MANIFEST_BYTES_PER_BYTE,
    MANIFEST_BYTES_PER_GROUP, DONE_BYTES_PER_PART, OUT_BYTES, OUT_QUEUE_SHARE, REPLY_FACTOR;

/* --- outgoing datagrams -------------------------------------------------------------------------------- */

/* _queue's check: 1 and ``len`` + OUT_BYTES charged to the budget's reserve for replies, 0 when the reserve is full
 * (the datagram is dropped and counted), -1 on error. */
int receiver_out_room(Receiver *r, uint32_t len) {
    if (!budget_out_charge(&r->memory, (long long)len + OUT_BYTES))
        return count_replies(r, "dropped_queue_full", 1) != 0 ? -1 : 0;
    return 1;
}

uint8_t *receiver_out_add_to(Receiver *r, PyObject *peer, const NetAddr *na, uint32_t len) {
    OutItem it = {.off = r->obuf.n, .len = len, .peer = peer, .has_na = na != NULL};
    if (na != NULL)
        it.na = *na;
    if (ARRAY_RESERVE(&r->obuf, r->obuf.n + len, 1 << 16) != 0 || ARRAY_PUSH(&r->out, it, 64) != 0)
        return NULL;
    Py_INCREF(peer);
    uint8_t *p = r->obuf.v + r->obuf.n;
    r->obuf.n += len;
    return p;
}

static inline uint8_t *out_add(Receiver *r, Job *job, uint32_t len) {
    return receiver_out_add_to(r, job->peer, job->peer_has_na ? &job->peer_na : NULL, len);
}

#define OBUF_KEEP (64u << 10)
#define OUT_KEEP 1024u

void receiver_out_clear(Receiver *r) {
    for (size_t i = 0; i < r->out.n; i++)
        Py_DECREF(r->out.v[i].peer);
    r->out.n = 0;
    r->obuf.n = 0;
    budget_out_release(&r->memory);
    /* give back what a burst of replies grew (the next burst grows it again, from a small first size) */
    if (r->obuf.cap > OBUF_KEEP)
        ARRAY_FREE(&r->obuf);
    if (r->out.cap > OUT_KEEP)
        ARRAY_FREE(&r->out);
}

/* _reply: a datagram of ``len`` bytes to a job's sender ``peer``, counted in the job's ``*tx``. 1 with *p where to
 * write it, 0 when the budget dropped it, -1 on error. */
static int reply_to(Receiver *r, PyObject *peer, const NetAddr *na, int64_t *tx, uint32_t len, uint8_t **p) {
    int ok = receiver_out_room(r, len);
    if (ok <= 0)
        return ok;
    if ((*p = receiver_out_add_to(r, peer, na, len)) == NULL)
        return -1;
    *tx += len;
    return count_replies(r, "reply_bytes", len) != 0 ? -1 : 1;
}

static inline int reply(Receiver *r, Job *job, uint32_t len, uint8_t **p) {
    return reply_to(r, job->peer, job->peer_has_na ? &job->peer_na : NULL, &job->tx_bytes, len, p);
}

/* _reply_room: bytes a job may still be sent, ``factor`` (REPLY_FACTOR, 1 while not validated) x what its sender
 * sent */
static inline int64_t room_of(long long factor, int64_t rx, int64_t tx) { return factor * rx - tx; }
static inline long long factor_of(const Job *job) { return job->validated ? REPLY_FACTOR : 1; }
static inline int64_t reply_room(const Job *job) { return room_of(factor_of(job), job->rx_bytes, job->tx_bytes); }

/* _send_done: the DONE parts a job's reply room (``factor`` x ``rx`` - ``*tx``) allows, from part ``*next`` on
 * (then round again). The job's fields are passed, not the job: it may be forgotten by then. */
static int send_done_to(Receiver *r, PyObject *peer, const NetAddr *na, long long factor, int64_t rx, int64_t *tx,
                        size_t *next, PyObject *done) {
    Py_ssize_t n = PyList_GET_SIZE(done);
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = ((Py_ssize_t)*next + k) % n;
        PyObject *d = PyList_GET_ITEM(done, i);
        uint32_t len = (uint32_t)PyBytes_GET_SIZE(d);
        if ((int64_t)len > room_of(factor, rx, *tx)) {
            *next = (size_t)i;
            return count_replies(r, "done_deferred", n - k);
        }
        uint8_t *p;
        int ok = reply_to(r, peer, na, tx, len, &p);
        if (ok < 0)
            return -1;
        if (ok)
            memcpy(p, PyBytes_AS_STRING(d), len);
    }
    *next = 0;
    return 0;
}

static inline int send_done(Receiver *r, Job *job, PyObject *done) {
    return send_done_to(r, job->peer, job->peer_has_na ? &job->peer_na : NULL, factor_of(job), job->rx_bytes,
                        &job->tx_bytes, &job->done_next, done);
}

/* _Job.note_seq */
void job_note_seq(Job *job, uint32_t seq) {
    uint32_t *f = job->seq_first, *l = job->seq_last;
    int n = job->nseq;
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (seq < f[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    int i = lo - 1;
    if (i >= 0 && l[i] >= seq)
        return;
    if (i >= 0 && (uint64_t)l[i] + 1 == seq) {
        l[i] = seq;
        if (i + 1 < n && (uint64_t)f[i + 1] == (uint64_t)seq + 1) {
            l[i] = l[i + 1];
            memmove(&f[i + 1], &f[i + 2], (size_t)(n - i - 2) * sizeof(uint32_t));
            memmove(&l[i + 1], &l[i + 2], (size_t)(n - i - 2) * sizeof(uint32_t));
            job->nseq--;
        }
    } else if (i + 1 < n && (uint64_t)f[i + 1] == (uint64_t)seq + 1) {
        f[i + 1] = seq;
    } else {
        memmove(&f[i + 2], &f[i + 1], (size_t)(n - i - 1) * sizeof(uint32_t));
        memmove(&l[i + 2], &l[i + 1], (size_t)(n - i - 1) * sizeof(uint32_t));
        f[i + 1] = seq;
        l[i + 1] = seq;
        job->nseq++;
        if (job->nseq > MAX_SACK_RANGES) {
            memmove(&f[0], &f[1], (size_t)(job->nseq - 1) * sizeof(uint32_t));
            memmove(&l[0], &l[1], (size_t)(job->nseq - 1) * sizeof(uint32_t));
            job->nseq--;
        }
    }
}

/* --- the delivered bitmap (_Bitmap) --- */

static inline int bm_has(Job *job, uint32_t i) {
    const uint8_t *c = (const uint8_t *)map_get(&job->chunks, i >> CHUNK_SHIFT);
    return c != NULL && (c[(i >> 3) & (CHUNK_RAW - 1)] >> (i & 7) & 1);
}

static inline int bm_needs_chunk(Job *job, uint32_t i) { return map_get(&job->chunks, i >> CHUNK_SHIFT) == 0; }

static int bm_reserve(Job *job, uint32_t i) {
    if (map_get(&job->chunks, i >> CHUNK_SHIFT) != 0)
        return 0;
    uint8_t *c = calloc(CHUNK_RAW, 1);
    if (c == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (map_put(&job->chunks, i >> CHUNK_SHIFT, (uintptr_t)c) != 0) {
        free(c);
        return -1;
    }
    return 0;
}

static inline void bm_add(Job *job, uint32_t i) {
    uint8_t *c = (uint8_t *)map_get(&job->chunks, i >> CHUNK_SHIFT);
    c[(i >> 3) & (CHUNK_RAW - 1)] |= (uint8_t)(1 << (i & 7));
}

/* _Job.received_seq */
static int received_seq(const Job *job, uint32_t seq) {
    int lo = 0, hi = job->nseq;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (seq < job->seq_first[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > 0 && job->seq_last[lo - 1] >= seq;
}

/* --- receiver grants --- */

/* _Job.need_packets: packets still needed to meet every group's MSR */
static long long need_packets(const Job *job, long long max_payload) {
    long long need = 0;
    for (size_t k = 0; k < job->ngroups; k++) {
        long long d = job->groups[k].required - job->groups[k].delivered;
        need += d > 0 ? d : 0;
    }
    if (need <= 0)
        return 0;
    long long by_count = need;
    if (job->records > job->data_packets && job->data_packets > 0)
        by_count = (need * job->data_packets + job->records - 1) / job->records;
    long long bytes = job->need_bytes - job->payload;
    long long by_bytes = bytes > 0 ? (bytes + max_payload - 1) / max_payload : 0;
    return by_count > by_bytes ? by_count : by_bytes;
}

/* _arrived: packet ``h`` of ``job`` arrived (whole or trimmed) */
static void arrived(Receiver *r, Job *job, const AtpHeader *h) {
    if (!job->has_top || (uint32_t)(h->seq - job->top) < (1u << 31)) {
        job->has_top = 1;
        job->top = h->seq;
        job->echo = *h;
        if (h->tlr < ATP_TLR_ONE && h->queue != job->grant_queue) { /* surplus (TLR 1.0) is in the lowest queue */
            job->grant_queue = h->queue;                           /* whatever the job's priority */
            r->grant_dirty = r->granting;
        }
    }
    if (r->granting && (job->alloc == 0 || need_packets(job, r->max_payload) < job->alloc))
        r->grant_dirty = 1;
}

/* _grant_of: the grant an answer to ``job`` carries (1 and *out), or 0 when this receiver does not schedule */
static int grant_of(Receiver *r, Job *job, uint32_t *out) {
    if (!r->granting || !job->has_top || r->grant_budget == 0)
        return 0;
    uint32_t g = job->top + 1 + (uint32_t)job->alloc;
    if (!job->has_grant || (uint32_t)(g - job->grant) < (1u << 31)) {
        job->grant = g;
        job->has_grant = 1;
    }
    *out = job->grant;
    return 1;
}

/* _ack_blocks: how many of the job's SACK blocks its reply room allows in an ACK with ``extra`` bytes of fields */
static int ack_blocks(Receiver *r, Job *job, long long extra, int *nb) {
    *nb = job->nseq < ATP_MAX_SACK_BLOCKS ? job->nseq : ATP_MAX_SACK_BLOCKS;
    int64_t spare = reply_room(job) - ATP_ACK_BASE_LEN - extra;
    int64_t room = spare > 0 ? spare / 8 : 0;
    if (*nb > room) { /* tiny DATA packets: fewer blocks, never an ACK larger than REPLY_FACTOR allows */
        *nb = (int)room;
        return count_replies(r, "sack_trimmed", 1);
    }
    return 0;
}

/* An ACK (``type`` PT_ACK) or GRANT echoing ``h`` into ``p``: ``nb`` SACK blocks of the job, then the grant and
 * the token when given. */
static void write_ack(uint8_t *p, uint8_t type, uint8_t flags, const AtpHeader *h, const Job *job, int nb,
                      int has_grant, uint32_t grant, PyObject *token) {
    uint16_t plen = (uint16_t)(2 + 8 * nb + (has_grant ? 4 : 0) + (token != NULL ? ATP_TOKEN_LEN : 0));
    AtpHeader a = {.version = ATP_VERSION, .type = type,
                   .flags = (uint8_t)(flags | (has_grant ? F_GRANT : 0) | (token != NULL ? F_TOKEN : 0)),
                   .queue = h->queue, .job_id = h->job_id, .msg_id = h->msg_id, .group_id = h->group_id,
                   .pkt_idx = h->pkt_idx, .pkt_cnt = h->pkt_cnt, .seq = h->seq, .deadline_us = ATP_NO_DEADLINE,
                   .length = plen};
    atp_encode(p, &a);
    uint8_t *q = p + ATP_HEADER_LEN;
    put16(q, (uint16_t)nb);
    q += 2;
    for (int k = 0; k < nb; k++, q += 8) {
        put32(q, job->seq_first[job->nseq - 1 - k]);
        put32(q + 4, job->seq_last[job->nseq - 1 - k]);
    }
    if (has_grant) {
        put32(q, grant);
        q += 4;
    }
    if (token != NULL)
        memcpy(q, PyBytes_AS_STRING(token), ATP_TOKEN_LEN);
}

static inline uint32_t ack_len(int nb, int has_grant, PyObject *token) {
    return ATP_HEADER_LEN + 2 + 8 * (uint32_t)nb + (has_grant ? 4 : 0) + (token != NULL ? ATP_TOKEN_LEN : 0);
}

/* _reply_within: a GRANT or a TRIM ACK of ``len`` bytes, if the job's reply room allows it (1 with *p), else
 * counted as ``what``_withheld (0); -1 on error */
int receiver_reply_within(Receiver *r, Job *job, uint32_t len, const char *what, uint8_t **p) {
    if ((int64_t)len > reply_room(job)) {
        char key[32];
        snprintf(key, sizeof key, "%s_withheld", what);
        return count_replies(r, key, 1) != 0 ? -1 : 0;
    }
    return reply(r, job, len, p);
}

/* --- ACKs (coalesced) --- */

static int flush_ack(Receiver *r, Job *job) {
    const AtpHeader *h = &job->pending_h;
    int ce = job->pending_ce;
    job->pending = 0;
    job->pending_count = 0;
    ARRAY_REMOVE(&r->pending, job);
    uint32_t grant = 0;
    int has_grant = grant_of(r, job, &grant), nb;
    if (ack_blocks(r, job, (has_grant ? 4 : 0) + (job->token != NULL ? ATP_TOKEN_LEN : 0), &nb) != 0)
        return -1;
    uint8_t *p;
    int ok = receiver_reply_within(r, job, ack_len(nb, has_grant, job->token), "ack", &p);
    if (ok <= 0)
        return ok;
    write_ack(p, PT_ACK, ce ? F_ECE : 0, h, job, nb, has_grant, grant, job->token);
    return 0;
}

int receiver_send_ack(Receiver *r, Job *job, const AtpHeader *h, int ce) {
    arrived(r, job, h);
    if (job->pending && (job->pending_h.queue != h->queue || job->pending_ce != ce) && flush_ack(r, job) != 0)
        return -1;
    if (!job->pending) {
        if (ARRAY_PUSH(&r->pending, job, 8) != 0)
            return -1;
        job->pending = 1;
    }
    job->pending_h = *h;
    job->pending_ce = ce;
    job->pending_count++;
    if (job->pending_count >= r->ack_every)
        return flush_ack(r, job);
    return 0;
}

/* _send_grant: a GRANT to a job given more than before that has no ACK waiting (again: whatever it was given) */
static int send_grant(Receiver *r, Job *job, int again) {
    int had = job->has_grant;
    uint32_t before = job->grant, grant;
    if (!grant_of(r, job, &grant) || (had && grant == before && !again))
        return 0;
    uint8_t *p;
    int ok = receiver_reply_within(r, job, ack_len(0, 1, NULL), "grant", &p);
    if (ok <= 0)
        return ok;
    write_ack(p, PT_GRANT, 0, &job->echo, job, 0, 1, grant, NULL);
    return 0;
}

typedef struct {
    Job *job;
    long long need;
} Planned;

static int planned_cmp(const void *a, const void *b) {
    const Planned *x = a, *y = b;
    if ((x->need == 0) != (y->need == 0)) /* a job whose MSR is met after every job that still needs data */
        return x->need == 0 ? 1 : -1;
    if (x->job->grant_queue != y->job->grant_queue)
        return x->job->grant_queue < y->job->grant_queue ? -1 : 1;
    if (x->need != y->need)
        return x->need < y->need ? -1 : 1;
    if (x->job->first_at != y->job->first_at)
        return x->job->first_at < y->job->first_at ? -1 : 1;
    return x->job->job_id < y->job->job_id ? -1 : x->job->job_id > y->job->job_id;
}

/* _schedule: share grant_budget packets in flight over the jobs, in the order the switches serve them (the queue
 * stamped on each job's newest needed packet), then least data left to their MSR; a job whose MSR is met last, with
 * what the others are not expected to need (its sender may still be sending the rest: completion all_sent) */
static int schedule(Receiver *r) {
    r->grant_dirty = 0;
    Planned *plan = malloc((r->jobs.n ? r->jobs.n : 1) * sizeof(Planned));
    if (plan == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t n = 0;
    for (size_t i = 0; i < r->jobs.n; i++) {
        Job *j = r->jobs.v[i];
        if (!j->finished && j->manifest != NULL)
            plan[n++] = (Planned){j, need_packets(j, r->max_payload)};
    }
    qsort(plan, n, sizeof(Planned), planned_cmp);
    long long budget = r->grant_budget, left = budget;
    int first = 1, rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        Job *j = plan[i].job;
        long long need = plan[i].need;
        long long a = first ? budget : need == 0 ? left : (left < need ? left : need);
        first = first && need == 0;
        left = left - need > 0 ? left - need : 0;
        if (a > j->alloc && !j->pending && j->has_top) {
            j->alloc = a;
            rc = send_grant(r, j, 0);
        }
        j->alloc = a;
    }
    free(plan);
    return rc;
}

int receiver_flush_acks(Receiver *r) {
    if (r->grant_dirty && schedule(r) != 0)
        return -1;
    while (r->pending.n)
        if (flush_ack(r, r->pending.v[0]) != 0)
            return -1;
    return 0;
}

/* ============================== delivery ============================== */

static PyObject *message_received(uint32_t job_id, uint32_t msg_id, long group_id, PyObject *data) {
    static const char *const names[] = {"job_id", "msg_id", "group_id", "data", NULL};
    Py_INCREF(data);
    PyObject *vals[] = {PyLong_FromUnsignedLong(job_id), PyLong_FromUnsignedLong(msg_id), PyLong_FromLong(group_id),
                        data};
    return make_frozen(R.MessageReceived, names, vals);
}

/* _hand_over */
static int hand_over(Receiver *r, Job *job, uint32_t msg_id, long group_id, PyObject *data) {
    if (!r->collect)
        return events_push(&r->ev, message_received(job->job_id, msg_id, group_id, data));
    if (job->coll == NULL) {
        PyObject *k = PyLong_FromUnsignedLong(job->job_id);
        if (k == NULL)
            return -1;
        PyObject *d = PyDict_GetItemWithError(r->collected, k);
        if (d == NULL) {
            if (PyErr_Occurred() || (d = PyDict_New()) == NULL || PyDict_SetItem(r->collected, k, d) != 0) {
                Py_XDECREF(d);
                Py_DECREF(k);
                return -1;
            }
        } else {
            Py_INCREF(d);
        }
        Py_DECREF(k);
        job->coll = d;
    }
    PyObject *key = PyLong_FromUnsignedLong(msg_id);
    int rc = key == NULL ? -1 : PyDict_SetItem(job->coll, key, data);
    Py_XDECREF(key);
    return rc;
}

static void unbuffer(Receiver *r, Job *job, long long nbytes) {
    r->buffered -= nbytes;
    charge(r, job, -(nbytes + PACKET_BYTES));
}

/* GroupIndex.find: position of the group listing msg_id, -1 if none */
static int index_find(Job *job, uint32_t msg_id) {
    size_t lo = 0, hi = job->nix;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (msg_id < job->ix_first[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo == 0)
        return -1;
    size_t i = lo - 1;
    return msg_id <= job->ix_last[i] ? job->ix_group[i] : -1;
}

static void cursor_advance(MGroup *g) {
    if (g->nxt < g->lasts[g->ri]) {
        g->nxt++;
    } else {
        g->ri++;
        g->nxt = g->ri < g->nranges ? g->firsts[g->ri] : 0;
    }
}

/* _release_in_order */
static int release_in_order(Receiver *r, Job *job, MGroup *g) {
    while (g->ri < g->nranges) {
        PyObject *key = PyLong_FromUnsignedLong(g->nxt);
        if (key == NULL)
            return -1;
        PyObject *data = PyDict_GetItemWithError(job->held, key);
        if (data == NULL) {
            Py_DECREF(key);
            return PyErr_Occurred() ? -1 : 0;
        }
        Py_INCREF(data);
        int rc = PyDict_DelItem(job->held, key);
        Py_DECREF(key);
        if (rc == 0) {
            unbuffer(r, job, PyBytes_GET_SIZE(data));
            rc = hand_over(r, job, g->nxt, g->group_id, data);
        }
        Py_DECREF(data);
        if (rc != 0)
            return -1;
        cursor_advance(g);
    }
    return 0;
}

/* _complete: a whole message (``nbytes`` and one PACKET_BYTES charged) is delivered or held */
static int complete(Receiver *r, Job *job, uint32_t msg_id, int k, PyObject *data, long long nbytes) {
    bm_add(job, msg_id);
    MGroup *g = &job->groups[k];
    g->delivered++;
    if (!g->ordered) {
        unbuffer(r, job, nbytes);
        return hand_over(r, job, msg_id, g->group_id, data);
    }
    if (g->ri < g->nranges && g->nxt == msg_id) {
        /* the next message of its group: held and released at once in the reference; the same, without the
         * dict (its charge is released by the same unbuffer) */
        unbuffer(r, job, PyBytes_GET_SIZE(data));
        if (hand_over(r, job, msg_id, g->group_id, data) != 0)
            return -1;
        cursor_advance(g);
        return PyDict_GET_SIZE(job->held) ? release_in_order(r, job, g) : 0;
    }
    PyObject *key = PyLong_FromUnsignedLong(msg_id);
    int rc = key == NULL ? -1 : PyDict_SetItem(job->held, key, data);
    Py_XDECREF(key);
    return rc != 0 ? -1 : release_in_order(r, job, g);
}

int receiver_duplicate(Receiver *r, Job *job, const AtpHeader *h, int ce) {
    job->duplicates++;
    job_note_seq(job, h->seq);
    return receiver_send_ack(r, job, h, ce);
}

static int on_packed(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload, double now, int ce);

/* _take: keep ``nbytes`` of payload costing ``cost`` bytes of the budget and acknowledge the packet: 1; 0 when the
 * budget cannot hold it (counted, nothing kept, no ACK); -1 on error */
static int take(Receiver *r, Job *job, const AtpHeader *h, long long cost, long long nbytes, double now, int ce) {
    if (!fits(r, job, cost))
        return drop(r, "memory_budget");
    charge(r, job, cost);
    r->buffered += nbytes;
    job->payload += nbytes;
    job->slot.progressed = 1;
    job->slot.progress_at = now;
    job_note_seq(job, h->seq);
    return receiver_send_ack(r, job, h, ce) != 0 ? -1 : 1;
}

static const double RATE_GAINS[RATE_PHASES] = {1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};

/* DeliveryRate._close: the window's sample (with the gaps, at most the in-order pace), the estimate, the loss */
static void rate_close(DeliveryRate *d) {
    /* the first sample: the gaps' side at most twice its bytes at the quickest spacing too (has_quick: span > 0) */
    if (d->samples == 0 && d->has_quick && IDLE_FACTOR * (double)d->sent * d->quick < d->span)
        d->span = IDLE_FACTOR * (double)d->sent * d->quick;
    double sample = (double)(8 * d->sent) / d->span;
    double bound = d->busy > 0 ? (double)(8 * d->bytes) / d->busy : d->bps; /* no in-order pair: not above it */
    if (bound < sample)
        sample = bound;
    if (d->samples == 0 || sample > d->bps)
        d->bps = sample;
    d->phase = (int)(d->samples % RATE_PHASES);
    d->samples++;
    double carried = sample * d->span < (double)(8 * d->sent) ? sample * d->span : (double)(8 * d->sent);
    d->loss = carried > 0 ? 1 - (double)(8 * d->got) / carried : 0.0;
    if (d->loss < 0)
        d->loss = 0.0;
    d->busy = d->span = 0.0;
    d->bytes = d->sent = d->got = 0;
}

/* DeliveryRate.note: a DATA packet of nbytes on the wire arrived at now, skipped sequence numbers past its job's
   newest (0: the next one; -1: below it) */
static void rate_note(DeliveryRate *d, long long nbytes, double now, long long skipped) {
    if (!d->started) {
        d->started = 1;
        d->last = now;
        return;
    }
    if (now > d->last && d->span >= d->window_s && d->window_s > 0 && (d->busy > 0 || d->samples > 0))
        rate_close(d);
    long long credit = 1 + (skipped < GAP_CREDIT_MAX ? skipped : GAP_CREDIT_MAX);
    double raw = now - d->last, dt = raw;
    if (d->samples > 0) { /* slower than twice the quicker of the estimate and the quickest spacing: an idle link */
        double per = 8 / d->bps;
        if (d->has_quick && d->quick < per)
            per = d->quick;
        double idle = IDLE_FACTOR * (double)credit * (double)nbytes * per;
        if (idle < dt)
            dt = idle;
    }
    if (skipped >= 0 && now > d->last) {
        d->span += dt;
        d->at = now;
        d->has_at = 1;
    }
    if (skipped >= 0 && d->has_at && now == d->at) { /* the first of its instant, or the rest of a counted batch */
        d->sent += credit * nbytes;
        d->got += nbytes;
    }
    if (skipped == 0 && now > d->last) {
        /* before the first sample, at most twice the quickest spacing so far: the pair may span the senders' wait */
        double quick = IDLE_FACTOR * (double)nbytes * d->quick;
        d->busy += d->samples > 0 || !d->has_quick || dt < quick ? dt : quick;
        d->counted = now;
        d->has_counted = 1;
    }
    if (skipped == 0 && d->has_counted && now == d->counted)
        d->bytes += nbytes;
    if (now > d->last && (!d->has_quick || raw / (double)nbytes < d->quick)) {
        d->quick = raw / (double)nbytes;
        d->has_quick = 1;
    }
    if (now > d->last)
        d->last = now;
}

/* DeliveryRate.gain: the cycle's gain, and 1 / (1 - loss) up to LOSS_GAIN_MAX */
static double rate_gain(const DeliveryRate *d) {
    double lost = d->loss * LOSS_GAIN_MAX >= LOSS_GAIN_MAX - 1 ? LOSS_GAIN_MAX : 1 / (1 - d->loss);
    return RATE_GAINS[d->phase] * lost;
}

/* The grant budget: one bandwidth-delay product (the told rate, or the delivery rate's estimate times its gain, x
   initial_rtt_s) in the packets that arrive (receiver.py, _note_data_size). */
static void note_data_size(Receiver *r, const Job *job, const AtpHeader *h, double now) {
    long long nbytes = ATP_HEADER_LEN + (long long)h->length + r->overhead_bytes;
    r->data_packets++;
    r->data_wire_bytes += nbytes;
    double bits = r->bdp_bits;
    if (r->delivery.on) {
        uint32_t skipped = job->has_top ? h->seq - job->top - 1 : 0;
        rate_note(&r->delivery, nbytes, now, skipped >= (1u << 31) ? -1 : (long long)skipped);
        if (r->delivery.samples == 0)
            return;
        bits = rate_gain(&r->delivery) * r->delivery.bps * r->rtt_s;
    }
    long long budget = (long long)ceil(bits * (double)r->data_packets / (double)(8 * r->data_wire_bytes));
    if (budget < 2)
        budget = 2;
    if (r->grant_cap > 0 && budget > r->grant_cap) /* config.grant_budget_for */
        budget = r->grant_cap;
    if (budget != r->grant_budget) {
        r->grant_budget = budget;
        r->grant_dirty = 1;
    }
}

static int on_data(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload, double now, int ce) {
    if (job->manifest == NULL)
        return drop(r, "before_announce");
    if (r->granting && !r->grant_fixed)
        note_data_size(r, job, h, now);
    if (h->count > 1)
        return on_packed(r, job, h, payload, now, ce);
    uint32_t msg_id = h->msg_id;
    if (msg_id >= job->total)
        return drop(r, "msg_id_out_of_range");
    if (h->pkt_cnt > r->max_packets)
        return drop(r, "too_many_packets");
    int k = index_find(job, msg_id);
    if (k < 0 || job->groups[k].group_id != h->group_id)
        return malformed(r, "inconsistent_message");
    job->packets++;
    job->data_packets++;
    job->records++;
    if (bm_has(job, msg_id))
        return receiver_duplicate(r, job, h, ce);
    Partial *part = (Partial *)map_get(&job->partial, msg_id);
    if (part != NULL) {
        if (part->cnt != h->pkt_cnt)
            return malformed(r, "inconsistent_message");
        if (part->have[h->pkt_idx >> 3] >> (h->pkt_idx & 7) & 1)
            return receiver_duplicate(r, job, h, ce);
    }
    long long n = h->length;
    long long cost = n + PACKET_BYTES;
    if (part == NULL) {
        cost += h->pkt_cnt > 1 ? PARTIAL_BYTES : 0;
        cost += bm_needs_chunk(job, msg_id) ? CHUNK_BYTES : 0;
    }
    int kept = take(r, job, h, cost, n, now, ce);
    if (kept <= 0)
        return kept;
    if (part == NULL) {
        if (bm_reserve(job, msg_id) != 0)
            return -1;
        if (h->pkt_cnt == 1) {
            PyObject *data = PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)n);
            if (data == NULL)
                return -1;
            int rc = complete(r, job, msg_id, k, data, n);
            Py_DECREF(data);
            return rc;
        }
        part = calloc(1, sizeof(Partial));
        if (part == NULL || (part->have = calloc(((size_t)h->pkt_cnt + 7) / 8, 1)) == NULL) {
            free(part);
            PyErr_NoMemory();
            return -1;
        }
        part->cnt = h->pkt_cnt;
        if (map_put(&job->partial, msg_id, (uintptr_t)part) != 0) {
            job_free_partial(part);
            return -1;
        }
    }
    if (ARRAY_RESERVE(&part->pieces, part->pieces.n + 1, 4) != 0)
        return -1;
    PyObject *chunk = PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)n);
    if (chunk == NULL)
        return -1;
    part->have[h->pkt_idx >> 3] |= (uint8_t)(1 << (h->pkt_idx & 7));
    part->pieces.v[part->pieces.n++] = (Piece){h->pkt_idx, chunk};
    part->nbytes += n;
    if (part->pieces.n < part->cnt)
        return 0;
    map_del(&job->partial, msg_id);
    /* b"".join(parts[i] for i in range(cnt)) */
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)part->nbytes);
    Py_ssize_t *at = malloc(part->cnt * sizeof(Py_ssize_t));
    if (data == NULL || at == NULL) {
        Py_XDECREF(data);
        free(at);
        job_free_partial(part);
        return data == NULL ? -1 : (PyErr_NoMemory(), -1);
    }
    for (uint32_t i = 0; i < part->cnt; i++)
        at[part->pieces.v[i].idx] = i;
    char *dst = PyBytes_AS_STRING(data);
    for (uint32_t p = 0; p < part->cnt; p++) {
        PyObject *c = part->pieces.v[at[p]].data;
        memcpy(dst, PyBytes_AS_STRING(c), (size_t)PyBytes_GET_SIZE(c));
        dst += PyBytes_GET_SIZE(c);
    }
    free(at);
    long long nbytes = part->nbytes;
    uint32_t cnt = part->cnt;
    job_free_partial(part);
    charge(r, job, -(PARTIAL_BYTES + (long long)(cnt - 1) * PACKET_BYTES));
    int rc = complete(r, job, msg_id, k, data, nbytes);
    Py_DECREF(data);
    return rc;
}

/* A packed message: its record in the payload. */
typedef struct {
    uint32_t msg_id;
    uint16_t len;
    int k; /* its group's index */
    const uint8_t *data;
} Record;

/* wire.decode_records: the ``count`` records filling the payload, the first one the header's msg_id, no id twice;
 * the number of records, or -1 (bad_pack). */
static int decode_records(const AtpHeader *h, const uint8_t *p, Record *out) {
    size_t off = 0, end = h->length;
    int n = 0;
    while (off < end) {
        if (off + ATP_RECORD_HEADER_LEN > end || n == h->count)
            return -1;
        out[n].msg_id = get32(p + off);
        out[n].len = get16(p + off + 4);
        off += ATP_RECORD_HEADER_LEN;
        if (off + out[n].len > end)
            return -1;
        out[n].data = p + off;
        off += out[n].len;
        n++;
    }
    if (n == 0 || n != h->count || out[0].msg_id != h->msg_id)
        return -1;
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++)
            if (out[i].msg_id == out[j].msg_id)
                return -1;
    return n;
}

/* _on_packed: ``count`` whole one-packet messages of the header's group, kept all or none */
static int on_packed(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload, double now, int ce) {
    Record rec[ATP_MAX_PACKED];
    int n = decode_records(h, payload, rec);
    if (n < 0)
        return malformed(r, "bad_pack");
    for (int i = 0; i < n; i++) {
        if (rec[i].msg_id >= job->total)
            return drop(r, "msg_id_out_of_range");
        int k = index_find(job, rec[i].msg_id);
        if (k < 0 || job->groups[k].group_id != h->group_id || map_get(&job->partial, rec[i].msg_id) != 0)
            return malformed(r, "inconsistent_message");
        rec[i].k = k;
    }
    job->packets++;
    job->data_packets++;
    job->records += n;
    int fresh[ATP_MAX_PACKED], nf = 0;
    uint32_t chunks[ATP_MAX_PACKED];
    int nchunks = 0;
    long long cost = 0, nbytes = 0;
    for (int i = 0; i < n; i++) {
        uint32_t id = rec[i].msg_id;
        if (bm_has(job, id))
            continue; /* this record came before */
        fresh[nf++] = i;
        cost += rec[i].len + PACKET_BYTES;
        nbytes += rec[i].len;
        if (bm_needs_chunk(job, id)) {
            int seen = 0;
            for (int c = 0; c < nchunks && !seen; c++)
                seen = chunks[c] == id >> CHUNK_SHIFT;
            if (!seen) {
                chunks[nchunks++] = id >> CHUNK_SHIFT;
                cost += CHUNK_BYTES;
            }
        }
    }
    if (nf == 0)
        return receiver_duplicate(r, job, h, ce);
    int kept = take(r, job, h, cost, nbytes, now, ce);
    if (kept <= 0)
        return kept;
    for (int f = 0; f < nf; f++) {
        const Record *x = &rec[fresh[f]];
        if (bm_reserve(job, x->msg_id) != 0)
            return -1;
        PyObject *data = PyBytes_FromStringAndSize((const char *)x->data, x->len);
        if (data == NULL)
            return -1;
        int rc = complete(r, job, x->msg_id, x->k, data, x->len);
        Py_DECREF(data);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* _on_trimmed: a DATA packet a switch trimmed on the way: the sender learns at once (a TRIM ACK echoing it) */
static int on_trimmed(Receiver *r, Job *job, const AtpHeader *h) {
    if (job->manifest == NULL)
        return drop(r, "before_announce");
    if (h->msg_id >= job->total)
        return drop(r, "msg_id_out_of_range");
    if (received_seq(job, h->seq))
        return drop(r, "trim_of_received"); /* that packet came whole: the header is forged or stale */
    r->trimmed++;
    job->trimmed++;
    job->data_packets++;
    job->records += h->count;
    arrived(r, job, h);
    if (job->pending && flush_ack(r, job) != 0)
        return -1;
    uint32_t grant = 0;
    int has_grant = grant_of(r, job, &grant), nb;
    if (ack_blocks(r, job, (has_grant ? 4 : 0) + (job->token != NULL ? ATP_TOKEN_LEN : 0), &nb) != 0)
        return -1;
    uint8_t *p;
    int ok = receiver_reply_within(r, job, ack_len(nb, has_grant, job->token), "trim_ack", &p);
    if (ok <= 0)
        return ok;
    write_ack(p, PT_ACK, F_TRIM, h, job, nb, has_grant, grant, job->token);
    return 0;
}

/* ============================== freeing, finishing ============================== */

static Py_ssize_t held_bytes(Job *job) {
    Py_ssize_t pos = 0, total = 0;
    PyObject *k, *v;
    while (PyDict_Next(job->held, &pos, &k, &v))
        total += PyBytes_GET_SIZE(v);
    return total;
}

/* _release: free buffers and bitmaps; the record (JOB_BYTES) stays charged while the job is tracked */
static void release(Receiver *r, Job *job) {
    long long partial_bytes = 0;
    for (uint32_t i = 0; job->partial.vals != NULL && i <= job->partial.mask; i++)
        if (job->partial.vals[i] != 0)
            partial_bytes += ((Partial *)job->partial.vals[i])->nbytes;
    r->buffered -= partial_bytes + held_bytes(job);
    charge(r, job, JOB_BYTES - job->charged);
    job_clear_partials(job, 1);
    PyDict_Clear(job->held);
    PyDict_Clear(job->announce_parts);
    job_clear_chunks(job, 1);
    job_free_group_index(job);
}

static int forget(Receiver *r, Job *job);

/* _forget_oldest_finished */
static int forget_oldest_finished(Receiver *r, Job *but, int *forgot) {
    *forgot = 0;
    for (size_t i = 0; i < r->finished.n; i++) {
        Job *job = r->finished.v[i];
        if (job != but) {
            if (count_admission(r, "linger_dropped") != 0 || forget(r, job) != 0)
                return -1;
            *forgot = 1;
            return 0;
        }
    }
    return 0;
}

/* _make_room: 1 when ``job`` may be charged ``n`` more (forgetting the oldest finished jobs if that helps) */
int receiver_make_room(Receiver *r, Job *job, long long n) {
    int forgot = 1;
    while (!fits(r, job, n) && forgot)
        if (forget_oldest_finished(r, job, &forgot) != 0)
            return -1;
    return fits(r, job, n);
}

/* _forget */
static int forget(Receiver *r, Job *job) {
    if (job->pending && flush_ack(r, job) != 0) /* what arrived is acknowledged before the job goes */
        return -1;
    release(r, job);
    charge(r, job, -job->charged);
    if (slots_remove(&r->slots, &job->slot) != 0)
        return -1;
    ARRAY_REMOVE(&r->finished, job);
    ARRAY_REMOVE(&r->pending, job);
    ARRAY_REMOVE(&r->jobs, job);
    if (r->last_job == job)
        r->last_job = NULL;
    job_free(job);
    r->grant_dirty = r->grant_dirty || r->granting;
    return 0;
}

/* _abandon */
int receiver_abandon(Receiver *r, Job *job, const char *reason) {
    long long delivered = 0;
    for (size_t i = 0; i < job->ngroups; i++)
        delivered += job->groups[i].delivered;
    uint32_t job_id = job->job_id;
    if (forget(r, job) != 0)
        return -1;
    return events_push(&r->ev, PyObject_CallFunction(R.JobAbandoned, "kLs", (unsigned long)job_id, delivered, reason));
}

/* _finish_record: the job gives up its slot and lingers to answer repeated FINs */
static int finish_record(Receiver *r, Job *job, double now) {
    budget_leave_slot(&r->memory, job->charged);
    job->finished = 1;
    job->finished_at = now;
    job->alloc = 0;
    r->grant_dirty = r->grant_dirty || r->granting;
    if (slots_remove(&r->slots, &job->slot) != 0)
        return -1;
    if (ARRAY_PUSH(&r->finished, job, 8) != 0)
        return -1;
    while ((long long)r->finished.n > r->slots.max_jobs || r->memory.pool > r->memory.pool_limit) {
        int forgot;
        if (forget_oldest_finished(r, job, &forgot) != 0)
            return -1;
        if (!forgot) {
            if (r->memory.pool > r->memory.pool_limit) {
                if (count_admission(r, "linger_dropped") != 0 || forget(r, job) != 0)
                    return -1;
            }
            break;
        }
    }
    return 0;
}

int receiver_reject_job(Receiver *r, Job *job, PyObject *reason, double now) {
    Py_INCREF(reason);
    Py_XSETREF(job->rejected, reason);
    uint32_t job_id = job->job_id;
    release(r, job);
    if (finish_record(r, job, now) != 0)
        return -1;
    return events_push(&r->ev, PyObject_CallFunction(R.JobRejected, "kO", (unsigned long)job_id, reason));
}


/* over 100 lines: receiver.py's _on_fin step by step (repeat, checks, DONE parts, finish), kept in its order */
static int on_fin(Receiver *r, Job *job, const AtpHeader *h, double now) {
    if (job->manifest == NULL)
        return drop(r, "fin_before_announce");
    /* an MSR = 1 group should have no gaps; if it has, hand over what is held anyway, in order */
    PyObject *keys = PyDict_Keys(job->held);
    if (keys == NULL || PyList_Sort(keys) != 0) {
        Py_XDECREF(keys);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        PyObject *data = PyDict_GetItem(job->held, k);
        Py_INCREF(data);
        PyDict_DelItem(job->held, k);
        unbuffer(r, job, PyBytes_GET_SIZE(data));
        uint32_t msg_id = (uint32_t)PyLong_AsUnsignedLong(k);
        int gk = index_find(job, msg_id);
        int rc = hand_over(r, job, msg_id, gk >= 0 ? job->groups[gk].group_id : 0, data);
        Py_DECREF(data);
        if (rc != 0) {
            Py_DECREF(keys);
            return -1;
        }
    }
    Py_DECREF(keys);
    /* lost = delivered.missing_ranges(total): flat first, end pairs, adjacent runs merged */
    ARRAY(uint32_t) lost = {0};
#define GAP(a, b)                                                                                        \
    do {                                                                                                 \
        uint32_t _a = (uint32_t)(a), _b = (uint32_t)(b);                                                 \
        if (_a < _b) {                                                                                   \
            if (lost.n && lost.v[lost.n - 1] == _a)                                                      \
                lost.v[lost.n - 1] = _b;                                                                 \
            else if (ARRAY_PUSH(&lost, _a, 64) != 0 || ARRAY_PUSH(&lost, _b, 64) != 0)                   \
                goto out;                                                                                \
        }                                                                                                \
    } while (0)
    PyObject *lost_ranges = NULL, *groups = NULL, *result = NULL, *done = NULL;
    int rc = -1;
    for (uint64_t base = 0; base < job->total; base += CHUNK_BITS) {
        const uint8_t *c = (const uint8_t *)map_get(&job->chunks, (uint32_t)(base >> CHUNK_SHIFT));
        uint64_t end = base + CHUNK_BITS < job->total ? base + CHUNK_BITS : job->total;
        if (c == NULL) {
            GAP(base, end);
            continue;
        }
        for (uint64_t i = base; i < end; i++)
            if (!(c[(i >> 3) & (CHUNK_RAW - 1)] >> (i & 7) & 1))
                GAP(i, i + 1);
    }
#undef GAP
    size_t nranges = lost.n / 2;
    lost_ranges = PyTuple_New((Py_ssize_t)nranges);
    groups = PyTuple_New((Py_ssize_t)job->ngroups);
    if (lost_ranges == NULL || groups == NULL)
        goto out;
    for (size_t i = 0; i < nranges; i++) {
        PyObject *v = Py_BuildValue("(kk)", (unsigned long)lost.v[2 * i], (unsigned long)lost.v[2 * i + 1]);
        if (v == NULL)
            goto out;
        PyTuple_SET_ITEM(lost_ranges, (Py_ssize_t)i, v);
    }
    for (size_t g = 0; g < job->ngroups; g++) {
        PyObject *gr = PyObject_CallFunction(R.GroupResult, "idIL", (int)job->groups[g].group_id, job->groups[g].msr,
                                             job->groups[g].count, (long long)job->groups[g].delivered);
        if (gr == NULL)
            goto out;
        PyTuple_SET_ITEM(groups, (Py_ssize_t)g, gr);
    }
    PyObject *kw = Py_BuildValue("{s:k,s:O,s:k,s:O,s:O,s:O,s:L,s:L,s:d,s:d}", "job_id", (unsigned long)job->job_id,
                                 "peer", job->peer, "total", (unsigned long)job->total, "vector_len", job->vector_len,
                                 "lost_ranges", lost_ranges, "groups", groups, "packets", (long long)job->packets,
                                 "duplicates", (long long)job->duplicates, "first_packet_at", job->first_at,
                                 "finished_at", now);
    if (kw == NULL)
        goto out;
    result = PyObject_Call(R.JobResult, R.empty_tuple, kw);
    Py_DECREF(kw);
    if (result == NULL)
        goto out;
    /* wire.encode_done_payloads + encode_done: n:u32, then n ranges (first, end) */
    long long per = (r->max_payload - 4) / 8;
    if (per < 1) {
        PyErr_Format(PyExc_ValueError, "max_payload %lld cannot carry a DONE part", r->max_payload);
        goto out;
    }
    if ((long long)nranges > per * 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "%zu lost ranges need more than 65535 DONE parts", nranges);
        goto out;
    }
    size_t nparts = nranges ? (nranges + (size_t)per - 1) / (size_t)per : 1;
    done = PyList_New((Py_ssize_t)nparts);
    if (done == NULL)
        goto out;
    long long kept = 0;
    for (size_t p = 0; p < nparts; p++) {
        size_t a = p * (size_t)per, b = a + (size_t)per < nranges ? a + (size_t)per : nranges;
        size_t plen = 4 + 8 * (b - a);
        PyObject *d = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(ATP_HEADER_LEN + plen));
        if (d == NULL)
            goto out;
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(d);
        AtpHeader dh = {.version = ATP_VERSION, .type = PT_DONE, .queue = ATP_QUEUE_UNSET, .job_id = job->job_id,
                        .pkt_idx = (uint16_t)p, .pkt_cnt = (uint16_t)nparts, .seq = h->seq,
                        .deadline_us = ATP_NO_DEADLINE, .length = (uint16_t)plen};
        atp_encode(o, &dh);
        put32(o + ATP_HEADER_LEN, (uint32_t)(b - a));
        for (size_t i = a; i < b; i++) {
            put32(o + ATP_HEADER_LEN + 4 + 8 * (i - a), lost.v[2 * i]);
            put32(o + ATP_HEADER_LEN + 8 + 8 * (i - a), lost.v[2 * i + 1]);
        }
        PyList_SET_ITEM(done, (Py_ssize_t)p, d);
        kept += (long long)(ATP_HEADER_LEN + plen) + DONE_BYTES_PER_PART;
    }
    uint32_t job_id = job->job_id;
    PyObject *peer = job->peer;
    Py_INCREF(peer);
    NetAddr na = job->peer_na;
    int has_na = job->peer_has_na;
    int64_t rx = job->rx_bytes, tx = job->tx_bytes;
    long long factor = factor_of(job);
    size_t next = job->done_next;
    release(r, job);
    if (finish_record(r, job, now) != 0) {
        Py_DECREF(peer);
        goto out;
    }
    Job *still = receiver_find_job(r, job_id); /* finish_record may have forgotten it */
    int room = still == NULL ? 0 : receiver_make_room(r, job, kept);
    if (room < 0) {
        Py_DECREF(peer);
        goto out;
    }
    still = receiver_find_job(r, job_id);
    if (still != NULL && room) {
        charge(r, job, kept);
        Py_INCREF(done);
        job->done_datagrams = done;
    } else if (count_admission(r, "done_not_kept") != 0) {
        Py_DECREF(peer);
        goto out;
    }
    if (still != NULL && job->pending && flush_ack(r, job) != 0) { /* the data's ACKs before the DONE */
        Py_DECREF(peer);
        goto out;
    }
    if (still != NULL)
        rc = send_done(r, job, done);
    else
        rc = send_done_to(r, peer, has_na ? &na : NULL, factor, rx, &tx, &next, done);
    Py_DECREF(peer);
    if (rc == 0) {
        Py_INCREF(result);
        rc = events_push(&r->ev, PyObject_CallOneArg(R.JobFinished, result));
        Py_DECREF(result);
    }
out:
    Py_XDECREF(result);
    Py_XDECREF(done);
    Py_XDECREF(lost_ranges);
    Py_XDECREF(groups);
    ARRAY_FREE(&lost);
    return rc;
}

/* ============================== receive_datagram ============================== */

/* ``addr``: the Python address, or NULL with ``na`` (from a socket; built only when needed) */
int receiver_receive(Receiver *r, const uint8_t *data, size_t len, PyObject *addr, const NetAddr *na, int ce,
                     double now) {
    r->datagrams++;
    AtpHeader h;
    const char *reason;
    if (atp_decode(data, len, &h, &reason) != 0)
        return malformed(r, reason);
    if (h.type != PT_DATA)
        return malformed(r, "not_data");
    if (h.job_id == 0)
        return malformed(r, "job_zero");
    int trimmed = (h.flags & F_TRIM) != 0;
    if (trimmed && ((h.flags & F_APPROX) || h.length || h.msg_id >= MSR_MSG_ID))
        return malformed(r, "bad_trim"); /* a switch leaves just the header of approximate data, APPROX cleared */
    Job *job = receiver_find_job(r, h.job_id);
    const uint8_t *payload = data + ATP_HEADER_LEN;
    if (job == NULL) {
        if (h.msg_id == ANNOUNCE_MSG_ID) {
            PyObject *a = addr;
            if (a == NULL && (a = addr_to_py(na)) == NULL)
                return -1;
            int rc = receiver_on_new_announce(r, &h, payload, a, na, now);
            if (addr == NULL)
                Py_DECREF(a);
            return rc;
        }
        return drop(r, h.msg_id == FIN_MSG_ID ? "fin_for_unknown_job" : "unknown_job");
    }
    int same;
    if (addr != NULL) {
        same = PyObject_RichCompareBool(job->peer, addr, Py_EQ);
        if (same < 0)
            return -1;
    } else if (job->peer_has_na) {
        same = netaddr_eq(&job->peer_na, na);
    } else { /* admitted through receive_datagram, now fed from a socket */
        PyObject *a = addr_to_py(na);
        if (a == NULL)
            return -1;
        same = PyObject_RichCompareBool(job->peer, a, Py_EQ);
        Py_DECREF(a);
        if (same < 0)
            return -1;
    }
    if (!same)
        return drop(r, "wrong_source");
    job->rx_bytes += (int64_t)len;
    if (count_replies(r, "request_bytes", (long long)len) != 0)
        return -1;
    if (job->finished) {
        if (job->rejected != NULL)
            return drop(r, "job_rejected");
        if (h.msg_id != FIN_MSG_ID)
            return drop(r, "job_finished");
        if (job->done_datagrams == NULL)
            return drop(r, "done_not_kept");
        return send_done(r, job, job->done_datagrams);
    }
    job->last_at = now;
    job->grant_repeats = 0;
    if (trimmed)
        return on_trimmed(r, job, &h);
    if (h.msg_id == FIN_MSG_ID)
        return on_fin(r, job, &h, now);
    if (h.msg_id == MSR_MSG_ID)
        return receiver_on_msr_change(r, job, &h, payload);
    if (h.msg_id == ANNOUNCE_MSG_ID) {
        int ok = receiver_announce_chunk(r, &h, payload);
        if (ok <= 0)
            return ok;
        int zero = receiver_token_is_zero(payload);
        int echo = !job->validated && !zero;
        if (echo && receiver_validate(r, job, &h, payload, now) != 0)
            return -1;
        return receiver_on_announce(r, job, &h, payload + ANNOUNCE_PREFIX_LEN, h.length - ANNOUNCE_PREFIX_LEN, now, echo);
    }
    return on_data(r, job, &h, payload, now, ce);
}

/* ============================== timers ============================== */

/* _grant_repeat_at: when the job's grant goes again in a GRANT; 0 when not due */
static int grant_repeat_at(const Receiver *r, const Job *job, double *at) {
    if (!r->granting || !job->has_grant || !job->has_top || job->grant == job->top + 1)
        return 0;
    int n = job->grant_repeats, k = n < GRANT_REPEAT_DOUBLINGS ? n : GRANT_REPEAT_DOUBLINGS; /* waits: 1, 2, .. 64 */
    long long waits = (1LL << (k + 1)) - 1 + (long long)(n - k) * (1LL << GRANT_REPEAT_DOUBLINGS);
    *at = job->last_at + GRANT_REPEAT_RTTS * r->rtt_s * (double)waits;
    return 1;
}

int receiver_timer_at(Receiver *r, double *out) {
    if (r->jobs.n == 0)
        return 1;
    double best = 0.0, repeat;
    for (size_t i = 0; i < r->jobs.n; i++) {
        Job *job = r->jobs.v[i];
        double t = job->finished ? job->finished_at + r->linger_s : job->last_at + r->idle_timeout_s;
        if (!job->finished && grant_repeat_at(r, job, &repeat) && repeat < t)
            t = repeat;
        if (i == 0 || t < best)
            best = t;
    }
    *out = best;
    return 0;
}

int receiver_handle_timer(Receiver *r, double now) {
    /* over a snapshot of the jobs, as list(self.jobs.items()); a job forgotten meanwhile is skipped */
    size_t n = r->jobs.n;
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = r->jobs.v[i]->job_id;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        Job *job = receiver_find_job(r, ids[i]);
        if (job == NULL)
            continue;
        if (job->finished) {
            if (now >= job->finished_at + r->linger_s)
                rc = forget(r, job);
        } else if (now >= job->last_at + r->idle_timeout_s) {
            rc = receiver_abandon(r, job, "idle");
        } else {
            double repeat;
            if (grant_repeat_at(r, job, &repeat) && now >= repeat) {
                job->grant_repeats++;
                rc = send_grant(r, job, 1);
            }
        }
    }
    free(ids);
    return rc;
}
