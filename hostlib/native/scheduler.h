/* Which message the sender serves next (hostlib/scheduler.py): a lazy priority queue of message ids, each filed
 * under its current key; stale entries are skipped when they reach the top. */
#ifndef NETAPPROX_SCHEDULER_H
#define NETAPPROX_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* scheduling_key as (a, retries, b, msg_id): the four key shapes of scheduler.py in one order */
typedef struct {
    uint8_t a;
    uint32_t r;
    int64_t b;
    uint32_t msg_id;
} SchedEntry;

typedef struct {
    uint8_t valid, a;
    uint32_t r;
    int64_t b;
} SchedKey;

typedef struct {
    int mrdf, repairs_last;
    ARRAY(SchedEntry) heap;
    SchedKey *key; /* per message id: its current key (scheduler._key) */
    size_t nmsgs;
} Scheduler;

/* A scheduler for message ids 0 .. nmsgs-1, none filed: 0, or -1 with MemoryError set. */
int sched_init(Scheduler *s, size_t nmsgs, int mrdf, int repairs_last);
void sched_free(Scheduler *s);
/* Scheduler.update: the message has something to send; (re)file it under its current key. */
int sched_update(Scheduler *s, uint32_t msg_id, int64_t remaining, int repair, uint32_t retries);
/* Scheduler.remove: the message has nothing to send (for now). */
static inline void sched_remove(Scheduler *s, uint32_t msg_id) { s->key[msg_id].valid = 0; }
/* Scheduler.peek: the message to serve next, or -1. */
int64_t sched_peek(Scheduler *s);

/* A binary min-heap over an array of ``n`` elements ordered by ``less(&x, &y)`` (heapq's push and pop). */
#define HEAP_PUSH(arr, n, item, less)                     \
    do {                                                  \
        size_t _i = (n)++;                                \
        (arr)[_i] = (item);                               \
        while (_i > 0) {                                  \
            size_t _p = (_i - 1) / 2;                     \
            if (!less(&(arr)[_i], &(arr)[_p]))            \
                break;                                    \
            __typeof__(item) _t = (arr)[_i];              \
            (arr)[_i] = (arr)[_p];                        \
            (arr)[_p] = _t;                               \
            _i = _p;                                      \
        }                                                 \
    } while (0)

#define HEAP_POP(arr, n, less)                                                   \
    do {                                                                         \
        (arr)[0] = (arr)[--(n)];                                                 \
        size_t _i = 0;                                                           \
        for (;;) {                                                               \
            size_t _l = 2 * _i + 1, _r = _l + 1, _m = _i;                        \
            if (_l < (n) && less(&(arr)[_l], &(arr)[_m]))                        \
                _m = _l;                                                         \
            if (_r < (n) && less(&(arr)[_r], &(arr)[_m]))                        \
                _m = _r;                                                         \
            if (_m == _i)                                                        \
                break;                                                           \
            __typeof__((arr)[0]) _t = (arr)[_i];                                 \
            (arr)[_i] = (arr)[_m];                                               \
            (arr)[_m] = _t;                                                      \
            _i = _m;                                                             \
        }                                                                        \
    } while (0)

#endif
