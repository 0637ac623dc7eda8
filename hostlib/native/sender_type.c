/* netapprox.hostlib._native.AtpSender: the Python type of the C sender (sender.c). Construction reads the JobSpec
 * and the AtpConfig through Python; the methods are hostlib/sender.py's interface, plus the socket fast path
 * (transmit, receive_from, and run: api.send_job's loop in C). */
#include <string.h>

#include "sender.h"

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
    Py_CLEAR(s->new_token);
    Py_CLEAR(s->admission_key);
    ARRAY_FREE(&s->sent_msg);
    ARRAY_FREE(&s->sent_idx);
    ARRAY_FREE(&s->more_ids);
    free(s->scratch);
    if (s->msgs) {
        for (size_t i = 0; i < s->nmsgs; i++) {
            Py_XDECREF(s->msgs[i].data);
            RING_FREE(&s->msgs[i].lost);
        }
        free(s->msgs);
    }
    if (s->groups) {
        for (size_t i = 0; i < s->ngroups; i++) {
            ARRAY_FREE(&s->groups[i].idle);
            ARRAY_FREE(&s->groups[i].parked);
        }
        free(s->groups);
    }
    free(s->tlr);
    free(s->msr_latest);
    free(s->msr_acked);
    free(s->msr_queued);
    ARRAY_FREE(&s->msr_sent);
    if (s->announce) {
        for (size_t i = 0; i < s->nannounce; i++)
            Py_XDECREF(s->announce[i]);
        free(s->announce);
    }
    free(s->announce_acked);
    free(s->pkt_state);
    sched_free(&s->sched);
    RING_FREE(&s->ctl);
    recovery_free(&s->recovery);
    rate_free(&s->rate);
    events_free(&s->ev);
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
    return events_traverse(&s->ev, visit, arg);
}

/* A message's tags (config.Tags or None). */
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

/* The mode and the flags of the AtpConfig. */
static int read_mode(Sender *s, PyObject *config) {
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
    PyObject *v = PyObject_GetAttrString(config, "completion");
    if (v == NULL)
        return -1;
    s->completion_early = PyUnicode_CompareWithASCIIString(v, "all_sent") != 0;
    Py_DECREF(v);
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
    return 0;
}

/* The groups: sorted ids of job.group_sizes(), each with its MSR and required count. */
static int read_groups(Sender *s, PyObject *job) {
    PyObject *sizes = PyObject_CallMethod(job, "group_sizes", NULL);
    PyObject *gids = sizes == NULL ? NULL : PyDict_Keys(sizes);
    long long *ids = NULL;
    int rc = -1;
    if (gids == NULL || PyList_Sort(gids) != 0)
        goto out;
    s->ngroups = (size_t)PyList_GET_SIZE(gids);
    size_t n = s->ngroups ? s->ngroups : 1;
    s->groups = calloc(n, sizeof(Group));
    s->tlr = calloc(n, sizeof(double));
    s->msr_latest = calloc(n, sizeof(uint32_t));
    s->msr_acked = calloc(n, sizeof(uint32_t));
    s->msr_queued = calloc(n, 1);
    ids = calloc(n, sizeof(long long));
    if (s->groups == NULL || s->tlr == NULL || ids == NULL || s->msr_latest == NULL || s->msr_acked == NULL ||
        s->msr_queued == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    int fixed = s->mode == MODE_FIXTLR || s->mode == MODE_BASE;
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        PyObject *gid = PyList_GET_ITEM(gids, (Py_ssize_t)i);
        ids[i] = g->group_id = PyLong_AsLongLong(gid);
        PyObject *total = PyDict_GetItem(sizes, gid);
        g->total = PyLong_AsLongLong(total);
        PyObject *msr = PyObject_CallMethod(job, "msr_of", "O", gid);
        if (msr == NULL)
            goto out;
        g->msr = PyFloat_AsDouble(msr);
        PyObject *req = PyObject_CallFunctionObjArgs(R.required_messages, msr, total, NULL);
        Py_DECREF(msr);
        if (req == NULL)
            goto out;
        g->required = PyLong_AsLongLong(req);
        Py_DECREF(req);
        g->budget = g->total - g->required;
        g->approx = g->msr < 1.0;
        g->fixed_tlr = fixed;
        s->tlr[i] = 1.0 - g->msr;
        g->active = g->total;
    }
    rc = rate_init(&s->rate, ids, s->ngroups);
out:
    free(ids);
    Py_XDECREF(gids);
    Py_XDECREF(sizes);
    return rc;
}

