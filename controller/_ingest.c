/* netapprox.controller._ingest: the report loop (ControllerCore.ingest_batch) in C, for the reports of groups
 * the controller already knows. controller/core.py is the contract: ``ingest_batch`` there calls this module
 * when it is built and ``now`` is a float, and runs its own loop otherwise; tests/controller/
 * test_ctl_ingest_native.py runs both on the same batches and compares every job's groups, the dirty set, the
 * reports taken, the sequence numbers, the token buckets and the counters.
 *
 *   ingest(batch, now, state) -> int
 *
 * For each (source, item) of ``batch`` (``reports.receive_batch``'s list): when ``item`` is a ``Report`` of an
 * existing (job, group) whose fields have their usual types, the checks of ``ReportIngest.receive`` (TLR and
 * loss in [0, 1], a sequence number that moves forward, the source's token bucket), then
 * ``policy.next_group_report`` and ``ControllerCore.ingest``'s bookkeeping (the group's report, the dirty set,
 * the reports taken) here; anything else (a reason, a new job or group, a source without a bucket, a field of
 * another type) goes to ``state``'s ``fallback`` (``ControllerCore.ingest``) as it would have in the Python
 * loop, in the same order. Returns how many reports were accepted, as ``ingest_batch`` does, and adds those
 * accepted here to ``ReportIngest.accepted``.
 *
 * ``state``: (jobs, stats, last_seq, buckets, dropped, dirty, reports, required, required_fn, group_report,
 * report, rate_per_host, burst, valued, adaptive, fallback, value_moved): the core's jobs, its ReportIngest and
 * that one's sequence numbers, buckets and drop counter, the core's dirty set and reports, ``policy._REQUIRED``
 * and ``policy._required``, the ``GroupReport`` and ``Report`` types, the bucket's rate and depth, whether jobs
 * are placed by value and whether the mode is adaptive, ``ControllerCore.ingest`` and
 * ``ControllerCore._value_moved``.
 *
 * Floating point is the Python loop's, operation for operation (the build keeps -ffp-contract=off).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* hostlib.wire.Report's fields (a NamedTuple) */
#define R_JOB 0
#define R_GROUP 1
#define R_SEQ 2
#define R_TLR 3
#define R_LOSS 4
#define R_MSR 5
#define R_RATE 6
#define R_TOTAL 7
#define R_DELIVERED 8
#define R_LOST 9
/* policy.GroupReport's fields (a NamedTuple) */
#define G_TLR 0
#define G_SEEN 1
#define G_LOSS 2
#define G_RATE 3
#define G_REMAINING 4
#define G_RESOLVED 5
#define G_PENDING 6
#define G_MESSAGE_BYTES 7
#define G_INTERVAL 8
#define G_FIELDS 9

#define MESSAGE_BYTES_GAIN 0.25 /* policy.MESSAGE_BYTES_GAIN */

typedef struct {
    PyObject *jobs, *stats, *last_seq, *buckets, *dropped, *dirty, *reports, *required, *required_fn;
    PyTypeObject *group_report, *report;
    double rate, burst;
    int valued, adaptive;
    PyObject *fallback, *value_moved;
} State;

static PyObject *s_groups, *s_min_tlr, *s_min_group, *s_value, *s_accepted, *s_stale_seq, *s_rate_limited;

static int parse_state(PyObject *p, State *s) {
    return PyArg_ParseTuple(p, "O!OO!O!O!O!O!O!OO!O!ddppOO:ingest state", &PyDict_Type, &s->jobs, &s->stats,
                            &PyDict_Type, &s->last_seq, &PyDict_Type, &s->buckets, &PyDict_Type, &s->dropped,
                            &PySet_Type, &s->dirty, &PyList_Type, &s->reports, &PyDict_Type, &s->required,
                            &s->required_fn, &PyType_Type, &s->group_report, &PyType_Type, &s->report, &s->rate,
                            &s->burst, &s->valued, &s->adaptive, &s->fallback, &s->value_moved);
}

