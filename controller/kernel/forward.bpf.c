// NetApprox kernel switch: the ECMP egress decision (ecmp_routes), spraying approximate ATP DATA per packet.
//
// A tc BPF classifier in direct-action mode on the ingress (clsact) of every switch port. For an IPv4 packet
// whose destination the route table holds (longest prefix first), it picks one of the route's ECMP_BUCKETS
// buckets and redirects the frame to that bucket's port, whose egress HTB tree then classifies and queues it
// as for any packet (controller/kernel/tc.py): approximate ATP DATA (IPv4 without options, first fragment, UDP
// to ATP_PORT, a whole ATP header whose byte 0 is ATP_DATA_BYTE0 and whose flags have APPROX) takes a random
// bucket per packet when the switch sprays (SPRAY 1), every other packet the low bits of the CRC-32 of
// (source, destination, protocol, source port, destination port) (ports 0 unless TCP/UDP first fragment
// without options), so its flow never splits. This is controller/reference.py's reference_next_hops.
// Packets no route holds (ARP, other protocols, addresses outside the fabric) go on to the bridge
// (TC_ACT_OK). The routes are compiled in: controller/kernel/forward.py writes them as ROUTE_LOOKUP (an
// if-chain returning the egress ifindex of bucket b, or 0) into a header included with -include; a new route
// table is a new object, attached with "tc filter replace" (routes change with the topology, not per epoch).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef ATP_PORT
#define ATP_PORT 7600
#endif
#ifndef SPRAY
#define SPRAY 1
#endif
#define ECMP_MASK (ECMP_BUCKETS - 1)

// CRC-32 (reflected, polynomial 0xEDB88320), one bit at a time. The low bit is hidden from the compiler (an
// empty asm) so that it multiplies instead of writing "-(crc & 1) & poly": Linux 6.18's verifier splits its
// state on an AND with a value in {0, -1}, and 104 such splits exceed its 1M-instruction limit ("BPF program
// is too large").
static __always_inline __u32 crc32_byte(__u32 crc, __u8 byte)
{
    crc ^= byte;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        __u32 low = crc & 1;
        asm volatile("" : "+r"(low));
        crc = (crc >> 1) ^ (0xEDB88320u * low);
    }
    return crc;
}

static __always_inline __u32 route_port(__u32 dst, __u32 b)
{
    ROUTE_LOOKUP
    return 0;
}

SEC("forward")
int ecmp_forward(struct __sk_buff *skb)
{
    __u8 ip[20];
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return TC_ACT_OK;
    if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(ip)) < 0 || (ip[0] >> 4) != 4)
        return TC_ACT_OK;
    __u32 dst = ((__u32)ip[16] << 24) | ((__u32)ip[17] << 16) | ((__u32)ip[18] << 8) | ip[19];
    __u16 ports[2] = {0, 0};
    int l4 = ip[0] == 0x45 && (ip[9] == IPPROTO_TCP || ip[9] == IPPROTO_UDP) && ((ip[6] & 0x1f) | ip[7]) == 0;
    if (l4 && bpf_skb_load_bytes(skb, ETH_HLEN + 20, ports, 4) < 0)
        l4 = 0, ports[0] = 0, ports[1] = 0;
    __u32 bucket;
    int approx = 0;
    if (SPRAY && l4 && ip[9] == IPPROTO_UDP && ports[1] == bpf_htons(ATP_PORT) &&
        skb->len >= ETH_HLEN + 28 + ATP_HEADER_LEN) {
        __u8 atp0, flags;
        if (bpf_skb_load_bytes(skb, ETH_HLEN + 28, &atp0, 1) == 0 &&
            bpf_skb_load_bytes(skb, ETH_HLEN + 28 + ATP_FLAGS_OFFSET, &flags, 1) == 0)
            approx = atp0 == ATP_DATA_BYTE0 && (flags & ATP_FLAG_APPROX);
    }
    if (approx) {
        bucket = bpf_get_prandom_u32() & ECMP_MASK;
    } else {
        __u8 *p = (__u8 *)ports;
        __u32 crc = 0xFFFFFFFFu;
#pragma unroll
        for (int i = 12; i < 20; i++)
            crc = crc32_byte(crc, ip[i]);
        crc = crc32_byte(crc, ip[9]);
#pragma unroll
        for (int i = 0; i < 4; i++)
            crc = crc32_byte(crc, p[i]);
        bucket = (crc ^ 0xFFFFFFFFu) & ECMP_MASK;
    }
    __u32 ifindex = route_port(dst, bucket);
    if (!ifindex)
        return TC_ACT_OK;
    return bpf_redirect(ifindex, 0);
}

char _license[] SEC("license") = "GPL";
