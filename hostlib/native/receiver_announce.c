/* A job's admission and its announce (receiver.h; hostlib/receiver.py's announce handling and hostlib/admission.py
 * are the specification): the ANNOUNCE chunks and the manifest they carry, the RETRY / NEW_TOKEN address
 * validation, who gets a job slot, and a live MSR change. */
#include <string.h>

#include "receiver.h"

/* ============================== announce, admission ============================== */

#define MANIFEST_HEAD_LEN 18 /* control.MANIFEST_HEAD_LEN: magic, total, vector_len, need_bytes, n_groups */

static long long manifest_cost(const uint8_t *blob, Py_ssize_t len) {
    long long n_groups = len >= MANIFEST_HEAD_LEN ? get16(blob + MANIFEST_HEAD_LEN - 2) : 0;
    if (n_groups > len / 12)
        n_groups = len / 12;
    return MANIFEST_BYTES + MANIFEST_BYTES_PER_BYTE * len + MANIFEST_BYTES_PER_GROUP * n_groups;
}

/* _announce_chunk: 1 with the chunk's offset in the payload, 0 when counted and dropped, -1 on error */
int receiver_announce_chunk(Receiver *r, const AtpHeader *h, const uint8_t *payload) {
    if (h->length < ANNOUNCE_PREFIX_LEN) {
        if (malformed(r, "bad_announce") != 0)
            return -1;
        return 0;
    }
    if (r->admission_key == Py_None)
        return 1;
    PyObject *kw = Py_BuildValue("{s:k,s:i,s:i,s:y#,s:y#}", "job_id", (unsigned long)h->job_id, "pkt_idx",
                                 (int)h->pkt_idx, "pkt_cnt", (int)h->pkt_cnt, "token", (const char *)payload,
                                 (Py_ssize_t)ATP_TOKEN_LEN, "chunk", (const char *)payload + ANNOUNCE_PREFIX_LEN,
                                 (Py_ssize_t)(h->length - ANNOUNCE_PREFIX_LEN));
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, r->admission_key);
    PyObject *want = args == NULL ? NULL : PyObject_Call(R.announce_auth, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    if (want == NULL)
        return -1;
    int ok = PyBytes_GET_SIZE(want) == ATP_AUTH_LEN;
    unsigned diff = 0;
    for (int i = 0; ok && i < ATP_AUTH_LEN; i++) /* hmac.compare_digest: no early exit */
        diff |= (unsigned)(PyBytes_AS_STRING(want)[i] ^ (char)payload[ATP_TOKEN_LEN + i]);
    Py_DECREF(want);
    if (!ok || diff != 0)
        return drop(r, "bad_auth") != 0 ? -1 : 0;
    return 1;
}

