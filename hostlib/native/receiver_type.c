/* netapprox.hostlib._native.AtpReceiver: the Python type of the C receiver (receiver.c). The methods are
 * hostlib/receiver.py's interface, plus the socket fast path (transmit, receive_from, and run: the receiving loop
 * of api.ReceiverEndpoint.serve in C); the attributes are snapshots of the receiver's state (jobs, slots, memory)
 * for tests and tools. */
#include "receiver.h"

static void Receiver_dealloc(Receiver *r) {
    PyObject_GC_UnTrack(r);
    Py_CLEAR(r->config);
    Py_CLEAR(r->accept_jobs);
    Py_CLEAR(r->malformed);
    Py_CLEAR(r->dropped);
    Py_CLEAR(r->admission);
    Py_CLEAR(r->tokens);
    Py_CLEAR(r->collected);
    Py_CLEAR(r->replies);
    Py_CLEAR(r->manifest_rate);
    Py_CLEAR(r->admission_key);
    for (size_t i = 0; i < r->jobs.n; i++)
        job_free(r->jobs.v[i]);
    ARRAY_FREE(&r->jobs);
    ARRAY_FREE(&r->finished);
    ARRAY_FREE(&r->pending);
    slots_free(&r->slots);
    receiver_out_clear(r);
    ARRAY_FREE(&r->obuf);
    ARRAY_FREE(&r->out);
    events_free(&r->ev);
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
    Py_VISIT(r->replies);
    Py_VISIT(r->manifest_rate);
    Py_VISIT(r->slots.per_source);
    Py_VISIT(r->collected);
    return events_traverse(&r->ev, visit, arg);
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
                 {"DONE_BYTES_PER_PART", &DONE_BYTES_PER_PART}, {"OUT_BYTES", &OUT_BYTES},
                 {"OUT_QUEUE_SHARE", &OUT_QUEUE_SHARE},
                 {"REPLY_FACTOR", &REPLY_FACTOR}};
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
    r->config = Py_NewRef(config);
    r->accept_jobs = Py_NewRef(accept);
    r->collect = collect;
    r->malformed = PyObject_CallNoArgs(R.Counter);
    r->dropped = PyObject_CallNoArgs(R.Counter);
    r->admission = PyObject_CallNoArgs(R.Counter);
    r->collected = PyDict_New();
    r->replies = PyObject_CallNoArgs(R.Counter);
    if (r->malformed == NULL || r->dropped == NULL || r->admission == NULL || r->collected == NULL ||
        r->replies == NULL)
        return -1;
    double lifetime, stall_s, manifest_rate;
    long long max_jobs, max_per_source, budget;
    if (cfg_int(config, "max_messages", &r->max_messages) || cfg_int(config, "max_packets_per_message", &r->max_packets) ||
        cfg_int(config, "max_jobs", &max_jobs) || cfg_int(config, "max_jobs_per_source", &max_per_source) ||
        cfg_int(config, "max_payload", &r->max_payload) || cfg_int(config, "ack_every", &r->ack_every) ||
        cfg_int(config, "memory_budget_bytes", &budget) ||
        cfg_double(config, "finished_linger_s", &r->linger_s) ||
        cfg_double(config, "idle_timeout_s", &r->idle_timeout_s) ||
        cfg_double(config, "stall_timeout_s", &stall_s) || cfg_double(config, "token_lifetime_s", &lifetime) ||
        cfg_double(config, "manifest_bytes_per_s", &manifest_rate) ||
        cfg_double(config, "open_admission_share", &r->open_share) ||
        cfg_bool(config, "receiver_grants", &r->granting))
        return -1;
    r->tokens_mode = !(accept == Py_None && r->open_share > 0);
    PyObject *gw = PyObject_GetAttrString(config, "grant_window_packets");
    if (gw == NULL)
        return -1;
    int gw_none = gw == Py_None || PyObject_Not(gw) == 1; /* ``grant_window_packets or bdp_packets`` */
    Py_DECREF(gw);
    if (cfg_int(config, gw_none ? "bdp_packets" : "grant_window_packets", &r->grant_budget) != 0 ||
        cfg_int(config, "grant_cap_packets", &r->grant_cap) != 0)
        return -1;
    r->grant_fixed = !gw_none;
    if (gw_none && r->grant_cap > 0 && r->grant_budget > r->grant_cap) /* config.grant_budget_for */
        r->grant_budget = r->grant_cap;
    double rate = 0.0, rtt = 0.0;
    int has_rate = 0;
    if (cfg_opt_double(config, "max_rate_bps", &rate, &has_rate) || cfg_double(config, "initial_rtt_s", &rtt) ||
        cfg_int(config, "overhead_bytes", &r->overhead_bytes))
        return -1;
    r->bdp_bits = (has_rate && rate != 0.0 ? rate : R.default_max_rate_bps) * rtt;
    r->data_packets = r->data_wire_bytes = 0;
    r->rtt_s = rtt;
    memset(&r->delivery, 0, sizeof r->delivery);
    if (r->granting && !r->grant_fixed && !(has_rate && rate != 0.0)) { /* receiver.py: ``delivery`` */
        r->delivery.on = 1;
        r->delivery.window_s = rtt;
        r->grant_budget = 0;
    }
    PyObject *rx_module = PyImport_ImportModule("netapprox.hostlib.receiver");
    long long small = 0;
    int bad = rx_module == NULL || cfg_int(rx_module, "SMALL_MANIFEST", &small);
    Py_XDECREF(rx_module);
    if (bad)
        return -1;
    /* admission.SourceRate(manifest_bytes_per_s, 4 * max_jobs, total_rate=2 * ..., small=SMALL_MANIFEST) */
    r->manifest_rate = PyObject_CallFunction(R.SourceRate, "dLdL", manifest_rate, 4 * max_jobs, 2 * manifest_rate,
                                             small);
    if (r->manifest_rate == NULL)
        return -1;
    if (slots_init(&r->slots, max_jobs, max_per_source, stall_s) != 0)
        return -1;
    r->admission_key = PyObject_GetAttrString(config, "admission_key");
    if (r->admission_key == NULL)
        return -1;
    double address_lifetime;
    if (cfg_double(config, "address_token_lifetime_s", &address_lifetime) != 0)
        return -1;
    PyObject *kw = Py_BuildValue("{s:d,s:O,s:d,s:d}", "lifetime_s", lifetime, "secret", secret, "address_lifetime_s",
                                 address_lifetime, "now", now);
    r->tokens = kw == NULL ? NULL : PyObject_Call(R.TokenMinter, R.empty_tuple, kw);
    Py_XDECREF(kw);
    if (r->tokens == NULL)
        return -1;
    /* admission.MemoryBudget(memory_budget_bytes, max_jobs, receiver.out_reserve(memory_budget_bytes)) */
    long long quarter = budget / 4, floor = quarter < (64 << 10) ? quarter : (64 << 10);
    budget_init(&r->memory, budget, max_jobs, budget / OUT_QUEUE_SHARE > floor ? budget / OUT_QUEUE_SHARE : floor);
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
    int rc = receiver_receive(r, data.buf, (size_t)data.len, addr, NULL, ce, now);
    PyBuffer_Release(&data);
    return none_or_error(rc);
}

