/* Growable arrays and rings (buf.h). */
#include <Python.h>
#include <string.h>

#include "buf.h"

int buf_reserve(void **p, size_t *cap, size_t need, size_t size, size_t first) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    if (n > SIZE_MAX / size) {
        PyErr_NoMemory();
        return -1;
    }
    void *q = realloc(*p, n * size);
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = n;
    return 0;
}

size_t ring_grow(void **v, size_t tail, size_t count, size_t cap, size_t size, size_t first) {
    size_t n = cap ? cap * 2 : first;
    if (n > SIZE_MAX / size) {
        PyErr_NoMemory();
        return 0;
    }
    char *q = malloc(n * size), *old = *v;
    if (q == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    /* the elements from tail to the end of the old array, then those that wrapped to its start */
    size_t at = cap ? tail & (cap - 1) : 0, run = cap - at < count ? cap - at : count;
    if (count) {
        memcpy(q, old + at * size, run * size);
        memcpy(q + run * size, old, (count - run) * size);
    }
    free(old);
    *v = q;
    return n;
}
