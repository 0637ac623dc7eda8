/* The sender's announce (sender.h; hostlib/sender.py is the specification): the job's announce built and split
 * into parts, each part's datagram, and what the receiver answers about admission and address validation (RETRY,
 * NEW_TOKEN, a token on an ACK). The announce's half of the sender, as receiver_announce.c is the receiver's. */
#include <string.h>

#include "sender.h"

/* _announce_datagram: announce part ``idx`` (token | auth | chunk) into ``out`` */
int sender_announce_datagram(Sender *s, uint32_t idx, uint32_t seq, uint8_t *out) {
    PyObject *chunk = s->announce[idx];
    Py_ssize_t clen = PyBytes_GET_SIZE(chunk);
    AtpHeader h = {.version = ATP_VERSION, .type = PT_DATA, .queue = ATP_QUEUE_UNSET, .job_id = (uint32_t)s->job_id,
                   .msg_id = ANNOUNCE_MSG_ID, .pkt_idx = (uint16_t)idx, .pkt_cnt = (uint16_t)s->nannounce, .seq = seq,
                   .deadline_us = ATP_NO_DEADLINE, .count = 1, .length = (uint16_t)(ANNOUNCE_PREFIX_LEN + clen)};
    atp_encode(out, &h);
    uint8_t *p = out + ATP_HEADER_LEN;
    if (s->admission_key == Py_None) {
        if (s->token != NULL)
            memcpy(p, PyBytes_AS_STRING(s->token), ATP_TOKEN_LEN);
        else
            memset(p, 0, ATP_TOKEN_LEN);
        memset(p + ATP_TOKEN_LEN, 0, ATP_AUTH_LEN);
        memcpy(p + ANNOUNCE_PREFIX_LEN, PyBytes_AS_STRING(chunk), (size_t)clen);
        return 0;
    }
    /* signed under the admission key: control.encode_announce_part (HMAC-SHA256) */
    PyObject *token = s->token, *zero = NULL;
    if (token == NULL && (token = zero = PyBytes_FromStringAndSize(NULL, ATP_TOKEN_LEN)) != NULL)
        memset(PyBytes_AS_STRING(zero), 0, ATP_TOKEN_LEN);
    PyObject *kw = token == NULL ? NULL : Py_BuildValue("{s:L,s:I,s:n,s:O,s:O}", "job_id", s->job_id, "pkt_idx",
                                                        (unsigned)idx, "pkt_cnt", (Py_ssize_t)s->nannounce,
                                                        "token", token, "key", s->admission_key);
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, chunk);
    PyObject *payload = args == NULL ? NULL : PyObject_Call(R.encode_announce_part, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_XDECREF(zero);
    if (payload == NULL)
        return -1;
    int rc = 0;
    if (!PyBytes_Check(payload) || PyBytes_GET_SIZE(payload) != ANNOUNCE_PREFIX_LEN + clen) {
        PyErr_SetString(PyExc_RuntimeError, "control.encode_announce_part returned an unexpected payload");
        rc = -1;
    } else {
        memcpy(p, PyBytes_AS_STRING(payload), (size_t)(ANNOUNCE_PREFIX_LEN + clen));
    }
    Py_DECREF(payload);
    return rc;
}


/* A token carried by a NEW_TOKEN or RETRY (ATP_TOKEN_LEN bytes, not all zero) as bytes in ``*out``: 0; a malformed
 * one is counted as rejected: 1; -1 with a Python error set */
static int read_token(Sender *s, const uint8_t *payload, size_t len, PyObject **out) {
    int zero = 1;
    for (size_t i = 0; i < len; i++)
        if (payload[i])
            zero = 0;
    if (len != ATP_TOKEN_LEN || zero)
        return sender_reject(s, "malformed") < 0 ? -1 : 1;
    *out = PyBytes_FromStringAndSize((const char *)payload, ATP_TOKEN_LEN);
    return *out == NULL ? -1 : 0;
}

/* _on_new_token: an address-validation token for this host's next jobs to the receiver, kept in ``new_token`` if it
 * answers one of this job's announce parts */
