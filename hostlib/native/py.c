/* Python objects the native cores use (py.h). */
#include <stdarg.h>

#include "py.h"

NativeRefs R;

/* interned attribute names, by the address of the name string (the callers pass static strings) */
static struct {
    const char *key;
    PyObject *name;
} name_cache[32];

static PyObject *interned(const char *s) {
    for (int i = 0; i < 32; i++) {
        if (name_cache[i].key == s)
            return name_cache[i].name;
        if (name_cache[i].key == NULL) {
            PyObject *n = PyUnicode_InternFromString(s);
            if (n == NULL)
                return NULL;
            name_cache[i].key = s;
            name_cache[i].name = n;
            return n;
        }
    }
    PyErr_SetString(PyExc_RuntimeError, "make_frozen: name cache full");
    return NULL;
}

PyObject *make_frozen(PyObject *cls, const char *const *names, PyObject **values) {
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *obj = tp->tp_alloc(tp, 0);
    int ok = obj != NULL;
    for (int i = 0; names[i] != NULL; i++) {
        if (ok) {
            PyObject *name = interned(names[i]);
            ok = name != NULL && values[i] != NULL && PyObject_GenericSetAttr(obj, name, values[i]) == 0;
        }
        Py_XDECREF(values[i]);
    }
    if (!ok) {
        Py_XDECREF(obj);
        return NULL;
    }
    return obj;
}

int counter_add(PyObject *counter, const char *key, Py_ssize_t n) {
    PyObject *k = PyUnicode_InternFromString(key);
    if (k == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(counter, k);
    if (old == NULL && PyErr_Occurred()) {
        Py_DECREF(k);
        return -1;
    }
    Py_ssize_t v = old == NULL ? 0 : PyLong_AsSsize_t(old);
    PyObject *nv = PyLong_FromSsize_t(v + n);
    int rc = nv == NULL ? -1 : PyDict_SetItem(counter, k, nv);
    Py_XDECREF(nv);
    Py_DECREF(k);
    return rc;
}

int cfg_double(PyObject *cfg, const char *name, double *out) {
    PyObject *v = PyObject_GetAttrString(cfg, name);
    if (v == NULL)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

int cfg_int(PyObject *cfg, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(cfg, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

int cfg_opt_double(PyObject *cfg, const char *name, double *out, int *present) {
    PyObject *v = PyObject_GetAttrString(cfg, name);
    if (v == NULL)
        return -1;
    *present = v != Py_None;
    *out = *present ? PyFloat_AsDouble(v) : 0.0;
    Py_DECREF(v);
    return (*present && *out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *import_attr(const char *module, const char *name) {
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return a;
}

int load_refs(void) {
#define IMP(field, mod, name)                                   \
    if ((R.field = import_attr("netapprox.hostlib." mod, name)) == NULL) \
        return -1;
    IMP(ConfigError, "config", "ConfigError")
    IMP(MalformedPacket, "wire", "MalformedPacket")
    IMP(SenderState, "sender", "SenderState")
    IMP(SendSummary, "sender", "SendSummary")
    IMP(GroupSummary, "sender", "GroupSummary")
    IMP(JobResult, "receiver", "JobResult")
    IMP(GroupResult, "receiver", "GroupResult")
    IMP(Report, "wire", "Report")
    IMP(ReportReady, "events", "ReportReady")
    IMP(EpochEnded, "events", "EpochEnded")
    IMP(MessageAcked, "events", "MessageAcked")
    IMP(JobCompleted, "events", "JobCompleted")
    IMP(JobFailed, "events", "JobFailed")
    IMP(MessageReceived, "events", "MessageReceived")
    IMP(JobFinished, "events", "JobFinished")
    IMP(JobAbandoned, "events", "JobAbandoned")
    IMP(JobRejected, "events", "JobRejected")
    IMP(required_messages, "config", "required_messages")
    IMP(default_config, "config", "AtpConfig")
#undef IMP
    PyObject *cfg = PyObject_CallNoArgs(R.default_config);
    if (cfg == NULL)
        return -1;
    Py_SETREF(R.default_config, cfg);
    PyObject *config_module = PyImport_ImportModule("netapprox.hostlib.config");
    int bad = config_module == NULL || cfg_double(config_module, "DEFAULT_MAX_RATE_BPS", &R.default_max_rate_bps);
    Py_XDECREF(config_module);
    if (bad)
        return -1;
    PyObject *manifest = import_attr("netapprox.hostlib.control", "Manifest");
    if (manifest == NULL)
        return -1;
    R.Manifest_decode = PyObject_GetAttrString(manifest, "decode");
    Py_DECREF(manifest);
    if (R.Manifest_decode == NULL)
        return -1;
    if ((R.encode_announce_part = import_attr("netapprox.hostlib.control", "encode_announce_part")) == NULL ||
        (R.announce_auth = import_attr("netapprox.hostlib.control", "announce_auth")) == NULL ||
        (R.TokenMinter = import_attr("netapprox.hostlib.admission", "TokenMinter")) == NULL ||
        (R.MemoryBudget = import_attr("netapprox.hostlib.admission", "MemoryBudget")) == NULL ||
        (R.SlotTable = import_attr("netapprox.hostlib.admission", "SlotTable")) == NULL ||
        (R.SourceRate = import_attr("netapprox.hostlib.admission", "SourceRate")) == NULL ||
        (R.randbelow = import_attr("secrets", "randbelow")) == NULL ||
        (R.OrderedDict = import_attr("collections", "OrderedDict")) == NULL)
        return -1;
    if ((R.Counter = import_attr("collections", "Counter")) == NULL ||
        (R.SimpleNamespace = import_attr("types", "SimpleNamespace")) == NULL)
        return -1;
    if ((R.st_sending = PyObject_GetAttrString(R.SenderState, "SENDING")) == NULL ||
        (R.st_closing = PyObject_GetAttrString(R.SenderState, "CLOSING")) == NULL ||
        (R.st_done = PyObject_GetAttrString(R.SenderState, "DONE")) == NULL ||
        (R.st_failed = PyObject_GetAttrString(R.SenderState, "FAILED")) == NULL)
        return -1;
    R.empty_tuple = PyTuple_New(0);
    return R.empty_tuple == NULL ? -1 : 0;
}

int config_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg != NULL) {
        PyErr_SetObject(R.ConfigError, msg);
        Py_DECREF(msg);
    }
    return -1;
}

PyObject *new_ref_or_none(PyObject *o) { return Py_NewRef(o != NULL ? o : Py_None); }
