/* netapprox.controller.p4runtime._jobwrites: the write queue's two loops over queue_by_job entries, in C.
 * controller/p4runtime/write_queue.py is the contract: ``WriteQueue._job_changes`` and ``_record_accepted`` there
 * call this module when it is built (and, for the first, when no update is held back as refused) and run their
 * own loops otherwise; tests/controller/test_ctl_writes_native.py runs both on the same epochs and compares
 * what they send and what they record.
 *
 *   job_changes(order, dirty, jobs, installed, inflight, adopted, encoded, budget, room, no_room_add, encode,
 *               change_type, table, kinds) -> changes
 *
 * For each dirty job in ``order`` not in flight: drop it from ``dirty`` when its entry is already what is wanted
 * (or nothing is to be deleted), else make its Change (INSERT, MODIFY or DELETE) from the encoding cache
 * ``encoded`` (``encode(kind, job, qid)`` on a miss), until ``budget`` changes are made. ``room``: (capacity or
 * None, entries installed and in flight): an INSERT beyond the capacity calls ``no_room_add(job)`` instead.
 *
 *   record_accepted(changes, jobs_table, installed, want, dirty, urgent, inflight, no_room, make_room, kinds)
 *
 * The switch took every change: commit each to ``installed`` (other tables' changes: ``change.commit()``), and a
 * job whose wanted queue moved while in flight goes back to ``dirty``. ``kinds``: (INSERT, MODIFY, DELETE).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_qid, *s_table, *s_key, *s_kind, *s_rule, *s_entry, *s_payload, *s_commit;

static int parse_kinds(PyObject *kinds, long *insert, long *modify, long *delete) {
    return PyArg_ParseTuple(kinds, "lll:kinds", insert, modify, delete) ? 0 : -1;
}

/* rule.qid == want (rule not None) */
static int rule_is(PyObject *rule, PyObject *want) {
    PyObject *qid;
    int same;
    if (rule == Py_None)
        return 0;
    if ((qid = PyObject_GetAttr(rule, s_qid)) == NULL)
        return -1;
    same = PyObject_RichCompareBool(qid, want, Py_EQ);
    Py_DECREF(qid);
    return same;
}

static PyObject *get(PyObject *dict, PyObject *key, int *err) { /* borrowed, NULL when absent */
    PyObject *v = PyDict_GetItemWithError(dict, key);
    *err = v == NULL && PyErr_Occurred();
    return v;
}

typedef struct {
    PyObject *dirty, *jobs, *installed, *inflight, *adopted, *encoded, *no_room_add, *encode, *change_type, *table;
    Py_ssize_t budget, room_base, capacity; /* capacity: of queue_by_job, when has_capacity */
    int has_capacity;
    long insert, modify, delete;
} Queue;

/* Change(kind, table, job, rule, None, payload): its __init__ only stores its arguments in its slots, so they are
 * stored here without a Python call */
static PyObject *new_change(const Queue *q, long kind, PyObject *job, PyObject *rule, PyObject *payload) {
    PyTypeObject *type = (PyTypeObject *)q->change_type;
    PyObject *kind_obj = PyLong_FromLong(kind), *change;
    if (kind_obj == NULL)
        return NULL;
    change = type->tp_alloc(type, 0);
    PyObject *names[] = {s_kind, s_table, s_key, s_rule, s_entry, s_payload};
    PyObject *values[] = {kind_obj, q->table, job, rule, Py_None, payload};
    for (int i = 0; change != NULL && i < 6; i++)
        if (PyObject_SetAttr(change, names[i], values[i]) < 0)
            Py_CLEAR(change);
    Py_DECREF(kind_obj);
    return change;
}

/* one dirty job, not in flight, whose entry is not what is wanted: ``want`` and ``have`` (an (rule, entry) pair)
 * are its wanted queue and installed entry, borrowed, NULL when absent. 1 a change appended, 0 nothing to send,
 * -1 error */
