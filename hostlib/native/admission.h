/* Who gets receiver state, and how much (hostlib/admission.py): the memory budget (half guaranteed to the job
 * slots in equal parts, half a shared pool) and the job slots (per source, with the choice of the slot a newcomer
 * may take). Admission and address-validation tokens stay in Python (admission.TokenMinter: a keyed BLAKE2s, once
 * or twice per job). */
#ifndef NETAPPROX_ADMISSION_H
#define NETAPPROX_ADMISSION_H

#include "buf.h"
#include "py.h"

/* admission.MemoryBudget */
typedef struct {
    long long limit, guarantee, reserve, pool_limit, used, pool, out, peak;
} MemoryBudget;

/* ``reserve``: bytes for the replies waiting to be sent, taken from the pool */
void budget_init(MemoryBudget *m, long long limit, long long slots, long long reserve);

/* What of a job's ``charged`` bytes is pool: beyond the guarantee when it holds a slot, all of it otherwise. */
static inline long long budget_over(const MemoryBudget *m, long long charged, int slot) {
    if (slot)
        return charged > m->guarantee ? charged - m->guarantee : 0;
    return charged;
}

/* Whether a job with ``charged`` bytes (holding a slot or not) may be charged ``n`` more. */
static inline int budget_fits(const MemoryBudget *m, long long charged, int slot, long long n) {
    return m->pool - budget_over(m, charged, slot) + budget_over(m, charged + n, slot) <= m->pool_limit;
}

/* Charge ``n`` bytes (negative: release) to a job that had ``charged``; callers check budget_fits. */
static inline void budget_charge(MemoryBudget *m, long long charged, int slot, long long n) {
    m->pool += budget_over(m, charged + n, slot) - budget_over(m, charged, slot);
    m->used += n;
    if (m->used > m->peak)
        m->peak = m->used;
}

/* MemoryBudget.out_charge: a reply of ``n`` bytes waiting to be sent, if the reserve has room (1), else 0. */
static inline int budget_out_charge(MemoryBudget *m, long long n) {
    if (m->out + n > m->reserve)
        return 0;
    m->out += n;
    m->used += n;
    if (m->used > m->peak)
        m->peak = m->used;
    return 1;
}

/* MemoryBudget.out_release: the waiting replies went to the socket. */
static inline void budget_out_release(MemoryBudget *m) {
    m->used -= m->out;
    m->out = 0;
}

/* A job with ``charged`` bytes gives up its slot: all of it is pool from now on. */
static inline void budget_leave_slot(MemoryBudget *m, long long charged) {
    m->pool += charged - budget_over(m, charged, 1);
}

/* admission.SlotHolder: what the slot table reads of a job (the receiver's Job starts with one). */
typedef struct {
    PyObject *source; /* the host part of its address (admission.source_of) */
    int progressed;
    double progress_at;
} SlotHolder;

/* admission.SlotTable */
typedef struct {
    long long max_jobs, max_per_source;
    double stall_s;
    ARRAY(SlotHolder *) holders; /* in the order they got their slots */
    PyObject *per_source;        /* collections.Counter: source -> slots held */
} SlotTable;

/* 0, or -1 with a Python error set. */
int slots_init(SlotTable *t, long long max_jobs, long long max_per_source, double stall_s);
void slots_free(SlotTable *t);
int slots_add(SlotTable *t, SlotHolder *job);
/* Give up the slot ``job`` holds, if it holds one: 0, or -1 with a Python error set. */
int slots_remove(SlotTable *t, SlotHolder *job);
/* SlotTable.rekey: ``job`` is charged to ``account`` from now on, keeping its place: 0, or -1 with a Python error. */
int slots_rekey(SlotTable *t, SlotHolder *job, PyObject *account);
/* SlotTable.choose for a new job from ``source``: *refusal a drop reason when it gets no slot; otherwise *victim
 * (NULL: a free slot) is the job whose slot it takes, *why "stalled" or "share". 0, or -1 with a Python error. */
int slots_choose(SlotTable *t, PyObject *source, double now, const char **refusal, SlotHolder **victim,
                 const char **why);

#endif
