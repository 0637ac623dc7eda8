/* netapprox.controller._decide: the epoch's decision loop (ControllerCore._decide_all) in C, for modes
 * ``netapprox`` with and without the finishing rule. controller/core.py is the contract: ``_decide_all`` there
 * calls this module when it is built, no job is pinned and the mode is not ``adaptive``, and runs its own loop
 * otherwise; tests/controller/test_ctl_decide_native.py runs both on the same epochs and compares every job's
 * state, every table, delta and change.
 *
 *   decide(job_ids, jobs, losing, urgent, assignments, tables, deltas, changes, params) -> None
 *
 * For each job id in ``job_ids`` (live jobs, in order): its lowest-TLR group (``policy.job_tlr``), its value
 * (``policy.finishing``: ``FINISH_VALUE`` when it finishes, else its TLR), ``policy.Placer.place`` for it, and
 * the bookkeeping of the Python loop: the losing and urgent sets, the job's queue, streak and value, the
 * assignments, each switch's table and delta, and one ``policy.JobChange`` per decision worth logging.
 *
 * ``params``: (upper, bands, margin, promote_after, retuned, by_finishing, finish_s, finish_value, reasons,
 * job_change): ``Placer``'s thresholds T_1..T_7 and hysteresis bands (queue -> (lo, hi)), the loss margin and
 * the promotion streak, whether the thresholds were just retuned, whether jobs are placed by value (the
 * finishing rule), its horizon in seconds, the value a finishing job gets, the reason strings (new, moved,
 * promoted, held, tuned) and the JobChange type (a tuple subclass).
 *
 * Floating point is the Python loop's, operation for operation (additions in the groups' order; the build
 * keeps -ffp-contract=off), so the decisions are the same bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define FIRST_APPROX_QUEUE 1
#define NUM_QUEUES 8
/* policy.GroupReport's fields (a NamedTuple) */
#define G_TLR 0
#define G_LOSS 2
#define G_RATE 3
#define G_REMAINING 4
#define G_MESSAGE_BYTES 7
#define G_FIELDS 9

enum { R_NEW, R_MOVED, R_PROMOTED, R_HELD, R_TUNED, R_COUNT };

typedef struct {
    double upper[NUM_QUEUES];
    Py_ssize_t n_upper;
    int has_band[NUM_QUEUES];
    double band_lo[NUM_QUEUES], band_hi[NUM_QUEUES];
    double margin;
    long promote_after;
    int retuned, by_finishing;
    double finish_s;
    PyObject *finish_value;
    PyObject *reasons[R_COUNT];
    PyTypeObject *job_change;
} Params;

static PyObject *s_groups, *s_min_tlr, *s_min_group, *s_qid, *s_streak, *s_value, *s_tag_only, *s_switches;