static int job_change(const Queue *q, PyObject *job, PyObject *want, PyObject *have, PyObject *changes,
                      Py_ssize_t *inserts) {
    int err;
    PyObject *hit, *rule, *change, *key;
    long kind, want_q = 0;
    if (want == NULL) {
        int kept = have == NULL ? 1 : PySet_Contains(q->adopted, job); /* adopted: kept until adopt_jobs_s */
        if (kept != 0)
            return kept < 0 || PyDict_DelItem(q->dirty, job) < 0 ? -1 : 0;
        kind = q->delete;
    } else {
        if ((want_q = PyLong_AsLong(want)) == -1 && PyErr_Occurred())
            return -1;
        if (have == NULL && q->has_capacity && q->room_base + *inserts >= q->capacity) {
            PyObject *r = PyObject_CallOneArg(q->no_room_add, job); /* no room: the job waits for a delete */
            Py_XDECREF(r);
            return r == NULL ? -1 : 0;
        }
        if (have == NULL)
            *inserts += 1;
        kind = have == NULL ? q->insert : q->modify;
    }
    /* the cache's key: job * 32 + kind * 8 + qid (job ids are below 2^32) */
    long long job_id = PyLong_AsLongLong(job);
    if (job_id == -1 && PyErr_Occurred())
        return -1;
    if ((key = PyLong_FromLongLong(job_id * 32 + kind * 8 + want_q)) == NULL)
        return -1;
    hit = get(q->encoded, key, &err);
    Py_DECREF(key);
    if (err)
        return -1;
    if (hit == NULL) {
        hit = PyObject_CallFunction(q->encode, "lOl", kind, job, want_q);
        if (hit == NULL)
            return -1;
    } else {
        Py_INCREF(hit);
    }
    if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2) {
        Py_DECREF(hit);
        PyErr_SetString(PyExc_TypeError, "job_changes: an encoding is not (rule, bytes)");
        return -1;
    }
    rule = kind == q->delete ? PyTuple_GET_ITEM(have, 0) : PyTuple_GET_ITEM(hit, 0);
    change = new_change(q, kind, job, rule, PyTuple_GET_ITEM(hit, 1));
    Py_DECREF(hit);
    if (change == NULL)
        return -1;
    err = PyList_Append(changes, change);
    Py_DECREF(change);
    return err < 0 ? -1 : 1;
}

static PyObject *job_changes(PyObject *self, PyObject *args) {
    PyObject *order, *room, *kinds, *changes;
    Queue q;
    Py_ssize_t inserts = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!nO!OOOOO!:job_changes", &PyList_Type, &order, &PyDict_Type, &q.dirty,
                          &PyDict_Type, &q.jobs, &PyDict_Type, &q.installed, &PySet_Type, &q.inflight, &PySet_Type,
                          &q.adopted, &PyDict_Type, &q.encoded, &q.budget, &PyTuple_Type, &room, &q.no_room_add,
                          &q.encode, &q.change_type, &q.table, &PyTuple_Type, &kinds))
        return NULL;
    if (!PyType_Check(q.change_type)) {
        PyErr_SetString(PyExc_TypeError, "job_changes: change_type is not a type");
        return NULL;
    }
    PyObject *capacity;
    if (!PyArg_ParseTuple(room, "On:room", &capacity, &q.room_base) ||
        parse_kinds(kinds, &q.insert, &q.modify, &q.delete) < 0)
        return NULL;
    q.has_capacity = capacity != Py_None;
    if (q.has_capacity && (q.capacity = PyLong_AsSsize_t(capacity)) == -1 && PyErr_Occurred())
        return NULL;
    if ((changes = PyList_New(0)) == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
        PyObject *job = PyList_GET_ITEM(order, i), *want, *have;
        int err, rc = PySet_Contains(q.inflight, job);
        if (rc != 0) { /* in flight: sent at its newest value once the switch has answered the earlier Write */
            if (rc < 0)
                goto fail;
            continue;
        }
        Py_INCREF(job);
        want = get(q.jobs, job, &err);
        have = err ? NULL : get(q.installed, job, &err);
        if (!err && have != NULL && (!PyTuple_Check(have) || PyTuple_GET_SIZE(have) != 2)) {
            PyErr_SetString(PyExc_TypeError, "job_changes: an installed entry is not (rule, entry)");
            err = 1;
        }
        if (!err && have != NULL && want != NULL) {
            rc = rule_is(PyTuple_GET_ITEM(have, 0), want);
            if (rc != 0) { /* already installed as wanted */
                rc = rc < 0 ? -1 : PyDict_DelItem(q.dirty, job);
                Py_DECREF(job);
                if (rc < 0)
                    goto fail;
                continue;
            }
        }
        if (err || PyList_GET_SIZE(changes) >= q.budget) {
            Py_DECREF(job);
            if (err)
                goto fail;
            break;
        }
        rc = job_change(&q, job, want, have, changes, &inserts);
        Py_DECREF(job);
        if (rc < 0)
            goto fail;
    }
    return changes;
