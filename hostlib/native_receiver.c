/* AtpReceiver in C: hostlib/receiver.py (with hostlib/admission.py's slots and memory budget) function for
 * function. Per packet: decode, job and source checks, the group index, duplicate suppression (the chunked
 * delivered bitmap), reassembly, the memory budget, delivery, ACK coalescing. Rare paths keep Python objects:
 * admission tokens (admission.TokenMinter), the announce's signature check and the manifest decode
 * (control.announce_auth, control.Manifest.decode), the per-source slot counts (a dict, for its order). */
#include <string.h>

#include "native_atp.h"

#define MAX_SACK_RANGES 64
#define CHUNK_SHIFT 10
#define CHUNK_BITS (1 << CHUNK_SHIFT)
#define CHUNK_RAW (CHUNK_BITS / 8)

/* the budget's charges, read from hostlib/receiver.py at import (receiver.JOB_BYTES, ...) */
static long long JOB_BYTES, CHUNK_BYTES, PARTIAL_BYTES, PACKET_BYTES, MANIFEST_BYTES, MANIFEST_BYTES_PER_BYTE,
    MANIFEST_BYTES_PER_GROUP, DONE_BYTES_PER_PART;

/* --- u32 -> pointer hash map (open addressing, backward-shift deletion) ----------------------------------- */

typedef struct {
    uint32_t *keys;
    void **vals;
    uint32_t mask;
    size_t len;
} PtrMap;

static inline uint32_t h32(uint32_t k) { return k * 2654435761u; }

static int pm_init(PtrMap *m) {
    m->mask = 7;
    m->len = 0;
    m->keys = calloc(8, sizeof(uint32_t));
    m->vals = calloc(8, sizeof(void *));
    return (m->keys && m->vals) ? 0 : -1;
}

static void pm_free(PtrMap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->len = 0;
}