/* The manifest's groups and index into C arrays. */
/* over 100 lines: one pass over the manifest's groups, each field checked as control.Manifest reads it */
static int adopt_manifest(Job *job, PyObject *manifest) {
    PyObject *total = PyObject_GetAttrString(manifest, "total");
    PyObject *vlen = total == NULL ? NULL : PyObject_GetAttrString(manifest, "vector_len");
    PyObject *groups = vlen == NULL ? NULL : PyObject_GetAttrString(manifest, "groups");
    PyObject *index = groups == NULL ? NULL : PyObject_CallMethod(manifest, "group_index", NULL);
    int rc = -1;
    Py_buffer bf = {0}, bl = {0}, bg = {0};
    if (index == NULL)
        goto out;
    job->total = (uint32_t)PyLong_AsUnsignedLong(total);
    Py_ssize_t ng = PyTuple_GET_SIZE(groups);
    job->groups = calloc(ng ? (size_t)ng : 1, sizeof(MGroup));
    if (job->groups == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    job->ngroups = (size_t)ng;
    for (Py_ssize_t k = 0; k < ng; k++) {
        PyObject *g = PyTuple_GET_ITEM(groups, k);
        MGroup *mg = &job->groups[k];
        long long gid, count;
        double msr;
        if (cfg_int(g, "group_id", &gid) || cfg_double(g, "msr", &msr) || cfg_int(g, "count", &count))
            goto out;
        mg->group_id = (uint16_t)gid;
        mg->msr = msr;
        mg->count = (uint32_t)count;
        PyObject *req = PyObject_CallFunction(R.required_messages, "dL", msr, count);
        if (req == NULL)
            goto out;
        mg->required = PyLong_AsLongLong(req);
        Py_DECREF(req);
        mg->ordered = msr >= 1.0;
        PyObject *fa = PyObject_GetAttrString(g, "firsts"), *la = fa == NULL ? NULL : PyObject_GetAttrString(g, "lasts");
        Py_buffer f1 = {0}, l1 = {0};
        int bad = la == NULL || PyObject_GetBuffer(fa, &f1, PyBUF_FORMAT) != 0;
        if (!bad && PyObject_GetBuffer(la, &l1, PyBUF_FORMAT) != 0) {
            PyBuffer_Release(&f1);
            bad = 1;
        }
        Py_XDECREF(fa);
        Py_XDECREF(la);
        if (bad)
            goto out;
        mg->nranges = (uint32_t)(f1.len / f1.itemsize);
        mg->firsts = malloc((mg->nranges ? mg->nranges : 1) * sizeof(uint32_t));
        mg->lasts = malloc((mg->nranges ? mg->nranges : 1) * sizeof(uint32_t));
        if (mg->firsts == NULL || mg->lasts == NULL || f1.itemsize != 4 || l1.itemsize != 4) {
            PyBuffer_Release(&f1);
            PyBuffer_Release(&l1);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "manifest ranges are not 32-bit arrays");
            goto out;
        }
        memcpy(mg->firsts, f1.buf, mg->nranges * sizeof(uint32_t));
        memcpy(mg->lasts, l1.buf, mg->nranges * sizeof(uint32_t));
        PyBuffer_Release(&f1);
        PyBuffer_Release(&l1);
        if (mg->ordered) {
            mg->ri = 0;
            mg->nxt = mg->nranges ? mg->firsts[0] : 0;
        }
    }
    PyObject *fa = PyObject_GetAttrString(index, "firsts"), *la = PyObject_GetAttrString(index, "lasts"),
             *ga = PyObject_GetAttrString(index, "group");
    int bad = fa == NULL || la == NULL || ga == NULL || PyObject_GetBuffer(fa, &bf, PyBUF_FORMAT) != 0;
    if (!bad && PyObject_GetBuffer(la, &bl, PyBUF_FORMAT) != 0)
        bad = 1;
    if (!bad && PyObject_GetBuffer(ga, &bg, PyBUF_FORMAT) != 0)
        bad = 1;
    Py_XDECREF(fa);
    Py_XDECREF(la);
    Py_XDECREF(ga);
    if (bad)
        goto out;
    job->nix = (size_t)(bf.len / 4);
    job->ix_first = malloc((job->nix ? job->nix : 1) * sizeof(uint32_t));
    job->ix_last = malloc((job->nix ? job->nix : 1) * sizeof(uint32_t));
    job->ix_group = malloc((job->nix ? job->nix : 1) * sizeof(uint16_t));
    if (job->ix_first == NULL || job->ix_last == NULL || job->ix_group == NULL || bg.itemsize != 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "unexpected manifest index arrays");
        goto out;
    }
    memcpy(job->ix_first, bf.buf, job->nix * sizeof(uint32_t));
    memcpy(job->ix_last, bl.buf, job->nix * sizeof(uint32_t));
    memcpy(job->ix_group, bg.buf, job->nix * sizeof(uint16_t));
    long long need_bytes;
    if (cfg_int(manifest, "need_bytes", &need_bytes) != 0)
        goto out;
    job->need_bytes = need_bytes;
    Py_INCREF(manifest);
    job->manifest = manifest;
    Py_INCREF(vlen);
    job->vector_len = vlen;
    rc = 0;
out:
    if (bf.obj)
        PyBuffer_Release(&bf);
    if (bl.obj)
        PyBuffer_Release(&bl);
    if (bg.obj)
        PyBuffer_Release(&bg);
    Py_XDECREF(total);
    Py_XDECREF(vlen);
    Py_XDECREF(groups);
    Py_XDECREF(index);
    if (rc != 0)
        job_free_manifest_arrays(job);
    return rc;
}

