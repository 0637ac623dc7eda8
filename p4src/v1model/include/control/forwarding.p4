// NetApprox v1model: IPv4 routing (NetApproxIngress.forwarding).
//
// Runs in ingress on IPv4 packets that passed validation. routes_v4 (LPM on the destination) picks the
// egress port and rewrites both MACs; the TTL is decremented. Like a router, a packet arriving with
// TTL <= 1 is not forwarded: it is dropped and counted (DROPPED_TTL_EXPIRED), no ICMP is sent.
// A miss drops the packet (default action drop, not counted).
#ifndef NETAPPROX_V1MODEL_FORWARDING_P4
#define NETAPPROX_V1MODEL_FORWARDING_P4

control Forwarding(inout parsed_headers_t hdr,
                   inout local_metadata_t local_md,
                   inout standard_metadata_t standard_md) {
    action route(PortId_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        standard_md.egress_spec = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    action drop() {
        local_md.drop = true;
    }

    table routes_v4 {
        key = {
            hdr.ipv4.dst_addr : lpm @name("dst_addr");
        }
        actions = {
            route;
            drop;
        }
        default_action = drop();
        size = ROUTES_V4_TABLE_SIZE;
    }

    apply {
        if (hdr.ipv4.ttl <= 1) {
            local_md.ttl_expired = true;
            local_md.drop = true;
        } else {
            routes_v4.apply();
        }
    }
}

#endif  // NETAPPROX_V1MODEL_FORWARDING_P4