fail:
    Py_DECREF(changes);
    return NULL;
}

/* one accepted change of queue_by_job; its attributes are new references released by the caller's loop */
static int record_one(PyObject *change, PyObject *job, long kind, PyObject **o, long delete) {
    /* o: installed, want, dirty, urgent, inflight, no_room, make_room */
    PyObject *have = NULL, *rule = NULL, *entry = NULL, *pair, *w;
    int rc = -1, ne, err;
    if (kind == delete) {
        int installed = PyDict_Contains(o[0], job);
        if (installed < 0 || (installed && PyDict_DelItem(o[0], job) < 0))
            return -1;
        if (PyDict_GET_SIZE(o[5]) > 0) {
            PyObject *r = PyObject_CallNoArgs(o[6]);
            Py_XDECREF(r);
            if (r == NULL)
                return -1;
        }
    } else {
        if ((rule = PyObject_GetAttr(change, s_rule)) == NULL || (entry = PyObject_GetAttr(change, s_entry)) == NULL)
            goto done;
        pair = PyTuple_Pack(2, rule, entry);
        if (pair == NULL)
            goto done;
        err = PyDict_SetItem(o[0], job, pair);
        Py_DECREF(pair);
        if (err < 0 || (have = PyObject_GetAttr(rule, s_qid)) == NULL)
            goto done;
    }
    if (PySet_Discard(o[3], job) < 0 || PySet_Discard(o[4], job) < 0)
        goto done;
    w = get(o[1], job, &err);
    if (err)
        goto done;
    ne = PyObject_RichCompareBool(w ? w : Py_None, have ? have : Py_None, Py_NE);
    if (ne < 0)
        goto done;
    if (ne) { /* changed again while in flight: its newest value goes next */
        int in_dirty = PyDict_Contains(o[2], job);
        if (in_dirty < 0 || (!in_dirty && PyDict_SetItem(o[2], job, Py_None) < 0))
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(have);
    Py_XDECREF(rule);
    Py_XDECREF(entry);
    return rc;
}

static PyObject *record_accepted(PyObject *self, PyObject *args) {
    PyObject *changes, *jobs_table, *kinds, *o[7];
    long insert, modify, delete;
    if (!PyArg_ParseTuple(args, "O!OO!O!O!O!O!O!OO!:record_accepted", &PyList_Type, &changes, &jobs_table,
                          &PyDict_Type, &o[0], &PyDict_Type, &o[1], &PyDict_Type, &o[2], &PySet_Type, &o[3],
                          &PySet_Type, &o[4], &PyDict_Type, &o[5], &o[6], &PyTuple_Type, &kinds) ||
        parse_kinds(kinds, &insert, &modify, &delete) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(changes); i++) {
        PyObject *change = PyList_GET_ITEM(changes, i), *table, *job = NULL, *kind_obj = NULL;
        long kind;
        int rc = -1;
        Py_INCREF(change);
        if ((table = PyObject_GetAttr(change, s_table)) == NULL)
            goto next;
        if (table != jobs_table) {
            PyObject *r = PyObject_CallMethodNoArgs(change, s_commit);
            Py_XDECREF(r);
            rc = r == NULL ? -1 : 0;
            goto next;
        }
        if ((job = PyObject_GetAttr(change, s_key)) == NULL || (kind_obj = PyObject_GetAttr(change, s_kind)) == NULL)
            goto next;
        if ((kind = PyLong_AsLong(kind_obj)) == -1 && PyErr_Occurred())
            goto next;
        rc = record_one(change, job, kind, o, delete);
    next:
        Py_XDECREF(table);
        Py_XDECREF(job);
        Py_XDECREF(kind_obj);
        Py_DECREF(change);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"job_changes", job_changes, METH_VARARGS, "WriteQueue._job_changes' loop (see the module)."},
    {"record_accepted", record_accepted, METH_VARARGS, "WriteQueue._record_accepted's loop (see the module)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jobwrites",
                                    "The write queue's queue_by_job loops in C (write_queue.py is the contract).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jobwrites(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_qid, "qid"},   {&s_table, "table"}, {&s_key, "key"},      {&s_kind, "kind"},
                 {&s_rule, "rule"}, {&s_entry, "entry"}, {&s_payload, "payload"}, {&s_commit, "commit"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
