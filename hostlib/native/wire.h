/* The ATP wire format in C (hostlib/wire.py is the specification, docs/wire-format.md the prose): constants, the
 * header, its codecs and big-endian helpers. No Python here: the controller's report helper
 * (controller/_reportrx.c) builds on this file too. */
#ifndef NETAPPROX_WIRE_H
#define NETAPPROX_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define ATP_VERSION 2 /* wire.VERSION: any other version is malformed (bad_version) */
#define ATP_HEADER_LEN 32
#define ATP_QUEUE_UNSET 0xFF
#define ATP_NO_DEADLINE 0xFFFFFFFFu
#define ATP_TLR_ONE 0x8000 /* Q1.15: 1.0 */
#define ATP_VALID_FLAGS 0xFF
#define ATP_MAX_PACKED 255     /* whole messages in one DATA packet (the 8-bit count) */
#define ATP_RECORD_HEADER_LEN 6 /* a packed message: msg_id:u32 | len:u16 */
#define ATP_ACK_BASE_LEN (ATP_HEADER_LEN + 2)
#define ATP_MAX_SACK_BLOCKS 16
#define ATP_TOKEN_LEN 16
#define ATP_AUTH_LEN 16
#define ATP_REPORT_PAYLOAD_LEN 24 /* loss:u16 msr:u16 rate_kbps:u32 total:u32 delivered:u32 lost:u32 epoch:u32 */
#define ATP_REPORT_MAC_LEN 16
/* byte offsets of the header fields (wire.OFFSETS) */
#define ATP_OFF_JOB_ID 4
#define ATP_OFF_COUNT 29

enum { PT_DATA = 1, PT_ACK = 2, PT_REPORT = 3, PT_DONE = 4, PT_RETRY = 5, PT_GRANT = 6, PT_NEW_TOKEN = 7 };
enum { F_APPROX = 0x01, F_RETX = 0x02, F_ECE = 0x04, F_TAGGED = 0x08, F_CE = 0x10, F_TRIM = 0x20, F_GRANT = 0x40,
       F_TOKEN = 0x80 };

/* hostlib/control.py: the reserved message ids and the announce part's prefix (token | auth) */
#define ANNOUNCE_MSG_ID 0xFFFFFFFFu
#define FIN_MSG_ID 0xFFFFFFFEu
#define MSR_MSG_ID 0xFFFFFFFCu /* a live MSR change (control.MSR_MSG_ID): payload change:u32 | msr:u16 */
#define MSR_CHANGE_LEN 6
#define ANNOUNCE_PREFIX_LEN (ATP_TOKEN_LEN + ATP_AUTH_LEN)

typedef struct {
    uint8_t version, type, flags, queue, priority, weight, count;
    uint32_t job_id, msg_id;
    uint16_t group_id, tlr, pkt_idx, pkt_cnt, length;
    uint32_t seq, deadline_us;
} AtpHeader;

typedef struct {
    uint32_t first, last;
} SackBlock;

/* wire.decode: 0 and the header, or -1 with ``*reason`` one of wire.MalformedPacket's reasons. The payload is
 * data[32:32 + length] (trailing bytes are ignored, as in Python). */
int atp_decode(const uint8_t *data, size_t len, AtpHeader *h, const char **reason);
/* wire.encode: the 32-byte header with ``length`` as given. */
void atp_encode(uint8_t *out, const AtpHeader *h);
/* wire.decode_ack_payload: number of blocks (0..16), or -1 (bad_ack). */
int atp_decode_ack(const uint8_t *p, size_t len, SackBlock *blocks);
/* wire.decode_ack: an ACK's or GRANT's payload with the fields ``flags`` announce: the number of blocks, *grant
 * (when F_GRANT; *has_grant) and *token (16 bytes in the payload, when F_TOKEN; NULL otherwise); -1 (bad_ack). */
int atp_decode_ack_fields(const uint8_t *p, size_t len, uint8_t flags, SackBlock *blocks, int *has_grant,
                          uint32_t *grant, const uint8_t **token);
/* wire.tlr_to_q15 for a number that is not NaN. */
uint16_t atp_q15(double x);

static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t get32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

#endif
