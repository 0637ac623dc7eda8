// NetApprox: every table and counter size, in one place (both architectures include this file).
#ifndef NETAPPROX_SIZES_P4
#define NETAPPROX_SIZES_P4

// routes_v4: IPv4 LPM routes. A ToR-sized table; the emulated topologies use a handful.
#define ROUTES_V4_TABLE_SIZE 1024
// ecmp_members: ECMP_BUCKETS (16) entries for each of up to 256 ECMP groups (one group per multi-path prefix).
#define ECMP_BUCKETS 16
#define ECMP_GROUPS 256
#define ECMP_MEMBERS_TABLE_SIZE 4096
// queue_by_class: ternary rules for non-approximate traffic (ip_proto x l4_dport).
#define QUEUE_BY_CLASS_TABLE_SIZE 64
// queue_by_job: one exact entry per job the controller pins to a queue.
#define QUEUE_BY_JOB_TABLE_SIZE 1024
// queue_by_tag: CadentFlow rules, priority range x deadline prefix. The controller expands each rule's
// deadline range into at most 62 disjoint prefixes (ternary value/mask, docs/dataplane.md), so 1024 entries
// hold at least 16 rules whatever their ranges, and typically far more ([0, D] ranges take one prefix per set
// bit of D + 1).
#define QUEUE_BY_TAG_TABLE_SIZE 1024
// queue_by_tlr: TLR ranges. The default policy uses 8; room for finer splits.
#define QUEUE_BY_TLR_TABLE_SIZE 32
// ecn_thresholds: one entry per logical queue.
#define ECN_THRESHOLDS_TABLE_SIZE 8

// enqueued_packets / transmitted_packets are indexed port * NUM_QUEUES + qid, i.e. the 9-bit port
// concatenated with the 3-bit logical queue: 2^(9 + 3) cells cover every port number.
#define PORT_QUEUE_COUNTER_SIZE 4096
// malformed_packets: one cell per drop reason (MALFORMED_* / DROPPED_* in define.p4), room for 16.
#define MALFORMED_COUNTER_SIZE 16
// report_meter: one cell per ingress port (9-bit port numbers), the rate limit of REPORTs punted to the CPU.
#define REPORT_METER_SIZE 512
// queue0_guard_packets: one cell, approximate packets the tables put in queue 0 (moved to queue 1).
#define QUEUE0_GUARD_COUNTER_SIZE 1

#endif  // NETAPPROX_SIZES_P4