int sender_on_new_token(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len) {
    uint32_t cm, ci;
    if (!sender_carried(s, h->seq, &cm, &ci) || cm != ANNOUNCE_MSG_ID || ci != h->pkt_idx)
        return sender_reject(s, "new_token_unsent_seq");
    PyObject *token;
    int bad = read_token(s, payload, len, &token);
    if (bad != 0)
        return bad < 0 ? -1 : 0;
    Py_XSETREF(s->new_token, token);
    return 0;
}

/* _on_retry: the receiver did not admit the job (under pressure, or the token held expired) and sent a token:
 * nothing sent so far reached it, so the job starts over at once, the announce with the token first and the data
 * right behind it */
int sender_on_retry(Sender *s, const AtpHeader *h, const uint8_t *payload, size_t len, double now) {
    if (s->state != S_SENDING || s->admitted)
        return sender_reject(s, "retry_unexpected");
    uint32_t cm, ci;
    if (!sender_carried(s, h->seq, &cm, &ci) || cm != ANNOUNCE_MSG_ID || ci != h->pkt_idx)
        return sender_reject(s, "retry_unsent_seq");
    PyObject *token;
    int bad = read_token(s, payload, len, &token);
    if (bad != 0)
        return bad < 0 ? -1 : 0;
    Py_XSETREF(s->token, token);
    s->token_pending = 0;
    s->retries_received++;
    if (sender_reset_transfer(s) != 0)
        return -1;
    s->free_until = sender_next_off(s) + (uint32_t)((long long)s->nannounce > s->first_window ? (long long)s->nannounce
                                                                                          : s->first_window);
    s->grant = -1;
    s->grant_top = -1;
    while (!RING_EMPTY(&s->ctl))
        RING_POP(&s->ctl);
    for (size_t i = 0; i < s->nannounce; i++)
        if (sender_ctl_append(s, ANNOUNCE_MSG_ID, (uint32_t)i) != 0)
            return -1;
    /* live MSR changes made so far hold on (reset keeps each group's MSR): sent again behind the announce */
    s->msr_sent.n = 0;
    for (size_t i = 0; i < s->ngroups; i++) {
        s->msr_acked[i] = 0;
        s->msr_queued[i] = 0;
        if (s->msr_latest[i] && (s->tlr[i] = sender_next_tlr(&s->groups[i]), sender_queue_msr_change(s, i) != 0))
            return -1;
    }
    s->epoch_end = now + sender_epoch_length(s);
    s->last_progress = now;
    return 0;
}

/* _on_token: an ACK carried an admission token (the job was admitted without one): echo it, announce part 0 again
 * with the token, at most once per smoothed RTT */
int sender_on_token(Sender *s, const uint8_t *token, double now) {
    if (s->token == NULL || memcmp(PyBytes_AS_STRING(s->token), token, ATP_TOKEN_LEN) != 0) {
        PyObject *t = PyBytes_FromStringAndSize((const char *)token, ATP_TOKEN_LEN);
        if (t == NULL)
            return -1;
        Py_XSETREF(s->token, t);
        s->echo_next = 0.0;
    }
    if (now >= s->echo_next && (s->state == S_SENDING || s->state == S_CLOSING)) {
        s->echo_next = now + s->recovery.srtt;
        return sender_ctl_append(s, ECHO_MSG_ID, 0);
    }
    return 0;
}

/* --- the announce ------------------------------------------------------------------------------------------------ */

