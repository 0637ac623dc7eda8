/* The ATP header and payload codecs of hostlib/wire.py, for the native cores and the controller's report helper. */
#include <math.h>

#include "wire.h"

int atp_decode(const uint8_t *d, size_t len, AtpHeader *h, const char **reason) {
    if (len < ATP_HEADER_LEN) {
        *reason = "truncated";
        return -1;
    }
    h->version = d[0] >> 4;
    h->type = d[0] & 0x0F;
    h->flags = d[1];
    h->queue = d[2];
    h->priority = d[3];
    h->job_id = get32(d + 4);
    h->msg_id = get32(d + 8);
    h->group_id = get16(d + 12);
    h->tlr = get16(d + 14);
    h->pkt_idx = get16(d + 16);
    h->pkt_cnt = get16(d + 18);
    h->seq = get32(d + 20);
    h->deadline_us = get32(d + 24);
    h->weight = d[28];
    h->count = d[29];
    h->length = get16(d + 30);
    if (h->version != ATP_VERSION) {
        *reason = "bad_version";
        return -1;
    }
    if (h->type < PT_DATA || h->type > PT_NEW_TOKEN) {
        *reason = "bad_type";
        return -1;
    }
    if (h->flags & ~ATP_VALID_FLAGS) {
        *reason = "bad_flags";
        return -1;
    }
    if (h->tlr > ATP_TLR_ONE) {
        *reason = "bad_tlr";
        return -1;
    }
    if (h->pkt_cnt == 0 || h->pkt_idx >= h->pkt_cnt) {
        *reason = "bad_index";
        return -1;
    }
    if (h->type == PT_DATA && (h->count == 0 || (h->count > 1 && (h->pkt_idx != 0 || h->pkt_cnt != 1)))) {
        *reason = "bad_count";
        return -1;
    }
    if (len < (size_t)ATP_HEADER_LEN + h->length) {
        *reason = "truncated";
        return -1;
    }
    return 0;
}

void atp_encode(uint8_t *o, const AtpHeader *h) {
    o[0] = (uint8_t)((h->version << 4) | h->type);
    o[1] = h->flags;
    o[2] = h->queue;
    o[3] = h->priority;
    put32(o + 4, h->job_id);
    put32(o + 8, h->msg_id);
    put16(o + 12, h->group_id);
    put16(o + 14, h->tlr);
    put16(o + 16, h->pkt_idx);
    put16(o + 18, h->pkt_cnt);
    put32(o + 20, h->seq);
    put32(o + 24, h->deadline_us);
    o[28] = h->weight;
    o[29] = h->count;
    put16(o + 30, h->length);
}

int atp_decode_ack(const uint8_t *p, size_t len, SackBlock *blocks) {
    if (len == 0)
        return 0;
    if (len < 2)
        return -1;
    unsigned n = get16(p);
    if (n > ATP_MAX_SACK_BLOCKS || len != 2 + 8 * (size_t)n)
        return -1;
    for (unsigned i = 0; i < n; i++) {
        blocks[i].first = get32(p + 2 + 8 * i);
        blocks[i].last = get32(p + 6 + 8 * i);
        if (blocks[i].first > blocks[i].last)
            return -1;
    }
    return (int)n;
}

int atp_decode_ack_fields(const uint8_t *p, size_t len, uint8_t flags, SackBlock *blocks, int *has_grant,
                          uint32_t *grant, const uint8_t **token) {
    size_t tail = (flags & F_GRANT ? 4 : 0) + (flags & F_TOKEN ? ATP_TOKEN_LEN : 0);
    if (len < tail)
        return -1;
    size_t end = len - tail;
    int n = atp_decode_ack(p, end, blocks);
    if (n < 0)
        return -1;
    *has_grant = 0;
    *token = NULL;
    if (flags & F_GRANT) {
        *has_grant = 1;
        *grant = get32(p + end);
        end += 4;
    }
    if (flags & F_TOKEN) {
        int zero = 1;
        for (size_t i = 0; i < ATP_TOKEN_LEN; i++)
            if (p[end + i])
                zero = 0;
        if (zero)
            return -1; /* an all-zero admission token */
        *token = p + end;
    }
    return n;
}

uint16_t atp_q15(double x) {
    /* int(round(min(1.0, max(0.0, x)) * TLR_ONE)): Python's round() is round-half-even, as rint() is in the
     * default rounding mode */
    double c = x;
    if (c < 0.0)
        c = 0.0;
    if (1.0 < c)
        c = 1.0;
    return (uint16_t)rint(c * (double)ATP_TLR_ONE);
}
