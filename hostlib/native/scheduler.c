/* The sender's scheduler (scheduler.h; hostlib/scheduler.py is the specification). */
#include <Python.h>

#include "scheduler.h"

static inline int sched_less(const SchedEntry *x, const SchedEntry *y) {
    if (x->a != y->a)
        return x->a < y->a;
    if (x->r != y->r)
        return x->r < y->r;
    if (x->b != y->b)
        return x->b < y->b;
    return x->msg_id < y->msg_id;
}

int sched_init(Scheduler *s, size_t nmsgs, int mrdf, int repairs_last) {
    s->mrdf = mrdf;
    s->repairs_last = repairs_last;
    s->nmsgs = nmsgs;
    s->key = calloc(nmsgs ? nmsgs : 1, sizeof(SchedKey));
    if (s->key == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

void sched_free(Scheduler *s) {
    ARRAY_FREE(&s->heap);
    free(s->key);
    s->key = NULL;
}

int sched_update(Scheduler *s, uint32_t msg_id, int64_t remaining, int repair, uint32_t retries) {
    uint8_t a;
    int64_t b;
    if (s->mrdf) {
        a = s->repairs_last ? (uint8_t)repair : 0;
        b = remaining;
    } else {
        a = s->repairs_last ? (uint8_t)repair : (uint8_t)!repair;
        b = 0;
    }
    SchedKey *k = &s->key[msg_id];
    if (k->valid && k->a == a && k->r == retries && k->b == b)
        return 0;
    if (ARRAY_RESERVE(&s->heap, s->heap.n + 1, 16) != 0)
        return -1;
    *k = (SchedKey){1, a, retries, b};
    SchedEntry e = {a, retries, b, msg_id};
    HEAP_PUSH(s->heap.v, s->heap.n, e, sched_less);
    return 0;
}

int64_t sched_peek(Scheduler *s) {
    while (s->heap.n) {
        SchedEntry *e = &s->heap.v[0];
        SchedKey *k = &s->key[e->msg_id];
        if (k->valid && k->a == e->a && k->r == e->r && k->b == e->b)
            return e->msg_id;
        HEAP_POP(s->heap.v, s->heap.n, sched_less);
    }
    return -1;
}
