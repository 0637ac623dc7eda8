/* A hash map from 32-bit keys to non-zero word values (pointers, or indexes + 1): open addressing with linear
 * probing, at most half full, backward-shift deletion (no tombstones). The sender keys its packets by sequence
 * number with it (recovery.c), the receiver its jobs' partial messages and bitmap chunks (receiver.c). */
#ifndef NETAPPROX_MAP_H
#define NETAPPROX_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t *keys;
    uintptr_t *vals; /* 0: an empty slot */
    uint32_t mask;   /* mask + 1 slots */
    size_t len;
} U32Map;

/* An empty map of 8 slots: 0, or -1 (no MemoryError set: the callers say what failed). */
int map_init(U32Map *m);
void map_free(U32Map *m);
/* The value of ``key``, 0 if absent. */
static inline uintptr_t map_get(const U32Map *m, uint32_t key) {
    uint32_t i = (key * 2654435761u) & m->mask;
    while (m->vals[i] != 0) {
        if (m->keys[i] == key)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    return 0;
}
/* m[key] = val for a key not in the map (val != 0): 0, or -1 with MemoryError set. */
int map_put(U32Map *m, uint32_t key, uintptr_t val);
/* Remove ``key`` if present. */
void map_del(U32Map *m, uint32_t key);
/* Iterate over the values: ``for (size_t i = 0; i <= m->mask; i++) if (m->vals[i]) ...`` (any order). */

#endif
