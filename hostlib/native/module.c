/* netapprox.hostlib._native: C implementations of AtpSender and AtpReceiver (hostlib/sender.py,
 * hostlib/receiver.py are the specification) and the batched socket I/O the adapters use with them.
 * hostlib/core.py decides which implementation hostlib uses.
 *
 * The files, as hostlib's Python modules (docs/hostlib.md, The native path):
 *   wire.c        the ATP header and payload codecs (wire.py)
 *   sender.c      the sender's protocol (sender.py), with scheduler.c, recovery.c and rate.c; sender_ack.c
 *                 (acknowledgements and losses), sender_announce.c (the announce, RETRY, NEW_TOKEN)
 *   receiver.c    the receiver's protocol (receiver.py), with admission.c (slots, memory budget) and
 *                 receiver_announce.c (admission, the announce, address validation, MSR changes)
 *   events.c      the event queue of a core (next_event; events.py has the classes)
 *   sender_type.c, receiver_type.c   the Python types: construction, methods, attributes, the socket fast path
 *   netio.c       batched UDP I/O (GSO/GRO, sendmmsg/recvmmsg), addresses, waiting
 *   py.c          what the cores take from Python (classes, rare paths) and helpers for Python objects
 *   buf.c, map.c  growable arrays and rings (one helper), the 32-bit-key hash map
 *   module.c      this module: its functions and its initialisation */
#include <errno.h>
#include <sys/prctl.h>

#include "buf.h"
#include "netio.h"
#include "py.h"

extern PyTypeObject SenderType;   /* sender_type.c */
extern PyTypeObject ReceiverType; /* receiver_type.c */

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
    b.no_gso = 0; /* tried again on every call: another socket may take it */
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

/* merge_ranges: every group's id ranges in id order, with their group's position (control.GroupIndex) */
typedef struct {
    uint32_t first, last;
    uint16_t group;
} IxRange;

static int cmp_ixrange(const void *a, const void *b) {
    const IxRange *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    return x->group < y->group ? -1 : x->group > y->group;
}

static PyObject *merge_ranges(PyObject *self, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "merge_ranges takes a sequence of (firsts, lasts) arrays");
    if (seq == NULL)
        return NULL;
    Py_ssize_t ng = PySequence_Fast_GET_SIZE(seq);
    if (ng > 0xFFFF) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "%zd groups: at most 65535", ng);
    }
    ARRAY(IxRange) all = {0};
    PyObject *out = NULL;
    for (Py_ssize_t k = 0; k < ng; k++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, k);
        Py_buffer f = {0}, l = {0};
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 0), &f, PyBUF_FORMAT) != 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "merge_ranges takes (firsts, lasts) pairs");
            goto out;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &l, PyBUF_FORMAT) != 0) {
            PyBuffer_Release(&f);
            goto out;
        }
        int ok = f.itemsize == 4 && l.itemsize == 4 && f.len == l.len &&
                 ARRAY_RESERVE(&all, all.n + (size_t)(f.len / 4), 1024) == 0;
        for (Py_ssize_t i = 0; ok && i < f.len / 4; i++)
            all.v[all.n++] = (IxRange){((const uint32_t *)f.buf)[i], ((const uint32_t *)l.buf)[i], (uint16_t)k};
        PyBuffer_Release(&f);
        PyBuffer_Release(&l);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "merge_ranges takes pairs of equal-length 32-bit arrays");
            goto out;
        }
    }
    if (all.n)
        qsort(all.v, all.n, sizeof(IxRange), cmp_ixrange);
    PyObject *firsts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * all.n));
    PyObject *lasts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * all.n));
    PyObject *group = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(2 * all.n));
    if (firsts != NULL && lasts != NULL && group != NULL) {
        uint32_t *pf = (uint32_t *)PyBytes_AS_STRING(firsts), *pl = (uint32_t *)PyBytes_AS_STRING(lasts);
        uint16_t *pg = (uint16_t *)PyBytes_AS_STRING(group);
        for (size_t i = 0; i < all.n; i++) {
            pf[i] = all.v[i].first;
            pl[i] = all.v[i].last;
            pg[i] = all.v[i].group;
        }
        out = PyTuple_Pack(3, firsts, lasts, group);
    }
    Py_XDECREF(firsts);
    Py_XDECREF(lasts);
    Py_XDECREF(group);
out:
    ARRAY_FREE(&all);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef module_methods[] = {
    {"merge_ranges", merge_ranges, METH_O,
     "merge_ranges([(firsts, lasts), ...]) -> (firsts, lasts, group) as native-endian bytes: every group's id "
     "ranges in id order (ties by group), with their group's position; control.GroupIndex at C speed."},
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

#ifndef NETAPPROX_SOURCE_HASH
#define NETAPPROX_SOURCE_HASH "" /* built without setup.py: nothing to compare (hostlib/buildinfo.py) */
#endif

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
        PyModule_AddObject(m, "AtpReceiver", (PyObject *)&ReceiverType) < 0 ||
        PyModule_AddStringConstant(m, "source_hash", NETAPPROX_SOURCE_HASH) < 0)
        return NULL;
    return m;
}
