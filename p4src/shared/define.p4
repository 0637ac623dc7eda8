// NetApprox: architecture-neutral types and constants.
//
// Included by the per-architecture shim (v1model/define_v1model.p4, tna/define_tna.p4) AFTER the shim
// has included its architecture file and defined what differs between targets:
//   PortId_t       physical port number (bit<9> on BMv2 and Tofino 1)
//   CPU_PORT       the port that carries P4Runtime packet-in/packet-out
// Nothing here may depend on an architecture's externs or intrinsic metadata.
#ifndef NETAPPROX_DEFINE_P4
#define NETAPPROX_DEFINE_P4

#include "sizes.p4"

// ---- ATP transport (docs/wire-format.md) -------------------------------------------------------
// The ATP UDP port. DATA and REPORT packets are sent TO it, ACK and DONE FROM it. Override at compile
// time with -DATP_UDP_PORT=<n> (make p4 P4_DEFINES=-DATP_UDP_PORT=<n>).
#ifndef ATP_UDP_PORT
#define ATP_UDP_PORT 7600
#endif
// The controller's report port: hosts may address REPORTs to it directly (wire-format.md, REPORT).
// UDP packets to this port are parsed as ATP too, so a well-formed REPORT is punted whichever port
// it was sent to. Override with -DATP_REPORT_PORT=<n>.
#ifndef ATP_REPORT_PORT
#define ATP_REPORT_PORT 7601
#endif

@noWarn("unused") const bit<16> ATP_PORT = ATP_UDP_PORT;
@noWarn("unused") const bit<16> ATP_REPORT_DST_PORT = ATP_REPORT_PORT;

@noWarn("unused") const bit<4> ATP_VERSION = 2;
@noWarn("unused") const bit<4> ATP_TYPE_DATA = 1;
@noWarn("unused") const bit<4> ATP_TYPE_ACK = 2;
@noWarn("unused") const bit<4> ATP_TYPE_REPORT = 3;
@noWarn("unused") const bit<4> ATP_TYPE_DONE = 4;
@noWarn("unused") const bit<4> ATP_TYPE_RETRY = 5;  // admission token, receiver -> sender (never approximate)
@noWarn("unused") const bit<4> ATP_TYPE_GRANT = 6;  // receiver -> sender: how far it may send (never approximate)
@noWarn("unused") const bit<4> ATP_TYPE_NEW_TOKEN = 7;  // address-validation token, receiver -> sender (never approximate)
@noWarn("unused") const bit<4> ATP_TYPE_MAX = ATP_TYPE_NEW_TOKEN;

@noWarn("unused") const bit<8> ATP_FLAG_APPROX = 0x01;
@noWarn("unused") const bit<8> ATP_FLAG_RETX = 0x02;
@noWarn("unused") const bit<8> ATP_FLAG_ECE = 0x04;
@noWarn("unused") const bit<8> ATP_FLAG_TAGGED = 0x08;
@noWarn("unused") const bit<8> ATP_FLAG_CE = 0x10;
@noWarn("unused") const bit<8> ATP_FLAG_TRIM = 0x20;   // DATA: a switch cut the payload; ACK: that packet came trimmed
@noWarn("unused") const bit<8> ATP_FLAG_GRANT = 0x40;  // ACK: carries a grant
@noWarn("unused") const bit<8> ATP_FLAG_TOKEN = 0x80;  // ACK: carries an admission token
@noWarn("unused") const bit<8> ATP_FLAGS_RESERVED = 0x00;  // version 2 defines every flag bit

@noWarn("unused") const bit<16> ATP_TLR_ONE = 0x8000;  // Q1.15: 1.0; larger values are malformed
@noWarn("unused") const bit<16> ATP_HEADER_BYTES = 32;
@noWarn("unused") const bit<16> UDP_HEADER_BYTES = 8;