static int parse_params(PyObject *p, Params *out) {
    PyObject *upper, *bands, *reasons, *job_change;
    if (!PyArg_ParseTuple(p, "O!O!dlppdOO!O!:decide params", &PyTuple_Type, &upper, &PyDict_Type, &bands,
                          &out->margin, &out->promote_after, &out->retuned, &out->by_finishing, &out->finish_s,
                          &out->finish_value, &PyTuple_Type, &reasons, &PyType_Type, &job_change))
        return -1;
    out->n_upper = PyTuple_GET_SIZE(upper);
    if (out->n_upper > NUM_QUEUES || PyTuple_GET_SIZE(reasons) != R_COUNT ||
        !PyType_IsSubtype((PyTypeObject *)job_change, &PyTuple_Type)) {
        PyErr_SetString(PyExc_ValueError, "decide params: bad thresholds, reasons or JobChange type");
        return -1;
    }
    for (Py_ssize_t i = 0; i < out->n_upper; i++) {
        out->upper[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(upper, i));
        if (out->upper[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    for (int q = 0; q < NUM_QUEUES; q++) {
        PyObject *key = PyLong_FromLong(q), *band;
        if (key == NULL)
            return -1;
        band = PyDict_GetItemWithError(bands, key);
        Py_DECREF(key);
        out->has_band[q] = band != NULL;
        if (band == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        if (!PyArg_ParseTuple(band, "dd:band", &out->band_lo[q], &out->band_hi[q]))
            return -1;
    }
    for (int r = 0; r < R_COUNT; r++)
        out->reasons[r] = PyTuple_GET_ITEM(reasons, r);
    out->job_change = (PyTypeObject *)job_change;
    return 0;
}

/* bisect.bisect_right(upper, key), at least FIRST_APPROX_QUEUE */
static long queue_for(const Params *p, double key) {
    Py_ssize_t lo = 0, hi = p->n_upper;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (key < p->upper[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > FIRST_APPROX_QUEUE ? (long)lo : FIRST_APPROX_QUEUE;
}

static int in_band(const Params *p, long q, double key) {
    return q >= 0 && q < NUM_QUEUES && p->has_band[q] && p->band_lo[q] <= key && key < p->band_hi[q];
}

/* Placer.place: *new_q, the reason's index or -1, *streak (in: the job's streak, out: after this epoch).
 * has_old 0: the job has no queue yet. */
static int place(const Params *p, double tlr, double loss, double key, int has_old, long old, long *streak,
                 long *new_q) {
    long target = queue_for(p, key), q;
    int losing = loss > tlr + p->margin;
    if (!has_old) {
        *new_q = target;
        *streak = 0;
        return R_NEW;
    }
    if (p->retuned) {
        if (losing) {
            *streak += 1;
            if (old < target)
                target = old; /* a losing job never moves down on a retune either */
        } else {
            *streak = 0;
        }
        *new_q = target;
        return target != old ? R_TUNED : -1;
    }
    if (losing) {
        *streak += 1;
        if (*streak >= p->promote_after && old > FIRST_APPROX_QUEUE) {
            *new_q = old - 1;
            *streak = 0;
            return R_PROMOTED;
        }
        q = in_band(p, old, key) ? old : target;
        if (q > old)
            q = old; /* a losing job never moves down */
    } else {
        *streak = 0;
        q = (target == old || in_band(p, old, key)) ? old : target;
    }
    *new_q = q;
    if (q != old)
        return R_MOVED;
    return target != old ? R_HELD : -1;
}

static int as_double(PyObject *o, double *out) {
    *out = PyFloat_AsDouble(o);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int group_report(PyObject *r) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < G_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "decide: a group's report is not a policy.GroupReport");
        return -1;
    }
    return 0;
}

/* policy.finishing(groups, within_s): 1, 0, or -1 with an exception set */
static int finishing(PyObject *groups, double within_s) {
    double rate = 0.0, work = 0.0, known_sum = 0.0, cost, value;
    long long known = 0, remaining = 0, unknown = 0, left;
    Py_ssize_t pos = 0;
    PyObject *gid, *r, *mb;
    if (within_s <= 0.0)
        return 0;
    while (PyDict_Next(groups, &pos, &gid, &r)) {
        if (group_report(r) < 0 || as_double(PyTuple_GET_ITEM(r, G_RATE), &value) < 0)
            return -1;
        rate += value;
        left = PyLong_AsLongLong(PyTuple_GET_ITEM(r, G_REMAINING));
        if (left == -1 && PyErr_Occurred())
            return -1;
        mb = PyTuple_GET_ITEM(r, G_MESSAGE_BYTES);
        if (mb != Py_None) {
            if (as_double(mb, &cost) < 0)
                return -1;
            known_sum += cost;
            known += 1;
            if (left) {
                work += (double)left * cost;
                remaining += left;
            }
        } else if (left) {
            unknown += left;
        }
    }
    if (!known)
        return 0; /* no message resolved yet: the work is not known */
    if (unknown) {
        work += (double)unknown * (known_sum / (double)known);
        remaining += unknown;
    }
    return remaining > 0 && work * 8.0 <= rate * within_s;
}

/* policy.job_tlr: the group with the lowest (tlr, group id); borrowed references */
static int lowest_group(PyObject *groups, PyObject **gid_out, PyObject **report_out, double *tlr_out) {
    Py_ssize_t pos = 0;
    PyObject *gid, *r;
    double tlr;
    *gid_out = NULL;
    while (PyDict_Next(groups, &pos, &gid, &r)) {
        if (group_report(r) < 0 || as_double(PyTuple_GET_ITEM(r, G_TLR), &tlr) < 0)
            return -1;
        if (*gid_out != NULL) {
            if (tlr > *tlr_out)
                continue;
            if (tlr == *tlr_out) {
                int less = PyObject_RichCompareBool(gid, *gid_out, Py_LT);
                if (less <= 0) {
                    if (less < 0)
                        return -1;
                    continue;
                }
            }
        }
        *gid_out = gid;
        *report_out = r;
        *tlr_out = tlr;
    }
    if (*gid_out == NULL) {
        PyErr_SetString(PyExc_ValueError, "decide: a live job without a group");
        return -1;
    }
    return 0;
}

static int set_attr_long(PyObject *o, PyObject *name, long v) {
    PyObject *x = PyLong_FromLong(v);
    int rc = x == NULL ? -1 : PyObject_SetAttr(o, name, x);
    Py_XDECREF(x);
    return rc;
}

static PyObject *job_change(const Params *p, PyObject *job_id, int reason, PyObject *old, PyObject *new_q,
                            PyObject *tlr, PyObject *gid, PyObject *loss) {
    PyObject *items[7] = {job_id, p->reasons[reason], old, new_q, tlr, gid, loss};
    PyObject *t = p->job_change->tp_alloc(p->job_change, 7);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < 7; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

/* each of the job's switches: its table entry and delta, when the queue is not already there */
static int set_queue(PyObject *job, PyObject *job_id, PyObject *new_q, PyObject *tables, PyObject *deltas) {
    PyObject *switches = PyObject_GetAttr(job, s_switches), *seq;
    int rc = -1;
    if (switches == NULL)
        return -1;
    seq = PySequence_Fast(switches, "decide: a job's switches are not a sequence");
    Py_DECREF(switches);
    if (seq == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *name = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *table = PyDict_GetItemWithError(tables, name), *delta, *have;
        if (table == NULL || !PyDict_Check(table)) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "decide: no table for switch %R", name);
            goto done;
        }
        have = PyDict_GetItemWithError(table, job_id);
        if (have == NULL && PyErr_Occurred())
            goto done;
        if (have != NULL) {
            int same = PyObject_RichCompareBool(have, new_q, Py_EQ);
            if (same < 0)
                goto done;
            if (same)
                continue;
        }
        delta = PyDict_GetItemWithError(deltas, name);
        if (delta == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "decide: no delta for switch %R", name);
            goto done;
        }
        if (PyDict_SetItem(table, job_id, new_q) < 0 || PyObject_SetItem(delta, job_id, new_q) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

typedef struct {
    PyObject *losing, *urgent, *assignments, *tables, *deltas, *changes;
} Out;

/* one job: the body of ControllerCore._decide_all's loop */
static int decide_job(const Params *p, const Out *o, PyObject *job_id, PyObject *job) {
    PyObject *groups = NULL, *gid, *report, *tlr_obj, *loss_obj, *old = NULL, *streak_obj = NULL, *new_obj = NULL;
    double tlr = 0.0, loss, key;
    long old_q = 0, streak, new_q;
    int reason, rc = -1, is_losing, fin;
    groups = PyObject_GetAttr(job, s_groups);
    if (groups == NULL)
        return -1;
    if (!PyDict_Check(groups)) {
        PyErr_SetString(PyExc_TypeError, "decide: a job's groups are not a dict");
        goto done;
    }
    if (lowest_group(groups, &gid, &report, &tlr) < 0)
        goto done;
    tlr_obj = PyTuple_GET_ITEM(report, G_TLR);
    loss_obj = PyTuple_GET_ITEM(report, G_LOSS);
    if (PyObject_SetAttr(job, s_min_tlr, tlr_obj) < 0 || PyObject_SetAttr(job, s_min_group, gid) < 0 ||
        as_double(loss_obj, &loss) < 0)
        goto done;
    if ((old = PyObject_GetAttr(job, s_qid)) == NULL || (streak_obj = PyObject_GetAttr(job, s_streak)) == NULL)
        goto done;
    if (old != Py_None && ((old_q = PyLong_AsLong(old)) == -1 && PyErr_Occurred()))
        goto done;
    if ((streak = PyLong_AsLong(streak_obj)) == -1 && PyErr_Occurred())
        goto done;
    key = tlr;
    if (p->by_finishing) {
        if ((fin = finishing(groups, p->finish_s)) < 0)
            goto done;
        PyObject *value = fin ? p->finish_value : tlr_obj;
        if (fin && as_double(value, &key) < 0)
            goto done;
        if (PyObject_SetAttr(job, s_value, value) < 0)
            goto done;
    }
    reason = place(p, tlr, loss, key, old != Py_None, old_q, &streak, &new_q);
    if (set_attr_long(job, s_streak, streak) < 0)
        goto done;
    is_losing = loss > tlr + p->margin;
    if (is_losing) {  /* losing: its streak moves every epoch, so decide it every epoch */
        if (PySet_Add(o->losing, job_id) < 0 || PySet_Add(o->urgent, job_id) < 0)
            goto done;
    } else if (PySet_Discard(o->losing, job_id) < 0) {
        goto done;
    }
    if ((new_obj = PyLong_FromLong(new_q)) == NULL || PyObject_SetAttr(job, s_qid, new_obj) < 0 ||
        PyDict_SetItem(o->assignments, job_id, new_obj) < 0)
        goto done;
    if (reason >= 0) {
        PyObject *change = job_change(p, job_id, reason, old, new_obj, tlr_obj, gid, loss_obj);
        int appended = change == NULL ? -1 : PyList_Append(o->changes, change);
        Py_XDECREF(change);
        if (appended < 0 || (reason == R_PROMOTED && PySet_Add(o->urgent, job_id) < 0))
            goto done;
        if (old == Py_None || new_q != old_q) {
            PyObject *tag_only = PyObject_GetAttr(job, s_tag_only);
            int left_to_tags = tag_only == NULL ? -1 : PyObject_IsTrue(tag_only);
            Py_XDECREF(tag_only);
            if (left_to_tags < 0 || (!left_to_tags && set_queue(job, job_id, new_obj, o->tables, o->deltas) < 0))
                goto done;
        }
    }
    rc = 0;
done:
    Py_XDECREF(groups);
    Py_XDECREF(old);
    Py_XDECREF(streak_obj);
    Py_XDECREF(new_obj);
    return rc;
}

static PyObject *decide(PyObject *self, PyObject *args) {
    PyObject *job_ids, *jobs, *params_obj;
    Out o;
    Params p;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!:decide", &PyList_Type, &job_ids, &PyDict_Type, &jobs,
                          &PySet_Type, &o.losing, &PySet_Type, &o.urgent, &PyDict_Type, &o.assignments,
                          &PyDict_Type, &o.tables, &PyDict_Type, &o.deltas, &PyList_Type, &o.changes,
                          &PyTuple_Type, &params_obj))
        return NULL;
    if (parse_params(params_obj, &p) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(job_ids); i++) {
        PyObject *job_id = PyList_GET_ITEM(job_ids, i);
        PyObject *job = PyDict_GetItemWithError(jobs, job_id);
        if (job == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "decide: no live job %R", job_id);
            return NULL;
        }
        Py_INCREF(job_id);
        Py_INCREF(job);
        int rc = decide_job(&p, &o, job_id, job);
        Py_DECREF(job);
        Py_DECREF(job_id);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decide", decide, METH_VARARGS, "decide(job_ids, jobs, losing, urgent, assignments, tables, deltas, "
                                     "changes, params): ControllerCore._decide_all's loop (see the module)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decide",
                                    "The controller's decision loop in C (controller/core.py is the contract).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__decide(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_groups, "groups"}, {&s_min_tlr, "min_tlr"}, {&s_min_group, "min_group"}, {&s_qid, "qid"},
                 {&s_streak, "streak"}, {&s_value, "value"},     {&s_tag_only, "tag_only"},   {&s_switches, "switches"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
