// NetApprox kernel switch: stamp the logical queue into the ATP queue byte of DATA packets.
//
// One tc BPF classifier per logical queue q (ELF section "q<q>"), attached (non direct-action) to the
// inner HTB class 1:2q that the u32 tables classify into; it returns -1, so the filter's classid (the leaf
// 1:1q) is the result. For IPv4 without options, first fragments, UDP to ATP_PORT with ATP byte 0 =
// ATP_DATA_BYTE0 (the wire version, DATA: 0x21) it writes q into the ATP queue byte (IPv4 + 28 + 2) and sets the
// UDP checksum to 0 ("no checksum", RFC 768), as the P4 program does. Other packets are untouched. skb->data is
// the Ethernet header on egress. Build: clang -O2 -target bpf -DATP_PORT=<port> -DATP_QUEUE_OFFSET=<n>
// -DATP_DATA_BYTE0=<b> -c stamp.c (controller/kernel/stamp.py, which takes both from hostlib.wire).
//
// ECN on queue 0 (built with -DECN_THRESHOLD_BYTES=<b> -DRATE_KBPS=<r> -DQUEUE0_BYTES=<c>): queue 0 is the
// highest priority, so it drains at the line rate r whatever the other queues hold. Section q0 then keeps a
// virtual copy of queue 0's backlog (bytes, drained at r since the previous packet, capped at queue 0's buffer
// c like the bfifo) and sets CE on ECT(0)/ECT(1) IPv4 packets that find at least b bytes queued ahead of them
// (the P4 program's "depth at enqueue >= threshold"). Not-ECT and CE packets are never changed. Classification
// runs under the qdisc lock, so the per-port state needs no atomics.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef ATP_PORT
#define ATP_PORT 7600
#endif
#ifndef ATP_QUEUE_OFFSET
#define ATP_QUEUE_OFFSET 2
#endif

#ifdef ECN_THRESHOLD_BYTES
struct vqueue {
    __u64 last_ns;
    __u64 backlog;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct vqueue);
} vqueue_map SEC(".maps");

static __always_inline void mark_ecn(struct __sk_buff *skb)
{
    __u32 key = 0;
    struct vqueue *vq = bpf_map_lookup_elem(&vqueue_map, &key);
    if (!vq)
        return;
    __u64 now = bpf_ktime_get_ns();
    __u64 drained = vq->last_ns ? (now - vq->last_ns) * RATE_KBPS / 8000000 : 0;
    __u64 backlog = vq->backlog > drained ? vq->backlog - drained : 0;
    vq->last_ns = now;
    if (backlog >= ECN_THRESHOLD_BYTES && skb->protocol == bpf_htons(ETH_P_IP)) {
        __u8 head[2];
        if (bpf_skb_load_bytes(skb, ETH_HLEN, head, 2) == 0 && (head[1] & 3) != 0 && (head[1] & 3) != 3) {
            __u16 old_word = *(__u16 *)head;
            head[1] |= 3;
            __u16 new_word = *(__u16 *)head;
            bpf_skb_store_bytes(skb, ETH_HLEN + 1, &head[1], 1, 0);
            bpf_l3_csum_replace(skb, ETH_HLEN + 10, old_word, new_word, 2);
        }
    }
    if (backlog + skb->len <= QUEUE0_BYTES)
        backlog += skb->len;
    vq->backlog = backlog;
}
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
    if (bpf_skb_load_bytes(skb, ETH_HLEN + 28, &atp0, 1) < 0 || atp0 != ATP_DATA_BYTE0)
        return -1;
    __u16 zero = 0;
    bpf_skb_store_bytes(skb, ETH_HLEN + 28 + ATP_QUEUE_OFFSET, &qid, 1, 0);
    bpf_skb_store_bytes(skb, ETH_HLEN + 26, &zero, 2, 0);
    return -1;
}

#define QUEUE(q) SEC("q" #q) int stamp_q##q(struct __sk_buff *skb) { return stamp(skb, q); }

#ifdef ECN_THRESHOLD_BYTES
SEC("q0") int stamp_q0(struct __sk_buff *skb)
{
    mark_ecn(skb);
    return stamp(skb, 0);
}
#else
QUEUE(0)
#endif
QUEUE(1) QUEUE(2) QUEUE(3) QUEUE(4) QUEUE(5) QUEUE(6) QUEUE(7)

char _license[] SEC("license") = "GPL";