static int count_drop(PyObject *dropped, PyObject *reason) {
    PyObject *v = PyDict_GetItemWithError(dropped, reason);
    if (v == NULL && PyErr_Occurred())
        return -1;
    long n = v == NULL ? 0 : PyLong_AsLong(v);
    if (n == -1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromLong(n + 1);
    if (nv == NULL)
        return -1;
    int rc = PyDict_SetItem(dropped, reason, nv);
    Py_DECREF(nv);
    return rc;
}

static int is_float_or_none(PyObject *o) { return o == Py_None || PyFloat_CheckExact(o); }

/* Whether ``item`` takes the C path: a Report with its usual types, of a (job, group) with a GroupReport of its
 * usual types. Sets *job_out (new reference) and *old_out (borrowed from the job's groups, which *groups_out,
 * a new reference, holds). 0: no (nothing set), 1: yes, -1: error. */
static int common_case(State *s, PyObject *item, PyObject **job_out, PyObject **groups_out, PyObject **old_out) {
    if (Py_TYPE(item) != s->report || PyTuple_GET_SIZE(item) < R_LOST + 1)
        return 0;
    for (int i = R_JOB; i <= R_LOST; i++) {
        PyObject *f = PyTuple_GET_ITEM(item, i);
        int want_float = i == R_TLR || i == R_LOSS || i == R_MSR;
        if (want_float ? !PyFloat_CheckExact(f) : !PyLong_CheckExact(f))
            return 0;
    }
    double tlr = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(item, R_TLR));
    double loss = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(item, R_LOSS));
    if (!(0.0 <= tlr && tlr <= 1.0 && 0.0 <= loss && loss <= 1.0))
        return 0; /* counted by the Python loop */
    PyObject *job_id = PyTuple_GET_ITEM(item, R_JOB);
    int zero = PyObject_Not(job_id);
    if (zero)
        return zero < 0 ? -1 : 0;
    PyObject *job = PyDict_GetItemWithError(s->jobs, job_id);
    if (job == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *groups = PyObject_GetAttr(job, s_groups);
    if (groups == NULL)
        return -1;
    if (!PyDict_CheckExact(groups)) {
        Py_DECREF(groups);
        return 0;
    }
    PyObject *old = PyDict_GetItemWithError(groups, PyTuple_GET_ITEM(item, R_GROUP));
    if (old == NULL) {
        Py_DECREF(groups);
        return PyErr_Occurred() ? -1 : 0;
    }
    int usual = Py_TYPE(old) == s->group_report && PyTuple_GET_SIZE(old) == G_FIELDS &&
                PyFloat_CheckExact(PyTuple_GET_ITEM(old, G_SEEN)) && PyFloat_CheckExact(PyTuple_GET_ITEM(old, G_RATE)) &&
                PyLong_CheckExact(PyTuple_GET_ITEM(old, G_RESOLVED)) &&
                PyFloat_CheckExact(PyTuple_GET_ITEM(old, G_PENDING)) &&
                is_float_or_none(PyTuple_GET_ITEM(old, G_MESSAGE_BYTES)) &&
                is_float_or_none(PyTuple_GET_ITEM(old, G_INTERVAL));
    if (!usual) {
        Py_DECREF(groups);
        return 0;
    }
    Py_INCREF(job);
    *job_out = job;
    *groups_out = groups;
    *old_out = old;
    return 1;
}

/* ReportIngest._take_token for a host whose bucket is a list [tokens, stamp] of floats (``ingest_one`` checks
 * it): 1 taken, 0 not, -1 error. */
static int take_token(State *s, PyObject *bucket, PyObject *now_obj) {
    double now = PyFloat_AS_DOUBLE(now_obj);
    double tokens = PyFloat_AS_DOUBLE(PyList_GET_ITEM(bucket, 0));
    double stamp = PyFloat_AS_DOUBLE(PyList_GET_ITEM(bucket, 1));
    if (now > stamp) {
        tokens += (now - stamp) * s->rate;
        if (tokens > s->burst)
            tokens = s->burst;
    }
    Py_INCREF(now_obj);
    PyList_SetItem(bucket, 1, now_obj);
    int taken = tokens >= 1.0;
    PyObject *left = PyFloat_FromDouble(taken ? tokens - 1.0 : tokens);
    if (left == NULL)
        return -1;
    PyList_SetItem(bucket, 0, left);
    return taken;
}