/* _on_announce; ``echo``: the part that carried the token back (acknowledged, not a duplicate) */
/* over 100 lines: receiver.py's _on_announce in its order (part checks, budget, decode, adopt, answer) */
int receiver_on_announce(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *chunk, Py_ssize_t clen,
                         double now, int echo) {
    if (job->announce_cnt >= 0 && h->pkt_cnt != job->announce_cnt)
        return malformed(r, "inconsistent_announce");
    PyObject *key = PyLong_FromLong(h->pkt_idx);
    if (key == NULL)
        return -1;
    int have = PyDict_Contains(job->announce_parts, key);
    if (have < 0) {
        Py_DECREF(key);
        return -1;
    }
    if (job->manifest != NULL || have) {
        Py_DECREF(key);
        if (echo) {
            job_note_seq(job, h->seq);
            return receiver_send_ack(r, job, h, 0);
        }
        return receiver_duplicate(r, job, h, 0);
    }
    long long cost = clen + PACKET_BYTES;
    if (!fits(r, job, cost)) {
        Py_DECREF(key);
        return drop(r, "memory_budget");
    }
    if (PyDict_GET_SIZE(job->announce_parts) + 1 == h->pkt_cnt) { /* completes the manifest: decode it now? */
        long long size = clen;
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(job->announce_parts, &pos, &k, &v))
            size += PyBytes_GET_SIZE(v);
        PyObject *ok = PyObject_CallMethod(r->manifest_rate, "take", "OLd", job->slot.source, size, now);
        if (ok == NULL) {
            Py_DECREF(key);
            return -1;
        }
        int allowed = PyObject_IsTrue(ok);
        Py_DECREF(ok);
        if (allowed <= 0) {
            Py_DECREF(key);
            return allowed < 0 ? -1 : drop(r, "manifest_rate");
        }
    }
    charge(r, job, cost);
    job_note_seq(job, h->seq);
    job->announce_cnt = h->pkt_cnt;
    PyObject *part = PyBytes_FromStringAndSize((const char *)chunk, clen);
    int rc = part == NULL ? -1 : PyDict_SetItem(job->announce_parts, key, part);
    Py_XDECREF(part);
    Py_DECREF(key);
    if (rc != 0)
        return -1;
    job->slot.progress_at = now;
    if (receiver_send_ack(r, job, h, 0) != 0)
        return -1;
    if (PyDict_GET_SIZE(job->announce_parts) < h->pkt_cnt)
        return 0;
    PyObject *list = PyList_New(h->pkt_cnt);
    if (list == NULL)
        return -1;
    for (long i = 0; i < h->pkt_cnt; i++) {
        PyObject *k = PyLong_FromLong(i);
        PyObject *v = k == NULL ? NULL : PyDict_GetItemWithError(job->announce_parts, k);
        Py_XDECREF(k);
        if (v == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_KeyError, "%ld", i);
            Py_DECREF(list);
            return -1;
        }
        Py_INCREF(v);
        PyList_SET_ITEM(list, i, v);
    }
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    PyObject *blob = empty == NULL ? NULL : _PyBytes_Join(empty, list);
    Py_XDECREF(empty);
    Py_DECREF(list);
    if (blob == NULL)
        return -1;
    long long mcost = manifest_cost((const uint8_t *)PyBytes_AS_STRING(blob), PyBytes_GET_SIZE(blob));
    int room = receiver_make_room(r, job, mcost);
    if (room <= 0) {
        Py_DECREF(blob);
        if (room < 0 || drop(r, "memory_budget") != 0)
            return -1;
        PyObject *why = PyUnicode_FromString("announce does not fit the receiver's memory budget (memory_budget_bytes)");
        rc = why == NULL ? -1 : receiver_reject_job(r, job, why, now);
        Py_XDECREF(why);
        return rc;
    }
    charge(r, job, mcost);
    charge(r, job, -(PyBytes_GET_SIZE(blob) + (long long)h->pkt_cnt * PACKET_BYTES));
    PyDict_Clear(job->announce_parts);
    PyObject *kw = Py_BuildValue("{s:L}", "max_messages", r->max_messages);
    PyObject *args = kw == NULL ? NULL : PyTuple_Pack(1, blob);
    PyObject *manifest = args == NULL ? NULL : PyObject_Call(R.Manifest_decode, args, kw);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_DECREF(blob);
    if (manifest == NULL) {
        if (!PyErr_ExceptionMatches(R.MalformedPacket))
            return -1;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *reason = PyObject_GetAttrString(value, "reason"), *text = PyObject_Str(value);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        Py_XDECREF(value);
        rc = -1;
        if (reason != NULL && text != NULL) {
            const char *rs = PyUnicode_AsUTF8(reason);
            rc = rs == NULL || malformed(r, rs) != 0 ? -1 : receiver_reject_job(r, job, text, now);
        }
        Py_XDECREF(reason);
        Py_XDECREF(text);
        return rc;
    }
    rc = adopt_manifest(job, manifest);
    Py_DECREF(manifest);
    r->grant_dirty = r->granting;
    return rc;
}

