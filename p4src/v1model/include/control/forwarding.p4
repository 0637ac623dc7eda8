// NetApprox v1model: IPv4 routing (NetApproxIngress.forwarding).
//
// Runs in ingress on IPv4 packets that passed validation. routes_v4 (LPM on the destination) picks the
// egress port and rewrites both MACs; the TTL is decremented. Like a router, a packet arriving with
// TTL <= 1 is not forwarded: it is dropped and counted (DROPPED_TTL_EXPIRED), no ICMP is sent.
// A miss drops the packet (default action drop, not counted).
// A multi-path route (set_ecmp_group) picks one of ECMP_BUCKETS buckets of its group, and ecmp_members (exact
// on group and bucket, written by the controller from model.ecmp_buckets) the member: approximate ATP DATA a
// random bucket per packet when the route sprays, every other packet the low 4 bits of CRC-32 over
// {src, dst, protocol, l4 sport, l4 dport} (model.flow_hash), so a non-approximate flow never splits.
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

    bool ecmp = false;
    bit<1> ecmp_spray = 0;
    ecmp_group_id_t ecmp_group = 0;
    ecmp_bucket_t ecmp_bucket = 0;

    action set_ecmp_group(ecmp_group_id_t group_id, bit<1> spray) {
        ecmp = true;
        ecmp_group = group_id;
        ecmp_spray = spray;
    }

    table routes_v4 {
        key = {
            hdr.ipv4.dst_addr : lpm @name("dst_addr");
        }
        actions = {
            route;
            set_ecmp_group;
            drop;
        }
        default_action = drop();
        size = ROUTES_V4_TABLE_SIZE;
    }

    table ecmp_members {
        key = {
            ecmp_group  : exact @name("group_id");
            ecmp_bucket : exact @name("bucket");
        }
        actions = {
            route;
            drop;
        }
        default_action = drop();
        size = ECMP_MEMBERS_TABLE_SIZE;
    }

    apply {
        if (hdr.ipv4.ttl <= 1) {
            local_md.ttl_expired = true;
            local_md.drop = true;
        } else {
            routes_v4.apply();
            if (ecmp) {
                // Approximate ATP DATA: the same test as classification's (ATP port, DATA, APPROX).
                bool approx = hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_DATA
                    && hdr.udp.dst_port == ATP_UDP_PORT && (hdr.atp.flags & ATP_FLAG_APPROX) != 0;
                if (ecmp_spray == 1 && approx) {
                    random<ecmp_bucket_t>(ecmp_bucket, 0, ECMP_BUCKETS - 1);
                } else {
                    bit<32> h;
                    hash(h, HashAlgorithm.crc32, 32w0,
                         {hdr.ipv4.src_addr, hdr.ipv4.dst_addr, hdr.ipv4.protocol, local_md.l4_sport,
                          local_md.l4_dport},
                         33w4294967296);
                    ecmp_bucket = h[3:0];
                }
                ecmp_members.apply();
            }
        }
    }
}

#endif  // NETAPPROX_V1MODEL_FORWARDING_P4
