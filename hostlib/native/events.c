/* The event queue of a core (events.h). */
#include "events.h"

int events_push(EventQueue *q, PyObject *ev) {
    if (ev == NULL)
        return -1;
    if (RING_PUSH(q, ev, 64) != 0) {
        Py_DECREF(ev);
        return -1;
    }
    return 0;
}

PyObject *events_pop(EventQueue *q) {
    if (RING_EMPTY(q))
        return NULL;
    PyObject *ev = RING_FRONT(q);
    RING_POP(q);
    return ev;
}

void events_free(EventQueue *q) {
    PyObject *ev;
    while ((ev = events_pop(q)) != NULL)
        Py_DECREF(ev);
    RING_FREE(q);
}

int events_traverse(EventQueue *q, visitproc visit, void *arg) {
    for (size_t i = 0; i < RING_COUNT(q); i++)
        Py_VISIT(RING_AT(q, i));
    return 0;
}