/* The messages of job.messages (``fast``): their bytes, group, packet count and tags. */
static int read_messages(Sender *s, PyObject *fast, PyObject *job_tags, PyObject *vector_len) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    long long mp = s->max_payload;
    s->nmsgs = (size_t)n;
    s->msgs = calloc(n ? (size_t)n : 1, sizeof(Msg));
    if (s->msgs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t total_pkts = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = PySequence_Fast_GET_ITEM(fast, i);
        Msg *m = &s->msgs[i];
        PyObject *data = PyObject_GetAttrString(msg, "data");
        if (data == NULL)
            return -1;
        if (PyBytes_CheckExact(data)) {
            m->data = data;
        } else {
            m->data = PyBytes_FromObject(data);
            Py_DECREF(data);
            if (m->data == NULL)
                return -1;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(m->data);
        if (vector_len != Py_None && len > mp)
            return config_error("vector message %zd has %zd bytes but one packet carries %lld: build the job with "
                                "floats_per_message <= %lld", i, len, mp, mp - 8 >= 0 ? (mp - 8) / 4 : 0LL);
        if (len > 0xFFFF * mp)
            return config_error("message %zd of %zd bytes needs more than 65535 packets", i, len);
        long long gid;
        if (cfg_int(msg, "group_id", &gid) != 0)
            return -1;
        m->group = (uint32_t)rate_group_index(&s->rate, gid);
        long long cnt = (len + mp - 1) / mp;
        m->cnt = (uint32_t)(cnt < 1 ? 1 : cnt);
        m->remaining = len;
        m->state = M_ACTIVE;
        m->pkt_base = total_pkts;
        total_pkts += m->cnt;
        PyObject *tags = PyObject_GetAttrString(msg, "tags");
        if (tags == NULL)
            return -1;
        int truthy = PyObject_IsTrue(tags);
        int rc = truthy < 0 ? -1 : read_tags(truthy ? tags : job_tags, m);
        Py_DECREF(tags);
        if (rc != 0)
            return -1;
    }
    s->pkt_state = calloc(total_pkts ? total_pkts : 1, 1);
    if (s->pkt_state == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The rate controller of the mode (rate.py's constructors) and the loss recovery. */
static int setup_rate(Sender *s, PyObject *config) {
    RateCtl *rc = &s->rate;
    long long initial_window, max_window, reorder_threshold;
    double initial_rate, pacing_gain, initial_rtt_s, min_loss_timeout_s;
    int has_initial_rate, has_max_rate, adaptive_reorder, path_reorders;
    if (cfg_opt_double(config, "max_rate_bps", &rc->max_rate_bps, &has_max_rate) ||
        cfg_double(config, "gain", &rc->gain) ||
        cfg_opt_double(config, "initial_rate_bps", &initial_rate, &has_initial_rate) ||
        cfg_int(config, "loss_memory", &rc->loss_memory) || cfg_int(config, "loss_min_samples", &rc->min_samples) ||
        cfg_int(config, "first_window", &initial_window) || cfg_int(config, "max_window", &max_window) ||
        cfg_double(config, "pacing_gain", &pacing_gain) || cfg_double(config, "initial_rtt_s", &initial_rtt_s) ||
        cfg_int(config, "reorder_threshold", &reorder_threshold) ||
        cfg_bool(config, "adaptive_reorder", &adaptive_reorder) || cfg_bool(config, "path_reorders", &path_reorders) ||
        cfg_double(config, "min_loss_timeout_s", &min_loss_timeout_s))
        return -1;
    if (!has_max_rate) /* no socket here to ask the link: the documented default (hostlib/link.py) */
        rc->max_rate_bps = R.default_max_rate_bps;
    long long wire_max = s->packet_size + s->overhead;
    rc->packet_bits = (double)(wire_max * 8);
    rc->adaptive = s->adaptive;
    memcpy(rc->queue_packets, s->queue_packets, sizeof rc->queue_packets);
    if (s->adaptive) {
        rc->rate_bps = pacing_gain * rc->max_rate_bps;
        rc->header_bytes = ATP_HEADER_LEN + s->overhead;
        rc->mean_packet_bits = rc->packet_bits;
        rc->window = (double)(initial_window < max_window ? initial_window : max_window);
        rc->max_window = (double)max_window;
        rc->min_window = 1.0;
        rc->cap = (double)max_window;
        rc->queue = -1;
        rc->rtt = INFINITY;
        rc->slow_start = 1;
        rc->recover_until = -1;
        rc->largest_acked = -1;
    } else {
        rc->fixed = s->mode == MODE_BASE;
        double initial = has_initial_rate && initial_rate != 0.0 ? initial_rate : rc->max_rate_bps;
        rc->rate_bps = rc->fixed ? rc->max_rate_bps : initial;
    }
    if (recovery_init(&s->recovery, initial_rtt_s, reorder_threshold, min_loss_timeout_s, adaptive_reorder,
                      path_reorders, rc) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* _reset_transfer: message, group, scheduler, loss-recovery and rate state as at the start of the job (a RETRY:
 * nothing sent reached the receiver); the packet counters and REPORT sequence numbers go on. */
int sender_reset_transfer(Sender *s) {
    long long *ids = calloc(s->ngroups ? s->ngroups : 1, sizeof(long long));
    if (ids == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < s->ngroups; i++) {
        Group *g = &s->groups[i];
        ids[i] = g->group_id;
        g->delivered = g->started = g->damaged = g->repairing = 0;
        g->active = g->total;
        g->idle.n = 0;
        g->parked.n = 0;
        memset(g->qcount, 0, sizeof g->qcount);
        g->nq = 0;
        g->ece = 0;
        s->tlr[i] = 1.0 - g->msr;
    }
    uint64_t total_pkts = 0;
    for (size_t i = 0; i < s->nmsgs; i++) {
        Msg *m = &s->msgs[i];
        m->next_new = m->acked = 0;
        m->remaining = PyBytes_GET_SIZE(m->data);
        RING_FREE(&m->lost);
        m->state = M_ACTIVE;
        m->retries = 0;
        m->surplus = 0;
        total_pkts = m->pkt_base + m->cnt;
    }
    memset(s->pkt_state, 0, total_pkts ? total_pkts : 1);
    int mrdf = s->sched.mrdf, base = s->sched.repairs_last;
    sched_free(&s->sched);
    int rc = sched_init(&s->sched, s->nmsgs, mrdf, base);
    for (size_t i = 0; rc == 0 && i < s->nmsgs; i++)
        rc = sched_update(&s->sched, (uint32_t)i, s->msgs[i].remaining, 0, 0);
    s->unsent_open = (int64_t)s->nmsgs;
    s->more_ids.n = 0;
    recovery_free(&s->recovery);
    rate_free(&s->rate);
    memset(&s->recovery, 0, sizeof s->recovery);
    memset(&s->rate, 0, sizeof s->rate);
    if (rc == 0)
        rc = rate_init(&s->rate, ids, s->ngroups);
    free(ids);
    return rc == 0 ? setup_rate(s, s->config) : -1;
}

/* The first sequence number: random below 2^31 (secrets.randbelow, as the reference), or the caller's. */
static int read_isn(Sender *s, PyObject *isn) {
    PyObject *v = isn == Py_None ? PyObject_CallFunction(R.randbelow, "k", 1UL << 31) : Py_NewRef(isn);
    if (v == NULL)
        return -1;
    unsigned long long n = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (PyErr_Occurred())
        return -1;
    if (n > 0xFFFFFFFFULL)
        return config_error("isn %llu: must be 0..4294967295", n);
    s->isn = s->seq = (uint32_t)n;
    return 0;
}

/* The job's address-validation token: None, or 16 bytes, not all zero. */
static int read_token(Sender *s, PyObject *address_token) {
    if (address_token == Py_None)
        return 0;
    int ok = 0;
    if (PyBytes_Check(address_token) && PyBytes_GET_SIZE(address_token) == ATP_TOKEN_LEN)
        for (int i = 0; i < ATP_TOKEN_LEN; i++)
            ok |= PyBytes_AS_STRING(address_token)[i] != 0;
    if (!ok)
        return config_error("address_token must be %d bytes, not all zero", ATP_TOKEN_LEN);
    s->token = Py_NewRef(address_token);
    return 0;
}

static int Sender_init(Sender *s, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"job", "config", "peer", "now", "message_events", "isn", "address_token", NULL};
    PyObject *job, *config = NULL, *peer = Py_None, *isn = Py_None, *address_token = Py_None;
    double now;
    int message_events = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOdpOO:AtpSender", kwlist, &job, &config, &peer, &now,
                                     &message_events, &isn, &address_token))
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
    if (read_token(s, address_token) != 0)
        return -1;
    s->job = Py_NewRef(job);
    s->config = Py_NewRef(config);
    s->peer = Py_NewRef(peer);
    s->message_events = message_events;
    s->state = S_SENDING;
    s->start_time = now;
    s->done_cnt = -1;
    s->path_queue = -1;
    s->grant = -1;
    s->grant_top = -1;
    s->done_parts = PyDict_New();
    s->rejected = PyObject_CallNoArgs(R.Counter);
    if (s->done_parts == NULL || s->rejected == NULL)
        return -1;
    int mrdf;
    PyObject *v = PyObject_GetAttrString(config, "mrdf");
    if (v == NULL || (mrdf = PyObject_IsTrue(v)) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    if (read_mode(s, config) != 0 || cfg_double(config, "min_epoch_s", &s->min_epoch_s) ||
        cfg_opt_double(config, "epoch_s", &s->epoch_s, &s->has_epoch_s) ||
        cfg_double(config, "idle_timeout_s", &s->idle_timeout_s) ||
        cfg_double(config, "fin_timeout_s", &s->fin_timeout_s) || cfg_int(config, "max_payload", &s->max_payload) ||
        cfg_int(config, "overhead_bytes", &s->overhead) || cfg_int(config, "packet_size", &s->packet_size) ||
        cfg_int(config, "burst_packets", &s->burst_packets) ||
        cfg_double(config, "pacing_train_s", &s->pacing_train_s) ||
        cfg_int(config, "first_window", &s->first_window) || cfg_bool(config, "pack_messages", &s->pack) ||
        cfg_bool(config, "surplus", &s->surplus_on) || cfg_bool(config, "first_window_low", &s->first_low) ||
        cfg_bool(config, "grant_overrides_window", &s->grant_overrides) ||
        cfg_int(config, "job_rank_levels", &s->rank_levels) ||
        cfg_double(config, "job_rank_promote_s", &s->rank_promote_s))
        return -1;
    s->scratch = malloc((size_t)(ATP_HEADER_LEN + ANNOUNCE_PREFIX_LEN + s->max_payload));
    if (s->scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
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
    if (fast == NULL || read_groups(s, job) != 0 || read_messages(s, fast, job_tags, vector_len) != 0 ||
        sched_init(&s->sched, s->nmsgs, mrdf, s->mode == MODE_BASE) != 0)
        goto out;
    for (size_t i = 0; i < s->nmsgs; i++)
        if (sched_update(&s->sched, (uint32_t)i, s->msgs[i].remaining, 0, 0) != 0)
            goto out;
    s->unsent_open = (int64_t)s->nmsgs;
    if (setup_rate(s, config) != 0)
        goto out;
    s->bucket.burst = s->bucket.tokens = sender_burst_bytes(s, s->rate.rate_bps);
    s->bucket.stamp = now;
    s->epoch_end = now + sender_epoch_length(s);
    s->last_progress = now;
    if (sender_build_announce(s, vector_len) != 0 || read_isn(s, isn) != 0)
        goto out;
    s->free_until = (uint32_t)((long long)s->nannounce > s->first_window ? (long long)s->nannounce : s->first_window);
    s->admission_key = PyObject_GetAttrString(config, "admission_key");
    if (s->admission_key == NULL)
        goto out;
    rc = 0;
out:
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
    double now;
    if (time_arg(arg, &now) != 0)
        return NULL;
    ListRoom r = {PyList_New(0), s->peer};
    if (r.list == NULL)
        return NULL;
    if (sender_produce(s, now, list_room, &r) != 0) {
        Py_DECREF(r.list);
        return NULL;
    }
    return r.list;
}

static PyObject *Sender_get_timer(Sender *s, PyObject *unused) {
    double t;
    if (sender_timer_at(s, &t) != 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

static PyObject *Sender_handle_timer(Sender *s, PyObject *arg) {
    double now;
    return time_arg(arg, &now) != 0 ? NULL : none_or_error(sender_handle_timer(s, now));
}

static PyObject *Sender_receive_datagram(Sender *s, PyObject *args) {
    Py_buffer data;
    PyObject *addr;
    double now;
    if (!PyArg_ParseTuple(args, "y*Od:receive_datagram", &data, &addr, &now))
        return NULL;
    int from_peer = sender_from_peer_py(s, addr);
    int rc = from_peer < 0 ? -1 : sender_receive(s, data.buf, (size_t)data.len, from_peer, now);
    PyBuffer_Release(&data);
    return none_or_error(rc);
}

static PyObject *Sender_next_event(Sender *s, PyObject *unused) {
    PyObject *ev = events_pop(&s->ev);
    return ev != NULL ? ev : Py_NewRef(Py_None);
}

/* The index of the group ``arg`` names, or -1 with KeyError set. */
static int group_arg(Sender *s, PyObject *arg) {
    long long gid = PyLong_AsLongLong(arg);
    if (gid == -1 && PyErr_Occurred())
        return -1;
    int gi = rate_group_index(&s->rate, gid);
    if (gi < 0)
        PyErr_SetObject(PyExc_KeyError, arg);
    return gi;
}

static PyObject *Sender_tlr(Sender *s, PyObject *arg) {
    int gi = group_arg(s, arg);
    return gi < 0 ? NULL : PyFloat_FromDouble(s->tlr[gi]);
}

static PyObject *Sender_delivered(Sender *s, PyObject *arg) {
    int gi = group_arg(s, arg);
    return gi < 0 ? NULL : PyLong_FromLongLong(s->groups[gi].delivered);
}

static PyObject *Sender_set_msr(Sender *s, PyObject *args) {
    PyObject *gid, *msr_obj;
    double now;
    if (!PyArg_ParseTuple(args, "OOd", &gid, &msr_obj, &now))
        return NULL;
    int gi = group_arg(s, gid);
    if (gi < 0)
        return NULL;
    Group *g = &s->groups[gi];
    double msr = (PyLong_Check(msr_obj) && !PyBool_Check(msr_obj)) || PyFloat_Check(msr_obj)
                     ? PyFloat_AsDouble(msr_obj) : -1.0;
    if (msr == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(msr >= 0.0 && msr < 1.0)) {
        PyObject *r = PyObject_Repr(msr_obj);
        if (r != NULL) {
            config_error("MSR %U for group %lld: a live change must be in [0, 1)", r, g->group_id);
            Py_DECREF(r);
        }
        return NULL;
    }
    if (!g->approx) {
        config_error("group %lld was announced with MSR 1 (exact, in order): its MSR cannot change", g->group_id);
        return NULL;
    }
    if (s->state != S_SENDING) {
        PyObject *st = s->state == S_CLOSING ? R.st_closing : s->state == S_DONE ? R.st_done : R.st_failed;
        PyObject *v = PyObject_GetAttrString(st, "value");
        if (v != NULL) {
            config_error("job %lld is %U: its MSR can no longer change", (long long)s->job_id, v);
            Py_DECREF(v);
        }
        return NULL;
    }
    msr = atp_q15(msr) / 32768.0; /* what the wire carries, so both ends agree on ceil(MSR * N) */
    PyObject *req = PyObject_CallFunction(R.required_messages, "dL", msr, (long long)g->total);
    if (req == NULL)
        return NULL;
    long long required = PyLong_AsLongLong(req);
    Py_DECREF(req);
    if (required == -1 && PyErr_Occurred())
        return NULL;
    if (sender_set_msr(s, (size_t)gi, msr, required, now) != 0)
        return NULL;
    Py_RETURN_NONE;
}

/* --- socket fast path ---------------------------------------------------------------------------------- */

/* a send batch as the Room of sender_produce */
typedef struct {
    SendBatch *batch;
    int32_t dst;
} BatchRoom;

static uint8_t *batch_room(void *ctx, size_t len) {
    BatchRoom *r = ctx;
    return batch_add(r->batch, (uint32_t)len, r->dst);
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
    if (r.dst < 0)
        return -1;
    if (sender_produce(s, now, batch_room, &r) != 0)
        return -1;
    return s->batch.d.n == 0 ? 0 : batch_flush(&s->batch, fd);
}

FD_METHOD(Sender, transmit, transmit)

static int sender_sink(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now) {
    Sender *s = core;
    return sender_receive(s, data, len, sender_from_peer_na(s, src), now);
}

static Py_ssize_t receive_from(Sender *s, int fd, double now) {
    return ring_receive(&s->ring, fd, s, sender_sink, now, 16);
}

FD_METHOD(Sender, receive_from, receive_from)

/* run: hostlib.api.send_job's loop in C, until an event is queued, the job is over, or ``until`` (monotonic); the
 * events queued, or -1 with a Python error */
static Py_ssize_t run(Sender *s, int fd, double until) {
    long long refused = s->batch.refused + s->ring.refused;
    for (;;) {
        double now = monotonic_now();
        if (transmit(s, fd, now) < 0)
            return -1;
        if (!RING_EMPTY(&s->ev) || s->state == S_DONE || s->state == S_FAILED || now >= until ||
            s->batch.refused + s->ring.refused != refused)
            break;
        double t;
        int none = sender_timer_at(s, &t);
        double wake = none || until < t ? until : t;
        /* pacing in trains: never wake sooner than a quantum after this wake-up (half the pacing train, at most
         * 200 µs), so that one wake-up sends what a quantum's worth of tokens allows (the bucket keeps the rest of
         * the train for lateness); nothing the core waits for is that urgent (loss timers >= 5 ms, epochs >= 2 ms) */
        double quantum = s->pacing_train_s / 2 < 200e-6 ? s->pacing_train_s / 2 : 200e-6;
        if (wake < now + quantum && now + quantum < until)
            wake = now + quantum;
        /* the next packet is due soon: sleep through arriving ACKs and read them in one batch afterwards */
        if (wait_fd(fd, wake, now, SHORT_WAIT_S) != 0)
            return -1;
        now = monotonic_now();
        Py_ssize_t got = receive_from(s, fd, now);
        if (got < 0)
            return -1;
        if (s->batch.refused + s->ring.refused != refused)
            break; /* the caller decides what an ICMP port unreachable means (hostlib.api.send_job) */
        if (got > 0)
            none = sender_timer_at(s, &t);
        if (!none && t <= now && sender_handle_timer(s, now) != 0)
            return -1;
        if (!RING_EMPTY(&s->ev))
            break;
    }
    return (Py_ssize_t)RING_COUNT(&s->ev);
}

FD_METHOD(Sender, run, run)

static PyMethodDef Sender_methods[] = {
    {"run", (PyCFunction)Sender_run, METH_VARARGS,
     "run(fd, until) -> events: transmit, wait (1 ns timer slack: precise_timers), receive_from and handle_timer on "
     "the UDP socket fd until an event is queued, the job is over, the socket reports ICMP port unreachable "
     "(socket_refused grows), or time.monotonic() reaches until. The GIL is "
     "released while it waits."},
    {"datagrams_to_send", (PyCFunction)Sender_datagrams_to_send, METH_O,
     "Datagrams the pacer allows now, as [(bytes, peer)]."},
    {"get_timer", (PyCFunction)Sender_get_timer, METH_NOARGS, "The next time handle_timer must run, or None."},
    {"handle_timer", (PyCFunction)Sender_handle_timer, METH_O, "handle_timer(now)"},
    {"receive_datagram", (PyCFunction)Sender_receive_datagram, METH_VARARGS, "receive_datagram(data, addr, now)"},
    {"next_event", (PyCFunction)Sender_next_event, METH_NOARGS, "The next event, or None."},
    {"tlr", (PyCFunction)Sender_tlr, METH_O, "tlr(group_id): the group's current TLR."},
    {"delivered", (PyCFunction)Sender_delivered, METH_O, "delivered(group_id): messages fully acknowledged."},
    {"set_msr", (PyCFunction)Sender_set_msr, METH_VARARGS,
     "set_msr(group_id, msr, now): change a live group's MSR (hostlib.sender.AtpSender.set_msr)."},
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

static PyObject *get_job(Sender *s, void *c) { return new_ref_or_none(s->job); }
static PyObject *get_config(Sender *s, void *c) { return new_ref_or_none(s->config); }
static PyObject *get_peer(Sender *s, void *c) { return new_ref_or_none(s->peer); }
static PyObject *get_summary(Sender *s, void *c) { return new_ref_or_none(s->summary); }
static PyObject *get_failure(Sender *s, void *c) { return new_ref_or_none(s->failure); }
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
static PyObject *get_rejected(Sender *s, void *c) { return new_ref_or_none(s->rejected); }
static PyObject *get_srtt(Sender *s, void *c) { return PyFloat_FromDouble(s->recovery.srtt); }
static PyObject *get_rate(Sender *s, void *c) { return PyFloat_FromDouble(s->rate.rate_bps); }
static PyObject *get_in_flight(Sender *s, void *c) { return PyLong_FromSize_t(s->recovery.in_flight.len); }

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
    const RateCtl *w = &s->rate;
    return ns(Py_BuildValue("{s:d,s:d,s:d,s:d,s:O,s:O,s:L,s:L,s:L,s:d,s:d,s:d}", "window", w->window, "cap", w->cap,
                            "max_window", w->max_window, "min_window", w->min_window, "cap_known",
                            w->cap_known ? Py_True : Py_False, "slow_start", w->slow_start ? Py_True : Py_False,
                            "cuts", (long long)w->cuts, "recover_until", (long long)w->recover_until,
                            "largest_acked", (long long)w->largest_acked, "rate_bps", w->rate_bps,
                            "mean_packet_bits", w->mean_packet_bits, "delivery_rate_bps", w->delivery_rate_bps));
}

static PyObject *get_rate_ns(Sender *s, void *c) {
    return ns(Py_BuildValue("{s:d,s:d}", "rate_bps", s->rate.rate_bps, "max_rate_bps", s->rate.max_rate_bps));
}

static PyObject *get_recovery(Sender *s, void *c) {
    const Recovery *r = &s->recovery;
    return ns(Py_BuildValue("{s:d,s:d,s:d,s:d,s:O,s:L,s:L,s:L,s:L,s:n,s:{s:L,s:L,s:L,s:L},s:O,s:d,s:L,s:L,s:d}", "srtt", r->srtt, "rttvar",
                            r->rttvar, "latest_rtt", r->latest_rtt, "min_rtt", r->min_rtt, "has_rtt_sample",
                            r->has_rtt_sample ? Py_True : Py_False, "largest_acked", (long long)r->largest_acked,
                            "packets_acked", (long long)r->packets_acked, "packets_lost", (long long)r->packets_lost,
                            "late_acks", (long long)r->late_acks, "packets_in_flight", (Py_ssize_t)r->in_flight.len,
                            "lost_by", "reorder", (long long)r->lost_reorder, "time", (long long)r->lost_time, "tail",
                            (long long)r->lost_tail, "trim", (long long)r->lost_trim, "reordering",
                            r->reordering ? Py_True : Py_False, "reorder_window", r->reorder_window, "spurious_losses",
                            (long long)r->spurious_losses, "missed_answers", (long long)r->missed_answers,
                            "answer_loss", recovery_answer_loss(r)));
}

static PyObject *get_refused(Sender *s, void *c) {
    return PyLong_FromLongLong(s->batch.refused + s->ring.refused);
}
static PyObject *get_surplus(Sender *s, void *c) { return PyLong_FromLongLong(s->packets_surplus); }
static PyObject *get_retries_received(Sender *s, void *c) { return PyLong_FromLongLong(s->retries_received); }
static PyObject *get_new_token(Sender *s, void *c) { return new_ref_or_none(s->new_token); }

static PyGetSetDef Sender_getset[] = {
    {"window", (getter)get_window, NULL, "adaptive: a snapshot of the window controller's state, else None.", NULL},
    {"rate", (getter)get_rate_ns, NULL, "A snapshot of the pacing rate (rate_bps).", NULL},
    {"recovery", (getter)get_recovery, NULL, "A snapshot of the loss recovery's state (RTT, counts).", NULL},
    {"packets_surplus", (getter)get_surplus, NULL, "Packets sent as surplus.", NULL},
    {"socket_refused", (getter)get_refused, NULL,
     "ECONNREFUSED seen by transmit/receive_from/run (ICMP port unreachable on a connected socket).", NULL},
    {"retries_received", (getter)get_retries_received, NULL, "RETRYs that made the job start over.", NULL},
    {"new_token", (getter)get_new_token, NULL, "The address-validation token of the receiver's NEW_TOKEN, or None.",
     NULL},
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
