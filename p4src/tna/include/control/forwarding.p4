// NetApprox TNA: IPv4 routing (NetApproxIngress.forwarding). Same contract as
// p4src/v1model/include/control/forwarding.p4: LPM on the destination, MAC rewrite, TTL decrement,
// TTL <= 1 dropped and counted by the caller, miss dropped; a multi-path route (set_ecmp_group) picks one of
// ECMP_BUCKETS buckets of its group and ecmp_members (exact on group and bucket) the member: approximate ATP
// DATA a Random<bit<4>> bucket per packet when the route sprays, every other packet the low 4 bits of CRC-32
// over {src, dst, protocol, l4 sport, l4 dport} (model.flow_hash; Tofino's CRC32 is zlib's).
// An exact bucket table rather than an ActionSelector, so the controller, not the target's selector, says which
// member a bucket holds and both architectures share one P4Info (docs/dataplane.md, Spraying).
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

    Hash<bit<32>>(HashAlgorithm_t.CRC32) flow_hash;
    Random<ecmp_bucket_t>() spray_bucket;

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
            ig_md.ttl_expired = true;
            ig_md.drop = true;
        } else {
            routes_v4.apply();
            if (ecmp) {
                // Approximate ATP DATA: the same test as classification's (ATP port, DATA, APPROX).
                if (ecmp_spray == 1 && hdr.atp.isValid() && hdr.atp.type == ATP_TYPE_DATA
                        && hdr.udp.dst_port == ATP_UDP_PORT && (hdr.atp.flags & ATP_FLAG_APPROX) != 0) {
                    ecmp_bucket = spray_bucket.get();
                } else {
                    bit<32> h = flow_hash.get({hdr.ipv4.src_addr, hdr.ipv4.dst_addr, hdr.ipv4.protocol,
                                               ig_md.l4_sport, ig_md.l4_dport});
                    ecmp_bucket = h[3:0];
                }
                ecmp_members.apply();
            }
        }
    }
}

#endif  // NETAPPROX_TNA_FORWARDING_P4
