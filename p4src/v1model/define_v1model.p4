// NetApprox shim for BMv2 simple_switch_grpc (v1model): what differs from TNA, then the shared files.
#ifndef NETAPPROX_DEFINE_V1MODEL_P4
#define NETAPPROX_DEFINE_V1MODEL_P4

// v1model.p4 declares PortId_t (bit<9>) and types standard_metadata ports with it only from this
// version on; without it they are plain bit<9> and PortId_t does not exist.
#define V1MODEL_VERSION 20200408
#include <core.p4>
#include <v1model.p4>

// simple_switch_grpc must be started with --cpu-port 255 (the P4Runtime packet-in/out port).
const PortId_t CPU_PORT = 255;

#include "../shared/define.p4"
#include "../shared/header.p4"

// Logical queue -> BMv2 priority queue. simple_switch_grpc runs with --priority-queues 8 and enqueues
// on standard_metadata.priority; its QueueingLogicPriRL serves priority 7 first and priority 0 last
// (measured on BMv2 1.15.5 by ptf/tests/queueing.py, docs/dataplane.md), so logical queue q
// (0 = highest) is priority 7 - q.
#define BMV2_PRIORITY_OF(q) ((bit<3>)(NUM_QUEUES_MINUS_ONE - (q)))

// Per-packet state shared by ingress and egress (BMv2 carries user metadata from ingress to egress).
struct local_metadata_t {
    logical_queue_t qid;            // chosen logical queue
    bit<16> l4_dport;               // UDP/TCP destination port, 0 if neither
    bit<16> l4_sport;               // UDP/TCP source port, 0 if neither (the ECMP flow hash)
    bit<8> ip_proto;                // IPv4 protocol, 0 if not IPv4
    bool drop;                      // set by validation/forwarding: the packet must not leave
    bool ttl_expired;               // forwarding: routed packet had TTL <= 1
    bool from_cpu;                  // P4Runtime packet-out: send unchanged, no classification
    bool to_cpu;                    // punted to the controller as packet-in
    PortId_t ingress_port;          // copied for the packet-in header
    bit<16> ipv4_tos_word;          // version, ihl, dscp, ecn as received (incremental checksum update)
    bit<16> ipv4_ttl_word;          // ttl, protocol as received (incremental checksum update)
}

// RFC 1624 (eqn. 3) incremental update of a 16-bit one's complement checksum `hc` for two changed words:
// HC' = ~(~HC + ~m + m' + ~n + n'). Used for IPv4 headers with options, which this program does not parse
// whole; an unchanged word contributes nothing (~m + m is negative zero).
bit<16> csum16_update(in bit<16> hc, in bit<16> old_a, in bit<16> new_a, in bit<16> old_b, in bit<16> new_b) {
    bit<32> sum = (bit<32>)(~hc) + (bit<32>)(~old_a) + (bit<32>)new_a + (bit<32>)(~old_b) + (bit<32>)new_b;
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    return ~(bit<16>)sum;
}

#endif  // NETAPPROX_DEFINE_V1MODEL_P4