/* policy._required(msr, total), through policy._REQUIRED first. New reference. */
static PyObject *required_of(State *s, PyObject *msr, PyObject *total) {
    PyObject *key = PyTuple_Pack(2, msr, total);
    if (key == NULL)
        return NULL;
    PyObject *r = PyDict_GetItemWithError(s->required, key);
    Py_DECREF(key);
    if (r != NULL) {
        Py_INCREF(r);
        return r;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallFunctionObjArgs(s->required_fn, msr, total, NULL);
}

/* policy.next_group_report(old, now, ...) for an ``old`` of the usual types. New reference. */
static PyObject *next_group_report(State *s, PyObject *old, PyObject *item, PyObject *now_obj) {
    PyObject *req = required_of(s, PyTuple_GET_ITEM(item, R_MSR), PyTuple_GET_ITEM(item, R_TOTAL));
    if (req == NULL)
        return NULL;
    long long required = PyLong_AsLongLong(req);
    Py_DECREF(req);
    long long delivered = PyLong_AsLongLong(PyTuple_GET_ITEM(item, R_DELIVERED));
    long long lost = PyLong_AsLongLong(PyTuple_GET_ITEM(item, R_LOST));
    long long old_resolved = PyLong_AsLongLong(PyTuple_GET_ITEM(old, G_RESOLVED));
    long long rate_kbps = PyLong_AsLongLong(PyTuple_GET_ITEM(item, R_RATE));
    if (PyErr_Occurred())
        return NULL;
    long long remaining = required - delivered;
    if (remaining < 0)
        remaining = 0;
    long long resolved = delivered + lost;
    double now = PyFloat_AS_DOUBLE(now_obj);
    double gap = now - PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(old, G_SEEN));
    if (gap < 0.0)
        gap = 0.0;
    double pending = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(old, G_PENDING));
    pending += PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(old, G_RATE)) * gap / 8.0;
    PyObject *per_message = PyTuple_GET_ITEM(old, G_MESSAGE_BYTES), *interval = PyTuple_GET_ITEM(old, G_INTERVAL);
    long long done = resolved - old_resolved;
    PyObject *fields[G_FIELDS] = {NULL};
    if (done > 0) {
        double sample = pending / (double)done;
        double pm = per_message == Py_None
                        ? sample
                        : PyFloat_AS_DOUBLE(per_message) + MESSAGE_BYTES_GAIN * (sample - PyFloat_AS_DOUBLE(per_message));
        fields[G_MESSAGE_BYTES] = PyFloat_FromDouble(pm);
        pending = 0.0;
    } else {
        Py_INCREF(per_message);
        fields[G_MESSAGE_BYTES] = per_message;
    }
    double iv = interval == Py_None ? gap : PyFloat_AS_DOUBLE(interval) + MESSAGE_BYTES_GAIN * (gap - PyFloat_AS_DOUBLE(interval));
    fields[G_TLR] = PyTuple_GET_ITEM(item, R_TLR);
    Py_INCREF(fields[G_TLR]);
    fields[G_SEEN] = now_obj;
    Py_INCREF(now_obj);
    fields[G_LOSS] = PyTuple_GET_ITEM(item, R_LOSS);
    Py_INCREF(fields[G_LOSS]);
    fields[G_RATE] = PyFloat_FromDouble((double)rate_kbps * 1000.0);
    fields[G_REMAINING] = PyLong_FromLongLong(remaining);
    fields[G_RESOLVED] = PyLong_FromLongLong(resolved);
    fields[G_PENDING] = PyFloat_FromDouble(pending);
    fields[G_INTERVAL] = PyFloat_FromDouble(iv);
    PyObject *t = NULL;
    int ok = 1;
    for (int i = 0; i < G_FIELDS; i++)
        ok = ok && fields[i] != NULL;
    if (ok)
        t = s->group_report->tp_alloc(s->group_report, G_FIELDS);
    if (t == NULL) {
        for (int i = 0; i < G_FIELDS; i++)
            Py_XDECREF(fields[i]);
        return NULL;
    }
    for (int i = 0; i < G_FIELDS; i++)
        PyTuple_SET_ITEM(t, i, fields[i]);
    return t;
}

