/* netapprox.controller._reportrx: the report socket drained in batches, REPORTs decoded and their HMAC checked,
 * in C. controller/reports.py is the contract: ``receive_batch`` there selects this module when it is built and
 * a pure-Python loop otherwise; tests/controller/test_ctl_reportrx.py runs both on the same datagrams.
 *
 *   recv_reports(fd, max_batch, key, report_type) -> list
 *
 * One recvmmsg(2) call (MSG_DONTWAIT, the GIL released) takes up to ``max_batch`` datagrams from the UDP socket
 * ``fd``. Each becomes ``(source, item)``: ``source`` the sender's address as text, ``item`` a ``report_type``
 * (``hostlib.wire.Report``, a tuple subclass) when the datagram is a well-formed REPORT (with ``key``, its
 * HMAC-SHA256 tag correct), else the reason ``wire.Report.decode`` would raise (a ``MalformedPacket`` reason:
 * the header is decoded by hostlib/native/wire.c, the codec of the native cores, and the checks follow in
 * Report.decode's order). An empty list: nothing was waiting. Raises OSError for socket errors other than
 * EAGAIN/EINTR.
 *
 * Hostile input costs one fixed-size buffer slot and, at worst, one HMAC: nothing here allocates by what a
 * datagram claims. Datagrams longer than the buffer are truncated, as recvfrom(2048) truncates them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "wire.h"

#define MAX_BATCH 256
#define DGRAM_MAX 2048
#define SIGNED_LEN (ATP_REPORT_PAYLOAD_LEN + ATP_REPORT_MAC_LEN)
#define MAC_INPUT_HEADER (ATP_OFF_RESERVED - ATP_OFF_JOB_ID) /* job_id .. weight */

static PyThread_type_lock buffer_lock;

/* --- SHA-256 (FIPS 180-4) and HMAC (RFC 2104) ------------------------------------------------------------ */

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t len; /* bytes in buf */
    uint64_t total;
} sha256_ctx;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; k = h[7];
    for (i = 0; i < 64; i++) {
        t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

static void sha256_init(sha256_ctx *c) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->total = 0;
}

static void sha256_update(sha256_ctx *c, const uint8_t *p, size_t n) {
    c->total += n;
    while (n > 0) {
        size_t take = 64 - c->len < n ? 64 - c->len : n;
        memcpy(c->buf + c->len, p, take);
        c->len += take;
        p += take;
        n -= take;
        if (c->len == 64) {
            sha256_block(c->h, c->buf);
            c->len = 0;
        }
    }
}