static int retry(Receiver *r, const AtpHeader *h, PyObject *addr, const NetAddr *na, double now) {
    if (count_admission(r, "retries") != 0)
        return -1;
    PyObject *token = PyObject_CallMethod(r->tokens, "mint", "kOd", (unsigned long)h->job_id, addr, now);
    if (token == NULL)
        return -1;
    if (!PyBytes_Check(token) || PyBytes_GET_SIZE(token) != ATP_TOKEN_LEN) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_RuntimeError, "TokenMinter.mint returned an unexpected token");
        return -1;
    }
    int ok = receiver_out_room(r, ATP_HEADER_LEN + ATP_TOKEN_LEN);
    if (ok <= 0) {
        Py_DECREF(token);
        return ok;
    }
    uint8_t *p = receiver_out_add_to(r, addr, na, ATP_HEADER_LEN + ATP_TOKEN_LEN);
    if (p == NULL || count_replies(r, "retry_bytes", ATP_HEADER_LEN + ATP_TOKEN_LEN) != 0 ||
        count_replies(r, "announce_bytes", ATP_HEADER_LEN + h->length) != 0) {
        Py_DECREF(token);
        return -1;
    }
    AtpHeader rh = {.version = ATP_VERSION, .type = PT_RETRY, .queue = ATP_QUEUE_UNSET, .job_id = h->job_id,
                    .msg_id = h->msg_id, .pkt_idx = h->pkt_idx, .pkt_cnt = h->pkt_cnt, .seq = h->seq,
                    .deadline_us = ATP_NO_DEADLINE, .length = ATP_TOKEN_LEN};
    atp_encode(p, &rh);
    memcpy(p + ATP_HEADER_LEN, PyBytes_AS_STRING(token), ATP_TOKEN_LEN);
    Py_DECREF(token);
    return 0;
}

/* _new_token: an address-validation token (NEW_TOKEN echoing announce part ``h``) to a job that proved its address,
 * within its reply room */
static int new_token(Receiver *r, Job *job, const AtpHeader *h, double now) {
    PyObject *token = PyObject_CallMethod(r->tokens, "mint_address", "Od", job->peer, now);
    if (token == NULL)
        return -1;
    if (!PyBytes_Check(token) || PyBytes_GET_SIZE(token) != ATP_TOKEN_LEN) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_RuntimeError, "TokenMinter.mint_address returned an unexpected token");
        return -1;
    }
    uint8_t *p;
    int ok = receiver_reply_within(r, job, ATP_HEADER_LEN + ATP_TOKEN_LEN, "new_token", &p);
    if (ok > 0) {
        AtpHeader nh = {.version = ATP_VERSION, .type = PT_NEW_TOKEN, .queue = ATP_QUEUE_UNSET, .job_id = h->job_id,
                        .msg_id = h->msg_id, .pkt_idx = h->pkt_idx, .pkt_cnt = h->pkt_cnt, .seq = h->seq,
                        .deadline_us = ATP_NO_DEADLINE, .length = ATP_TOKEN_LEN};
        atp_encode(p, &nh);
        memcpy(p + ATP_HEADER_LEN, PyBytes_AS_STRING(token), ATP_TOKEN_LEN);
    }
    Py_DECREF(token);
    return ok < 0 ? -1 : 0;
}

/* admission.account_of: the source host for a validated job, ("unvalidated", host) otherwise (new reference) */
static PyObject *account_of(PyObject *source, int validated) {
    return validated ? Py_NewRef(source) : Py_BuildValue("(sO)", "unvalidated", source);
}