/* Whether the new report makes the job dirty (ControllerCore.ingest's tests for a known group): 1 yes, 0 no,
 * 2 only ``_value_moved`` can tell (the Python method decides), -1 error. */
static int makes_dirty(State *s, PyObject *job, PyObject *item, PyObject *old, PyObject *new) {
    PyObject *group_id = PyTuple_GET_ITEM(item, R_GROUP), *tlr = PyTuple_GET_ITEM(item, R_TLR);
    PyObject *min_group = PyObject_GetAttr(job, s_min_group);
    if (min_group == NULL)
        return -1;
    int same = PyObject_RichCompareBool(group_id, min_group, Py_EQ);
    if (same > 0) {
        Py_DECREF(min_group);
        int moved = PyObject_RichCompareBool(tlr, PyTuple_GET_ITEM(old, G_TLR), Py_NE);
        if (moved == 0)
            moved = PyObject_RichCompareBool(PyTuple_GET_ITEM(item, R_LOSS), PyTuple_GET_ITEM(old, G_LOSS), Py_NE);
        if (moved != 0)
            return moved;
    } else if (same == 0) {
        PyObject *min_tlr = PyObject_GetAttr(job, s_min_tlr);
        if (min_tlr == NULL) {
            Py_DECREF(min_group);
            return -1;
        }
        /* (tlr, group_id) < (min_tlr, min_group), as Python compares tuples */
        int eq = PyObject_RichCompareBool(tlr, min_tlr, Py_EQ);
        int below = eq < 0 ? -1 : !eq ? PyObject_RichCompareBool(tlr, min_tlr, Py_LT)
                                     : PyObject_RichCompareBool(group_id, min_group, Py_LT);
        Py_DECREF(min_tlr);
        Py_DECREF(min_group);
        if (below != 0)
            return below;
    } else {
        Py_DECREF(min_group);
        return -1;
    }
    if (!s->valued)
        return 0;
    PyObject *value = PyObject_GetAttr(job, s_value);
    if (value == NULL)
        return -1;
    Py_DECREF(value); /* the job holds it; only its identity is read */
    if (value == Py_None)
        return 0;
    if (s->adaptive)
        return 2;
    /* _value_moved's shortcut: mode netapprox's value reads nothing else of a group's report */
    static const int read[] = {G_RATE, G_REMAINING, G_MESSAGE_BYTES};
    for (size_t i = 0; i < sizeof read / sizeof read[0]; i++) {
        int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(old, read[i]), PyTuple_GET_ITEM(new, read[i]), Py_EQ);
        if (eq <= 0)
            return eq < 0 ? -1 : 2;
    }
    return 0;
}

/* The C path for one report of a known (job, group) (``common_case``): 1 accepted, 0 dropped (counted), 2 the
 * source has no bucket of the usual form (nothing done: the Python loop takes it), -1 error. */
