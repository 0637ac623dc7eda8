/* Shared declarations of hostlib's native cores (the C port of hostlib/sender.py and hostlib/receiver.py).
 *
 * The Python modules are the specification: every function here mirrors one there, with the same floating
 * point expressions in the same order (compiled with -ffp-contract=off), so that the two implementations
 * produce identical datagrams, timers, events and summaries (tests/hostlib/test_hostlib_differential.py). */
#ifndef NETAPPROX_ATP_H
#define NETAPPROX_ATP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/socket.h>

/* --- wire (hostlib/wire.py) ----------------------------------------------------------------------- */

#define ATP_VERSION 1
#define ATP_HEADER_LEN 32
#define ATP_QUEUE_UNSET 0xFF
#define ATP_NO_DEADLINE 0xFFFFFFFFu
#define ATP_TLR_ONE 0x8000
#define ATP_VALID_FLAGS 0x1F
#define ATP_MAX_SACK_BLOCKS 16

enum { PT_DATA = 1, PT_ACK = 2, PT_REPORT = 3, PT_DONE = 4, PT_RETRY = 5 };
#define ATP_TOKEN_LEN 16
#define ATP_AUTH_LEN 16
#define ANNOUNCE_PREFIX_LEN (ATP_TOKEN_LEN + ATP_AUTH_LEN)
enum { F_APPROX = 0x01, F_RETX = 0x02, F_ECE = 0x04, F_TAGGED = 0x08, F_CE = 0x10 };

#define ANNOUNCE_MSG_ID 0xFFFFFFFFu
#define FIN_MSG_ID 0xFFFFFFFEu

typedef struct {
    uint8_t version, type, flags, queue, priority, weight;
    uint32_t job_id, msg_id;
    uint16_t group_id, tlr, pkt_idx, pkt_cnt, length;
    uint32_t seq, deadline_us;
} AtpHeader;

typedef struct {
    uint32_t first, last;
} SackBlock;

/* wire.decode: 0 and the header, or -1 with ``*reason`` one of wire.MalformedPacket's reasons. The payload is
 * data[32:32 + length] (trailing bytes are ignored, as in Python). */
int atp_decode(const uint8_t *data, size_t len, AtpHeader *h, const char **reason);
/* wire.encode: the 32-byte header with ``length`` as given. */
void atp_encode(uint8_t *out, const AtpHeader *h);
/* wire.decode_ack_payload: number of blocks (0..16), or -1 (bad_ack). */
int atp_decode_ack(const uint8_t *p, size_t len, SackBlock *blocks);
/* wire.tlr_to_q15 for a number that is not NaN. */
uint16_t atp_q15(double x);

static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t get32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* --- Python objects the cores build (imported once by the module) --------------------------------- */

typedef struct {
    PyObject *ConfigError, *MalformedPacket;
    PyObject *SenderState, *st_sending, *st_closing, *st_done, *st_failed;
    PyObject *SendSummary, *GroupSummary, *JobResult, *GroupResult;
    PyObject *Report;
    PyObject *ReportReady, *EpochEnded, *MessageAcked, *JobCompleted, *JobFailed;
    PyObject *MessageReceived, *JobFinished, *JobAbandoned, *JobRejected;
    PyObject *Counter, *SimpleNamespace, *required_messages, *Manifest_decode, *default_config;
    PyObject *encode_announce_part, *announce_auth, *randbelow, *TokenMinter, *MemoryBudget, *SlotTable, *OrderedDict;
    PyObject *empty_tuple;
} NativeRefs;

extern NativeRefs R;

/* An instance of a frozen dataclass without running its __init__ (fields set in its __dict__): the hot events.
 * ``names`` is NULL-terminated; steals the references in ``values``. */
PyObject *make_frozen(PyObject *cls, const char *const *names, PyObject **values);
/* ``counter[key] += 1`` for a collections.Counter (or dict). */
int counter_add(PyObject *counter, const char *key, Py_ssize_t n);
/* Attribute helpers for reading AtpConfig. */
int cfg_double(PyObject *cfg, const char *name, double *out);
int cfg_int(PyObject *cfg, const char *name, long long *out);
int cfg_opt_double(PyObject *cfg, const char *name, double *out, int *present);

/* --- socket batching (netio.c) --------------------------------------------------------------------- */

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

typedef struct {
    uint8_t *buf;
    size_t used, cap;
    OutDatagram *d;
    size_t n, dcap;
    NetAddr *addrs;
    size_t naddrs, acap;
    int gso; /* 1 allowed, 0 disabled after the kernel refused it on this socket */
} SendBatch;

int batch_init(SendBatch *b);
void batch_free(SendBatch *b);
void batch_clear(SendBatch *b);
/* Room for one datagram of ``len`` bytes to ``dst`` (an index from batch_addr); NULL on memory error. */
uint8_t *batch_add(SendBatch *b, uint32_t len, int32_t dst);
/* Index of ``a`` in the batch's address table (added when new); -1 on memory error. */
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
    int gro;
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

/* --- types --------------------------------------------------------------------------------------- */

extern PyTypeObject SenderType;
extern PyTypeObject ReceiverType;

#endif