static void sha256_final(sha256_ctx *c, uint8_t out[32]) {
    uint64_t bits = c->total * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    int i;
    sha256_update(c, &pad, 1);
    while (c->len != 56)
        sha256_update(c, &zero, 1);
    for (i = 0; i < 8; i++)
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, len, 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

/* The HMAC key's inner and outer padded states, computed once per call. */
typedef struct {
    sha256_ctx inner, outer;
} hmac_key;

static void hmac_setup(hmac_key *k, const uint8_t *key, size_t n) {
    uint8_t block[64], pad[64];
    int i;
    memset(block, 0, sizeof block);
    if (n > 64) {
        sha256_ctx c;
        sha256_init(&c);
        sha256_update(&c, key, n);
        sha256_final(&c, block);
    } else {
        memcpy(block, key, n);
    }
    for (i = 0; i < 64; i++)
        pad[i] = block[i] ^ 0x36;
    sha256_init(&k->inner);
    sha256_update(&k->inner, pad, 64);
    for (i = 0; i < 64; i++)
        pad[i] = block[i] ^ 0x5c;
    sha256_init(&k->outer);
    sha256_update(&k->outer, pad, 64);
}

static void hmac_sha256(const hmac_key *k, const uint8_t *p, size_t n, uint8_t out[32]) {
    sha256_ctx c = k->inner;
    uint8_t inner[32];
    sha256_update(&c, p, n);
    sha256_final(&c, inner);
    c = k->outer;
    sha256_update(&c, inner, 32);
    sha256_final(&c, out);
}

/* --- decoding --------------------------------------------------------------------------------------------- */

/* ``reason`` as an interned str (the few reasons there are stay in the interpreter's table). */
static PyObject *reason_str(const char *reason) { return PyUnicode_InternFromString(reason); }

/* The ``report_type`` of a well-formed REPORT, else its MalformedPacket reason (str); NULL with a Python error
 * set only when Python itself fails. */
static PyObject *decode(const uint8_t *d, size_t n, const hmac_key *key, PyTypeObject *report_type) {
    AtpHeader h;
    const char *reason;
    if (atp_decode(d, n, &h, &reason) != 0)
        return reason_str(reason);
    if (h.type != PT_REPORT)
        return reason_str("not_report");
    if (h.length != ATP_REPORT_PAYLOAD_LEN && h.length != SIGNED_LEN)
        return reason_str("bad_report");
    const uint8_t *body = d + ATP_HEADER_LEN;
    if (key != NULL) {
        /* the header from job_id to weight, the reserved byte as zero, then the body (wire._report_mac) */
        uint8_t input[MAC_INPUT_HEADER + 1 + ATP_REPORT_PAYLOAD_LEN], mac[32];
        if (h.length != SIGNED_LEN)
            return reason_str("bad_mac");
        memcpy(input, d + ATP_OFF_JOB_ID, MAC_INPUT_HEADER);
        input[MAC_INPUT_HEADER] = 0;
        memcpy(input + MAC_INPUT_HEADER + 1, body, ATP_REPORT_PAYLOAD_LEN);
        hmac_sha256(key, input, sizeof input, mac);
        unsigned diff = 0;
        for (int i = 0; i < ATP_REPORT_MAC_LEN; i++) /* hmac.compare_digest: no early exit */
            diff |= (unsigned)(mac[i] ^ body[ATP_REPORT_PAYLOAD_LEN + i]);
        if (diff != 0)
            return reason_str("bad_mac");
    }
    uint32_t loss = get16(body), msr = get16(body + 2);
    if (loss > ATP_TLR_ONE || msr > ATP_TLR_ONE)
        return reason_str("bad_report");
    PyObject *r = report_type->tp_alloc(report_type, 11);
    if (r == NULL)
        return NULL;
    PyObject *items[11] = {
        PyLong_FromUnsignedLong(h.job_id),
        PyLong_FromUnsignedLong(h.group_id),
        PyLong_FromUnsignedLong(h.seq),
        PyFloat_FromDouble((double)h.tlr / ATP_TLR_ONE),
        PyFloat_FromDouble((double)loss / ATP_TLR_ONE),
        PyFloat_FromDouble((double)msr / ATP_TLR_ONE),
        PyLong_FromUnsignedLong(get32(body + 4)),  /* rate_kbps */
        PyLong_FromUnsignedLong(get32(body + 8)),  /* total */
        PyLong_FromUnsignedLong(get32(body + 12)), /* delivered */
        PyLong_FromUnsignedLong(get32(body + 16)), /* lost */
        PyLong_FromUnsignedLong(get32(body + 20)), /* epoch */
    };
    for (int i = 0; i < 11; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 11; j++)
                Py_XDECREF(items[j]);
            /* the tuple's slots are still NULL: freeing it is safe */
            Py_DECREF(r);
            return NULL;
        }
    }
    for (int i = 0; i < 11; i++)
        PyTuple_SET_ITEM(r, i, items[i]);
    return r;
}

/* --- the batch receive ------------------------------------------------------------------------------------ */

