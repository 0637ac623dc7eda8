/* Batched UDP I/O for the native cores (netio.c): send batches (UDP GSO for runs of equal-size datagrams to one
 * address, sendmmsg), a receive ring (recvmmsg, GRO super-datagrams split, the ECN CE mark), socket addresses,
 * and waiting for a socket or a deadline with the GIL released. */
#ifndef NETAPPROX_NETIO_H
#define NETAPPROX_NETIO_H

#include <stdint.h>
#include <sys/socket.h>

#include "buf.h"
#include "py.h"

typedef struct {
    struct sockaddr_storage addr;
    socklen_t addrlen;
} NetAddr;

/* One outgoing datagram in a batch: ``len`` bytes at ``off`` in the batch buffer, to ``dst``. */
typedef struct {
    size_t off;
    uint32_t len;
    int32_t dst; /* index into the batch's address table */
} OutDatagram;

/* Zeroed (as a new Python object's memory is), a batch is empty and may use GSO. */
typedef struct {
    ARRAY(uint8_t) bytes;
    ARRAY(OutDatagram) d;
    ARRAY(NetAddr) addrs;
    int no_gso; /* the kernel refused GSO on this socket: one datagram per message from now on */
    long long refused; /* sends that failed with ECONNREFUSED: an ICMP port unreachable on a connected socket */
} SendBatch;

void batch_free(SendBatch *b);
void batch_clear(SendBatch *b);
/* Room for one datagram of ``len`` bytes to ``dst`` (an index from batch_addr); NULL with MemoryError set. */
uint8_t *batch_add(SendBatch *b, uint32_t len, int32_t dst);
/* Index of ``a`` in the batch's address table (added when new); -1 with MemoryError set. */
int32_t batch_addr(SendBatch *b, const NetAddr *a);
/* Send everything (GSO runs of equal-size datagrams, sendmmsg); returns the number of datagrams the kernel
 * took, or -1 with a Python OSError set for an error other than a full buffer or an unreachable peer. */
Py_ssize_t batch_flush(SendBatch *b, int fd);

/* A received datagram handed to a core: data, source, CE mark. */
typedef int (*DatagramSink)(void *core, const uint8_t *data, size_t len, const NetAddr *src, int ce, double now);

/* Zeroed (as a new Python object's memory is), a ring is empty: ring_receive allocates its buffers on first use. */
typedef struct {
    uint8_t *buf; /* nbufs x bufsize, NULL until the first ring_receive */
    size_t bufsize;
    unsigned nbufs;
    long long refused; /* reads that returned ECONNREFUSED: an ICMP port unreachable on a connected socket */
} RecvRing;

void ring_free(RecvRing *r); /* safe on an empty ring */
/* Read what the socket holds (at most ``max_calls`` recvmmsg calls), splitting GRO super-datagrams, feeding
 * each datagram to ``sink``. Returns datagrams fed, or -1 with a Python error set. */
Py_ssize_t ring_receive(RecvRing *r, int fd, void *core, DatagramSink sink, double now, int max_calls);
/* Python address object (host, port[, flowinfo, scope_id]) of a socket address, as the socket module makes it. */
PyObject *addr_to_py(const NetAddr *a);
/* Socket address of a Python (host, port[, ...]) tuple with a numeric host; -1 with a Python error set. */
int addr_from_py(PyObject *obj, NetAddr *out);
int netaddr_eq(const NetAddr *a, const NetAddr *b);
/* Same family, address and port (an IPv6 flow label or scope id does not count). */
int netaddr_same_host_port(const NetAddr *a, const NetAddr *b);
/* time.monotonic() */
double monotonic_now(void);
/* Wait until ``until`` (monotonic) or until fd is readable; waits up to ``sleep_below`` seconds long sleep without
 * watching fd (so that what arrives meanwhile is read in one batch). Releases the GIL; 0, or -1 with a Python
 * error (a signal handler raised). */
int wait_fd(int fd, double until, double now, double sleep_below);
#define SHORT_WAIT_S 0.001

#endif