// ---- Logical queues ----------------------------------------------------------------------------
// 8 logical queues per port; 0 is the highest priority and is reserved for non-approximate traffic;
// 7 is the lowest. Each target maps a logical queue to its own queue number in its shim
// (v1model: standard_metadata.priority; TNA: ig_intr_md_for_tm.qid); see docs/dataplane.md.
#define QUEUE_ID_BITS 3
typedef bit<QUEUE_ID_BITS> logical_queue_t;
@noWarn("unused") const logical_queue_t NUM_QUEUES_MINUS_ONE = (1 << QUEUE_ID_BITS) - 1;
@noWarn("unused") const logical_queue_t QUEUE_NON_APPROX = 0;
@noWarn("unused") const logical_queue_t QUEUE_FIRST_APPROX = 1;   // the highest queue approximate traffic may use
@noWarn("unused") const logical_queue_t QUEUE_LOWEST = NUM_QUEUES_MINUS_ONE;

// ECN threshold: queue depth at enqueue (BMv2: packets; Tofino: 80-byte cells). Both targets report
// enq_qdepth as bit<19>.
typedef bit<19> queue_depth_t;

// Index of enqueued_packets / transmitted_packets: port * 8 + qid, i.e. port ++ qid.
@noWarn("unused") typedef bit<12> port_queue_index_t;

// Colour a meter returns when the packet is within its rate (v1model and TNA both use 0).
@noWarn("unused") const bit<8> METER_GREEN = 0;

// ---- Drop reasons: the index of NetApproxIngress.malformed_packets ------------------------------
// The names follow hostlib.wire.MalformedPacket.reason where there is one. Order of the checks (the
// first that fails is counted): truncated, bad_version, bad_type, bad_flags, bad_tlr, bad_index.
typedef bit<4> drop_reason_t;
@noWarn("unused") const drop_reason_t MALFORMED_TRUNCATED = 0;      // UDP on an ATP port too short for the 32-byte header,
                                                  // or UDP length < 32 + ATP length
@noWarn("unused") const drop_reason_t MALFORMED_BAD_VERSION = 1;    // version != ATP_VERSION
@noWarn("unused") const drop_reason_t MALFORMED_BAD_TYPE = 2;       // type 0 or 6..15
@noWarn("unused") const drop_reason_t MALFORMED_BAD_FLAGS = 3;      // flag bits 5..7 set
@noWarn("unused") const drop_reason_t MALFORMED_BAD_TLR = 4;        // tlr > 0x8000
@noWarn("unused") const drop_reason_t MALFORMED_BAD_INDEX = 5;      // pkt_cnt == 0 or pkt_idx >= pkt_cnt
@noWarn("unused") const drop_reason_t DROPPED_TTL_EXPIRED = 6;      // routed IPv4 packet with TTL <= 1
@noWarn("unused") const drop_reason_t DROPPED_IPV4_CHECKSUM = 7;    // IPv4 header checksum wrong (IHL 5 only)
@noWarn("unused") const drop_reason_t DROPPED_REPORT_RATE = 8;      // REPORT over its ingress port's punt meter

// ---- L2/L3 ------------------------------------------------------------------------------------
@noWarn("unused") const bit<16> ETHERTYPE_IPV4 = 0x0800;
@noWarn("unused") const bit<8> IP_PROTO_TCP = 6;
@noWarn("unused") const bit<8> IP_PROTO_UDP = 17;
// IPv4 ECN codepoints (low 2 bits of the old TOS byte).
@noWarn("unused") const bit<2> ECN_NOT_ECT = 0;
@noWarn("unused") const bit<2> ECN_ECT1 = 1;
@noWarn("unused") const bit<2> ECN_ECT0 = 2;
@noWarn("unused") const bit<2> ECN_CE = 3;

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
// ECMP: a group id (routes_v4 set_ecmp_group) and a bucket of ECMP_BUCKETS (sizes.p4).
typedef bit<16> ecmp_group_id_t;
typedef bit<4> ecmp_bucket_t;

#endif  // NETAPPROX_DEFINE_P4