static void *pm_get(const PtrMap *m, uint32_t k) {
    uint32_t i = h32(k) & m->mask;
    while (m->vals[i] != NULL) {
        if (m->keys[i] == k)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

static void pm_place(uint32_t *keys, void **vals, uint32_t mask, uint32_t k, void *v) {
    uint32_t i = h32(k) & mask;
    while (vals[i] != NULL)
        i = (i + 1) & mask;
    keys[i] = k;
    vals[i] = v;
}

/* m[k] = v (v not NULL, k not present) */
static int pm_put(PtrMap *m, uint32_t k, void *v) {
    if ((m->len + 1) * 2 > (size_t)m->mask + 1) {
        uint32_t nmask = m->mask * 2 + 1;
        uint32_t *nk = calloc((size_t)nmask + 1, sizeof(uint32_t));
        void **nv = calloc((size_t)nmask + 1, sizeof(void *));
        if (nk == NULL || nv == NULL) {
            free(nk);
            free(nv);
            PyErr_NoMemory();
            return -1;
        }
        for (uint32_t i = 0; i <= m->mask; i++)
            if (m->vals[i] != NULL)
                pm_place(nk, nv, nmask, m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->mask = nmask;
    }
    pm_place(m->keys, m->vals, m->mask, k, v);
    m->len++;
    return 0;
}

static void pm_del(PtrMap *m, uint32_t k) {
    uint32_t i = h32(k) & m->mask;
    while (m->vals[i] != NULL && m->keys[i] != k)
        i = (i + 1) & m->mask;
    if (m->vals[i] == NULL)
        return;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->vals[j] == NULL)
            break;
        uint32_t home = h32(m->keys[j]) & m->mask;
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = NULL;
    m->len--;
}

/* --- per-job state ------------------------------------------------------------------------------------- */

typedef struct {
    uint32_t cnt, got;
    int64_t nbytes;
    uint8_t *have;    /* cnt bits */
    uint16_t *idx;    /* arrival order: packet index ... */
    PyObject **data;  /* ... and its payload */
    uint32_t cap;
} Partial;

typedef struct {
    uint16_t group_id;
    double msr;
    uint32_t count;
    uint32_t *firsts, *lasts; /* the group's id ranges */
    uint32_t nranges;
    int ordered;
    uint32_t ri, nxt;          /* cursor (ordered groups) */
    int64_t delivered;
} MGroup;

typedef struct Job {
    uint32_t job_id;
    PyObject *peer, *source;
    NetAddr peer_na;
    int peer_has_na;
    double first_at, last_at, progress_at;
    int progressed;
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
    PtrMap partial;           /* msg_id -> Partial* */
    PtrMap chunks;            /* delivered bitmap: chunk index -> uint8_t[CHUNK_RAW] */
    PyObject *held;           /* dict msg_id -> bytes */
    uint32_t seq_first[MAX_SACK_RANGES + 1], seq_last[MAX_SACK_RANGES + 1];
    int nseq;
    int64_t packets, duplicates, charged;
    PyObject *done_datagrams; /* list of bytes or NULL */
    int finished;
    double finished_at;
    PyObject *rejected;       /* str or NULL */
    PyObject *coll;           /* collect_messages: this job's dict in Receiver.collected, or NULL */
    int pending;              /* ACK coalescing: the newest packet not yet acknowledged */
    AtpHeader pending_h;
    int pending_ce;
    long pending_count;
} Job;

typedef struct {
    size_t off;
    uint32_t len;
    PyObject *peer;
    NetAddr na;
    int has_na;
} OutItem;

typedef struct {
    PyObject_HEAD
    PyObject *config, *accept_jobs, *malformed, *dropped, *admission, *tokens, *per_source, *collected;
    long long max_messages, max_packets, max_jobs, max_per_source, max_payload, ack_every, budget;
    double linger_s, idle_timeout_s, stall_s;
    PyObject *admission_key; /* bytes or None */
    long long jobs_seen, buffered, datagrams;
    int collect;
    /* jobs, in the order they were admitted (the reference's dict order) */
    Job **jobs;
    size_t njobs, jobs_cap;
    Job *last_job;
    Job **holders; /* jobs holding a slot, in the order they got it */
    size_t nholders, holders_cap;
    Job **finished; /* finished jobs kept for repeated FINs, in the order they finished */
    size_t nfinished, finished_cap;
    /* admission.MemoryBudget */
    long long m_limit, m_guarantee, m_pool_limit, m_used, m_pool, m_peak;
    /* outgoing datagrams */
    uint8_t *obuf;
    size_t oused, ocap;
    OutItem *out;
    size_t nout, outcap;
    Job **pending; /* jobs with an ACK waiting, in the order their first packet arrived */
    size_t npending, pending_cap;
    /* events */
    PyObject **ev;
    size_t ev_head, ev_len, ev_cap;
    /* socket I/O */
    SendBatch batch;
    RecvRing ring;
} Receiver;

/* ============================== small helpers ============================== */

static int rpush_event(Receiver *r, PyObject *ev) {
    if (ev == NULL)
        return -1;
    if (r->ev_len == r->ev_cap) {
        size_t ncap = r->ev_cap ? r->ev_cap * 2 : 64;
        PyObject **n = malloc(ncap * sizeof(PyObject *));
        if (n == NULL) {
            Py_DECREF(ev);
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < r->ev_len; i++)
            n[i] = r->ev[(r->ev_head + i) % r->ev_cap];
        free(r->ev);
        r->ev = n;
        r->ev_cap = ncap;
        r->ev_head = 0;
    }
    r->ev[(r->ev_head + r->ev_len) % r->ev_cap] = ev;
    r->ev_len++;
    return 0;
}

static int drop(Receiver *r, const char *reason) { return counter_add(r->dropped, reason, 1); }
static int malformed(Receiver *r, const char *reason) { return counter_add(r->malformed, reason, 1); }
static int count_admission(Receiver *r, const char *what) { return counter_add(r->admission, what, 1); }

static int ptr_append(Job ***arr, size_t *n, size_t *cap, Job *job) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        Job **q = realloc(*arr, c * sizeof(Job *));
        if (q == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *arr = q;
        *cap = c;
    }
    (*arr)[(*n)++] = job;
    return 0;
}

static int ptr_remove(Job **arr, size_t *n, Job *job) {
    for (size_t i = 0; i < *n; i++)
        if (arr[i] == job) {
            memmove(&arr[i], &arr[i + 1], (*n - i - 1) * sizeof(Job *));
            (*n)--;
            return 1;
        }
    return 0;
}

/* --- admission.MemoryBudget ---------------------------------------------------------------------------- */

static inline long long m_over(Receiver *r, long long charged, int slot) {
    if (slot)
        return charged > r->m_guarantee ? charged - r->m_guarantee : 0;
    return charged;
}

static inline int m_fits(Receiver *r, long long charged, int slot, long long n) {
    return r->m_pool - m_over(r, charged, slot) + m_over(r, charged + n, slot) <= r->m_pool_limit;
}

static inline void m_charge(Receiver *r, long long charged, int slot, long long n) {
    r->m_pool += m_over(r, charged + n, slot) - m_over(r, charged, slot);
    r->m_used += n;
    if (r->m_used > r->m_peak)
        r->m_peak = r->m_used;
}

static inline int holds_slot(Job *job) { return !job->finished; }
static inline int fits(Receiver *r, Job *job, long long n) { return m_fits(r, job->charged, holds_slot(job), n); }

static inline void charge(Receiver *r, Job *job, long long n) {
    m_charge(r, job->charged, holds_slot(job), n);
    job->charged += n;
}

/* --- outgoing datagrams -------------------------------------------------------------------------------- */

static uint8_t *out_add_to(Receiver *r, PyObject *peer, const NetAddr *na, uint32_t len) {
    if (r->oused + len > r->ocap) {
        size_t n = r->ocap ? r->ocap : 1 << 16;
        while (n < r->oused + len)
            n *= 2;
        uint8_t *q = realloc(r->obuf, n);
        if (q == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        r->obuf = q;
        r->ocap = n;
    }
    if (r->nout == r->outcap) {
        size_t n = r->outcap ? r->outcap * 2 : 64;
        OutItem *q = realloc(r->out, n * sizeof(OutItem));
        if (q == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        r->out = q;
        r->outcap = n;
    }
    OutItem *it = &r->out[r->nout++];
    it->off = r->oused;
    it->len = len;
    it->peer = peer;
    Py_INCREF(peer);
    it->has_na = na != NULL;
    if (na != NULL)
        it->na = *na;
    uint8_t *p = r->obuf + r->oused;
    r->oused += len;
    return p;
}

static inline uint8_t *out_add(Receiver *r, Job *job, uint32_t len) {
    return out_add_to(r, job->peer, job->peer_has_na ? &job->peer_na : NULL, len);
}

static int out_add_bytes_to(Receiver *r, PyObject *peer, const NetAddr *na, PyObject *b) {
    uint8_t *p = out_add_to(r, peer, na, (uint32_t)PyBytes_GET_SIZE(b));
    if (p == NULL)
        return -1;
    memcpy(p, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
    return 0;
}

static void out_clear(Receiver *r) {
    for (size_t i = 0; i < r->nout; i++)
        Py_DECREF(r->out[i].peer);
    r->nout = 0;
    r->oused = 0;
}

/* ============================== jobs ============================== */

static void free_partial(Partial *p) {
    for (uint32_t i = 0; i < p->got; i++)
        Py_XDECREF(p->data[i]);
    free(p->have);
    free(p->idx);
    free(p->data);
    free(p);
}

static void free_manifest_arrays(Job *job) {
    for (size_t i = 0; i < job->ngroups; i++) {
        free(job->groups[i].firsts);
        free(job->groups[i].lasts);
    }
    free(job->groups);
    job->groups = NULL;
    job->ngroups = 0;
    free(job->ix_first);
    free(job->ix_last);
    free(job->ix_group);
    job->ix_first = job->ix_last = NULL;
    job->ix_group = NULL;
    job->nix = 0;
}

static void clear_partials(Job *job) {
    for (uint32_t i = 0; job->partial.vals != NULL && i <= job->partial.mask; i++)
        if (job->partial.vals[i] != NULL)
            free_partial(job->partial.vals[i]);
    pm_free(&job->partial);
    pm_init(&job->partial);
}

static void clear_chunks(Job *job) {
    for (uint32_t i = 0; job->chunks.vals != NULL && i <= job->chunks.mask; i++)
        free(job->chunks.vals[i]);
    pm_free(&job->chunks);
    pm_init(&job->chunks);
}

static void job_free(Job *job) {
    Py_XDECREF(job->peer);
    Py_XDECREF(job->source);
    Py_XDECREF(job->manifest);
    Py_XDECREF(job->vector_len);
    Py_XDECREF(job->announce_parts);
    Py_XDECREF(job->held);
    Py_XDECREF(job->done_datagrams);
    Py_XDECREF(job->rejected);
    Py_XDECREF(job->coll);
    for (uint32_t i = 0; job->partial.vals != NULL && i <= job->partial.mask; i++)
        if (job->partial.vals[i] != NULL)
            free_partial(job->partial.vals[i]);
    pm_free(&job->partial);
    for (uint32_t i = 0; job->chunks.vals != NULL && i <= job->chunks.mask; i++)
        free(job->chunks.vals[i]);
    pm_free(&job->chunks);
    free_manifest_arrays(job);
    free(job);
}

static PyObject *source_of(PyObject *addr) {
    PyObject *s = (PyTuple_Check(addr) && PyTuple_GET_SIZE(addr) > 0) ? PyTuple_GET_ITEM(addr, 0) : addr;
    Py_INCREF(s);
    return s;
}

static Job *job_new(uint32_t job_id, PyObject *peer, const NetAddr *na, double now) {
    Job *job = calloc(1, sizeof(Job));
    if (job == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    job->job_id = job_id;
    Py_INCREF(peer);
    job->peer = peer;
    job->source = source_of(peer);
    if (na != NULL) {
        job->peer_na = *na;
        job->peer_has_na = 1;
    }
    job->first_at = job->last_at = job->progress_at = now;
    job->announce_cnt = -1;
    job->announce_parts = PyDict_New();
    job->held = PyDict_New();
    if (job->announce_parts == NULL || job->held == NULL || pm_init(&job->partial) != 0 ||
        pm_init(&job->chunks) != 0) {
        job_free(job);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    return job;
}

static Job *find_job(Receiver *r, uint32_t job_id) {
    if (r->last_job != NULL && r->last_job->job_id == job_id)
        return r->last_job;
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i]->job_id == job_id)
            return r->last_job = r->jobs[i];
    return NULL;
}

/* _Job.note_seq */
static void note_seq(Job *job, uint32_t seq) {
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
    uint8_t *c = pm_get(&job->chunks, i >> CHUNK_SHIFT);
    return c != NULL && (c[(i >> 3) & (CHUNK_RAW - 1)] >> (i & 7) & 1);
}

static inline int bm_needs_chunk(Job *job, uint32_t i) { return pm_get(&job->chunks, i >> CHUNK_SHIFT) == NULL; }

static int bm_reserve(Job *job, uint32_t i) {
    if (pm_get(&job->chunks, i >> CHUNK_SHIFT) != NULL)
        return 0;
    uint8_t *c = calloc(CHUNK_RAW, 1);
    if (c == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (pm_put(&job->chunks, i >> CHUNK_SHIFT, c) != 0) {
        free(c);
        return -1;
    }
    return 0;
}

static inline void bm_add(Job *job, uint32_t i) {
    uint8_t *c = pm_get(&job->chunks, i >> CHUNK_SHIFT);
    c[(i >> 3) & (CHUNK_RAW - 1)] |= (uint8_t)(1 << (i & 7));
}

/* --- ACKs (coalesced) --- */

static int flush_ack(Receiver *r, Job *job) {
    const AtpHeader *h = &job->pending_h;
    int ce = job->pending_ce;
    job->pending = 0;
    job->pending_count = 0;
    ptr_remove(r->pending, &r->npending, job);
    int nb = job->nseq < ATP_MAX_SACK_BLOCKS ? job->nseq : ATP_MAX_SACK_BLOCKS;
    uint8_t *p = out_add(r, job, ATP_HEADER_LEN + 2 + 8 * (uint32_t)nb);
    if (p == NULL)
        return -1;
    AtpHeader a = {.version = ATP_VERSION, .type = PT_ACK, .flags = ce ? F_ECE : 0, .queue = h->queue,
                   .job_id = h->job_id, .msg_id = h->msg_id, .group_id = h->group_id, .pkt_idx = h->pkt_idx,
                   .pkt_cnt = h->pkt_cnt, .seq = h->seq, .deadline_us = ATP_NO_DEADLINE,
                   .length = (uint16_t)(2 + 8 * nb)};
    atp_encode(p, &a);
    put16(p + ATP_HEADER_LEN, (uint16_t)nb);
    for (int k = 0; k < nb; k++) {
        put32(p + ATP_HEADER_LEN + 2 + 8 * k, job->seq_first[job->nseq - 1 - k]);
        put32(p + ATP_HEADER_LEN + 6 + 8 * k, job->seq_last[job->nseq - 1 - k]);
    }
    return 0;
}

static int send_ack(Receiver *r, Job *job, const AtpHeader *h, int ce) {
    if (job->pending && (job->pending_h.queue != h->queue || job->pending_ce != ce) && flush_ack(r, job) != 0)
        return -1;
    if (!job->pending) {
        if (ptr_append(&r->pending, &r->npending, &r->pending_cap, job) != 0)
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

static int flush_all(Receiver *r) {
    while (r->npending)
        if (flush_ack(r, r->pending[0]) != 0)
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
        return rpush_event(r, message_received(job->job_id, msg_id, group_id, data));
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

static int duplicate(Receiver *r, Job *job, const AtpHeader *h, int ce) {
    job->duplicates++;
    note_seq(job, h->seq);
    return send_ack(r, job, h, ce);
}

static int on_data(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload, double now, int ce) {
    if (job->manifest == NULL)
        return drop(r, "before_announce");
    uint32_t msg_id = h->msg_id;
    if (msg_id >= job->total)
        return drop(r, "msg_id_out_of_range");
    if (h->pkt_cnt > r->max_packets)
        return drop(r, "too_many_packets");
    int k = index_find(job, msg_id);
    if (k < 0 || job->groups[k].group_id != h->group_id)
        return malformed(r, "inconsistent_message");
    job->packets++;
    if (bm_has(job, msg_id))
        return duplicate(r, job, h, ce);
    Partial *part = pm_get(&job->partial, msg_id);
    if (part != NULL) {
        if (part->cnt != h->pkt_cnt)
            return malformed(r, "inconsistent_message");
        if (part->have[h->pkt_idx >> 3] >> (h->pkt_idx & 7) & 1)
            return duplicate(r, job, h, ce);
    }
    long long n = h->length;
    long long cost = n + PACKET_BYTES;
    if (part == NULL) {
        cost += h->pkt_cnt > 1 ? PARTIAL_BYTES : 0;
        cost += bm_needs_chunk(job, msg_id) ? CHUNK_BYTES : 0;
    }
    if (!fits(r, job, cost))
        return drop(r, "memory_budget");
    charge(r, job, cost);
    r->buffered += n;
    job->progressed = 1;
    job->progress_at = now;
    note_seq(job, h->seq);
    if (send_ack(r, job, h, ce) != 0)
        return -1;
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
        if (pm_put(&job->partial, msg_id, part) != 0) {
            free_partial(part);
            return -1;
        }
    }
    if (part->got == part->cap) {
        uint32_t c = part->cap ? part->cap * 2 : 4;
        if (c > part->cnt)
            c = part->cnt;
        uint16_t *ni = realloc(part->idx, c * sizeof(uint16_t));
        if (ni == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        part->idx = ni;
        PyObject **nd = realloc(part->data, c * sizeof(PyObject *));
        if (nd == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        part->data = nd;
        part->cap = c;
    }
    PyObject *chunk = PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)n);
    if (chunk == NULL)
        return -1;
    part->have[h->pkt_idx >> 3] |= (uint8_t)(1 << (h->pkt_idx & 7));
    part->idx[part->got] = h->pkt_idx;
    part->data[part->got] = chunk;
    part->got++;
    part->nbytes += n;
    if (part->got < part->cnt)
        return 0;
    pm_del(&job->partial, msg_id);
    /* b"".join(parts[i] for i in range(cnt)) */
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)part->nbytes);
    Py_ssize_t *at = malloc(part->cnt * sizeof(Py_ssize_t));
    if (data == NULL || at == NULL) {
        Py_XDECREF(data);
        free(at);
        free_partial(part);
        return data == NULL ? -1 : (PyErr_NoMemory(), -1);
    }
    for (uint32_t i = 0; i < part->cnt; i++)
        at[part->idx[i]] = i;
    char *dst = PyBytes_AS_STRING(data);
    for (uint32_t p = 0; p < part->cnt; p++) {
        PyObject *c = part->data[at[p]];
        memcpy(dst, PyBytes_AS_STRING(c), (size_t)PyBytes_GET_SIZE(c));
        dst += PyBytes_GET_SIZE(c);
    }
    free(at);
    long long nbytes = part->nbytes;
    uint32_t cnt = part->cnt;
    free_partial(part);
    charge(r, job, -(PARTIAL_BYTES + (long long)(cnt - 1) * PACKET_BYTES));
    int rc = complete(r, job, msg_id, k, data, nbytes);
    Py_DECREF(data);
    return rc;
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
    for (uint32_t i = 0; i <= job->partial.mask; i++)
        if (job->partial.vals[i] != NULL)
            partial_bytes += ((Partial *)job->partial.vals[i])->nbytes;
    r->buffered -= partial_bytes + held_bytes(job);
    charge(r, job, JOB_BYTES - job->charged);
    clear_partials(job);
    PyDict_Clear(job->held);
    PyDict_Clear(job->announce_parts);
    clear_chunks(job);
    free(job->ix_first);
    free(job->ix_last);
    free(job->ix_group);
    job->ix_first = job->ix_last = NULL;
    job->ix_group = NULL;
    job->nix = 0;
}

static int forget(Receiver *r, Job *job);

/* _forget_oldest_finished */
static int forget_oldest_finished(Receiver *r, Job *but, int *forgot) {
    *forgot = 0;
    for (size_t i = 0; i < r->nfinished; i++) {
        Job *job = r->finished[i];
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
static int make_room(Receiver *r, Job *job, long long n) {
    int forgot = 1;
    while (!fits(r, job, n) && forgot)
        if (forget_oldest_finished(r, job, &forgot) != 0)
            return -1;
    return fits(r, job, n);
}

static int slot_remove(Receiver *r, Job *job);

/* _forget */
static int forget(Receiver *r, Job *job) {
    if (job->pending && flush_ack(r, job) != 0) /* what arrived is acknowledged before the job goes */
        return -1;
    release(r, job);
    charge(r, job, -job->charged);
    if (slot_remove(r, job) != 0)
        return -1;
    ptr_remove(r->finished, &r->nfinished, job);
    ptr_remove(r->pending, &r->npending, job);
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i] == job) {
            memmove(&r->jobs[i], &r->jobs[i + 1], (r->njobs - i - 1) * sizeof(Job *));
            r->njobs--;
            break;
        }
    if (r->last_job == job)
        r->last_job = NULL;
    job_free(job);
    return 0;
}

/* slots.remove */
static int slot_remove(Receiver *r, Job *job) {
    if (!ptr_remove(r->holders, &r->nholders, job))
        return 0;
    PyObject *c = PyDict_GetItemWithError(r->per_source, job->source);
    if (c == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long v = PyLong_AsLong(c) - 1;
    if (v == 0)
        return PyDict_DelItem(r->per_source, job->source);
    PyObject *nv = PyLong_FromLong(v);
    int rc = nv == NULL ? -1 : PyDict_SetItem(r->per_source, job->source, nv);
    Py_XDECREF(nv);
    return rc;
}

/* _abandon */
static int abandon(Receiver *r, Job *job, const char *reason) {
    long long delivered = 0;
    for (size_t i = 0; i < job->ngroups; i++)
        delivered += job->groups[i].delivered;
    uint32_t job_id = job->job_id;
    if (forget(r, job) != 0)
        return -1;
    return rpush_event(r, PyObject_CallFunction(R.JobAbandoned, "kLs", (unsigned long)job_id, delivered, reason));
}

/* _finish_record: the job gives up its slot and lingers to answer repeated FINs */
static int finish_record(Receiver *r, Job *job, double now) {
    r->m_pool += job->charged - m_over(r, job->charged, 1); /* memory.leave_slot */
    job->finished = 1;
    job->finished_at = now;
    if (slot_remove(r, job) != 0)
        return -1;
    if (ptr_append(&r->finished, &r->nfinished, &r->finished_cap, job) != 0)
        return -1;
    while ((long long)r->nfinished > r->max_jobs || r->m_pool > r->m_pool_limit) {
        int forgot;
        if (forget_oldest_finished(r, job, &forgot) != 0)
            return -1;
        if (!forgot) {
            if (r->m_pool > r->m_pool_limit) {
                if (count_admission(r, "linger_dropped") != 0 || forget(r, job) != 0)
                    return -1;
            }
            break;
        }
    }
    return 0;
}

static int reject_job(Receiver *r, Job *job, PyObject *reason, double now) {
    Py_INCREF(reason);
    Py_XSETREF(job->rejected, reason);
    uint32_t job_id = job->job_id;
    release(r, job);
    if (finish_record(r, job, now) != 0)
        return -1;
    return rpush_event(r, PyObject_CallFunction(R.JobRejected, "kO", (unsigned long)job_id, reason));
}

/* ============================== announce, admission ============================== */

static long long manifest_cost(const uint8_t *blob, Py_ssize_t len) {
    long long n_groups = len >= 14 ? get16(blob + 12) : 0;
    if (n_groups > len / 12)
        n_groups = len / 12;
    return MANIFEST_BYTES + MANIFEST_BYTES_PER_BYTE * len + MANIFEST_BYTES_PER_GROUP * n_groups;
}

/* _announce_chunk: 1 with the chunk's offset in the payload, 0 when counted and dropped, -1 on error */
static int announce_chunk(Receiver *r, const AtpHeader *h, const uint8_t *payload) {
    if (h->length < ANNOUNCE_PREFIX_LEN) {
        if (malformed(r, "bad_announce") != 0)
            return -1;
        return 0;
    }
    if (r->admission_key == Py_None)
        return 1;
    PyObject *kw = Py_BuildValue("{s:k,s:i,s:i,s:y#,s:y#}", "job_id", (unsigned long)h->job_id, "pkt_idx",
                                 (int)h->pkt_idx, "pkt_cnt", (int)h->pkt_cnt, "token", (const char *)payload,
                                 (Py_ssize_t)ATP_TOKEN_LEN, "chunk", (const char *)payload + ANNOUNCE_PREFIX_LEN,
                                 (Py_ssize_t)(h->length - ANNOUNCE_PREFIX_LEN));
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, r->admission_key);
    PyObject *want = args == NULL ? NULL : PyObject_Call(R.announce_auth, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    if (want == NULL)
        return -1;
    int ok = PyBytes_GET_SIZE(want) == ATP_AUTH_LEN;
    unsigned diff = 0;
    for (int i = 0; ok && i < ATP_AUTH_LEN; i++) /* hmac.compare_digest: no early exit */
        diff |= (unsigned)(PyBytes_AS_STRING(want)[i] ^ (char)payload[ATP_TOKEN_LEN + i]);
    Py_DECREF(want);
    if (!ok || diff != 0)
        return drop(r, "bad_auth") != 0 ? -1 : 0;
    return 1;
}

/* The manifest's groups and index into C arrays. */
static int adopt_manifest(Job *job, PyObject *manifest) {
    PyObject *total = PyObject_GetAttrString(manifest, "total");
    PyObject *vlen = total == NULL ? NULL : PyObject_GetAttrString(manifest, "vector_len");
    PyObject *groups = vlen == NULL ? NULL : PyObject_GetAttrString(manifest, "groups");
    PyObject *index = groups == NULL ? NULL : PyObject_CallMethod(manifest, "group_index", NULL);
    int rc = -1;
    Py_buffer bf = {0}, bl = {0}, bg = {0};
    if (index == NULL)
        goto out;
    job->total = (uint32_t)PyLong_AsUnsignedLong(total);
    Py_ssize_t ng = PyTuple_GET_SIZE(groups);
    job->groups = calloc(ng ? (size_t)ng : 1, sizeof(MGroup));
    if (job->groups == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    job->ngroups = (size_t)ng;
    for (Py_ssize_t k = 0; k < ng; k++) {
        PyObject *g = PyTuple_GET_ITEM(groups, k);
        MGroup *mg = &job->groups[k];
        long long gid, count;
        double msr;
        if (cfg_int(g, "group_id", &gid) || cfg_double(g, "msr", &msr) || cfg_int(g, "count", &count))
            goto out;
        mg->group_id = (uint16_t)gid;
        mg->msr = msr;
        mg->count = (uint32_t)count;
        mg->ordered = msr >= 1.0;
        PyObject *fa = PyObject_GetAttrString(g, "firsts"), *la = fa == NULL ? NULL : PyObject_GetAttrString(g, "lasts");
        Py_buffer f1 = {0}, l1 = {0};
        int bad = la == NULL || PyObject_GetBuffer(fa, &f1, PyBUF_FORMAT) != 0;
        if (!bad && PyObject_GetBuffer(la, &l1, PyBUF_FORMAT) != 0) {
            PyBuffer_Release(&f1);
            bad = 1;
        }
        Py_XDECREF(fa);
        Py_XDECREF(la);
        if (bad)
            goto out;
        mg->nranges = (uint32_t)(f1.len / f1.itemsize);
        mg->firsts = malloc((mg->nranges ? mg->nranges : 1) * sizeof(uint32_t));
        mg->lasts = malloc((mg->nranges ? mg->nranges : 1) * sizeof(uint32_t));
        if (mg->firsts == NULL || mg->lasts == NULL || f1.itemsize != 4 || l1.itemsize != 4) {
            PyBuffer_Release(&f1);
            PyBuffer_Release(&l1);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "manifest ranges are not 32-bit arrays");
            goto out;
        }
        memcpy(mg->firsts, f1.buf, mg->nranges * sizeof(uint32_t));
        memcpy(mg->lasts, l1.buf, mg->nranges * sizeof(uint32_t));
        PyBuffer_Release(&f1);
        PyBuffer_Release(&l1);
        if (mg->ordered) {
            mg->ri = 0;
            mg->nxt = mg->nranges ? mg->firsts[0] : 0;
        }
    }
    PyObject *fa = PyObject_GetAttrString(index, "firsts"), *la = PyObject_GetAttrString(index, "lasts"),
             *ga = PyObject_GetAttrString(index, "group");
    int bad = fa == NULL || la == NULL || ga == NULL || PyObject_GetBuffer(fa, &bf, PyBUF_FORMAT) != 0;
    if (!bad && PyObject_GetBuffer(la, &bl, PyBUF_FORMAT) != 0)
        bad = 1;
    if (!bad && PyObject_GetBuffer(ga, &bg, PyBUF_FORMAT) != 0)
        bad = 1;
    Py_XDECREF(fa);
    Py_XDECREF(la);
    Py_XDECREF(ga);
    if (bad)
        goto out;
    job->nix = (size_t)(bf.len / 4);
    job->ix_first = malloc((job->nix ? job->nix : 1) * sizeof(uint32_t));
    job->ix_last = malloc((job->nix ? job->nix : 1) * sizeof(uint32_t));
    job->ix_group = malloc((job->nix ? job->nix : 1) * sizeof(uint16_t));
    if (job->ix_first == NULL || job->ix_last == NULL || job->ix_group == NULL || bg.itemsize != 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "unexpected manifest index arrays");
        goto out;
    }
    memcpy(job->ix_first, bf.buf, job->nix * sizeof(uint32_t));
    memcpy(job->ix_last, bl.buf, job->nix * sizeof(uint32_t));
    memcpy(job->ix_group, bg.buf, job->nix * sizeof(uint16_t));
    Py_INCREF(manifest);
    job->manifest = manifest;
    Py_INCREF(vlen);
    job->vector_len = vlen;
    rc = 0;
out:
    if (bf.obj)
        PyBuffer_Release(&bf);
    if (bl.obj)
        PyBuffer_Release(&bl);
    if (bg.obj)
        PyBuffer_Release(&bg);
    Py_XDECREF(total);
    Py_XDECREF(vlen);
    Py_XDECREF(groups);
    Py_XDECREF(index);
    if (rc != 0)
        free_manifest_arrays(job);
    return rc;
}

static int on_announce(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *chunk, Py_ssize_t clen,
                       double now) {
    if (job->announce_cnt >= 0 && h->pkt_cnt != job->announce_cnt)
        return malformed(r, "inconsistent_announce");
    PyObject *key = PyLong_FromLong(h->pkt_idx);
    if (key == NULL)
        return -1;
    int have = PyDict_Contains(job->announce_parts, key);
    if (have < 0) {
        Py_DECREF(key);
        return -1;
    }
    if (job->manifest != NULL || have) {
        Py_DECREF(key);
        return duplicate(r, job, h, 0);
    }
    long long cost = clen + PACKET_BYTES;
    if (!fits(r, job, cost)) {
        Py_DECREF(key);
        return drop(r, "memory_budget");
    }
    charge(r, job, cost);
    note_seq(job, h->seq);
    job->announce_cnt = h->pkt_cnt;
    PyObject *part = PyBytes_FromStringAndSize((const char *)chunk, clen);
    int rc = part == NULL ? -1 : PyDict_SetItem(job->announce_parts, key, part);
    Py_XDECREF(part);
    Py_DECREF(key);
    if (rc != 0)
        return -1;
    job->progress_at = now;
    if (send_ack(r, job, h, 0) != 0)
        return -1;
    if (PyDict_GET_SIZE(job->announce_parts) < h->pkt_cnt)
        return 0;
    PyObject *list = PyList_New(h->pkt_cnt);
    if (list == NULL)
        return -1;
    for (long i = 0; i < h->pkt_cnt; i++) {
        PyObject *k = PyLong_FromLong(i);
        PyObject *v = k == NULL ? NULL : PyDict_GetItemWithError(job->announce_parts, k);
        Py_XDECREF(k);
        if (v == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "%ld", i);
            Py_DECREF(list);
            return -1;
        }
        Py_INCREF(v);
        PyList_SET_ITEM(list, i, v);
    }
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    PyObject *blob = empty == NULL ? NULL : _PyBytes_Join(empty, list);
    Py_XDECREF(empty);
    Py_DECREF(list);
    if (blob == NULL)
        return -1;
    long long mcost = manifest_cost((const uint8_t *)PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
    int room = make_room(r, job, mcost);
    if (room <= 0) {
        Py_DECREF(blob);
        if (room < 0 || drop(r, "memory_budget") != 0)
            return -1;
        PyObject *why = PyUnicode_FromString("announce does not fit the receiver's memory budget (memory_budget_bytes)");
        rc = why == NULL ? -1 : reject_job(r, job, why, now);
        Py_XDECREF(why);
        return rc;
    }
    charge(r, job, mcost);
    charge(r, job, -(PyBytes_GET_SIZE(blob) + (long long)h->pkt_cnt * PACKET_BYTES));
    PyDict_Clear(job->announce_parts);
    PyObject *kw = Py_BuildValue("{s:L}", "max_messages", r->max_messages);
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, blob);
    PyObject *manifest = args == NULL ? NULL : PyObject_Call(R.Manifest_decode, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(blob);
    if (manifest == NULL) {
        if (!PyErr_ExceptionMatches(R.MalformedPacket))
            return -1;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *reason = PyObject_GetAttrString(value, "reason"), *text = PyObject_Str(value);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        Py_XDECREF(value);
        rc = -1;
        if (reason != NULL && text != NULL) {
            const char *rs = PyUnicode_AsUTF8(reason);
            rc = rs == NULL || malformed(r, rs) != 0 ? -1 : reject_job(r, job, text, now);
        }
        Py_XDECREF(reason);
        Py_XDECREF(text);
        return rc;
    }
    rc = adopt_manifest(job, manifest);
    Py_DECREF(manifest);
    return rc;
}

static int retry(Receiver *r, const AtpHeader *h, PyObject *addr, const NetAddr *na, double now) {
    if (count_admission(r, "retries") != 0)
        return -1;
    PyObject *token = PyObject_CallMethod(r->tokens, "mint", "kOd", (unsigned long)h->job_id, addr, now);
    if (token == NULL)
        return -1;
    if (!PyBytes_Check(token) || PyBytes_GET_SIZE(token) != ATP_TOKEN_LEN) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_RuntimeError, "TokenMinter.mint returned an unexpected token");
        return -1;
    }
    uint8_t *p = out_add_to(r, addr, na, ATP_HEADER_LEN + ATP_TOKEN_LEN);
    if (p == NULL) {
        Py_DECREF(token);
        return -1;
    }
    AtpHeader rh = {.version = ATP_VERSION, .type = PT_RETRY, .queue = ATP_QUEUE_UNSET, .job_id = h->job_id,
                    .msg_id = h->msg_id, .pkt_idx = h->pkt_idx, .pkt_cnt = h->pkt_cnt, .seq = h->seq,
                    .deadline_us = ATP_NO_DEADLINE, .length = ATP_TOKEN_LEN};
    atp_encode(p, &rh);
    memcpy(p + ATP_HEADER_LEN, PyBytes_AS_STRING(token), ATP_TOKEN_LEN);
    Py_DECREF(token);
    return 0;
}

static inline int progress_less(Job *a, Job *b) {
    if (a->progressed != b->progressed)
        return a->progressed < b->progressed;
    return a->progress_at < b->progress_at;
}

/* SlotTable._stalled over the holders (``source`` NULL: all, else that source's) */
static int stalled(Receiver *r, PyObject *source, double now, Job **out) {
    Job *best = NULL;
    for (size_t i = 0; i < r->nholders; i++) {
        Job *j = r->holders[i];
        if (source != NULL) {
            int eq = PyObject_RichCompareBool(j->source, source, Py_EQ);
            if (eq < 0)
                return -1;
            if (!eq)
                continue;
        }
        if (now - j->progress_at >= r->stall_s && (best == NULL || progress_less(j, best)))
            best = j;
    }
    *out = best;
    return 0;
}

/* SlotTable.choose: 0 with *refusal (a drop reason), or *victim and *why (victim NULL: a free slot); -1 error */
static int choose(Receiver *r, PyObject *source, double now, const char **refusal, Job **victim, const char **why) {
    *refusal = NULL;
    *victim = NULL;
    *why = "";
    PyObject *c = PyDict_GetItemWithError(r->per_source, source);
    if (c == NULL && PyErr_Occurred())
        return -1;
    long mine = c == NULL ? 0 : PyLong_AsLong(c);
    if (mine >= r->max_per_source) {
        if (stalled(r, source, now, victim) != 0)
            return -1;
        if (*victim != NULL)
            *why = "stalled";
        else
            *refusal = "source_share";
        return 0;
    }
    if ((long long)r->nholders < r->max_jobs)
        return 0;
    if (stalled(r, NULL, now, victim) != 0)
        return -1;
    if (*victim != NULL) {
        *why = "stalled";
        return 0;
    }
    long long sources = PyDict_GET_SIZE(r->per_source) + (c == NULL);
    long long share = r->max_jobs / sources;
    if (share < 1)
        share = 1;
    PyObject *big = NULL, *k, *v;
    long held = -1;
    Py_ssize_t pos = 0;
    while (PyDict_Next(r->per_source, &pos, &k, &v)) {
        long x = PyLong_AsLong(v);
        if (big == NULL || x > held) {
            big = k;
            held = x;
        }
    }
    if (big != NULL && held > share && held > mine + 1) {
        Job *best = NULL;
        for (size_t i = 0; i < r->nholders; i++) {
            int eq = PyObject_RichCompareBool(r->holders[i]->source, big, Py_EQ);
            if (eq < 0)
                return -1;
            if (eq && (best == NULL || progress_less(r->holders[i], best)))
                best = r->holders[i];
        }
        *victim = best;
        *why = "share";
        return 0;
    }
    *refusal = "no_slot";
    return 0;
}

static int slot_add(Receiver *r, Job *job) {
    if (ptr_append(&r->holders, &r->nholders, &r->holders_cap, job) != 0)
        return -1;
    PyObject *c = PyDict_GetItemWithError(r->per_source, job->source);
    if (c == NULL && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromLong((c == NULL ? 0 : PyLong_AsLong(c)) + 1);
    int rc = nv == NULL ? -1 : PyDict_SetItem(r->per_source, job->source, nv);
    Py_XDECREF(nv);
    return rc;
}

/* _on_new_announce: RETRY, admit, or drop; ``addr`` is the Python address (built by the caller) */
static int on_new_announce(Receiver *r, const AtpHeader *h, const uint8_t *payload, PyObject *addr,
                           const NetAddr *na, double now) {
    if (r->accept_jobs != Py_None) {
        long long limit = PyLong_AsLongLong(r->accept_jobs);
        if (limit == -1 && PyErr_Occurred())
            return -1;
        if (r->jobs_seen >= limit)
            return drop(r, "not_accepting_jobs");
    }
    int ok = announce_chunk(r, h, payload);
    if (ok <= 0)
        return ok;
    PyObject *source = source_of(addr);
    const char *refusal, *why;
    Job *victim;
    int rc = choose(r, source, now, &refusal, &victim, &why);
    Py_DECREF(source);
    if (rc != 0)
        return -1;
    if (refusal != NULL)
        return drop(r, refusal);
    int zero = 1;
    for (int i = 0; i < ATP_TOKEN_LEN; i++)
        if (payload[i])
            zero = 0;
    if (zero)
        return retry(r, h, addr, na, now);
    PyObject *token = PyBytes_FromStringAndSize((const char *)payload, ATP_TOKEN_LEN);
    PyObject *bad = token == NULL ? NULL
                  : PyObject_CallMethod(r->tokens, "check", "OkOd", token, (unsigned long)h->job_id, addr, now);
    Py_XDECREF(token);
    if (bad == NULL)
        return -1;
    if (bad != Py_None) {
        const char *reason = PyUnicode_AsUTF8(bad);
        rc = reason == NULL || drop(r, reason) != 0 ? -1 : retry(r, h, addr, na, now);
        Py_DECREF(bad);
        return rc;
    }
    Py_DECREF(bad);
    Job *job = job_new(h->job_id, addr, na, now);
    if (job == NULL)
        return -1;
    int room = make_room(r, job, JOB_BYTES);
    if (room <= 0) {
        job_free(job);
        return room < 0 ? -1 : drop(r, "memory_budget");
    }
    if (victim != NULL) {
        char what[32];
        snprintf(what, sizeof what, "evicted_%s", why);
        if (count_admission(r, what) != 0 || abandon(r, victim, why) != 0) {
            job_free(job);
            return -1;
        }
    }
    if (ptr_append(&r->jobs, &r->njobs, &r->jobs_cap, job) != 0) {
        job_free(job);
        return -1;
    }
    r->last_job = job;
    charge(r, job, JOB_BYTES);
    if (slot_add(r, job) != 0)
        return -1;
    r->jobs_seen++;
    if (count_admission(r, "admitted") != 0)
        return -1;
    return on_announce(r, job, h, payload + ANNOUNCE_PREFIX_LEN, h->length - ANNOUNCE_PREFIX_LEN, now);
}

/* ============================== FIN, DONE ============================== */

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
    /* lost = delivered.missing(total) */
    size_t nlost = 0, cap = 1024;
    uint32_t *lost = malloc(cap * sizeof(uint32_t));
    if (lost == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t base = 0; base < job->total; base += CHUNK_BITS) {
        uint8_t *c = pm_get(&job->chunks, (uint32_t)(base >> CHUNK_SHIFT));
        uint64_t end = base + CHUNK_BITS < job->total ? base + CHUNK_BITS : job->total;
        for (uint64_t i = base; i < end; i++) {
            if (c != NULL && (c[(i >> 3) & (CHUNK_RAW - 1)] >> (i & 7) & 1))
                continue;
            if (nlost == cap) {
                cap *= 2;
                uint32_t *q = realloc(lost, cap * sizeof(uint32_t));
                if (q == NULL) {
                    free(lost);
                    PyErr_NoMemory();
                    return -1;
                }
                lost = q;
            }
            lost[nlost++] = (uint32_t)i;
        }
    }
    PyObject *lost_ids = PyTuple_New((Py_ssize_t)nlost), *groups = PyTuple_New((Py_ssize_t)job->ngroups);
    PyObject *result = NULL, *done = NULL;
    int rc = -1;
    if (lost_ids == NULL || groups == NULL)
        goto out;
    for (size_t i = 0; i < nlost; i++) {
        PyObject *v = PyLong_FromUnsignedLong(lost[i]);
        if (v == NULL)
            goto out;
        PyTuple_SET_ITEM(lost_ids, (Py_ssize_t)i, v);
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
                                 "lost_ids", lost_ids, "groups", groups, "packets", (long long)job->packets,
                                 "duplicates", (long long)job->duplicates, "first_packet_at", job->first_at,
                                 "finished_at", now);
    if (kw == NULL)
        goto out;
    result = PyObject_Call(R.JobResult, R.empty_tuple, kw);
    Py_DECREF(kw);
    if (result == NULL)
        goto out;
    /* wire.encode_done_payloads + encode_done */
    long long per = (r->max_payload - 4) / 4;
    if (per < 1) {
        PyErr_Format(PyExc_ValueError, "max_payload %lld cannot carry a DONE part", r->max_payload);
        goto out;
    }
    if ((long long)nlost > per * 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "%zu lost ids need more than 65535 DONE parts", nlost);
        goto out;
    }
    size_t nparts = nlost ? (nlost + (size_t)per - 1) / (size_t)per : 1;
    done = PyList_New((Py_ssize_t)nparts);
    if (done == NULL)
        goto out;
    long long kept = 0;
    for (size_t p = 0; p < nparts; p++) {
        size_t a = p * (size_t)per, b = a + (size_t)per < nlost ? a + (size_t)per : nlost;
        size_t plen = 4 + 4 * (b - a);
        PyObject *d = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(ATP_HEADER_LEN + plen));
        if (d == NULL)
            goto out;
        uint8_t *o = (uint8_t *)PyBytes_AS_STRING(d);
        AtpHeader dh = {.version = ATP_VERSION, .type = PT_DONE, .queue = ATP_QUEUE_UNSET, .job_id = job->job_id,
                        .pkt_idx = (uint16_t)p, .pkt_cnt = (uint16_t)nparts, .seq = h->seq,
                        .deadline_us = ATP_NO_DEADLINE, .length = (uint16_t)plen};
        atp_encode(o, &dh);
        put32(o + ATP_HEADER_LEN, (uint32_t)(b - a));
        for (size_t i = a; i < b; i++)
            put32(o + ATP_HEADER_LEN + 4 + 4 * (i - a), lost[i]);
        PyList_SET_ITEM(done, (Py_ssize_t)p, d);
        kept += (long long)(ATP_HEADER_LEN + plen) + DONE_BYTES_PER_PART;
    }
    uint32_t job_id = job->job_id;
    PyObject *peer = job->peer;
    Py_INCREF(peer);
    NetAddr na = job->peer_na;
    int has_na = job->peer_has_na;
    release(r, job);
    if (finish_record(r, job, now) != 0) {
        Py_DECREF(peer);
        goto out;
    }
    Job *still = find_job(r, job_id); /* finish_record may have forgotten it */
    int room = still == NULL ? 0 : make_room(r, job, kept);
    if (room < 0) {
        Py_DECREF(peer);
        goto out;
    }
    still = find_job(r, job_id);
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
    rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(done); i++)
        rc = out_add_bytes_to(r, peer, has_na ? &na : NULL, PyList_GET_ITEM(done, i));
    Py_DECREF(peer);
    if (rc == 0) {
        Py_INCREF(result);
        rc = rpush_event(r, PyObject_CallOneArg(R.JobFinished, result));
        Py_DECREF(result);
    }
out:
    Py_XDECREF(result);
    Py_XDECREF(done);
    Py_XDECREF(lost_ids);
    Py_XDECREF(groups);
    free(lost);
    return rc;
}

