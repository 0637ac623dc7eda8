/* The 32-bit-key hash map (map.h). */
#include <Python.h>

#include "map.h"

static inline uint32_t home(uint32_t key, uint32_t mask) { return (key * 2654435761u) & mask; }

int map_init(U32Map *m) {
    m->mask = 7;
    m->len = 0;
    m->keys = calloc(8, sizeof(uint32_t));
    m->vals = calloc(8, sizeof(uintptr_t));
    if (m->keys == NULL || m->vals == NULL) {
        map_free(m);
        return -1;
    }
    return 0;
}

void map_free(U32Map *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->mask = 0;
    m->len = 0;
}

static void place(uint32_t *keys, uintptr_t *vals, uint32_t mask, uint32_t key, uintptr_t val) {
    uint32_t i = home(key, mask);
    while (vals[i] != 0)
        i = (i + 1) & mask;
    keys[i] = key;
    vals[i] = val;
}

int map_put(U32Map *m, uint32_t key, uintptr_t val) {
    if ((m->len + 1) * 2 > (size_t)m->mask + 1) {
        uint32_t nmask = m->mask * 2 + 1;
        uint32_t *nk = calloc((size_t)nmask + 1, sizeof(uint32_t));
        uintptr_t *nv = calloc((size_t)nmask + 1, sizeof(uintptr_t));
        if (nk == NULL || nv == NULL) {
            free(nk);
            free(nv);
            PyErr_NoMemory();
            return -1;
        }
        for (uint32_t i = 0; i <= m->mask; i++)
            if (m->vals[i] != 0)
                place(nk, nv, nmask, m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        m->keys = nk;
        m->vals = nv;
        m->mask = nmask;
    }
    place(m->keys, m->vals, m->mask, key, val);
    m->len++;
    return 0;
}

void map_del(U32Map *m, uint32_t key) {
    uint32_t mask = m->mask, i = home(key, mask);
    while (m->vals[i] != 0 && m->keys[i] != key)
        i = (i + 1) & mask;
    if (m->vals[i] == 0)
        return;
    /* backward shift: move later entries of the probe run into the hole when their home allows it */
    for (uint32_t j = i;;) {
        j = (j + 1) & mask;
        if (m->vals[j] == 0)
            break;
        uint32_t h = home(m->keys[j], mask);
        /* the entry at j may move to i when its home is not in (i, j] (cyclically) */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = 0;
    m->len--;
}
