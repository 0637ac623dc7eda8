// NetApprox TNA: IPv4 routing (NetApproxIngress.forwarding). Same contract as
// p4src/v1model/include/control/forwarding.p4: LPM on the destination, MAC rewrite, TTL decrement,
// TTL <= 1 dropped and counted by the caller, miss dropped.
#ifndef NETAPPROX_TNA_FORWARDING_P4
#define NETAPPROX_TNA_FORWARDING_P4

control Forwarding(inout parsed_headers_t hdr,
                   inout ingress_metadata_t ig_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    action route(PortId_t port, mac_addr_t src_mac, mac_addr_t dst_mac) {
        ig_tm_md.ucast_egress_port = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
    }

    action drop() {
        ig_md.drop = true;
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
            ig_md.ttl_expired = true;
            ig_md.drop = true;
        } else {
            routes_v4.apply();
        }
    }
}

#endif  // NETAPPROX_TNA_FORWARDING_P4