/* _validate: an unvalidated job's sender echoed ``token`` (16 bytes) on announce part ``h`` */
int receiver_validate(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *token, double now) {
    PyObject *t = PyBytes_FromStringAndSize((const char *)token, ATP_TOKEN_LEN);
    PyObject *bad = t == NULL ? NULL
                  : PyObject_CallMethod(r->tokens, "check", "OkOd", t, (unsigned long)job->job_id, job->peer, now);
    Py_XDECREF(t);
    if (bad == NULL)
        return -1;
    if (bad != Py_None) {
        const char *reason = PyUnicode_AsUTF8(bad);
        int rc = reason == NULL ? -1 : drop(r, reason);
        Py_DECREF(bad);
        return rc;
    }
    Py_DECREF(bad);
    job->validated = 1;
    Py_CLEAR(job->token);
    if (count_admission(r, "validated") != 0)
        return -1;
    PyObject *host = receiver_source_of(job->peer);
    int rc = slots_rekey(&r->slots, &job->slot, host);
    Py_DECREF(host);
    return rc != 0 ? -1 : new_token(r, job, h, now);
}

/* _admits_without_token: 1 when a token-less announce is admitted at once, 0 when it gets a RETRY, -1 on error;
 * notes every switch of admission_mode */
static int admits_without_token(Receiver *r, const AtpHeader *h, PyObject *account) {
    double share = r->open_share;
    if (r->accept_jobs != Py_None || share <= 0)
        return 0;
    int pressure = (double)r->slots.holders.n >= share * (double)r->slots.max_jobs ||
                   (double)r->memory.used >= share * (double)r->memory.limit;
    if (pressure != r->tokens_mode) {
        r->tokens_mode = pressure;
        if (count_admission(r, pressure ? "to_tokens" : "to_open") != 0)
            return -1;
    }
    if (h->pkt_cnt > 1 || pressure)
        return 0;
    PyObject *held = PyDict_GetItemWithError(r->slots.per_source, account);
    if (held == NULL && PyErr_Occurred())
        return -1;
    long long n = held == NULL ? 0 : PyLong_AsLongLong(held);
    if (n == -1 && PyErr_Occurred())
        return -1;
    double fair = share * (double)r->slots.max_per_source;
    return (double)n < (fair > 1.0 ? fair : 1.0);
}

/* _on_new_announce: admit (at once while not under pressure, else with a valid token: a RETRY's or an
 * address-validation token), RETRY, or drop; ``addr`` is the Python address (built by the caller) */