/* Ranges of consecutive ids in ids[a .. b): how many, and (with ``out``) each as first:u32 last:u32. */
static size_t ranges(const uint32_t *ids, size_t a, size_t b, uint8_t *out) {
    size_t n = 0;
    for (size_t k = a; k < b; k++) {
        if (k != a && ids[k - 1] + 1 == ids[k])
            continue;
        size_t e = k;
        while (e + 1 < b && ids[e] + 1 == ids[e + 1])
            e++;
        if (out != NULL) {
            put32(out + 8 * n, ids[k]);
            put32(out + 8 * n + 4, ids[e]);
        }
        n++;
    }
    return n;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int sender_build_announce(Sender *s, PyObject *vector_len) {
    /* message ids per group, ascending: count per group, then fill */
    size_t ng = s->ngroups, n = s->nmsgs;
    size_t *count = calloc(ng ? ng : 1, sizeof(size_t)), *start_at = calloc(ng + 1, sizeof(size_t));
    uint32_t *ids = malloc((n ? n : 1) * sizeof(uint32_t));
    uint8_t *blob = NULL;
    int rc = -1;
    if (count == NULL || start_at == NULL || ids == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        count[s->msgs[i].group]++;
    for (size_t g = 0; g < ng; g++)
        start_at[g + 1] = start_at[g] + count[g];
    memset(count, 0, ng * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t g = s->msgs[i].group;
        ids[start_at[g] + count[g]++] = (uint32_t)i;
    }
    /* need_bytes: the smallest messages of each group that meet its MSR (what a receiver must let through) */
    uint64_t need = 0;
    int64_t *sizes = malloc((n ? n : 1) * sizeof(int64_t));
    if (sizes == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (size_t g = 0; g < ng; g++) {
        size_t k = 0;
        for (size_t i = start_at[g]; i < start_at[g + 1]; i++)
            sizes[k++] = PyBytes_GET_SIZE(s->msgs[ids[i]].data);
        qsort(sizes, k, sizeof(int64_t), cmp_i64);
        for (int64_t i = 0; i < s->groups[g].required && (size_t)i < k; i++)
            need += (uint64_t)sizes[i];
    }
    free(sizes);
    /* magic "ATPJ" | total:u32 | vector_len:u32 | need_bytes:u32 | n_groups:u16, then per group 12 bytes and 8
     * per range */
    size_t size = 18;
    for (size_t g = 0; g < ng; g++)
        size += 12 + 8 * ranges(ids, start_at[g], start_at[g + 1], NULL);
    blob = malloc(size);
    if (blob == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    memcpy(blob, "ATPJ", 4);
    put32(blob + 4, (uint32_t)n);
    uint32_t vlen = 0xFFFFFFFFu;
    if (vector_len != Py_None) {
        unsigned long v = PyLong_AsUnsignedLong(vector_len);
        if (v == (unsigned long)-1 && PyErr_Occurred())
            goto out;
        vlen = (uint32_t)v;
    }
    put32(blob + 8, vlen);
    put32(blob + 12, need > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)need);
    put16(blob + 16, (uint16_t)ng);
    size_t off = 18;
    for (size_t g = 0; g < ng; g++) {
        size_t nr = ranges(ids, start_at[g], start_at[g + 1], blob + off + 12);
        put16(blob + off, (uint16_t)s->groups[g].group_id);
        put16(blob + off + 2, atp_q15(s->groups[g].msr));
        put32(blob + off + 4, (uint32_t)(start_at[g + 1] - start_at[g]));
        put32(blob + off + 8, (uint32_t)nr);
        off += 12 + 8 * nr;
    }
    size_t mp = (size_t)s->max_payload;
    size_t parts = (size + mp - 1) / mp;
    if (parts == 0)
        parts = 1;
    if (parts > 0xFFFF) {
        config_error("job announce too large: split the job or give groups contiguous message ids");
        goto out;
    }
    s->announce = calloc(parts, sizeof(PyObject *));
    s->announce_acked = calloc(parts, 1);
    if (s->announce == NULL || s->announce_acked == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    s->nannounce = parts;
    for (size_t i = 0; i < parts; i++) {
        size_t a = i * mp, b = a + mp < size ? a + mp : size;
        s->announce[i] = PyBytes_FromStringAndSize((const char *)blob + a, (Py_ssize_t)(b - a));
        if (s->announce[i] == NULL)
            goto out;
        if (sender_ctl_append(s, ANNOUNCE_MSG_ID, (uint32_t)i) != 0)
            goto out;
    }
    rc = 0;
out:
    free(count);
    free(start_at);
    free(ids);
    free(blob);
    return rc;
}

