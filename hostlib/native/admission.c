/* The receiver's memory budget and job slots (admission.h; hostlib/admission.py is the specification). */
#include "admission.h"

void budget_init(MemoryBudget *m, long long limit, long long slots, long long reserve) {
    m->limit = limit;
    m->guarantee = limit / (2 * slots);
    m->reserve = reserve;
    m->pool_limit = limit - slots * m->guarantee - reserve;
    m->used = m->pool = m->out = m->peak = 0;
}

int slots_init(SlotTable *t, long long max_jobs, long long max_per_source, double stall_s) {
    t->max_jobs = max_jobs;
    t->max_per_source = max_per_source;
    t->stall_s = stall_s;
    t->per_source = PyObject_CallNoArgs(R.Counter);
    return t->per_source == NULL ? -1 : 0;
}

void slots_free(SlotTable *t) {
    ARRAY_FREE(&t->holders);
    Py_CLEAR(t->per_source);
}

/* per_source[source] += delta, the entry deleted at 0 */
static int count_source(SlotTable *t, PyObject *source, long delta) {
    PyObject *c = PyDict_GetItemWithError(t->per_source, source);
    if (c == NULL && (PyErr_Occurred() || delta < 0))
        return PyErr_Occurred() ? -1 : 0;
    long v = (c == NULL ? 0 : PyLong_AsLong(c)) + delta;
    if (v == 0)
        return PyDict_DelItem(t->per_source, source);
    PyObject *nv = PyLong_FromLong(v);
    int rc = nv == NULL ? -1 : PyDict_SetItem(t->per_source, source, nv);
    Py_XDECREF(nv);
    return rc;
}

int slots_add(SlotTable *t, SlotHolder *job) {
    if (ARRAY_PUSH(&t->holders, job, 8) != 0)
        return -1;
    return count_source(t, job->source, 1);
}

int slots_remove(SlotTable *t, SlotHolder *job) {
    if (!ARRAY_REMOVE(&t->holders, job))
        return 0;
    return count_source(t, job->source, -1);
}

int slots_rekey(SlotTable *t, SlotHolder *job, PyObject *account) {
    int held = 0;
    for (size_t i = 0; i < t->holders.n && !held; i++)
        held = t->holders.v[i] == job;
    if (held && (count_source(t, job->source, -1) != 0 || count_source(t, account, 1) != 0))
        return -1;
    Py_SETREF(job->source, Py_NewRef(account));
    return 0;
}

/* _progress_key order: jobs that never progressed first, then the longest without progress */
static inline int progress_less(const SlotHolder *a, const SlotHolder *b) {
    if (a->progressed != b->progressed)
        return a->progressed < b->progressed;
    return a->progress_at < b->progress_at;
}

/* _stalled over the holders (``source`` NULL: all, else that source's) */
static int stalled(SlotTable *t, PyObject *source, double now, SlotHolder **out) {
    SlotHolder *best = NULL;
    for (size_t i = 0; i < t->holders.n; i++) {
        SlotHolder *j = t->holders.v[i];
        if (source != NULL) {
            int eq = PyObject_RichCompareBool(j->source, source, Py_EQ);
            if (eq < 0)
                return -1;
            if (!eq)
                continue;
        }
        if (now - j->progress_at >= t->stall_s && (best == NULL || progress_less(j, best)))
            best = j;
    }
    *out = best;
    return 0;
}

int slots_choose(SlotTable *t, PyObject *source, double now, const char **refusal, SlotHolder **victim,
                 const char **why) {
    *refusal = NULL;
    *victim = NULL;
    *why = "";
    PyObject *c = PyDict_GetItemWithError(t->per_source, source);
    if (c == NULL && PyErr_Occurred())
        return -1;
    long mine = c == NULL ? 0 : PyLong_AsLong(c);
    if (mine >= t->max_per_source) {
        if (stalled(t, source, now, victim) != 0)
            return -1;
        if (*victim != NULL)
            *why = "stalled";
        else
            *refusal = "source_share";
        return 0;
    }
    if ((long long)t->holders.n < t->max_jobs)
        return 0;
    if (stalled(t, NULL, now, victim) != 0)
        return -1;
    if (*victim != NULL) {
        *why = "stalled";
        return 0;
    }
    long long sources = PyDict_GET_SIZE(t->per_source) + (c == NULL);
    long long share = t->max_jobs / sources;
    if (share < 1)
        share = 1;
    PyObject *big = NULL, *k, *v;
    long held = -1;
    Py_ssize_t pos = 0;
    while (PyDict_Next(t->per_source, &pos, &k, &v)) {
        long x = PyLong_AsLong(v);
        if (big == NULL || x > held) {
            big = k;
            held = x;
        }
    }
    if (big != NULL && held > share && held > mine + 1) {
        SlotHolder *best = NULL;
        for (size_t i = 0; i < t->holders.n; i++) {
            int eq = PyObject_RichCompareBool(t->holders.v[i]->source, big, Py_EQ);
            if (eq < 0)
                return -1;
            if (eq && (best == NULL || progress_less(t->holders.v[i], best)))
                best = t->holders.v[i];
        }
        *victim = best;
        *why = "share";
        return 0;
    }
    *refusal = "no_slot";
    return 0;
}