static int ingest_one(State *s, PyObject *source, PyObject *item, PyObject *now, PyObject *job, PyObject *groups,
                      PyObject *old) {
    PyObject *job_id = PyTuple_GET_ITEM(item, R_JOB), *group_id = PyTuple_GET_ITEM(item, R_GROUP);
    PyObject *seq = PyTuple_GET_ITEM(item, R_SEQ);
    PyObject *bucket = PyDict_GetItemWithError(s->buckets, source);
    if (bucket == NULL)
        return PyErr_Occurred() ? -1 : 2;
    if (!PyList_CheckExact(bucket) || PyList_GET_SIZE(bucket) != 2 || !PyFloat_CheckExact(PyList_GET_ITEM(bucket, 0)) ||
        !PyFloat_CheckExact(PyList_GET_ITEM(bucket, 1)))
        return 2;
    PyObject *key = PyTuple_Pack(2, job_id, group_id);
    if (key == NULL)
        return -1;
    int rc = -1;
    PyObject *last = PyDict_GetItemWithError(s->last_seq, key);
    if (last == NULL && PyErr_Occurred())
        goto out;
    if (last != NULL) {
        int stale = PyObject_RichCompareBool(seq, last, Py_LE);
        if (stale != 0) {
            rc = stale < 0 ? -1 : count_drop(s->dropped, s_stale_seq) < 0 ? -1 : 0;
            goto out;
        }
    }
    int taken = take_token(s, bucket, now);
    if (taken <= 0) {
        rc = taken < 0 ? -1 : count_drop(s->dropped, s_rate_limited) < 0 ? -1 : 0;
        goto out;
    }
    if (PyDict_SetItem(s->last_seq, key, seq) < 0)
        goto out;
    rc = 1; /* accepted: counted by the caller whatever follows */
    Py_INCREF(old); /* the groups' reference goes with the new report */
    PyObject *new = next_group_report(s, old, item, now);
    if (new == NULL || PyDict_SetItem(groups, group_id, new) < 0) {
        Py_XDECREF(new);
        Py_DECREF(old);
        rc = -1;
        goto out;
    }
    int dirty = makes_dirty(s, job, item, old, new);
    if (dirty == 2) {
        PyObject *moved = PyObject_CallFunctionObjArgs(s->value_moved, job, old, new, NULL);
        dirty = moved == NULL ? -1 : PyObject_IsTrue(moved);
        Py_XDECREF(moved);
    }
    Py_DECREF(new);
    Py_DECREF(old);
    if (dirty < 0 || (dirty && PySet_Add(s->dirty, job_id) < 0) || PyList_Append(s->reports, item) < 0)
        rc = -1;
out:
    Py_DECREF(key);
    return rc;
}

static PyObject *ingest(PyObject *self, PyObject *args) {
    PyObject *batch, *now, *state_tuple;
    if (!PyArg_ParseTuple(args, "OO!O!:ingest", &batch, &PyFloat_Type, &now, &PyTuple_Type, &state_tuple))
        return NULL;
    State s;
    if (!parse_state(state_tuple, &s))
        return NULL;
    PyObject *seq = PySequence_Fast(batch, "ingest: the batch must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long accepted = 0, here = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *source, *item;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "ingest: each batch entry is a (source, item) pair");
            failed = 1;
            break;
        }
        source = PyTuple_GET_ITEM(pair, 0);
        item = PyTuple_GET_ITEM(pair, 1);
        PyObject *job = NULL, *groups = NULL, *old = NULL;
        int common = common_case(&s, item, &job, &groups, &old);
        int rc = common < 0 ? -1 : common ? ingest_one(&s, source, item, now, job, groups, old) : 2;
        Py_XDECREF(job);
        Py_XDECREF(groups);
        if (rc == 2) { /* the Python loop's own path */
            PyObject *r = PyObject_CallFunctionObjArgs(s.fallback, item, source, now, NULL);
            if (r == NULL)
                failed = 1;
            else
                accepted += r != Py_None;
            Py_XDECREF(r);
        } else if (rc < 0) {
            failed = 1;
        } else {
            here += rc;
        }
    }
    Py_DECREF(seq);
    if (here) { /* ReportIngest.accepted += here, also when an error stopped the loop */
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        PyObject *was = PyObject_GetAttr(s.stats, s_accepted), *sum = NULL;
        if (was != NULL) {
            PyObject *add = PyLong_FromLong(here);
            sum = add == NULL ? NULL : PyNumber_Add(was, add);
            Py_XDECREF(add);
        }
        int set = sum != NULL && PyObject_SetAttr(s.stats, s_accepted, sum) == 0;
        Py_XDECREF(was);
        Py_XDECREF(sum);
        if (exc_type != NULL)
            PyErr_Restore(exc_type, exc_value, exc_tb);
        else if (!set)
            failed = 1;
    }
    if (failed)
        return NULL;
    return PyLong_FromLong(accepted + here);
}

static PyMethodDef methods[] = {
    {"ingest", ingest, METH_VARARGS, "ingest(batch, now, state) -> accepted: ControllerCore.ingest_batch's loop "
                                     "(see the module)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ingest",
                                    "The controller's report loop in C (controller/core.py is the contract).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ingest(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_groups, "groups"},   {&s_min_tlr, "min_tlr"},     {&s_min_group, "min_group"},
                 {&s_value, "value"},     {&s_accepted, "accepted"},   {&s_stale_seq, "stale_seq"},
                 {&s_rate_limited, "rate_limited"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
