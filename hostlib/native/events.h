/* The events a core hands its owner through next_event() (hostlib/events.py has their classes): a queue of
 * Python objects, oldest first. */
#ifndef NETAPPROX_EVENTS_H
#define NETAPPROX_EVENTS_H

#include "buf.h"
#include "py.h"

typedef RING(PyObject *, size_t) EventQueue;

/* Queue ``ev`` (a new reference, or NULL after a failed constructor): 0, or -1 with a Python error set (the
 * reference is released). */
int events_push(EventQueue *q, PyObject *ev);
/* The oldest event (a new reference), or NULL when there is none. */
PyObject *events_pop(EventQueue *q);
/* Release every queued event and the queue's memory. */
void events_free(EventQueue *q);
/* tp_traverse over the queued events. */
int events_traverse(EventQueue *q, visitproc visit, void *arg);

#endif