/* ============================== receive_datagram ============================== */

/* ``addr``: the Python address, or NULL with ``na`` (from a socket; built only when needed) */
static int receive(Receiver *r, const uint8_t *data, size_t len, PyObject *addr, const NetAddr *na, int ce,
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
    Job *job = find_job(r, h.job_id);
    const uint8_t *payload = data + ATP_HEADER_LEN;
    if (job == NULL) {
        if (h.msg_id == ANNOUNCE_MSG_ID) {
            PyObject *a = addr;
            if (a == NULL && (a = addr_to_py(na)) == NULL)
                return -1;
            int rc = on_new_announce(r, &h, payload, a, na, now);
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
    if (job->finished) {
        if (job->rejected != NULL)
            return drop(r, "job_rejected");
        if (h.msg_id != FIN_MSG_ID)
            return drop(r, "job_finished");
        if (job->done_datagrams == NULL)
            return drop(r, "done_not_kept");
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(job->done_datagrams); i++)
            if (out_add_bytes_to(r, job->peer, job->peer_has_na ? &job->peer_na : NULL,
                                 PyList_GET_ITEM(job->done_datagrams, i)) != 0)
                return -1;
        return 0;
    }
    job->last_at = now;
    if (h.msg_id == FIN_MSG_ID)
        return on_fin(r, job, &h, now);
    if (h.msg_id == ANNOUNCE_MSG_ID) {
        int ok = announce_chunk(r, &h, payload);
        if (ok <= 0)
            return ok;
        return on_announce(r, job, &h, payload + ANNOUNCE_PREFIX_LEN, h.length - ANNOUNCE_PREFIX_LEN, now);
    }
    return on_data(r, job, &h, payload, now, ce);
}

/* ============================== Python type ============================== */

static void Receiver_dealloc(Receiver *r) {
    PyObject_GC_UnTrack(r);
    Py_CLEAR(r->config);
    Py_CLEAR(r->accept_jobs);
    Py_CLEAR(r->malformed);
    Py_CLEAR(r->dropped);
    Py_CLEAR(r->admission);
    Py_CLEAR(r->tokens);
    Py_CLEAR(r->per_source);
    Py_CLEAR(r->collected);
    Py_CLEAR(r->admission_key);
    for (size_t i = 0; i < r->njobs; i++)
        job_free(r->jobs[i]);
    free(r->jobs);
    free(r->holders);
    free(r->finished);
    free(r->pending);
    out_clear(r);
    free(r->obuf);
    free(r->out);
    while (r->ev_len) {
        Py_DECREF(r->ev[r->ev_head]);
        r->ev_head = (r->ev_head + 1) % r->ev_cap;
        r->ev_len--;
    }
    free(r->ev);
    batch_free(&r->batch);
    ring_free(&r->ring);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int Receiver_traverse(Receiver *r, visitproc visit, void *arg) {
    Py_VISIT(r->config);
    Py_VISIT(r->accept_jobs);
    Py_VISIT(r->malformed);
    Py_VISIT(r->dropped);
    Py_VISIT(r->admission);
    Py_VISIT(r->tokens);
    Py_VISIT(r->per_source);
    Py_VISIT(r->collected);
    for (size_t i = 0; i < r->ev_len; i++)
        Py_VISIT(r->ev[(r->ev_head + i) % r->ev_cap]);
    return 0;
}

static int load_costs(void) {
    static int loaded = 0;
    if (loaded)
        return 0;
    PyObject *m = PyImport_ImportModule("netapprox.hostlib.receiver");
    if (m == NULL)
        return -1;
    struct {
        const char *name;
        long long *dst;
    } costs[] = {{"JOB_BYTES", &JOB_BYTES}, {"CHUNK_BYTES", &CHUNK_BYTES}, {"PARTIAL_BYTES", &PARTIAL_BYTES},
                 {"PACKET_BYTES", &PACKET_BYTES}, {"MANIFEST_BYTES", &MANIFEST_BYTES},
                 {"MANIFEST_BYTES_PER_BYTE", &MANIFEST_BYTES_PER_BYTE},
                 {"MANIFEST_BYTES_PER_GROUP", &MANIFEST_BYTES_PER_GROUP},
                 {"DONE_BYTES_PER_PART", &DONE_BYTES_PER_PART}};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof costs / sizeof costs[0]; i++)
        rc = cfg_int(m, costs[i].name, costs[i].dst);
    Py_DECREF(m);
    if (rc == 0) {
        if (CHUNK_BITS != 1024) {
            PyErr_SetString(PyExc_RuntimeError, "chunk size differs from hostlib/receiver.py");
            return -1;
        }
        loaded = 1;
    }
    return rc;
}

static int Receiver_init(Receiver *r, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"config", "now", "accept_jobs", "token_secret", "collect_messages", NULL};
    PyObject *config = NULL, *accept = Py_None, *secret = Py_None;
    double now = 0.0;
    int collect = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OdOOp:AtpReceiver", kwlist, &config, &now, &accept, &secret,
                                     &collect))
        return -1;
    if (r->config != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "AtpReceiver is already initialised");
        return -1;
    }
    if (load_costs() != 0)
        return -1;
    if (config == NULL)
        config = R.default_config;
    Py_INCREF(config);
    r->config = config;
    Py_INCREF(accept);
    r->accept_jobs = accept;
    r->collect = collect;
    r->malformed = PyObject_CallNoArgs(R.Counter);
    r->dropped = PyObject_CallNoArgs(R.Counter);
    r->admission = PyObject_CallNoArgs(R.Counter);
    r->per_source = PyObject_CallNoArgs(R.Counter);
    r->collected = PyDict_New();
    if (r->malformed == NULL || r->dropped == NULL || r->admission == NULL || r->per_source == NULL ||
        r->collected == NULL || batch_init(&r->batch) != 0)
        return -1;
    double lifetime;
    if (cfg_int(config, "max_messages", &r->max_messages) || cfg_int(config, "max_packets_per_message", &r->max_packets) ||
        cfg_int(config, "max_jobs", &r->max_jobs) || cfg_int(config, "max_jobs_per_source", &r->max_per_source) ||
        cfg_int(config, "max_payload", &r->max_payload) || cfg_int(config, "ack_every", &r->ack_every) ||
        cfg_int(config, "memory_budget_bytes", &r->budget) ||
        cfg_double(config, "finished_linger_s", &r->linger_s) ||
        cfg_double(config, "idle_timeout_s", &r->idle_timeout_s) ||
        cfg_double(config, "stall_timeout_s", &r->stall_s) || cfg_double(config, "token_lifetime_s", &lifetime))
        return -1;
    r->admission_key = PyObject_GetAttrString(config, "admission_key");
    if (r->admission_key == NULL)
        return -1;
    PyObject *kw = Py_BuildValue("{s:d,s:O}", "lifetime_s", lifetime, "secret", secret);
    r->tokens = kw == NULL ? NULL : PyObject_Call(R.TokenMinter, R.empty_tuple, kw);
    Py_XDECREF(kw);
    if (r->tokens == NULL)
        return -1;
    /* admission.MemoryBudget(memory_budget_bytes, max_jobs) */
    r->m_limit = r->budget;
    r->m_guarantee = r->budget / (2 * r->max_jobs);
    r->m_pool_limit = r->budget - r->max_jobs * r->m_guarantee;
    return 0;
}