static PyObject *recv_reports(PyObject *self, PyObject *args) {
    int fd, max_batch;
    PyObject *key_obj, *type_obj;
    static uint8_t bufs[MAX_BATCH][DGRAM_MAX]; /* guarded by buffer_lock (taken with the GIL released) */
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sockaddr_storage addrs[MAX_BATCH];
    hmac_key key, *keyp = NULL;
    int got, i;

    if (!PyArg_ParseTuple(args, "iiOO:recv_reports", &fd, &max_batch, &key_obj, &type_obj))
        return NULL;
    if (!PyType_Check(type_obj) || !PyType_IsSubtype((PyTypeObject *)type_obj, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "report_type must be a tuple subclass");
        return NULL;
    }
    if (key_obj != Py_None) {
        char *kp;
        Py_ssize_t kn;
        if (PyBytes_AsStringAndSize(key_obj, &kp, &kn) < 0)
            return NULL;
        hmac_setup(&key, (const uint8_t *)kp, (size_t)kn);
        keyp = &key;
    }
    if (max_batch < 1)
        max_batch = 1;
    if (max_batch > MAX_BATCH)
        max_batch = MAX_BATCH;
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)max_batch);
    for (i = 0; i < max_batch; i++) {
        iov[i].iov_base = bufs[i];
        iov[i].iov_len = DGRAM_MAX;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &addrs[i];
        msgs[i].msg_hdr.msg_namelen = sizeof addrs[i];
    }
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(buffer_lock, WAIT_LOCK);
    do {
        got = recvmmsg(fd, msgs, (unsigned int)max_batch, MSG_DONTWAIT, NULL);
    } while (got < 0 && errno == EINTR);
    err = errno;
    Py_END_ALLOW_THREADS
    if (got < 0) {
        PyThread_release_lock(buffer_lock);
        if (err == EAGAIN || err == EWOULDBLOCK)
            return PyList_New(0);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *out = PyList_New(got);
    if (out == NULL) {
        PyThread_release_lock(buffer_lock);
        return NULL;
    }
    for (i = 0; i < got; i++) {
        char text[INET6_ADDRSTRLEN] = "?";
        if (addrs[i].ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&addrs[i])->sin_addr, text, sizeof text);
        else if (addrs[i].ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&addrs[i])->sin6_addr, text, sizeof text);
        PyObject *item = decode(bufs[i], msgs[i].msg_len, keyp, (PyTypeObject *)type_obj);
        if (item == NULL)
            goto fail;
        PyObject *source = PyUnicode_FromString(text);
        if (source == NULL) {
            Py_DECREF(item);
            goto fail;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(item);
            Py_DECREF(source);
            goto fail;
        }
        PyTuple_SET_ITEM(pair, 0, source);
        PyTuple_SET_ITEM(pair, 1, item);
        PyList_SET_ITEM(out, i, pair);
    }
    PyThread_release_lock(buffer_lock);
    return out;
fail:
    PyThread_release_lock(buffer_lock);
    Py_DECREF(out); /* unset slots are NULL: list_dealloc skips them */
    return NULL;
}

/* hmac_sha256(key, data) -> 32 bytes: the C HMAC, for the tests to compare with hashlib's. */
static PyObject *py_hmac_sha256(PyObject *self, PyObject *args) {
    Py_buffer key, data;
    hmac_key k;
    uint8_t out[32];
    if (!PyArg_ParseTuple(args, "y*y*:hmac_sha256", &key, &data))
        return NULL;
    hmac_setup(&k, key.buf, (size_t)key.len);
    hmac_sha256(&k, data.buf, (size_t)data.len, out);
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyMethodDef methods[] = {
    {"recv_reports", recv_reports, METH_VARARGS,
     "recv_reports(fd, max_batch, key, report_type) -> [(source, report or reason)]: one recvmmsg batch."},
    {"hmac_sha256", py_hmac_sha256, METH_VARARGS, "hmac_sha256(key, data) -> bytes (32)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_reportrx",
                                    "The report socket drained with recvmmsg, REPORTs decoded in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__reportrx(void) {
    if (buffer_lock == NULL && (buffer_lock = PyThread_allocate_lock()) == NULL)
        return PyErr_NoMemory();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
