/* Batched UDP I/O for the native cores: UDP GSO (UDP_SEGMENT) for runs of equal-size datagrams to one address,
 * several of them per sendmmsg; recvmmsg with GRO super-datagrams split back into datagrams; ECN from IP_TOS. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include "netio.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

#define GSO_MAX_SEGMENTS 64
#define GSO_MAX_BYTES 65000 /* one IPv4/IPv6 UDP datagram, with room for the headers */
#define MMSG_VLEN 64

/* --- send batches ---------------------------------------------------------------------------------------- */

void batch_free(SendBatch *b) {
    ARRAY_FREE(&b->bytes);
    ARRAY_FREE(&b->d);
    ARRAY_FREE(&b->addrs);
}

void batch_clear(SendBatch *b) {
    b->bytes.n = 0;
    b->d.n = 0;
    b->addrs.n = 0;
}

uint8_t *batch_add(SendBatch *b, uint32_t len, int32_t dst) {
    if (ARRAY_RESERVE(&b->bytes, b->bytes.n + len, 1 << 16) != 0 ||
        ARRAY_PUSH(&b->d, ((OutDatagram){b->bytes.n, len, dst}), 256) != 0)
        return NULL;
    uint8_t *p = b->bytes.v + b->bytes.n;
    b->bytes.n += len;
    return p;
}

int netaddr_eq(const NetAddr *a, const NetAddr *b) {
    return a->addrlen == b->addrlen && memcmp(&a->addr, &b->addr, a->addrlen) == 0;
}

int netaddr_same_host_port(const NetAddr *na, const NetAddr *nb) {
    const struct sockaddr_storage *a = &na->addr, *b = &nb->addr;
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
    }
    return 0;
}

int32_t batch_addr(SendBatch *b, const NetAddr *a) {
    for (size_t i = 0; i < b->addrs.n; i++)
        if (netaddr_eq(&b->addrs.v[i], a))
            return (int32_t)i;
    if (ARRAY_PUSH(&b->addrs, *a, 4) != 0)
        return -1;
    return (int32_t)(b->addrs.n - 1);
}

/* How many datagrams from ``i`` one sendmsg carries: a GSO run (equal sizes to one address, the last one may be
 * shorter) or a single datagram. */
static size_t run_length(const SendBatch *b, size_t i) {
    const OutDatagram *d = b->d.v;
    if (b->no_gso || d[i].len == 0)
        return 1;
    uint32_t seg = d[i].len;
    size_t j = i + 1, bytes = seg;
    while (j < b->d.n && j - i < GSO_MAX_SEGMENTS && d[j].dst == d[i].dst && d[j].len <= seg && d[j].len > 0 &&
           bytes + d[j].len <= GSO_MAX_BYTES && d[j].off == d[j - 1].off + d[j - 1].len) {
        bytes += d[j].len;
        j++;
        if (d[j - 1].len < seg)
            break; /* a shorter datagram ends the run */
    }
    return j - i;
}

static int droppable(int err) {
    /* what hostlib.api._send_all drops: the datagram is lost, ATP treats it as such */
    return err == EAGAIN || err == EWOULDBLOCK || err == ECONNREFUSED || err == ENOBUFS || err == EHOSTUNREACH ||
           err == ENETUNREACH || err == EPERM;
}

