/* What the native cores take from Python: the classes they build (events, summaries, results), hostlib's rare
 * paths they call (the announce's signature, the manifest decode, admission tokens), and small helpers for
 * Python objects. py.c; the references are loaded once, when the module is imported (module.c). */
#ifndef NETAPPROX_PY_H
#define NETAPPROX_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject *ConfigError, *MalformedPacket;
    PyObject *SenderState, *st_sending, *st_closing, *st_done, *st_failed;
    PyObject *SendSummary, *GroupSummary, *JobResult, *GroupResult;
    PyObject *Report;
    PyObject *ReportReady, *EpochEnded, *MessageAcked, *JobCompleted, *JobFailed;
    PyObject *MessageReceived, *JobFinished, *JobAbandoned, *JobRejected;
    PyObject *Counter, *SimpleNamespace, *required_messages, *Manifest_decode, *default_config;
    PyObject *encode_announce_part, *announce_auth, *randbelow, *TokenMinter, *MemoryBudget, *SlotTable, *OrderedDict;
    PyObject *SourceRate;
    double default_max_rate_bps;
    PyObject *empty_tuple;
} NativeRefs;

extern NativeRefs R;

/* Fill R from hostlib's modules: 0, or -1 with a Python error set. */
int load_refs(void);

/* An instance of a frozen dataclass without running its __init__ (fields set in its __dict__): the hot events.
 * ``names`` is NULL-terminated; steals the references in ``values``. */
PyObject *make_frozen(PyObject *cls, const char *const *names, PyObject **values);
/* ``counter[key] += n`` for a collections.Counter (or dict). */
int counter_add(PyObject *counter, const char *key, Py_ssize_t n);
/* Attribute readers (AtpConfig, JobSpec, ...): 0, or -1 with a Python error set. */
int cfg_double(PyObject *cfg, const char *name, double *out);
int cfg_int(PyObject *cfg, const char *name, long long *out);
/* ``*present`` = the attribute is not None; ``*out`` its value then, 0.0 otherwise. */
int cfg_opt_double(PyObject *cfg, const char *name, double *out, int *present);
/* hostlib.config.ConfigError(printf-style message); returns -1. */
int config_error(const char *fmt, ...);
/* A new reference to ``o``, or to None when ``o`` is NULL (getters of optional fields). */
PyObject *new_ref_or_none(PyObject *o);

/* --- the cores' Python methods ---------------------------------------------------------------------------- */

/* ``now`` of a method taking a time (handle_timer(now), datagrams_to_send(now)): 0, or -1 with a Python error. */
static inline int time_arg(PyObject *arg, double *now) {
    *now = PyFloat_AsDouble(arg);
    return *now == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* The result of a method that returns None: None after ``rc`` 0, NULL (the error set) after -1. */
static inline PyObject *none_or_error(int rc) { return rc != 0 ? NULL : Py_NewRef(Py_None); }

/* ``Type_name(self, (fd, t))``: a method of the socket fast path, ``name(fd, now_or_until) -> int``, calling
 * ``Py_ssize_t impl(Type *, int fd, double t)`` (-1 with a Python error set). */
#define FD_METHOD(Type, name, impl)                                                  \
    static PyObject *Type##_##name(Type *self, PyObject *args) {                    \
        int fd;                                                                      \
        double t;                                                                    \
        if (!PyArg_ParseTuple(args, "id:" #name, &fd, &t))                           \
            return NULL;                                                             \
        Py_ssize_t n = impl(self, fd, t);                                            \
        return n < 0 ? NULL : PyLong_FromSsize_t(n);                                 \
    }

#endif
