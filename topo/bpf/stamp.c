// NetApprox kernel switch: stamp the logical queue into the ATP queue byte of DATA packets.
//
// One tc BPF classifier per logical queue q (ELF section "q<q>"), attached (non direct-action) to the
// inner HTB class 1:2q that the u32 tables classify into; it returns -1, so the filter's classid (the leaf
// 1:1q) is the result. For IPv4 without options, first fragments, UDP to ATP_PORT with ATP byte 0 = 0x11
// (version 1, DATA) it writes q into the ATP queue byte (IPv4 + 28 + 2) and sets the UDP checksum to 0
// ("no checksum", RFC 768), as the P4 program does. Other packets are untouched. skb->data is the
// Ethernet header on egress. Build: clang -O2 -target bpf -DATP_PORT=<port> -c stamp.c (topo/kernel_switch.py).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef ATP_PORT
#define ATP_PORT 7600
#endif

static __always_inline int stamp(struct __sk_buff *skb, __u8 qid)
{
    __u8 ip[20];
    __u8 atp0;
    __u16 dport;
    if (skb->protocol != bpf_htons(ETH_P_IP))
        return -1;
    if (bpf_skb_load_bytes(skb, ETH_HLEN, ip, sizeof(ip)) < 0)
        return -1;
    if (ip[0] != 0x45 || ip[9] != IPPROTO_UDP || ((ip[6] & 0x1f) | ip[7]) != 0)
        return -1;
    if (bpf_skb_load_bytes(skb, ETH_HLEN + 22, &dport, 2) < 0 || dport != bpf_htons(ATP_PORT))
        return -1;
    if (bpf_skb_load_bytes(skb, ETH_HLEN + 28, &atp0, 1) < 0 || atp0 != 0x11)
        return -1;
    __u16 zero = 0;
    bpf_skb_store_bytes(skb, ETH_HLEN + 28 + 2, &qid, 1, 0);
    bpf_skb_store_bytes(skb, ETH_HLEN + 26, &zero, 2, 0);
    return -1;
}

#define QUEUE(q) SEC("q" #q) int stamp_q##q(struct __sk_buff *skb) { return stamp(skb, q); }
QUEUE(0) QUEUE(1) QUEUE(2) QUEUE(3) QUEUE(4) QUEUE(5) QUEUE(6) QUEUE(7)

char _license[] SEC("license") = "GPL";