/* over 100 lines: receiver.py's _on_new_announce in its order (pressure, token, slot choice, admit) */
int receiver_on_new_announce(Receiver *r, const AtpHeader *h, const uint8_t *payload, PyObject *addr,
                             const NetAddr *na, double now) {
    if (r->accept_jobs != Py_None) {
        long long limit = PyLong_AsLongLong(r->accept_jobs);
        if (limit == -1 && PyErr_Occurred())
            return -1;
        if (r->jobs_seen >= limit)
            return drop(r, "not_accepting_jobs");
    }
    int ok = receiver_announce_chunk(r, h, payload);
    if (ok <= 0)
        return ok;
    int zero = receiver_token_is_zero(payload);
    /* what the token proves (admission.TokenMinter.check_announce): "job", "address", or why it is refused */
    PyObject *proof = NULL;
    if (!zero) {
        PyObject *token = PyBytes_FromStringAndSize((const char *)payload, ATP_TOKEN_LEN);
        proof = token == NULL ? NULL
              : PyObject_CallMethod(r->tokens, "check_announce", "OkOd", token, (unsigned long)h->job_id, addr, now);
        Py_XDECREF(token);
        if (proof == NULL)
            return -1;
    }
    const char *said = proof == NULL ? NULL : PyUnicode_AsUTF8(proof);
    if (proof != NULL && said == NULL) {
        Py_DECREF(proof);
        return -1;
    }
    int by_address = said != NULL && strcmp(said, "address") == 0;
    int validated = said != NULL && (by_address || strcmp(said, "job") == 0);
    PyObject *host = receiver_source_of(addr);
    PyObject *source = account_of(host, validated);
    Py_DECREF(host);
    if (source == NULL) {
        Py_XDECREF(proof);
        return -1;
    }
    const char *refusal, *why;
    SlotHolder *holder;
    int rc = slots_choose(&r->slots, source, now, &refusal, &holder, &why);
    Job *victim = (Job *)holder; /* a Job starts with its SlotHolder */
    if (rc != 0 || refusal != NULL || (said != NULL && !validated)) {
        if (rc == 0)
            rc = refusal != NULL ? drop(r, refusal)
                 : drop(r, said) != 0 ? -1 : retry(r, h, addr, na, now);
        Py_XDECREF(proof);
        Py_DECREF(source);
        return rc != 0 ? -1 : 0;
    }
    Py_XDECREF(proof);
    if (zero) {
        int at_once = admits_without_token(r, h, source);
        if (at_once <= 0) {
            Py_DECREF(source);
            return at_once < 0 ? -1 : retry(r, h, addr, na, now);
        }
    }
    Job *job = job_new(h->job_id, addr, na, now);
    if (job == NULL) {
        Py_DECREF(source);
        return -1;
    }
    job->validated = validated;
    Py_SETREF(job->slot.source, Py_NewRef(source));
    int room = receiver_make_room(r, job, JOB_BYTES);
    if (room <= 0) {
        job_free(job);
        Py_DECREF(source);
        return room < 0 ? -1 : drop(r, "memory_budget");
    }
    if (victim != NULL) {
        char what[32];
        snprintf(what, sizeof what, "evicted_%s", why);
        if (count_admission(r, what) != 0 || receiver_abandon(r, victim, why) != 0) {
            job_free(job);
            Py_DECREF(source);
            return -1;
        }
    }
    if (ARRAY_PUSH(&r->jobs, job, 8) != 0) {
        job_free(job);
        Py_DECREF(source);
        return -1;
    }
    r->last_job = job;
    job->rx_bytes = ATP_HEADER_LEN + h->length; /* the announce that admitted it */
    if (count_replies(r, "request_bytes", job->rx_bytes) != 0) {
        Py_DECREF(source);
        return -1;
    }
    charge(r, job, JOB_BYTES);
    if (slots_add(&r->slots, &job->slot) != 0) {
        Py_DECREF(source);
        return -1;
    }
    r->jobs_seen++;
    rc = count_admission(r, "admitted");
    if (rc == 0 && validated) {
        if (by_address)
            rc = count_admission(r, "admitted_by_address_token");
        if (rc == 0)
            rc = new_token(r, job, h, now);
    } else if (rc == 0) {
        rc = count_admission(r, "admitted_without_token");
        if (rc == 0) {
            job->token = PyObject_CallMethod(r->tokens, "mint", "kOd", (unsigned long)h->job_id, addr, now);
            if (job->token == NULL)
                rc = -1;
            else if (!PyBytes_Check(job->token) || PyBytes_GET_SIZE(job->token) != ATP_TOKEN_LEN) {
                PyErr_SetString(PyExc_RuntimeError, "TokenMinter.mint returned an unexpected token");
                rc = -1;
            }
        }
    }
    Py_DECREF(source);
    if (rc != 0)
        return -1;
    return receiver_on_announce(r, job, h, payload + ANNOUNCE_PREFIX_LEN, h->length - ANNOUNCE_PREFIX_LEN, now, 0);
}

/* ============================== FIN, DONE ============================== */

/* _on_msr_change: a live MSR change of group h->group_id, applied when newer than the group's last, acknowledged
 * either way */
int receiver_on_msr_change(Receiver *r, Job *job, const AtpHeader *h, const uint8_t *payload) {
    if (h->length != MSR_CHANGE_LEN)
        return malformed(r, "bad_msr_change");
    uint32_t change = (uint32_t)payload[0] << 24 | (uint32_t)payload[1] << 16 | (uint32_t)payload[2] << 8 | payload[3];
    uint16_t q = (uint16_t)(payload[4] << 8 | payload[5]);
    if (change == 0 || q >= ATP_TLR_ONE)
        return malformed(r, "bad_msr_change");
    if (job->manifest == NULL)
        return drop(r, "msr_before_announce");
    MGroup *g = NULL;
    for (size_t k = 0; k < job->ngroups && g == NULL; k++)
        if (job->groups[k].group_id == h->group_id)
            g = &job->groups[k];
    if (g == NULL)
        return drop(r, "msr_unknown_group");
    if (g->ordered)
        return drop(r, "msr_exact_group");
    if (change > g->msr_change) {
        double msr = q / 32768.0;
        PyObject *req = PyObject_CallFunction(R.required_messages, "dL", msr, (long long)g->count);
        if (req == NULL)
            return -1;
        long long required = PyLong_AsLongLong(req);
        Py_DECREF(req);
        if (required == -1 && PyErr_Occurred())
            return -1;
        g->msr_change = change;
        g->msr = msr;
        g->required = required;
    }
    return receiver_send_ack(r, job, h, 0);
}
