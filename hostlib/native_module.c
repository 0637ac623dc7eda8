/* netapprox.hostlib._native: C implementations of AtpSender and AtpReceiver (hostlib/sender.py,
 * hostlib/receiver.py are the specification) and the batched socket I/O the adapters use with them.
 * hostlib/core.py decides which implementation hostlib uses. */
#include <errno.h>
#include <sys/prctl.h>

#include "native_atp.h"

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

static int load_refs(void) {
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

/* --- module functions ---------------------------------------------------------------------------------- */

static PyObject *set_timer_slack(PyObject *self, PyObject *arg) {
    long ns = PyLong_AsLong(arg);
    if (ns == -1 && PyErr_Occurred())
        return NULL;
    int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old < 0 || prctl(PR_SET_TIMERSLACK, (unsigned long)(ns < 1 ? 1 : ns), 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(old);
}

static PyObject *py_send_batch(PyObject *self, PyObject *args) {
    int fd;
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "iO:send_batch", &fd, &seq))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "send_batch: a sequence of (bytes, address) pairs");
    if (fast == NULL)
        return NULL;
    static SendBatch b; /* one for the module, buffers kept: calls hold the GIL throughout */
    batch_clear(&b);
    b.gso = 1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), sent = -1;
    PyObject *last_addr = NULL;
    int32_t last_dst = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *data, *addr;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "send_batch: items must be (bytes, address) pairs");
            goto done;
        }
        data = PyTuple_GET_ITEM(item, 0);
        addr = PyTuple_GET_ITEM(item, 1);
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0)
            goto done;
        if (addr != last_addr) {
            NetAddr na;
            if (addr_from_py(addr, &na) != 0) {
                PyBuffer_Release(&view);
                goto done;
            }
            last_dst = batch_addr(&b, &na);
            last_addr = addr;
        }
        uint8_t *dst = last_dst < 0 ? NULL : batch_add(&b, (uint32_t)view.len, last_dst);
        if (dst == NULL) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            goto done;
        }
        memcpy(dst, view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
    }
    sent = batch_flush(&b, fd);
done:
    Py_DECREF(fast);
    return sent < 0 ? NULL : PyLong_FromSsize_t(sent);
}

typedef struct {
    PyObject *list;
    PyObject *last;   /* the address object of ``last_na`` */
    NetAddr last_na;
} ListSink;

static int list_sink(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now) {
    ListSink *s = core;
    if (s->last == NULL || !netaddr_eq(&s->last_na, src)) {
        PyObject *a = addr_to_py(src);
        if (a == NULL)
            return -1;
        Py_XSETREF(s->last, a);
        s->last_na = *src;
    }
    PyObject *d = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)len);
    PyObject *t = d == NULL ? NULL : PyTuple_Pack(3, d, s->last, ce ? Py_True : Py_False);
    Py_XDECREF(d);
    if (t == NULL || PyList_Append(s->list, t) != 0) {
        Py_XDECREF(t);
        return -1;
    }
    Py_DECREF(t);
    return 0;
}

static PyObject *py_recv_batch(PyObject *self, PyObject *args) {
    int fd, max_calls = 1;
    if (!PyArg_ParseTuple(args, "i|i:recv_batch", &fd, &max_calls))
        return NULL;
    static RecvRing r; /* one for the module: calls hold the GIL throughout */
    ListSink s = {PyList_New(0), NULL};
    if (s.list == NULL)
        return NULL;
    Py_ssize_t n = ring_receive(&r, fd, &s, list_sink, 0.0, max_calls);
    Py_XDECREF(s.last);
    if (n < 0) {
        Py_DECREF(s.list);
        return NULL;
    }
    return s.list;
}

static PyObject *enable_gro(PyObject *self, PyObject *arg) {
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0)
        return NULL;
    int one = 1;
    /* UDP_GRO (104) at SOL_UDP (17): the kernel may hand over several datagrams of one flow as one */
    return PyBool_FromLong(setsockopt(fd, 17, 104, &one, sizeof one) == 0);
}

static PyMethodDef module_methods[] = {
    {"enable_gro", enable_gro, METH_O,
     "enable_gro(sock_or_fd) -> bool: ask for UDP GRO super-datagrams (receive_from / recv_batch split them)."},
    {"set_timer_slack", set_timer_slack, METH_O,
     "set_timer_slack(ns) -> previous: this thread's timer slack (prctl PR_SET_TIMERSLACK), so that short sleeps "
     "wake on time."},
    {"send_batch", py_send_batch, METH_VARARGS,
     "send_batch(fd, [(bytes, address), ...]) -> sent: UDP GSO for runs of equal-size datagrams to one address, "
     "sendmmsg for the rest. A full buffer or an unreachable peer drops datagrams (ATP sees loss)."},
    {"recv_batch", py_recv_batch, METH_VARARGS,
     "recv_batch(fd, max_calls=1) -> [(bytes, address, ce), ...]: recvmmsg, GRO super-datagrams split."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_native",
    "C implementations of AtpSender and AtpReceiver and batched UDP I/O (see hostlib/core.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (load_refs() != 0)
        return NULL;
    if (PyType_Ready(&SenderType) < 0 || PyType_Ready(&ReceiverType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SenderType);
    Py_INCREF(&ReceiverType);
    if (PyModule_AddObject(m, "AtpSender", (PyObject *)&SenderType) < 0 ||
        PyModule_AddObject(m, "AtpReceiver", (PyObject *)&ReceiverType) < 0)
        return NULL;
    return m;
}
