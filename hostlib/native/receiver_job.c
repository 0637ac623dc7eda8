/* The ATP receiver's jobs (receiver.h; hostlib/receiver.py's _Job is the specification): allocating one, freeing
 * its partial messages, its delivered bitmap and its manifest's arrays, finding one by id. */
#include "receiver.h"

void job_free_partial(Partial *p) {
    for (size_t i = 0; i < p->pieces.n; i++)
        Py_XDECREF(p->pieces.v[i].data);
    free(p->have);
    ARRAY_FREE(&p->pieces);
    free(p);
}

void job_free_group_index(Job *job) {
    free(job->ix_first);
    free(job->ix_last);
    free(job->ix_group);
    job->ix_first = job->ix_last = NULL;
    job->ix_group = NULL;
    job->nix = 0;
}

void job_free_manifest_arrays(Job *job) {
    for (size_t i = 0; i < job->ngroups; i++) {
        free(job->groups[i].firsts);
        free(job->groups[i].lasts);
    }
    free(job->groups);
    job->groups = NULL;
    job->ngroups = 0;
    job_free_group_index(job);
}

/* Free the partial messages (``reuse``: the map stays usable, empty). */
void job_clear_partials(Job *job, int reuse) {
    for (uint32_t i = 0; job->partial.vals != NULL && i <= job->partial.mask; i++)
        if (job->partial.vals[i] != 0)
            job_free_partial((Partial *)job->partial.vals[i]);
    map_free(&job->partial);
    if (reuse)
        map_init(&job->partial);
}

/* Free the delivered bitmap (``reuse``: the map stays usable, empty). */
void job_clear_chunks(Job *job, int reuse) {
    for (uint32_t i = 0; job->chunks.vals != NULL && i <= job->chunks.mask; i++)
        free((void *)job->chunks.vals[i]);
    map_free(&job->chunks);
    if (reuse)
        map_init(&job->chunks);
}

void job_free(Job *job) {
    Py_XDECREF(job->peer);
    Py_XDECREF(job->slot.source);
    Py_XDECREF(job->manifest);
    Py_XDECREF(job->vector_len);
    Py_XDECREF(job->announce_parts);
    Py_XDECREF(job->held);
    Py_XDECREF(job->done_datagrams);
    Py_XDECREF(job->rejected);
    Py_XDECREF(job->coll);
    Py_XDECREF(job->token);
    job_clear_partials(job, 0);
    job_clear_chunks(job, 0);
    job_free_manifest_arrays(job);
    free(job);
}

PyObject *receiver_source_of(PyObject *addr) {
    PyObject *s = (PyTuple_Check(addr) && PyTuple_GET_SIZE(addr) > 0) ? PyTuple_GET_ITEM(addr, 0) : addr;
    Py_INCREF(s);
    return s;
}

Job *job_new(uint32_t job_id, PyObject *peer, const NetAddr *na, double now) {
    Job *job = calloc(1, sizeof(Job));
    if (job == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    job->job_id = job_id;
    job->peer = Py_NewRef(peer);
    job->slot.source = receiver_source_of(peer);
    if (na != NULL) {
        job->peer_na = *na;
        job->peer_has_na = 1;
    }
    job->first_at = job->last_at = job->slot.progress_at = now;
    job->announce_cnt = -1;
    job->grant_queue = 0xFF; /* QUEUE_UNSET */
    job->validated = 1;
    job->announce_parts = PyDict_New();
    job->held = PyDict_New();
    if (job->announce_parts == NULL || job->held == NULL || map_init(&job->partial) != 0 ||
        map_init(&job->chunks) != 0) {
        job_free(job);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return NULL;
    }
    return job;
}

Job *receiver_find_job(Receiver *r, uint32_t job_id) {
    if (r->last_job != NULL && r->last_job->job_id == job_id)
        return r->last_job;
    for (size_t i = 0; i < r->jobs.n; i++)
        if (r->jobs.v[i]->job_id == job_id)
            return r->last_job = r->jobs.v[i];
    return NULL;
}
