// NetApprox shim for Tofino (TNA): what differs from v1model, then the shared files.
#ifndef NETAPPROX_DEFINE_TNA_P4
#define NETAPPROX_DEFINE_TNA_P4

#include <core.p4>
#include <tna.p4>   // PortId_t (bit<9> on Tofino 1), QueueId_t (bit<5>), Counter, Checksum, ...

// The PCIe CPU port of a 2-pipe Tofino 1 (bf_pci0). 4-pipe parts and Tofino 2 use other numbers:
// build with -DTNA_CPU_PORT=<n>.
#ifndef TNA_CPU_PORT
#define TNA_CPU_PORT 192
#endif
const PortId_t CPU_PORT = TNA_CPU_PORT;

#include "../shared/define.p4"
#include "../shared/header.p4"

// Logical queue -> Tofino queue id. The identity: the controller configures the traffic manager so
// that queue q of every port has strict priority 7 - q (tm.queue.sched_cfg max_priority) and the
// buffer of docs/dataplane.md (tm.queue.buffer). Strict priority is NOT the TM default.
#define TNA_QID_OF(q) ((QueueId_t)(q))

// Ingress -> egress: TNA does not carry user metadata across the traffic manager, so ingress emits
// this header in front of the packet and the egress parser extracts it. 4 bytes.
header bridged_metadata_t {
    bit<7> _pad0;
    PortId_t ingress_port;          // for the packet-in header
    bit<5> _pad1;
    logical_queue_t qid;            // the logical queue (eg_intr_md.egress_qid is the physical one)
    bit<7> _pad2;
    bit<1> from_cpu;                // P4Runtime packet-out: send unchanged
}

struct ingress_metadata_t {
    bridged_metadata_t bridged;
    bit<16> l4_dport;               // UDP/TCP destination port, 0 if neither
    bit<16> l4_sport;               // UDP/TCP source port, 0 if neither (the ECMP flow hash)
    bit<8> ip_proto;                // IPv4 protocol, 0 if not IPv4
    bool ipv4_checksum_err;         // set by the ingress parser (meaningful for ihl == 5 only)
    bit<16> ipv4_residual;          // ingress parser: the checksum residual without the TTL word
    bool drop;                      // forwarding: the packet must not leave
    bool ttl_expired;               // forwarding: routed packet had TTL <= 1
}

struct egress_metadata_t {
    bridged_metadata_t bridged;
    bit<16> ipv4_residual;          // egress parser: the checksum residual without the ECN word
}

#endif  // NETAPPROX_DEFINE_TNA_P4
