// NetApprox: packet headers, architecture-neutral.
//
// atp_t is THE ATP header of docs/wire-format.md, field for field and bit for bit (32 bytes, network
// order). tests/test_wire_contract.py parses this declaration and compares it with
// hostlib.wire.HEADER_FIELDS: keep every field on its own line as `bit<N> name;` with a literal N.
#ifndef NETAPPROX_HEADER_P4
#define NETAPPROX_HEADER_P4

#include "define.p4"

// P4Runtime packet-in: prepended by the egress pipeline on packets sent to CPU_PORT; the P4Runtime
// server strips it into PacketIn.metadata (id 1: ingress_port, id 2: _pad).
@controller_header("packet_in")
header packet_in_header_t {
    PortId_t ingress_port;
    bit<7> _pad;
}

// P4Runtime packet-out: prepended by the P4Runtime server on packets the controller injects on
// CPU_PORT; the packet is sent unchanged out of egress_port (metadata id 1: egress_port, id 2: _pad).
@controller_header("packet_out")
header packet_out_header_t {
    PortId_t egress_port;
    bit<7> _pad;
}

header ethernet_t {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16> ether_type;
}

// The fixed 20 bytes of IPv4. Options (ihl > 5; hosts we control send none) are not parsed: such a packet
// is routed and classified as non-ATP traffic (its L4 header is not parsed either), its options travel as
// payload, its header checksum is verified only when ihl == 5 and is updated incrementally (RFC 1624)
// after the TTL and ECN changes. ihl < 5 is dropped.
header ipv4_t {
    bit<4> version;
    bit<4> ihl;
    bit<6> dscp;
    bit<2> ecn;
    bit<16> total_len;
    bit<16> identification;
    bit<3> flags;
    bit<13> frag_offset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

header tcp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<32> seq_no;
    bit<32> ack_no;
    bit<4> data_offset;
    bit<4> res;
    bit<8> flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent_ptr;
}

// ATP header, docs/wire-format.md (version 2). 32 bytes.
header atp_t {
    bit<4> version;
    bit<4> type;
    bit<8> flags;
    bit<8> queue;
    bit<8> priority;
    bit<32> job_id;
    bit<32> msg_id;
    bit<16> group_id;
    bit<16> tlr;
    bit<16> pkt_idx;
    bit<16> pkt_cnt;
    bit<32> seq;
    bit<32> deadline_us;
    bit<8> weight;
    bit<8> count;
    bit<16> length;
}

// Every header either pipeline parses or emits, in wire order.
struct parsed_headers_t {
    packet_out_header_t packet_out;
    packet_in_header_t packet_in;
    ethernet_t ethernet;
    ipv4_t ipv4;
    udp_t udp;
    tcp_t tcp;
    atp_t atp;
}

#endif  // NETAPPROX_HEADER_P4