static PyObject *Receiver_receive_datagram(Receiver *r, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"data", "addr", "now", "ce", NULL};
    Py_buffer data;
    PyObject *addr;
    double now;
    int ce = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*Od|$p:receive_datagram", kwlist, &data, &addr, &now, &ce))
        return NULL;
    int rc = receive(r, data.buf, (size_t)data.len, addr, NULL, ce, now);
    PyBuffer_Release(&data);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Receiver_datagrams_to_send(Receiver *r, PyObject *arg) {
    if (flush_all(r) != 0)
        return NULL;
    PyObject *out = PyList_New((Py_ssize_t)r->nout);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < r->nout; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)r->obuf + r->out[i].off, r->out[i].len);
        PyObject *t = b == NULL ? NULL : PyTuple_Pack(2, b, r->out[i].peer);
        Py_XDECREF(b);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    out_clear(r);
    return out;
}

/* get_timer: 0 and *t, or 1 for None */
static int rtimer_at(Receiver *r, double *out) {
    if (r->njobs == 0)
        return 1;
    double best = 0.0;
    for (size_t i = 0; i < r->njobs; i++) {
        Job *job = r->jobs[i];
        double t = job->finished ? job->finished_at + r->linger_s : job->last_at + r->idle_timeout_s;
        if (i == 0 || t < best)
            best = t;
    }
    *out = best;
    return 0;
}