Py_ssize_t batch_flush(SendBatch *b, int fd) {
    struct mmsghdr msgs[MMSG_VLEN];
    struct iovec iov[MMSG_VLEN];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl[MMSG_VLEN];
    size_t counts[MMSG_VLEN];
    size_t i = 0;
    Py_ssize_t sent = 0;
    while (i < b->d.n) {
        unsigned m = 0;
        size_t k = i;
        while (k < b->d.n && m < MMSG_VLEN) {
            size_t c = run_length(b, k);
            const OutDatagram *d = &b->d.v[k];
            size_t bytes = (size_t)(b->d.v[k + c - 1].off + b->d.v[k + c - 1].len - d->off);
            memset(&msgs[m], 0, sizeof msgs[m]);
            iov[m].iov_base = b->bytes.v + d->off;
            iov[m].iov_len = bytes;
            msgs[m].msg_hdr.msg_iov = &iov[m];
            msgs[m].msg_hdr.msg_iovlen = 1;
            msgs[m].msg_hdr.msg_name = &b->addrs.v[d->dst].addr;
            msgs[m].msg_hdr.msg_namelen = b->addrs.v[d->dst].addrlen;
            if (c > 1) {
                memset(&ctl[m], 0, sizeof ctl[m]);
                msgs[m].msg_hdr.msg_control = ctl[m].buf;
                msgs[m].msg_hdr.msg_controllen = sizeof ctl[m].buf;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&msgs[m].msg_hdr);
                cm->cmsg_level = SOL_UDP;
                cm->cmsg_type = UDP_SEGMENT;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t seg = (uint16_t)d->len;
                memcpy(CMSG_DATA(cm), &seg, sizeof seg);
            }
            counts[m] = c;
            k += c;
            m++;
        }
        int r = sendmmsg(fd, msgs, m, MSG_DONTWAIT);
        if (r > 0) {
            for (int q = 0; q < r; q++) {
                sent += (Py_ssize_t)counts[q];
                i += counts[q];
            }
            continue;
        }
        int err = errno;
        if (err == EINTR) {
            if (PyErr_CheckSignals() != 0)
                return -1;
            continue;
        }
        if (counts[0] > 1 && (err == EIO || err == EINVAL || err == EOPNOTSUPP || err == ENOPROTOOPT)) {
            b->no_gso = 1; /* no checksum offload or a segment over the path MTU here: one datagram per message */
            continue;
        }
        if (droppable(err)) {
            if (err == ECONNREFUSED)
                b->refused++;
            i += counts[0];
            continue;
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return sent;
}

/* --- receive ring ---------------------------------------------------------------------------------------- */

#define CTL_SPACE (CMSG_SPACE(sizeof(int)) * 4)

#define RING_BUFS 16
#define RING_BUFSIZE 65536 /* a GRO super-datagram */

static int ring_init(RecvRing *r) {
    r->buf = malloc((size_t)RING_BUFS * RING_BUFSIZE);
    r->nbufs = RING_BUFS;
    r->bufsize = RING_BUFSIZE;
    if (r->buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void ring_free(RecvRing *r) {
    free(r->buf);
    r->buf = NULL;
}

Py_ssize_t ring_receive(RecvRing *r, int fd, void *core, DatagramSink sink, double now, int max_calls) {
    struct mmsghdr msgs[64];
    struct iovec iov[64];
    struct sockaddr_storage names[64];
    union {
        char buf[CTL_SPACE];
        struct cmsghdr align;
    } ctl[64];
    if (r->buf == NULL && ring_init(r) != 0)
        return -1;
    unsigned nb = r->nbufs < 64 ? r->nbufs : 64;
    Py_ssize_t fed = 0;
    for (int call = 0; call < max_calls; call++) {
        for (unsigned i = 0; i < nb; i++) {
            memset(&msgs[i], 0, sizeof msgs[i]);
            iov[i].iov_base = r->buf + (size_t)i * r->bufsize;
            iov[i].iov_len = r->bufsize;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof names[i];
            msgs[i].msg_hdr.msg_control = ctl[i].buf;
            msgs[i].msg_hdr.msg_controllen = sizeof ctl[i].buf;
        }
        int n = recvmmsg(fd, msgs, nb, MSG_DONTWAIT, NULL);
        if (n < 0) {
            int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK)
                break;
            if (err == ECONNREFUSED) {
                r->refused++; /* an ICMP error for an earlier send: consumed and counted, read on */
                continue;
            }
            if (err == EINTR) {
                if (PyErr_CheckSignals() != 0)
                    return -1;
                continue;
            }
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        for (int i = 0; i < n; i++) {
            struct msghdr *h = &msgs[i].msg_hdr;
            int ce = 0, seg = 0;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c != NULL; c = CMSG_NXTHDR(h, c)) {
                if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS && c->cmsg_len >= CMSG_LEN(1)) {
                    ce = (CMSG_DATA(c)[0] & 0x03) == 0x03;
                } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS &&
                           c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                    int tclass;
                    memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
                    ce = (tclass & 0x03) == 0x03;
                } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                    memcpy(&seg, CMSG_DATA(c), sizeof seg);
                }
            }
            NetAddr src;
            memcpy(&src.addr, &names[i], h->msg_namelen);
            src.addrlen = h->msg_namelen;
            const uint8_t *data = iov[i].iov_base;
            size_t len = msgs[i].msg_len;
            if (seg <= 0 || (size_t)seg >= len) {
                if (sink(core, data, len, &src, ce, now) != 0)
                    return -1;
                fed++;
                continue;
            }
            for (size_t off = 0; off < len; off += (size_t)seg) {
                size_t l = len - off < (size_t)seg ? len - off : (size_t)seg;
                if (sink(core, data + off, l, &src, ce, now) != 0)
                    return -1;
                fed++;
            }
        }
        if ((unsigned)n < nb)
            break;
    }
    return fed;
}

