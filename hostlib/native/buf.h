/* Growable arrays and rings: the one helper behind every buffer of the native cores.
 *
 *   ARRAY(T)     v[0 .. n-1], capacity cap; ARRAY_PUSH appends, ARRAY_RESERVE makes room.
 *   RING(T, I)   a FIFO as in the kernel's include/linux/circ_buf.h: a power-of-two array, free-running head
 *                (where the next element goes) and tail (the oldest element) of index type I, count = head - tail
 *                (unsigned arithmetic wraps); RING_PUSH grows a full ring to twice its size, oldest first.
 *
 * Growth doubles from a first capacity each use names; a failed allocation leaves the buffer as it was and
 * returns -1 with a Python MemoryError set. Nothing here shrinks or frees on its own (ARRAY_FREE, RING_FREE). */
#ifndef NETAPPROX_BUF_H
#define NETAPPROX_BUF_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Room for ``need`` elements of ``size`` bytes at *p, whose capacity is *cap elements (doubled from ``first``
 * until it is enough). 0, or -1 with MemoryError set. */
int buf_reserve(void **p, size_t *cap, size_t need, size_t size, size_t first);

/* A ring's ``count`` elements, oldest at ``tail``, moved in order to the start of a new array of twice ``cap``
 * (``first`` when the ring never had one; a power of two). The new capacity, or 0 with MemoryError set. */
size_t ring_grow(void **v, size_t tail, size_t count, size_t cap, size_t size, size_t first);

#define ARRAY(T)      \
    struct {          \
        T *v;         \
        size_t n, cap; \
    }

#define ARRAY_RESERVE(a, need, first) buf_reserve((void **)&(a)->v, &(a)->cap, (need), sizeof *(a)->v, (first))
/* Append ``x``: 0, or -1 with MemoryError set. */
#define ARRAY_PUSH(a, x, first) \
    (ARRAY_RESERVE(a, (a)->n + 1, first) != 0 ? -1 : ((a)->v[(a)->n++] = (x), 0))
#define ARRAY_FREE(a) (free((a)->v), (a)->v = NULL, (a)->n = (a)->cap = 0)
/* Remove the first element equal to ``x`` (compared with ==), keeping the order: 1 if there was one, else 0. */
#define ARRAY_REMOVE(a, x)                                                                            \
    ({                                                                                                \
        size_t _i = 0;                                                                                \
        while (_i < (a)->n && (a)->v[_i] != (x))                                                      \
            _i++;                                                                                     \
        int _found = _i < (a)->n;                                                                     \
        if (_found) {                                                                                 \
            memmove(&(a)->v[_i], &(a)->v[_i + 1], ((a)->n - _i - 1) * sizeof *(a)->v);                \
            (a)->n--;                                                                                 \
        }                                                                                             \
        _found;                                                                                       \
    })

#define RING(T, I)          \
    struct {                \
        T *v;               \
        I head, tail, cap;  \
    }

#define RING_COUNT(r) ((r)->head - (r)->tail)
#define RING_EMPTY(r) ((r)->head == (r)->tail)
/* the i-th oldest element (0: the front) */
#define RING_AT(r, i) ((r)->v[((r)->tail + (i)) & ((r)->cap - 1)])
#define RING_FRONT(r) RING_AT(r, 0)
#define RING_POP(r) ((void)(r)->tail++)
/* Append ``x``: 0, or -1 with MemoryError set. */
#define RING_PUSH(r, x, first)                                                                                 \
    ({                                                                                                         \
        int _rc = 0;                                                                                           \
        if ((r)->v == NULL || RING_COUNT(r) == (r)->cap) {                                                     \
            size_t _count = (r)->v == NULL ? 0 : (size_t)RING_COUNT(r);                                        \
            size_t _cap = ring_grow((void **)&(r)->v, (size_t)(r)->tail, _count, (size_t)(r)->cap,             \
                                    sizeof *(r)->v, (first));                                                  \
            if (_cap == 0) {                                                                                   \
                _rc = -1;                                                                                      \
            } else {                                                                                           \
                (r)->tail = 0;                                                                                 \
                (r)->head = (__typeof__((r)->head))_count;                                                     \
                (r)->cap = (__typeof__((r)->cap))_cap;                                                         \
            }                                                                                                  \
        }                                                                                                      \
        if (_rc == 0)                                                                                          \
            (r)->v[(r)->head++ & ((r)->cap - 1)] = (x);                                                        \
        _rc;                                                                                                   \
    })
#define RING_FREE(r) (free((r)->v), (r)->v = NULL, (r)->head = (r)->tail = (r)->cap = 0)

#endif