static PyObject *Receiver_get_timer(Receiver *r, PyObject *unused) {
    double t;
    if (rtimer_at(r, &t) != 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

static int rhandle_timer(Receiver *r, double now) {
    /* over a snapshot of the jobs, as list(self.jobs.items()); a job forgotten meanwhile is skipped */
    size_t n = r->njobs;
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        ids[i] = r->jobs[i]->job_id;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        Job *job = find_job(r, ids[i]);
        if (job == NULL)
            continue;
        if (job->finished) {
            if (now >= job->finished_at + r->linger_s)
                rc = forget(r, job);
        } else if (now >= job->last_at + r->idle_timeout_s) {
            rc = abandon(r, job, "idle");
        }
    }
    free(ids);
    return rc;
}

static PyObject *Receiver_handle_timer(Receiver *r, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (rhandle_timer(r, now) != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Receiver_next_event(Receiver *r, PyObject *unused) {
    if (!r->ev_len)
        Py_RETURN_NONE;
    PyObject *ev = r->ev[r->ev_head];
    r->ev_head = (r->ev_head + 1) % r->ev_cap;
    r->ev_len--;
    return ev;
}

static Py_ssize_t rtransmit(Receiver *r, int fd) {
    if (flush_all(r) != 0)
        return -1;
    if (r->nout == 0)
        return 0;
    batch_clear(&r->batch);
    for (size_t i = 0; i < r->nout; i++) {
        OutItem *it = &r->out[i];
        NetAddr na;
        if (it->has_na)
            na = it->na;
        else if (addr_from_py(it->peer, &na) != 0)
            return -1;
        int32_t dst = batch_addr(&r->batch, &na);
        uint8_t *p = dst < 0 ? NULL : batch_add(&r->batch, it->len, dst);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(p, r->obuf + it->off, it->len);
    }
    out_clear(r);
    return batch_flush(&r->batch, fd);
}

static PyObject *Receiver_transmit(Receiver *r, PyObject *args) {
    int fd;
    double now;
    if (!PyArg_ParseTuple(args, "id:transmit", &fd, &now))
        return NULL;
    Py_ssize_t sent = rtransmit(r, fd);
    return sent < 0 ? NULL : PyLong_FromSsize_t(sent);
}

static int receiver_sink(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now) {
    return receive((Receiver *)core, data, len, NULL, src, ce, now);
}

static Py_ssize_t rreceive_from(Receiver *r, int fd, double now) {
    return ring_receive(&r->ring, fd, r, receiver_sink, now, 16);
}

static PyObject *Receiver_receive_from(Receiver *r, PyObject *args) {
    int fd;
    double now;
    if (!PyArg_ParseTuple(args, "id:receive_from", &fd, &now))
        return NULL;
    Py_ssize_t n = rreceive_from(r, fd, now);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *Receiver_run(Receiver *r, PyObject *args) {
    int fd;
    double until;
    if (!PyArg_ParseTuple(args, "id:run", &fd, &until))
        return NULL;
    for (;;) {
        double now = monotonic_now();
        if (rtransmit(r, fd) < 0)
            return NULL;
        if (r->ev_len || now >= until)
            break;
        double t;
        double wake = rtimer_at(r, &t) != 0 || until < t ? until : t;
        if (wait_fd(fd, wake, now, 0.0) != 0)
            return NULL;
        now = monotonic_now();
        if (rreceive_from(r, fd, now) < 0)
            return NULL;
        if (rtimer_at(r, &t) == 0 && t <= now && rhandle_timer(r, now) != 0)
            return NULL;
        if (r->ev_len)
            break;
    }
    if (rtransmit(r, fd) < 0)
        return NULL;
    return PyLong_FromSize_t(r->ev_len);
}

static PyObject *Receiver_take_messages(Receiver *r, PyObject *arg) {
    unsigned long job_id = PyLong_AsUnsignedLong(arg);
    if (job_id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    Job *job = find_job(r, (uint32_t)job_id);
    if (job != NULL)
        Py_CLEAR(job->coll);
    PyObject *d = PyDict_GetItemWithError(r->collected, arg);
    if (d == NULL)
        return PyErr_Occurred() ? NULL : PyDict_New();
    Py_INCREF(d);
    if (PyDict_DelItem(r->collected, arg) != 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* admission.MemoryBudget with the current figures (a copy: what the reference exposes as ``memory``) */
static PyObject *memory_snapshot(Receiver *r) {
    PyObject *m = PyObject_CallFunction(R.MemoryBudget, "LL", r->m_limit, r->max_jobs);
    if (m == NULL)
        return NULL;
    struct {
        const char *name;
        long long v;
    } f[] = {{"used", r->m_used}, {"pool", r->m_pool}, {"peak", r->m_peak}};
    for (size_t i = 0; i < 3; i++) {
        PyObject *v = PyLong_FromLongLong(f[i].v);
        if (v == NULL || PyObject_SetAttrString(m, f[i].name, v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(m);
            return NULL;
        }
        Py_DECREF(v);
    }
    return m;
}

static PyObject *Receiver_stats(Receiver *r, PyObject *unused) {
    PyObject *mem = memory_snapshot(r);
    PyObject *md = mem == NULL ? NULL : PyObject_CallMethod(mem, "as_dict", NULL);
    Py_XDECREF(mem);
    if (md == NULL)
        return NULL;
    return Py_BuildValue("{s:L,s:N,s:N,s:N,s:n,s:n,s:N}", "datagrams", r->datagrams, "malformed",
                         PyDict_Copy(r->malformed), "dropped", PyDict_Copy(r->dropped), "admission",
                         PyDict_Copy(r->admission), "jobs", (Py_ssize_t)r->nholders, "finished",
                         (Py_ssize_t)r->nfinished, "memory", md);
}

static PyMethodDef Receiver_methods[] = {
    {"receive_datagram", (PyCFunction)(void (*)(void))Receiver_receive_datagram, METH_VARARGS | METH_KEYWORDS,
     "receive_datagram(data, addr, now, *, ce=False)"},
    {"datagrams_to_send", (PyCFunction)Receiver_datagrams_to_send, METH_O,
     "ACKs (the waiting ones now), RETRYs and DONEs to send, [(bytes, addr)]."},
    {"get_timer", (PyCFunction)Receiver_get_timer, METH_NOARGS, "The next time handle_timer must run, or None."},
    {"handle_timer", (PyCFunction)Receiver_handle_timer, METH_O, "handle_timer(now)"},
    {"next_event", (PyCFunction)Receiver_next_event, METH_NOARGS, "The next event, or None."},
    {"take_messages", (PyCFunction)Receiver_take_messages, METH_O,
     "take_messages(job_id) -> {msg_id: bytes}: the job's whole messages kept while collect_messages was set."},
    {"stats", (PyCFunction)Receiver_stats, METH_NOARGS, "Counters for summaries and metrics."},
    {"transmit", (PyCFunction)Receiver_transmit, METH_VARARGS,
     "transmit(fd, now) -> sent: what datagrams_to_send(now) returns, written straight to the UDP socket fd."},
    {"receive_from", (PyCFunction)Receiver_receive_from, METH_VARARGS,
     "receive_from(fd, now) -> n: read every datagram the socket holds (recvmmsg, GRO, ECN) into the core."},
    {"run", (PyCFunction)Receiver_run, METH_VARARGS,
     "run(fd, until) -> events: transmit, wait for the UDP socket fd, receive_from and handle_timer until an event "
     "is queued or time.monotonic() reaches until. The GIL is released while it waits."},
    {NULL, NULL, 0, NULL},
};

/* --- attributes ----------------------------------------------------------------------------------------- */

static PyObject *job_view(Receiver *r, Job *job) {
    PyObject *ann = PyDict_Copy(job->announce_parts);
    PyObject *finished_at = job->finished ? PyFloat_FromDouble(job->finished_at) : Py_NewRef(Py_None);
    if (ann == NULL || finished_at == NULL) {
        Py_XDECREF(ann);
        Py_XDECREF(finished_at);
        return NULL;
    }
    PyObject *kw = Py_BuildValue(
        "{s:k,s:O,s:O,s:d,s:d,s:d,s:O,s:O,s:O,s:N,s:L,s:L,s:L,s:N,s:n}", "job_id", (unsigned long)job->job_id, "peer",
        job->peer, "source", job->source, "first_at", job->first_at, "last_at", job->last_at, "progress_at",
        job->progress_at, "progressed", job->progressed ? Py_True : Py_False, "manifest",
        job->manifest ? job->manifest : Py_None, "rejected", job->rejected ? job->rejected : Py_None,
        "announce_parts", ann, "packets", (long long)job->packets, "duplicates", (long long)job->duplicates,
        "charged", (long long)job->charged, "finished_at", finished_at, "partials", (Py_ssize_t)job->partial.len);
    if (kw == NULL)
        return NULL;
    PyObject *ns = PyObject_Call(R.SimpleNamespace, R.empty_tuple, kw);
    Py_DECREF(kw);
    return ns;
}

static PyObject *get_jobs(Receiver *r, void *c) {
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < r->njobs; i++) {
        PyObject *k = PyLong_FromUnsignedLong(r->jobs[i]->job_id), *v = job_view(r, r->jobs[i]);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *get_finished(Receiver *r, void *c) {
    PyObject *d = PyObject_CallNoArgs(R.OrderedDict);
    for (size_t i = 0; d != NULL && i < r->nfinished; i++) {
        PyObject *k = PyLong_FromUnsignedLong(r->finished[i]->job_id);
        if (k == NULL || PyObject_SetItem(d, k, Py_None) != 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
    }
    return d;
}

/* an admission.SlotTable copy: ``holders`` keyed by job id, in slot order; ``per_source`` as counted */
static PyObject *get_slots(Receiver *r, void *c) {
    PyObject *kw = Py_BuildValue("{s:L,s:L,s:d}", "max_jobs", r->max_jobs, "max_per_source", r->max_per_source,
                                 "stall_s", r->stall_s);
    PyObject *t = kw == NULL ? NULL : PyObject_Call(R.SlotTable, R.empty_tuple, kw);
    Py_XDECREF(kw);
    PyObject *per = t == NULL ? NULL : PyObject_CallOneArg(R.Counter, r->per_source);
    PyObject *holders = per == NULL ? NULL : PyDict_New();
    for (size_t i = 0; holders != NULL && i < r->nholders; i++) {
        PyObject *k = PyLong_FromUnsignedLong(r->holders[i]->job_id);
        if (k == NULL || PyDict_SetItem(holders, k, Py_None) != 0)
            Py_CLEAR(holders);
        Py_XDECREF(k);
    }
    int ok = holders != NULL && PyObject_SetAttrString(t, "per_source", per) == 0 &&
             PyObject_SetAttrString(t, "holders", holders) == 0;
    Py_XDECREF(per);
    Py_XDECREF(holders);
    if (!ok) {
        Py_XDECREF(t);
        return NULL;
    }
    return t;
}

static PyObject *get_memory(Receiver *r, void *c) { return memory_snapshot(r); }

static PyObject *get_accept(Receiver *r, void *c) { return Py_NewRef(r->accept_jobs); }

static int set_accept(Receiver *r, PyObject *v, void *c) {
    if (v == NULL || (v != Py_None && !PyLong_Check(v))) {
        PyErr_SetString(PyExc_TypeError, "accept_jobs must be an int or None");
        return -1;
    }
    Py_INCREF(v);
    Py_SETREF(r->accept_jobs, v);
    return 0;
}

static PyObject *get_collect(Receiver *r, void *c) { return PyBool_FromLong(r->collect); }

static int set_collect(Receiver *r, PyObject *v, void *c) {
    int t = v == NULL ? -1 : PyObject_IsTrue(v);
    if (t < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "cannot delete collect_messages");
        return -1;
    }
    r->collect = t;
    return 0;
}

static PyObject *get_config(Receiver *r, void *c) { return Py_NewRef(r->config); }
static PyObject *get_malformed(Receiver *r, void *c) { return Py_NewRef(r->malformed); }
static PyObject *get_dropped(Receiver *r, void *c) { return Py_NewRef(r->dropped); }
static PyObject *get_admission(Receiver *r, void *c) { return Py_NewRef(r->admission); }
static PyObject *get_tokens(Receiver *r, void *c) { return Py_NewRef(r->tokens); }
static PyObject *get_jobs_seen(Receiver *r, void *c) { return PyLong_FromLongLong(r->jobs_seen); }
static PyObject *get_buffered(Receiver *r, void *c) { return PyLong_FromLongLong(r->buffered); }
static PyObject *get_datagrams(Receiver *r, void *c) { return PyLong_FromLongLong(r->datagrams); }

static PyGetSetDef Receiver_getset[] = {
    {"config", (getter)get_config, NULL, "The AtpConfig.", NULL},
    {"accept_jobs", (getter)get_accept, (setter)set_accept, "Admit at most this many distinct jobs (None: any).",
     NULL},
    {"collect_messages", (getter)get_collect, (setter)set_collect,
     "Keep whole messages for take_messages instead of a MessageReceived event each.", NULL},
    {"jobs_seen", (getter)get_jobs_seen, NULL, NULL, NULL},
    {"jobs", (getter)get_jobs, NULL, "A snapshot {job_id: namespace of the job's record} (tests and tools).", NULL},
    {"_finished", (getter)get_finished, NULL, "A snapshot of the finished jobs kept, in finishing order.", NULL},
    {"slots", (getter)get_slots, NULL, "A snapshot of the job slots: per_source (Counter), holders.", NULL},
    {"memory", (getter)get_memory, NULL, "A snapshot of the memory budget (admission.MemoryBudget).", NULL},
    {"tokens", (getter)get_tokens, NULL, "The admission.TokenMinter.", NULL},
    {"buffered", (getter)get_buffered, NULL, "Payload bytes held for incomplete or not-yet-in-order messages.", NULL},
    {"datagrams", (getter)get_datagrams, NULL, "Datagrams received.", NULL},
    {"malformed", (getter)get_malformed, NULL, "collections.Counter of malformed datagrams by reason.", NULL},
    {"dropped", (getter)get_dropped, NULL, "collections.Counter of dropped datagrams by reason.", NULL},
    {"admission", (getter)get_admission, NULL, "collections.Counter: retries, admitted, evictions, ...", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "netapprox.hostlib._native.AtpReceiver",
    .tp_basicsize = sizeof(Receiver),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "AtpReceiver(*, config=AtpConfig(), now=0.0, accept_jobs=None, token_secret=None, "
              "collect_messages=False): the C implementation of hostlib.receiver.AtpReceiver.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Receiver_init,
    .tp_dealloc = (destructor)Receiver_dealloc,
    .tp_traverse = (traverseproc)Receiver_traverse,
    .tp_methods = Receiver_methods,
    .tp_getset = Receiver_getset,
};