/* --- addresses ------------------------------------------------------------------------------------------- */

PyObject *addr_to_py(const NetAddr *a) {
    char host[INET6_ADDRSTRLEN];
    if (a->addr.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&a->addr;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        return Py_BuildValue("(si)", host, ntohs(s->sin_port));
    }
    if (a->addr.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->addr;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        return Py_BuildValue("(siII)", host, ntohs(s->sin6_port), ntohl(s->sin6_flowinfo), s->sin6_scope_id);
    }
    PyErr_Format(PyExc_ValueError, "unsupported address family %d", a->addr.ss_family);
    return NULL;
}

int addr_from_py(PyObject *obj, NetAddr *out) {
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 2) {
        PyErr_Format(PyExc_TypeError, "address must be a (host, port) tuple, got %R", obj);
        return -1;
    }
    const char *host = PyUnicode_AsUTF8(PyTuple_GET_ITEM(obj, 0));
    if (host == NULL)
        return -1;
    long port = PyLong_AsLong(PyTuple_GET_ITEM(obj, 1));
    if (port == -1 && PyErr_Occurred())
        return -1;
    memset(out, 0, sizeof *out);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&out->addr;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&out->addr;
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        out->addrlen = sizeof *s4;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        if (PyTuple_GET_SIZE(obj) >= 4) {
            s6->sin6_flowinfo = htonl((uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(obj, 2)));
            s6->sin6_scope_id = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(obj, 3));
            if (PyErr_Occurred())
                return -1;
        }
        out->addrlen = sizeof *s6;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "address %R: the host must be a numeric IPv4 or IPv6 address", obj);
    return -1;
}

/* --- waiting --------------------------------------------------------------------------------------------- */

double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int wait_fd(int fd, double until, double now, double sleep_below) {
    double left = until - now;
    if (!(left > 0))
        return 0;
    int rc;
    if (left <= sleep_below) {
        struct timespec ts;
        double whole = (double)(long long)until;
        ts.tv_sec = (time_t)whole;
        ts.tv_nsec = (long)((until - whole) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        Py_BEGIN_ALLOW_THREADS
        rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        Py_END_ALLOW_THREADS
        if (rc == EINTR && PyErr_CheckSignals() != 0)
            return -1;
        return 0;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct timespec ts;
    ts.tv_sec = (time_t)left;
    ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
    Py_BEGIN_ALLOW_THREADS
    rc = ppoll(&p, 1, &ts, NULL);
    Py_END_ALLOW_THREADS
    if (rc < 0 && errno == EINTR && PyErr_CheckSignals() != 0)
        return -1;
    return 0;
}