static PyObject *Receiver_datagrams_to_send(Receiver *r, PyObject *arg) {
    if (receiver_flush_acks(r) != 0)
        return NULL;
    PyObject *out = PyList_New((Py_ssize_t)r->out.n);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < r->out.n; i++) {
        const OutItem *it = &r->out.v[i];
        PyObject *b = PyBytes_FromStringAndSize((const char *)r->obuf.v + it->off, it->len);
        PyObject *t = b == NULL ? NULL : PyTuple_Pack(2, b, it->peer);
        Py_XDECREF(b);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    receiver_out_clear(r);
    return out;
}

static PyObject *Receiver_get_timer(Receiver *r, PyObject *unused) {
    double t;
    if (receiver_timer_at(r, &t) != 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(t);
}

static PyObject *Receiver_handle_timer(Receiver *r, PyObject *arg) {
    double now;
    return time_arg(arg, &now) != 0 ? NULL : none_or_error(receiver_handle_timer(r, now));
}

static PyObject *Receiver_next_event(Receiver *r, PyObject *unused) {
    PyObject *ev = events_pop(&r->ev);
    return ev != NULL ? ev : Py_NewRef(Py_None);
}

/* transmit: what datagrams_to_send(now) would return, straight to the socket; -1 with a Python error */
static Py_ssize_t transmit(Receiver *r, int fd, double now) {
    if (receiver_flush_acks(r) != 0)
        return -1;
    if (r->out.n == 0)
        return 0;
    batch_clear(&r->batch);
    for (size_t i = 0; i < r->out.n; i++) {
        const OutItem *it = &r->out.v[i];
        NetAddr na;
        if (it->has_na)
            na = it->na;
        else if (addr_from_py(it->peer, &na) != 0)
            return -1;
        int32_t dst = batch_addr(&r->batch, &na);
        uint8_t *p = dst < 0 ? NULL : batch_add(&r->batch, it->len, dst);
        if (p == NULL)
            return -1;
        memcpy(p, r->obuf.v + it->off, it->len);
    }
    receiver_out_clear(r);
    return batch_flush(&r->batch, fd);
}

FD_METHOD(Receiver, transmit, transmit)

static int receiver_sink(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now) {
    return receiver_receive((Receiver *)core, data, len, NULL, src, ce, now);
}

static Py_ssize_t receive_from(Receiver *r, int fd, double now) {
    return ring_receive(&r->ring, fd, r, receiver_sink, now, 16);
}

FD_METHOD(Receiver, receive_from, receive_from)

/* run: the receiving loop of api.ReceiverEndpoint.serve in C, until an event is queued or ``until`` (monotonic);
 * the events queued, or -1 with a Python error */
static Py_ssize_t run(Receiver *r, int fd, double until) {
    for (;;) {
        double now = monotonic_now();
        if (transmit(r, fd, now) < 0)
            return -1;
        if (!RING_EMPTY(&r->ev) || now >= until)
            break;
        double t;
        double wake = receiver_timer_at(r, &t) != 0 || until < t ? until : t;
        if (wait_fd(fd, wake, now, 0.0) != 0)
            return -1;
        now = monotonic_now();
        if (receive_from(r, fd, now) < 0)
            return -1;
        if (receiver_timer_at(r, &t) == 0 && t <= now && receiver_handle_timer(r, now) != 0)
            return -1;
        if (!RING_EMPTY(&r->ev))
            break;
    }
    if (transmit(r, fd, monotonic_now()) < 0)
        return -1;
    return (Py_ssize_t)RING_COUNT(&r->ev);
}

FD_METHOD(Receiver, run, run)

static PyObject *Receiver_take_messages(Receiver *r, PyObject *arg) {
    unsigned long job_id = PyLong_AsUnsignedLong(arg);
    if (job_id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    Job *job = receiver_find_job(r, (uint32_t)job_id);
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
    PyObject *m = PyObject_CallFunction(R.MemoryBudget, "LLL", r->memory.limit, r->slots.max_jobs, r->memory.reserve);
    if (m == NULL)
        return NULL;
    struct {
        const char *name;
        long long v;
    } f[] = {{"used", r->memory.used}, {"pool", r->memory.pool}, {"peak", r->memory.peak}, {"out", r->memory.out}};
    for (size_t i = 0; i < 4; i++) {
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
    return Py_BuildValue("{s:L,s:N,s:N,s:N,s:s,s:n,s:n,s:L,s:N,s:N}", "datagrams", r->datagrams, "malformed",
                         PyDict_Copy(r->malformed), "dropped", PyDict_Copy(r->dropped), "admission",
                         PyDict_Copy(r->admission), "admission_mode", r->tokens_mode ? "tokens" : "open", "jobs",
                         (Py_ssize_t)r->slots.holders.n, "finished", (Py_ssize_t)r->finished.n, "trimmed",
                         r->trimmed, "memory", md, "replies", PyDict_Copy(r->replies));
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
        "{s:k,s:O,s:O,s:d,s:d,s:d,s:O,s:O,s:O,s:N,s:L,s:L,s:L,s:N,s:n,s:O,s:L,s:L,s:L,s:O}", "job_id",
        (unsigned long)job->job_id,
        "peer",
        job->peer, "source", job->slot.source, "first_at", job->first_at, "last_at", job->last_at, "progress_at",
        job->slot.progress_at, "progressed", job->slot.progressed ? Py_True : Py_False, "manifest",
        job->manifest ? job->manifest : Py_None, "rejected", job->rejected ? job->rejected : Py_None,
        "announce_parts", ann, "packets", (long long)job->packets, "duplicates", (long long)job->duplicates,
        "charged", (long long)job->charged, "finished_at", finished_at, "partials", (Py_ssize_t)job->partial.len,
        "validated", job->validated ? Py_True : Py_False, "alloc", job->alloc, "rx_bytes", (long long)job->rx_bytes,
        "tx_bytes", (long long)job->tx_bytes, "token", job->token ? job->token : Py_None);
    if (kw == NULL)
        return NULL;
    PyObject *ns = PyObject_Call(R.SimpleNamespace, R.empty_tuple, kw);
    Py_DECREF(kw);
    return ns;
}

static PyObject *get_jobs(Receiver *r, void *c) {
    PyObject *d = PyDict_New();
    for (size_t i = 0; d != NULL && i < r->jobs.n; i++) {
        PyObject *k = PyLong_FromUnsignedLong(r->jobs.v[i]->job_id), *v = job_view(r, r->jobs.v[i]);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) != 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *get_finished(Receiver *r, void *c) {
    PyObject *d = PyObject_CallNoArgs(R.OrderedDict);
    for (size_t i = 0; d != NULL && i < r->finished.n; i++) {
        PyObject *k = PyLong_FromUnsignedLong(r->finished.v[i]->job_id);
        if (k == NULL || PyObject_SetItem(d, k, Py_None) != 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
    }
    return d;
}

/* an admission.SlotTable copy: ``holders`` keyed by job id, in slot order; ``per_source`` as counted */
static PyObject *get_slots(Receiver *r, void *c) {
    const SlotTable *st = &r->slots;
    PyObject *kw = Py_BuildValue("{s:L,s:L,s:d}", "max_jobs", st->max_jobs, "max_per_source", st->max_per_source,
                                 "stall_s", st->stall_s);
    PyObject *t = kw == NULL ? NULL : PyObject_Call(R.SlotTable, R.empty_tuple, kw);
    Py_XDECREF(kw);
    PyObject *per = t == NULL ? NULL : PyObject_CallOneArg(R.Counter, st->per_source);
    PyObject *holders = per == NULL ? NULL : PyDict_New();
    for (size_t i = 0; holders != NULL && i < st->holders.n; i++) {
        PyObject *k = PyLong_FromUnsignedLong(((Job *)st->holders.v[i])->job_id);
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
static PyObject *get_replies(Receiver *r, void *c) { return Py_NewRef(r->replies); }
static PyObject *get_manifest_rate(Receiver *r, void *c) { return Py_NewRef(r->manifest_rate); }
static PyObject *get_admission(Receiver *r, void *c) { return Py_NewRef(r->admission); }
static PyObject *get_tokens(Receiver *r, void *c) { return Py_NewRef(r->tokens); }
static PyObject *get_jobs_seen(Receiver *r, void *c) { return PyLong_FromLongLong(r->jobs_seen); }
static PyObject *get_buffered(Receiver *r, void *c) { return PyLong_FromLongLong(r->buffered); }
static PyObject *get_datagrams(Receiver *r, void *c) { return PyLong_FromLongLong(r->datagrams); }
static PyObject *get_trimmed(Receiver *r, void *c) { return PyLong_FromLongLong(r->trimmed); }
static PyObject *get_grant_budget(Receiver *r, void *c) { return PyLong_FromLongLong(r->grant_budget); }
static PyObject *get_grant_rate(Receiver *r, void *c) { /* receiver.py, grant_rate_bps */
    if (r->delivery.on)
        return r->delivery.samples ? PyFloat_FromDouble(r->delivery.bps) : Py_NewRef(Py_None);
    if (r->grant_fixed)
        return Py_NewRef(Py_None);
    PyObject *told = PyObject_GetAttrString(r->config, "max_rate_bps");
    if (told == NULL || (told != Py_None && PyObject_IsTrue(told) == 1))
        return told;
    Py_DECREF(told);
    return PyFloat_FromDouble(R.default_max_rate_bps);
}
static PyObject *get_admission_mode(Receiver *r, void *c) {
    return PyUnicode_FromString(r->tokens_mode ? "tokens" : "open");
}

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
    {"trimmed", (getter)get_trimmed, NULL, "DATA packets that arrived trimmed.", NULL},
    {"grant_budget", (getter)get_grant_budget, NULL, "Receiver grants: packets in flight towards it in all.", NULL},
    {"grant_rate_bps", (getter)get_grant_rate, NULL, "Receiver grants: the rate the budget is sized at.", NULL},
    {"admission_mode", (getter)get_admission_mode, NULL,
     "'open' (token-less announces admitted at once) or 'tokens' (they get a RETRY).", NULL},
    {"malformed", (getter)get_malformed, NULL, "collections.Counter of malformed datagrams by reason.", NULL},
    {"dropped", (getter)get_dropped, NULL, "collections.Counter of dropped datagrams by reason.", NULL},
    {"replies", (getter)get_replies, NULL, "collections.Counter of request and reply bytes (REPLY_FACTOR).", NULL},
    {"manifest_rate", (getter)get_manifest_rate, NULL, "The admission.SourceRate of manifest decoding.", NULL},
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
