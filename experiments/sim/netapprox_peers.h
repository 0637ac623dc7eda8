// The transports a user would pick instead of ATP, as ns-3 data plane: pFabric (Alizadeh et al., SIGCOMM 2013),
// Homa (Montazeri et al., SIGCOMM 2018) and Aeolus on ExpressPass-style credits (Hu et al., SIGCOMM 2020),
// each below pFabric.
//
// Loaded by experiments/sim/native.py after netapprox_sim_apps.h. docs/simulation.md ("Peer transports") says
// what is modelled and what is not.
//
// pFabric packets are UDP datagrams to port kPfPort whose payload starts with a 24-byte header (big endian):
//   magic 'P' (1) | type (1: DATA, 2: ACK, 3: PROBE) | flags (1; ACK: bit 0 = the receiver holds its target) |
//   reserved (1) | job (4) | seq (4: packet index in the flow; ACK: the packet acknowledged) |
//   remaining (4: the flow's bytes not yet sent when this packet first left, the packet's priority; ACK 0) |
//   packets (4: the flow's packets) | target (4: packets the receiver needs, a prefix of the flow)
// followed on DATA by the payload (up to MSS bytes).
//
// - PfabricQueueDisc: one queue of `capacity` packets per port (about two bandwidth-delay products). Every
//   packet has a priority: a pFabric DATA packet its `remaining`, any other packet 0 (the highest: ACKs,
//   probes). Dequeue: the flow (source address, job) of the packet with the smallest priority value sends its
//   earliest queued packet (pFabric's starvation-free rule, which also keeps a flow in order). Enqueue into a
//   full queue: the packet with the largest priority value (the arrival included; on ties the latest queued)
//   is dropped. Its counters take the NetApproxQueueDisc's shape, all in queue 0, so the trial's queue
//   statistics read either.
// - PfabricSender: one flow per job, started at line rate: a window of `window` packets (one BDP) in flight
//   from the first RTT; every DATA packet is acknowledged on its own (selective); a fixed retransmission
//   timeout `rtoNs` (about 3 RTTs) retransmits every unacknowledged packet, halves ssthresh and sets the
//   window to 1 (then slow start back, additive increase above ssthresh, never above `window`); after
//   `probeAfter` timeouts in a row the flow sends only a header-sized PROBE per timeout until an ACK arrives
//   (probe mode). Done when an ACK says the receiver holds its target: EarlySend then stops sending.
// - PfabricReceiver: acknowledges every DATA packet and PROBE; counts, per (source, job), the packets of the
//   target prefix; records when all of them arrived.
#ifndef NETAPPROX_PEERS_H
#define NETAPPROX_PEERS_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iterator>
#include <string>
#include <limits>
#include <map>
#include <unordered_map>
#include <vector>

#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/ipv4-queue-disc-item.h"
#include "ns3/network-module.h"
#include "ns3/queue-disc.h"

namespace netapprox
{

// What the peer transports share: a header of one word (magic, type, two bytes) and five big-endian 32-bit
// fields; the first bytes of a peer datagram in a queue disc item; a test item; a bound UDP socket; a message;
// and the bases of their queue discs (PeerQueueDisc, LeveledQueueDisc), senders (PeerSender) and receivers
// (PeerReceiver).
inline void
PutPeerHeader(uint8_t* b, uint8_t magic, uint8_t type, uint8_t x, uint8_t y, const uint32_t (&v)[5])
{
    b[0] = magic;
    b[1] = type;
    b[2] = x;
    b[3] = y;
    for (int k = 0; k < 5; k++)
    {
        b[4 + 4 * k] = uint8_t(v[k] >> 24);
        b[5 + 4 * k] = uint8_t(v[k] >> 16);
        b[6 + 4 * k] = uint8_t(v[k] >> 8);
        b[7 + 4 * k] = uint8_t(v[k]);
    }
}

// PutPeerHeader's reverse: false unless the magic is `magic` and the type within [lo, hi].
inline bool
GetPeerHeader(const uint8_t* b, uint8_t magic, uint8_t lo, uint8_t hi, uint32_t (&v)[5])
{
    if (b[0] != magic || b[1] < lo || b[1] > hi)
    {
        return false;
    }
    for (int k = 0; k < 5; k++)
    {
        v[k] = uint32_t(b[4 + 4 * k]) << 24 | uint32_t(b[5 + 4 * k]) << 16 | uint32_t(b[6 + 4 * k]) << 8 |
               uint32_t(b[7 + 4 * k]);
    }
    return true;
}

constexpr uint32_t kPeerHeader = 24;

// The words every peer header carries besides its fifth: the job, a packet index, the message's packets and the
// packets its receiver needs (a prefix).
struct PeerWords
{
    uint32_t job = 0;
    uint32_t seq = 0;
    uint32_t packets = 0;
    uint32_t target = 0;
};

// The UDP header and peer header of a datagram to `port` in `item` into `b`, and its source address: false when
// the item is something else.
inline bool
PeerDatagramOf(ns3::Ptr<ns3::QueueDiscItem> item, uint16_t port, uint8_t (&b)[kUdpHeader + kPeerHeader], uint32_t* src)
{
    auto ip = ns3::DynamicCast<ns3::Ipv4QueueDiscItem>(item);
    if (!ip)
    {
        return false;
    }
    const ns3::Ipv4Header& h = ip->GetHeader();
    *src = h.GetSource().Get();
    return h.GetProtocol() == 17 && h.GetFragmentOffset() == 0 &&
           item->GetPacket()->CopyData(b, sizeof(b)) >= sizeof(b) && Be16(b + 2) == port;
}

// A queue disc item of `size` datagram bytes from `srcIp` to UDP port `dport` (tests).
inline ns3::Ptr<ns3::QueueDiscItem>
PeerItem(const uint8_t* data, uint32_t size, uint32_t srcIp, uint16_t dport)
{
    auto p = ns3::Create<ns3::Packet>(data, size);
    ns3::UdpHeader udp;
    udp.SetSourcePort(9);
    udp.SetDestinationPort(dport);
    p->AddHeader(udp);
    ns3::Ipv4Header ip;
    ip.SetSource(ns3::Ipv4Address(srcIp));
    ip.SetDestination(ns3::Ipv4Address(0x0A0000FE));
    ip.SetProtocol(17);
    ip.SetPayloadSize(p->GetSize());
    return ns3::Create<ns3::Ipv4QueueDiscItem>(p, ns3::Address(), 0x0800, ip);
}

// A UDP socket of `node` bound to any port, delivering to `onRecv`.
inline ns3::Ptr<ns3::Socket>
BoundUdpSocket(ns3::Ptr<ns3::Node> node, ns3::Callback<void, ns3::Ptr<ns3::Socket>> onRecv)
{
    auto socket = ns3::Socket::CreateSocket(node, ns3::UdpSocketFactory::GetTypeId());
    socket->Bind();
    socket->SetRecvCallback(onRecv);
    return socket;
}

// What the peers' queue discs share: a port and a capacity (`Configure`), the trial's view of their counters in the
// NetApproxQueueDisc's shape (`CountersSince`; no limits to set and no ATP header read: `SetLimits`, `BadVersion`),
// when those counters start, and what every `CheckConfig` requires first (no classes, no filters, a capacity).
class PeerQueueDisc : public ns3::QueueDisc
{
  public:
    PeerQueueDisc()
        : ns3::QueueDisc(ns3::QueueDiscSizePolicy::NO_LIMITS)
    {
    }

    void Configure(uint32_t port, uint32_t capacity)
    {
        m_port = port;
        m_capacity = capacity;
    }

    double CountersSince() const
    {
        return m_since;
    }

    void SetLimits(const std::vector<uint32_t>&)
    {
    }

    // ATP packets of another version dropped (the NetApprox queue disc's counter): a peer's switch reads no ATP
    // header, so none.
    uint64_t BadVersion() const
    {
        return 0;
    }

  protected:
    // CheckConfig's part every peer shares: no classes, no filters, a capacity; the internal queues made once by
    // `add`, `queues` of them in the end.
    template <typename Add>
    bool ConfigWith(std::size_t queues, Add add)
    {
        if (GetNQueueDiscClasses() > 0 || GetNPacketFilters() > 0 || m_capacity == 0)
        {
            return false;
        }
        if (GetNInternalQueues() == 0)
        {
            add();
        }
        return GetNInternalQueues() == queues;
    }

    // A drop-tail internal queue of `packets` packets.
    void AddFifo(uint32_t packets)
    {
        AddInternalQueue(ns3::CreateObjectWithAttributes<ns3::DropTailQueue<ns3::QueueDiscItem>>(
            "MaxSize", ns3::QueueSizeValue(ns3::QueueSize(ns3::QueueSizeUnit::PACKETS, packets))));
    }

    void InitializeParams() override
    {
        m_last = m_since = ns3::Simulator::Now().GetSeconds();
    }

    uint32_t m_port = 0;
    uint32_t m_capacity = 1;
    double m_last = 0;
    double m_since = 0;
};

// A peer's queue disc with a backlog and counters per switch queue (Homa's priority levels, Aeolus' FIFO and
// credit queue).
class LeveledQueueDisc : public PeerQueueDisc
{
  public:
    uint32_t Backlog(int q) const
    {
        return m_len[q];
    }

    const QueueCounters& Counters(int q)
    {
        Account();
        return m_counters[q];
    }

  protected:
    void Account()
    {
        AccountBacklog(m_counters, m_len, kQueues, &m_last);
    }

    uint32_t m_len[kQueues] = {};
    QueueCounters m_counters[kQueues];
};

// `qd` as `device`'s root queue disc, in place of the one there.
template <class Disc>
ns3::Ptr<Disc>
AsRootQueueDisc(ns3::Ptr<ns3::NetDevice> device, ns3::Ptr<Disc> qd)
{
    auto tc = device->GetNode()->GetObject<ns3::TrafficControlLayer>();
    if (tc->GetRootQueueDiscOnDevice(device))
    {
        tc->DeleteRootQueueDiscOnDevice(device);
    }
    tc->SetRootQueueDiscOnDevice(device, qd);
    return qd;
}

// The next datagram on `s` (its sender into `*from` when given) whose first bytes are a valid `Header`, read into
// `h`; false once none is left. Shorter datagrams and other headers are skipped.
template <typename Header>
bool
NextPeerHeader(ns3::Ptr<ns3::Socket> s, Header& h, ns3::Address* from = nullptr)
{
    while (auto p = from ? s->RecvFrom(*from) : s->Recv())
    {
        uint8_t b[kPeerHeader];
        if (p->CopyData(b, kPeerHeader) >= kPeerHeader && h.Read(b))
        {
            return true;
        }
    }
    return false;
}

// The one message of a peer transport's sender: where it goes, its bytes in packets of `mss`, the first
// `target` packets needed.
struct PeerMessage
{
    void SetMessage(uint32_t ip, uint16_t port, uint32_t job, uint64_t streamBytes, uint64_t targetBytes, uint32_t mss)
    {
        m_peer = ns3::InetSocketAddress(ns3::Ipv4Address(ip), port);
        m_job = job;
        m_bytes = streamBytes;
        m_mss = mss;
        m_packets = uint32_t(std::max<uint64_t>(1, (streamBytes + mss - 1) / mss));
        m_target = uint32_t(std::min<uint64_t>(m_packets, std::max<uint64_t>(1, (targetBytes + mss - 1) / mss)));
    }

    // The payload bytes of packet `seq`.
    uint32_t PayloadOf(uint32_t seq) const
    {
        uint64_t offset = uint64_t(seq) * m_mss;
        return uint32_t(std::min<uint64_t>(m_mss, m_bytes > offset ? m_bytes - offset : 0));
    }

    ns3::Address m_peer;
    uint32_t m_job = 0;
    uint64_t m_bytes = 0;
    uint32_t m_mss = 1400;
    uint32_t m_packets = 1;
    uint32_t m_target = 1;
};

// What the peers' senders share: their message, when they started and finished, what they sent, sent again and
// timed out, their one timer (cancelled when the application stops) and whether they stop at the target.
template <typename Derived>
class PeerSender : public SocketApp<Derived>, protected PeerMessage
{
  public:
    int64_t StartNs() const
    {
        return m_startNs;
    }

    int64_t DoneNs() const
    {
        return m_doneNs;
    }

    uint32_t Packets() const
    {
        return m_packets;
    }

    uint64_t Sent() const
    {
        return m_sent;
    }

    uint64_t Retransmissions() const
    {
        return m_retx;
    }

    uint64_t Timeouts() const
    {
        return m_timeouts;
    }

  protected:
    void StopApplication() override
    {
        m_timer.Cancel();
        SocketApp<Derived>::StopApplication();
    }

    // Done, and told to stop once the receiver holds the target (pFabric's sender has its own test).
    bool Finished() const
    {
        return m_doneNs >= 0 && m_stopAtTarget;
    }

    // The receiver said the target prefix arrived: done from now on, no more timeouts.
    void NoteDone()
    {
        if (m_doneNs < 0)
        {
            m_doneNs = ns3::Simulator::Now().GetNanoSeconds();
        }
        m_timer.Cancel();
    }

    // The next datagram on `s` with a valid `Header` for this sender's job, read into `h`; false once none is left.
    template <typename Header>
    bool NextOwnHeader(ns3::Ptr<ns3::Socket> s, Header& h)
    {
        bool found = NextPeerHeader(s, h);
        while (found && h.job != m_job)
        {
            found = NextPeerHeader(s, h);
        }
        return found;
    }

    // The timeout `m_timeout` from now, until the target arrived; when it fires, the sender's `Timeout()` (Homa's,
    // Aeolus'; pFabric's sender runs its own retransmission timer).
    void Arm()
    {
        m_timer.Cancel();
        if (m_doneNs < 0)
        {
            m_timer = ns3::Simulator::Schedule(m_timeout, &PeerSender::OnTimeout, this);
        }
    }

    void OnTimeout()
    {
        if (m_doneNs >= 0)
        {
            return;
        }
        m_timeouts++;
        static_cast<Derived*>(this)->Timeout();
    }

    ns3::Time m_timeout;
    bool m_stopAtTarget = true;
    uint64_t m_sent = 0;
    uint64_t m_retx = 0;
    uint64_t m_timeouts = 0;
    int64_t m_startNs = -1;
    int64_t m_doneNs = -1;
    ns3::EventId m_timer;
};

constexpr uint16_t kPfPort = 7800;
constexpr uint32_t kPfHeader = kPeerHeader;
constexpr uint8_t kPfMagic = 'P';
constexpr uint8_t kPfData = 1;
constexpr uint8_t kPfAck = 2;
constexpr uint8_t kPfProbe = 3;
constexpr uint8_t kPfFlagDone = 1;

struct PfHeader : PeerWords
{
    uint8_t type = 0;
    uint8_t flags = 0;
    uint32_t remaining = 0;

    void Write(uint8_t* b) const
    {
        PutPeerHeader(b, kPfMagic, type, flags, 0, {job, seq, remaining, packets, target});
    }

    bool Read(const uint8_t* b)
    {
        uint32_t v[5];
        if (!GetPeerHeader(b, kPfMagic, kPfData, kPfProbe, v))
        {
            return false;
        }
        type = b[1];
        flags = b[2];
        job = v[0], seq = v[1], remaining = v[2], packets = v[3], target = v[4];
        return true;
    }
};

// A pFabric header built from Python (tests): the datagram's bytes.
inline std::string
PfabricDatagram(uint8_t type, uint32_t job, uint32_t seq, uint32_t remaining, uint32_t packets, uint32_t target,
                uint32_t payload)
{
    std::string s(kPfHeader + payload, '\0');
    PfHeader h;
    h.type = type;
    h.job = job;
    h.seq = seq;
    h.remaining = remaining;
    h.packets = packets;
    h.target = target;
    h.Write(reinterpret_cast<uint8_t*>(&s[0]));
    return s;
}

// The pFabric queue's storage: an ns-3 queue of queue disc items from which any position can leave (sent or
// dropped), so that ns-3's own packet accounting of the queue disc holds.
class PfabricStore : public ns3::Queue<ns3::QueueDiscItem>
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::PfabricStore")
                                     .SetParent<ns3::Queue<ns3::QueueDiscItem>>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    bool Enqueue(ns3::Ptr<ns3::QueueDiscItem> item) override
    {
        return DoEnqueue(GetContainer().end(), item);
    }

    ns3::Ptr<ns3::QueueDiscItem> Dequeue() override
    {
        return DoDequeue(GetContainer().begin());
    }

    ns3::Ptr<ns3::QueueDiscItem> Remove() override
    {
        return DoRemove(GetContainer().begin());
    }

    ns3::Ptr<const ns3::QueueDiscItem> Peek() const override
    {
        return DoPeek(GetContainer().begin());
    }

    ns3::Ptr<ns3::QueueDiscItem> DequeueAt(std::size_t i)
    {
        return DoDequeue(std::next(GetContainer().begin(), i));
    }

    ns3::Ptr<ns3::QueueDiscItem> RemoveAt(std::size_t i)
    {
        return DoRemove(std::next(GetContainer().begin(), i));
    }
};

class PfabricQueueDisc : public PeerQueueDisc
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::PfabricQueueDisc")
                                     .SetParent<ns3::QueueDisc>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    uint32_t Port() const
    {
        return m_port;
    }

    uint32_t Capacity() const
    {
        return m_capacity;
    }

    uint32_t Backlog(int q) const
    {
        return q == 0 ? uint32_t(m_meta.size()) : 0;
    }

    // The NetApproxQueueDisc's counters: everything in queue 0, queues 1-7 empty.
    const QueueCounters& Counters(int q)
    {
        Account();
        return q == 0 ? m_counters : m_empty;
    }

    // The priorities of the queued packets in queue order (tests).
    std::vector<uint32_t> QueuedPriorities() const
    {
        std::vector<uint32_t> out;
        for (const auto& e : m_meta)
        {
            out.push_back(e.prio);
        }
        return out;
    }

    // Priorities of the packets dropped, in drop order (tests; the first 4096).
    const std::vector<uint32_t>& DroppedPriorities() const
    {
        return m_droppedPrios;
    }

    // The priority of a packet: a pFabric DATA packet's remaining bytes, 0 for anything else; *flow: (source
    // address, job) of a pFabric DATA packet, else 0.
    static uint32_t Priority(ns3::Ptr<ns3::QueueDiscItem> item, uint64_t* flow)
    {
        *flow = 0;
        uint8_t b[kUdpHeader + kPeerHeader];
        uint32_t src = 0;
        PfHeader ph;
        if (!PeerDatagramOf(item, kPfPort, b, &src) || !ph.Read(b + kUdpHeader) || ph.type != kPfData)
        {
            return 0;
        }
        *flow = (uint64_t(src) << 32) | ph.job;
        return ph.remaining;
    }

  private:
    struct Meta
    {
        uint32_t prio;
        uint64_t flow;
    };

    void Account()
    {
        double now = ns3::Simulator::Now().GetSeconds();
        double dt = now - m_last;
        if (dt > 0)
        {
            m_counters.backlogIntegral += dt * m_meta.size();
        }
        m_last = now;
    }

    void NoteDrop(uint32_t prio)
    {
        m_counters.dropped++;
        if (m_droppedPrios.size() < 4096)
        {
            m_droppedPrios.push_back(prio);
        }
    }

    PfabricStore* Store()
    {
        return static_cast<PfabricStore*>(ns3::PeekPointer(GetInternalQueue(0)));
    }

    bool DoEnqueue(ns3::Ptr<ns3::QueueDiscItem> item) override
    {
        Account();
        uint64_t flow;
        uint32_t prio = Priority(item, &flow);
        m_counters.enqueued++;
        if (m_meta.size() >= m_capacity)
        {
            // the worst packet, the arrival included: largest priority value, the latest queued among equals
            std::size_t worst = 0;
            for (std::size_t i = 1; i < m_meta.size(); i++)
            {
                if (m_meta[i].prio >= m_meta[worst].prio)
                {
                    worst = i;
                }
            }
            if (m_meta.empty() || prio >= m_meta[worst].prio)
            {
                NoteDrop(prio);
                DropBeforeEnqueue(item, "pfabric: lowest priority");
                return false;
            }
            NoteDrop(m_meta[worst].prio);
            m_meta.erase(m_meta.begin() + worst);
            Store()->RemoveAt(worst); // ns-3 counts it dropped after dequeue
        }
        if (!Store()->Enqueue(item))
        {
            return false; // cannot happen: the store holds more than the capacity
        }
        m_meta.push_back({prio, flow});
        if (m_meta.size() > m_counters.maxBacklog)
        {
            m_counters.maxBacklog = uint32_t(m_meta.size());
        }
        return true;
    }

    ns3::Ptr<ns3::QueueDiscItem> DoDequeue() override
    {
        if (m_meta.empty())
        {
            return nullptr;
        }
        Account();
        std::size_t best = 0;
        for (std::size_t i = 1; i < m_meta.size(); i++)
        {
            if (m_meta[i].prio < m_meta[best].prio)
            {
                best = i;
            }
        }
        std::size_t pick = best;
        if (m_meta[best].flow != 0)
        {
            for (std::size_t i = 0; i < best; i++)
            {
                if (m_meta[i].flow == m_meta[best].flow)
                {
                    pick = i; // the flow's earliest queued packet
                    break;
                }
            }
        }
        m_meta.erase(m_meta.begin() + pick);
        ns3::Ptr<ns3::QueueDiscItem> item = Store()->DequeueAt(pick);
        CountTransmitted(m_counters, item);
        return item;
    }

    bool CheckConfig() override
    {
        return ConfigWith(1, [this] {
            auto store = ns3::CreateObject<PfabricStore>();
            store->SetMaxSize(ns3::QueueSize(ns3::QueueSizeUnit::PACKETS, m_capacity + 1));
            AddInternalQueue(store);
        });
    }

    std::deque<Meta> m_meta; // in the store's order
    QueueCounters m_counters;
    QueueCounters m_empty;
    std::vector<uint32_t> m_droppedPrios;
};

// A queue disc item as a switch port sees it (tests): a UDP datagram from srcIp to port `dport` whose payload
// is a pFabric header of `type` for `job` with priority `remaining` and `payload` more bytes.
inline ns3::Ptr<ns3::QueueDiscItem>
MakePfabricItem(uint32_t srcIp, uint16_t dport, uint8_t type, uint32_t job, uint32_t remaining, uint32_t payload)
{
    std::string d = PfabricDatagram(type, job, 0, remaining, 1, 1, payload);
    return PeerItem(reinterpret_cast<const uint8_t*>(d.data()), uint32_t(d.size()), srcIp, dport);
}

// The pFabric priority of a queue disc item (tests): what the switch reads.
inline uint32_t
PfabricPriorityOf(ns3::Ptr<ns3::QueueDiscItem> item)
{
    uint64_t flow;
    return PfabricQueueDisc::Priority(item, &flow);
}

inline ns3::Ptr<PfabricQueueDisc>
InstallPfabricQueueDisc(ns3::Ptr<ns3::NetDevice> device, uint32_t port, uint32_t capacity)
{
    auto qd = ns3::CreateObject<PfabricQueueDisc>();
    qd->Configure(port, capacity);
    return AsRootQueueDisc(device, qd);
}

// One pFabric flow per job: see the file's comment.
class PfabricSender : public PeerSender<PfabricSender>
{
  public:
    static constexpr const char* kTypeName = "netapprox::PfabricSender";

    // streamBytes in packets of mss payload bytes; the receiver needs the first targetBytes.
    void Setup(uint32_t ip, uint32_t job, uint64_t streamBytes, uint64_t targetBytes, uint32_t mss, uint32_t window,
               int64_t rtoNs, uint32_t probeAfter, bool stopAtTarget)
    {
        SetMessage(ip, kPfPort, job, streamBytes, targetBytes, mss);
        m_maxWindow = std::max<uint32_t>(1, window);
        m_cwnd = m_maxWindow;
        m_ssthresh = m_maxWindow;
        m_rto = ns3::NanoSeconds(rtoNs);
        m_probeAfter = probeAfter;
        m_stopAtTarget = stopAtTarget;
        m_acked.assign(m_packets, false);
        m_outstanding.assign(m_packets, false);
    }

    uint64_t Probes() const
    {
        return m_probes;
    }

  private:
    void StartApplication() override
    {
        m_startNs = ns3::Simulator::Now().GetNanoSeconds();
        m_socket = BoundUdpSocket(GetNode(), ns3::MakeCallback(&PfabricSender::OnRecv, this));
        Pump();
        ArmTimer();
    }

    bool Finished() const
    {
        return m_doneNs >= 0 && (m_stopAtTarget || m_ackedCount == m_packets);
    }

    void SendPacket(uint8_t type, uint32_t seq)
    {
        PfHeader h;
        h.type = type;
        h.job = m_job;
        h.seq = seq;
        uint64_t offset = uint64_t(seq) * m_mss;
        h.remaining = uint32_t(std::min<uint64_t>(m_bytes - std::min(offset, m_bytes), 0xFFFFFFFFu));
        h.packets = m_packets;
        h.target = m_target;
        uint32_t payload = 0;
        if (type == kPfData)
        {
            payload = PayloadOf(seq);
        }
        std::vector<uint8_t> buf(kPfHeader + payload, 0);
        h.Write(buf.data());
        m_socket->SendTo(ns3::Create<ns3::Packet>(buf.data(), buf.size()), 0, m_peer);
        if (type == kPfData)
        {
            m_sent++;
        }
        else
        {
            m_probes++;
        }
    }

    // Send while the window allows: retransmissions first, then new packets.
    void Pump()
    {
        if (Finished() || m_probing)
        {
            return;
        }
        while (m_inflight < uint32_t(m_cwnd))
        {
            uint32_t seq;
            if (!m_lost.empty())
            {
                seq = m_lost.front();
                m_lost.pop_front();
                if (m_acked[seq] || m_outstanding[seq])
                {
                    continue;
                }
                m_retx++;
            }
            else if (m_next < m_packets)
            {
                seq = m_next++;
            }
            else
            {
                break;
            }
            m_outstanding[seq] = true;
            m_inflight++;
            SendPacket(kPfData, seq);
        }
    }

    void ArmTimer()
    {
        m_timer.Cancel();
        if (!Finished())
        {
            m_timer = ns3::Simulator::Schedule(m_rto, &PfabricSender::OnTimeout, this);
        }
    }

    void OnTimeout()
    {
        if (Finished())
        {
            return;
        }
        m_timeouts++;
        m_consecutive++;
        for (uint32_t s = 0; s < m_packets; s++)
        {
            if (m_outstanding[s])
            {
                m_outstanding[s] = false;
                m_lost.push_back(s);
            }
        }
        m_inflight = 0;
        m_ssthresh = std::max(2.0, m_cwnd / 2);
        m_cwnd = 1;
        if (m_consecutive >= m_probeAfter)
        {
            m_probing = true;
            SendPacket(kPfProbe, m_lost.empty() ? 0 : m_lost.front());
        }
        else
        {
            Pump();
        }
        ArmTimer();
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        PfHeader h;
        while (NextOwnHeader(s, h))
        {
            if (h.type != kPfAck)
            {
                continue;
            }
            m_consecutive = 0;
            m_probing = false;
            if ((h.flags & kPfFlagDone) && m_doneNs < 0)
            {
                m_doneNs = ns3::Simulator::Now().GetNanoSeconds();
            }
            if (h.seq < m_packets && !m_acked[h.seq])
            {
                m_acked[h.seq] = true;
                m_ackedCount++;
                if (m_outstanding[h.seq])
                {
                    m_outstanding[h.seq] = false;
                    m_inflight--;
                }
                m_cwnd += m_cwnd < m_ssthresh ? 1.0 : 1.0 / m_cwnd;
                m_cwnd = std::min(m_cwnd, double(m_maxWindow));
                ArmTimer(); // progress: the timeout counts from the last new acknowledgement
            }
            Pump();
            if (Finished())
            {
                m_timer.Cancel();
            }
        }
    }

    uint32_t m_maxWindow = 1;
    double m_cwnd = 1;
    double m_ssthresh = 1;
    ns3::Time m_rto;
    uint32_t m_probeAfter = 5;
    std::vector<bool> m_acked;
    std::vector<bool> m_outstanding;
    std::deque<uint32_t> m_lost;
    uint32_t m_next = 0;
    uint32_t m_inflight = 0;
    uint32_t m_ackedCount = 0;
    uint32_t m_consecutive = 0;
    bool m_probing = false;
    uint64_t m_probes = 0;
};

// What the peers' receivers share: their address, their flows by (source address, job) with the packets of the
// target prefix that arrived in order and when the whole prefix had, a socket on their port with a large buffer,
// and a timer cancelled when the application stops (Homa's resends, Aeolus' credits; pFabric's receiver has none).
template <typename Derived, typename Flow>
class PeerReceiver : public SocketApp<Derived>
{
  public:
    // Packets of the flow's prefix that arrived in order (from packet 0 on, without a gap).
    uint32_t Contiguous(uint32_t srcIp, uint32_t job) const
    {
        auto it = m_flows.find(FlowKey(srcIp, job));
        return it == m_flows.end() ? 0 : it->second.contiguous;
    }

    int64_t TargetNs(uint32_t srcIp, uint32_t job) const
    {
        auto it = m_flows.find(FlowKey(srcIp, job));
        return it == m_flows.end() ? -1 : it->second.targetNs;
    }

  protected:
    static uint64_t FlowKey(uint32_t srcIp, uint32_t job)
    {
        return (uint64_t(srcIp) << 32) | job;
    }

    // The receiving socket, on this host's address and `port`, delivering to `onRecv`.
    void Listen(uint16_t port, ns3::Callback<void, ns3::Ptr<ns3::Socket>> onRecv)
    {
        auto socket = ns3::Socket::CreateSocket(this->GetNode(), ns3::UdpSocketFactory::GetTypeId());
        socket->SetAttribute("RcvBufSize", ns3::UintegerValue(64u << 20));
        socket->Bind(ns3::InetSocketAddress(ns3::Ipv4Address(m_ip), port));
        socket->SetRecvCallback(onRecv);
        this->m_socket = socket;
    }

    void StopApplication() override
    {
        m_timer.Cancel();
        SocketApp<Derived>::StopApplication();
    }

    uint32_t m_ip = 0;
    std::unordered_map<uint64_t, Flow> m_flows;
    ns3::EventId m_timer;
};

// A flow at a pFabric receiver: which of its packets arrived, how many of the target prefix.
struct PfabricFlow
{
    std::vector<bool> got;
    uint32_t inTarget = 0;
    uint32_t contiguous = 0;
    int64_t targetNs = -1;
};

class PfabricReceiver : public PeerReceiver<PfabricReceiver, PfabricFlow>
{
  public:
    static constexpr const char* kTypeName = "netapprox::PfabricReceiver";

    void Setup(uint32_t ip)
    {
        m_ip = ip;
    }

    uint64_t Duplicates() const
    {
        return m_duplicates;
    }

  private:
    void StartApplication() override
    {
        Listen(kPfPort, ns3::MakeCallback(&PfabricReceiver::OnRecv, this));
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        ns3::Address from;
        PfHeader h;
        while (NextPeerHeader(s, h, &from))
        {
            if (h.type == kPfAck || h.packets == 0 || h.packets > (1u << 24) || h.target > h.packets)
            {
                continue;
            }
            auto src = ns3::InetSocketAddress::ConvertFrom(from);
            PfabricFlow& f = m_flows[(uint64_t(src.GetIpv4().Get()) << 32) | h.job];
            if (f.got.empty())
            {
                f.got.assign(h.packets, false);
            }
            if (h.type == kPfData && h.seq < f.got.size())
            {
                if (f.got[h.seq])
                {
                    m_duplicates++;
                }
                else
                {
                    f.got[h.seq] = true;
                    f.inTarget += h.seq < h.target;
                    while (f.contiguous < f.got.size() && f.got[f.contiguous])
                    {
                        f.contiguous++;
                    }
                    if (f.targetNs < 0 && f.inTarget >= h.target)
                    {
                        f.targetNs = ns3::Simulator::Now().GetNanoSeconds();
                    }
                }
            }
            PfHeader ack;
            ack.type = kPfAck;
            ack.flags = f.targetNs >= 0 ? kPfFlagDone : 0;
            ack.job = h.job;
            ack.seq = h.type == kPfData ? h.seq : 0xFFFFFFFFu;
            uint8_t out[kPfHeader];
            ack.Write(out);
            s->SendTo(ns3::Create<ns3::Packet>(out, kPfHeader), 0, from);
        }
    }

    uint64_t m_duplicates = 0;
};


// ---------------------------------------------------------------------------------------------------------
// Homa (Montazeri et al., SIGCOMM 2018). Its packets are UDP datagrams to port kHomaPort with a 24-byte header:
//   magic 'H' | type (1: DATA, 2: GRANT, 3: RESEND, 4: DONE) | prio (the switch queue the packet travels in,
//   0 = the highest) | grant prio (GRANT: the level the granted packets are to use) | job (4) |
//   seq (4: DATA the packet index; RESEND the first packet to send again) | packets (4) | target (4) |
//   value (4: GRANT the packets granted, an exclusive limit; RESEND how many from seq)
// - HomaQueueDisc: 8 strict-priority FIFOs sharing one port buffer (drop tail when it is full); a Homa packet
//   goes to its prio byte, anything else to queue 0. No per-flow state.
// - HomaSender: one message per job. The first `rttPackets` (RTTbytes) leave at once at the message's
//   unscheduled level (`unschedPrio`, from the workload's cut-offs); the rest only as GRANTs allow, at the
//   level each grant names. RESENDs are answered; after `timeoutNs` without word from the receiver the first
//   unacknowledged packet is sent again (the receiver then learns of the message and asks for what it lacks).
// - HomaReceiver: grants to the `overcommit` active messages with the fewest packets still to come, each up to
//   what it received plus RTTbytes; the one with the fewest left gets the highest scheduled level, the others
//   the next lower ones, from the lowest level up when fewer are active (Homa's §3.4); every `resendNs` a
//   message that made no progress is asked for its missing granted packets (RESEND). DONE when the target
//   prefix arrived.
constexpr uint16_t kHomaPort = 7900;
constexpr uint8_t kHomaMagic = 'H';
constexpr uint8_t kHomaData = 1;
constexpr uint8_t kHomaGrant = 2;
constexpr uint8_t kHomaResend = 3;
constexpr uint8_t kHomaDone = 4;

struct HomaHeader : PeerWords
{
    uint8_t type = 0;
    uint8_t prio = 0;
    uint8_t grantPrio = 0;
    uint32_t value = 0;

    void Write(uint8_t* b) const
    {
        PutPeerHeader(b, kHomaMagic, type, prio, grantPrio, {job, seq, packets, target, value});
    }

    bool Read(const uint8_t* b)
    {
        uint32_t v[5];
        if (!GetPeerHeader(b, kHomaMagic, kHomaData, kHomaDone, v) || b[2] >= kQueues || b[3] >= kQueues)
        {
            return false;
        }
        type = b[1];
        prio = b[2];
        grantPrio = b[3];
        job = v[0], seq = v[1], packets = v[2], target = v[3], value = v[4];
        return true;
    }
};

inline void
HomaSend(ns3::Ptr<ns3::Socket> s, const HomaHeader& h, uint32_t payload, const ns3::Address& to)
{
    std::vector<uint8_t> buf(kPfHeader + payload, 0);
    h.Write(buf.data());
    s->SendTo(ns3::Create<ns3::Packet>(buf.data(), buf.size()), 0, to);
}

class HomaQueueDisc : public LeveledQueueDisc
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::HomaQueueDisc")
                                     .SetParent<ns3::QueueDisc>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    // The queue of a packet: a Homa packet's prio byte, anything else 0.
    static int Level(ns3::Ptr<ns3::QueueDiscItem> item)
    {
        uint8_t b[kUdpHeader + kPeerHeader];
        uint32_t src = 0;
        HomaHeader hh;
        return PeerDatagramOf(item, kHomaPort, b, &src) && hh.Read(b + kUdpHeader) ? hh.prio : 0;
    }

  private:
    bool DoEnqueue(ns3::Ptr<ns3::QueueDiscItem> item) override
    {
        Account();
        int q = Level(item);
        QueueCounters& c = m_counters[q];
        c.enqueued++;
        if (m_total >= m_capacity)
        {
            c.dropped++;
            DropBeforeEnqueue(item, "homa: port buffer full");
            return false;
        }
        if (!GetInternalQueue(q)->Enqueue(item))
        {
            return false;
        }
        m_len[q]++;
        m_total++;
        c.maxBacklog = std::max(c.maxBacklog, m_len[q]);
        return true;
    }

    ns3::Ptr<ns3::QueueDiscItem> DoDequeue() override
    {
        for (int q = 0; q < kQueues; q++)
        {
            if (m_len[q] == 0)
            {
                continue;
            }
            auto item = GetInternalQueue(q)->Dequeue();
            if (item)
            {
                Account();
                m_len[q]--;
                m_total--;
                CountTransmitted(m_counters[q], item);
                return item;
            }
        }
        return nullptr;
    }

    bool CheckConfig() override
    {
        return ConfigWith(kQueues, [this] {
            for (int q = 0; q < kQueues; q++)
            {
                AddFifo(m_capacity + 1);
            }
        });
    }

    uint32_t m_total = 0;
};

inline ns3::Ptr<HomaQueueDisc>
InstallHomaQueueDisc(ns3::Ptr<ns3::NetDevice> device, uint32_t port, uint32_t capacity)
{
    auto qd = ns3::CreateObject<HomaQueueDisc>();
    qd->Configure(port, capacity);
    return AsRootQueueDisc(device, qd);
}

// A Homa packet as a switch port sees it (tests).
inline ns3::Ptr<ns3::QueueDiscItem>
MakeHomaItem(uint32_t srcIp, uint8_t type, uint8_t prio, uint32_t job, uint32_t payload)
{
    std::vector<uint8_t> buf(kPfHeader + payload, 0);
    HomaHeader h;
    h.type = type;
    h.prio = prio;
    h.job = job;
    h.packets = 1;
    h.target = 1;
    h.Write(buf.data());
    return PeerItem(buf.data(), uint32_t(buf.size()), srcIp, kHomaPort);
}

inline int
HomaLevelOf(ns3::Ptr<ns3::QueueDiscItem> item)
{
    return HomaQueueDisc::Level(item);
}

class HomaSender : public PeerSender<HomaSender>
{
  public:
    static constexpr const char* kTypeName = "netapprox::HomaSender";

    void Setup(uint32_t ip, uint32_t job, uint64_t streamBytes, uint64_t targetBytes, uint32_t mss,
               uint32_t rttPackets, uint8_t unschedPrio, int64_t timeoutNs, bool stopAtTarget)
    {
        SetMessage(ip, kHomaPort, job, streamBytes, targetBytes, mss);
        m_granted = std::min(m_packets, std::max<uint32_t>(1, rttPackets));
        m_unschedPrio = unschedPrio;
        m_schedPrio = kQueues - 1;
        m_timeout = ns3::NanoSeconds(timeoutNs);
        m_stopAtTarget = stopAtTarget;
        m_unsched = m_granted;
    }

    uint64_t Grants() const
    {
        return m_grants;
    }

    uint32_t Granted() const
    {
        return m_granted;
    }

    // Levels the DATA packets left at (tests): packets sent at level q.
    uint64_t SentAt(int q) const
    {
        return q >= 0 && q < kQueues ? m_sentAt[q] : 0;
    }

  private:
    friend class PeerSender<HomaSender>; // Timeout()

    void StartApplication() override
    {
        m_startNs = ns3::Simulator::Now().GetNanoSeconds();
        m_socket = BoundUdpSocket(GetNode(), ns3::MakeCallback(&HomaSender::OnRecv, this));
        Pump();
        Arm();
    }

    void SendData(uint32_t seq, bool retx)
    {
        HomaHeader h;
        h.type = kHomaData;
        h.prio = seq < m_unsched ? m_unschedPrio : m_schedPrio;
        h.job = m_job;
        h.seq = seq;
        h.packets = m_packets;
        h.target = m_target;
        uint32_t payload = PayloadOf(seq);
        HomaSend(m_socket, h, payload, m_peer);
        m_sent++;
        m_sentAt[h.prio]++;
        m_retx += retx;
    }

    void Pump()
    {
        while (!Finished() && m_doneNs < 0 && m_next < m_granted)
        {
            SendData(m_next++, false);
        }
    }

    void Timeout()
    {
        SendData(0, true); // the receiver may know nothing of this message: it asks for the rest (RESEND)
        Arm();
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        HomaHeader h;
        while (NextOwnHeader(s, h))
        {
            Arm();
            if (h.type == kHomaDone)
            {
                NoteDone();
                continue;
            }
            if (m_doneNs >= 0)
            {
                continue;
            }
            if (h.type == kHomaGrant)
            {
                m_grants++;
                m_schedPrio = h.grantPrio;
                m_granted = std::max(m_granted, std::min(h.value, m_packets));
                Pump();
            }
            else if (h.type == kHomaResend)
            {
                uint32_t end = uint32_t(std::min<uint64_t>(uint64_t(h.seq) + h.value, m_next));
                for (uint32_t q = h.seq; q < end; q++)
                {
                    SendData(q, true);
                }
            }
        }
    }

    uint32_t m_granted = 1;
    uint32_t m_unsched = 1;
    uint32_t m_next = 0;
    uint8_t m_unschedPrio = 0;
    uint8_t m_schedPrio = kQueues - 1;
    uint64_t m_grants = 0;
    uint64_t m_sentAt[kQueues] = {};
};

// A message at a Homa receiver: which of its packets arrived, how many of the target prefix, what was granted.
struct HomaMsg
{
    ns3::Address from;
    uint32_t job = 0;
    std::vector<bool> got;
    uint32_t received = 0;
    uint32_t inTarget = 0;
    uint32_t target = 0;
    uint32_t contiguous = 0;
    uint32_t granted = 0;
    int64_t targetNs = -1;
    int64_t progressNs = 0;
};

class HomaReceiver : public PeerReceiver<HomaReceiver, HomaMsg>
{
  public:
    static constexpr const char* kTypeName = "netapprox::HomaReceiver";

    // Scheduled levels are firstSched..7 (0..firstSched-1 carry unscheduled packets).
    void Setup(uint32_t ip, uint32_t rttPackets, uint32_t overcommit, uint8_t firstSched, int64_t resendNs)
    {
        m_ip = ip;
        m_rtt = std::max<uint32_t>(1, rttPackets);
        m_overcommit = std::max<uint32_t>(1, overcommit);
        m_firstSched = std::min<uint8_t>(firstSched, kQueues - 1);
        m_resend = ns3::NanoSeconds(resendNs);
    }

    uint64_t GrantsSent() const
    {
        return m_grantsSent;
    }

    uint64_t Resends() const
    {
        return m_resends;
    }

    // The most messages granted at once (tests: never above the overcommitment degree).
    uint32_t MaxGrantedAtOnce() const
    {
        return m_maxGrantedAtOnce;
    }

    // Grants sent at level q (tests).
    uint64_t GrantsAt(int q) const
    {
        return q >= 0 && q < kQueues ? m_grantsAt[q] : 0;
    }

  private:
    void StartApplication() override
    {
        Listen(kHomaPort, ns3::MakeCallback(&HomaReceiver::OnRecv, this));
    }

    void Reply(HomaMsg& m, uint8_t type, uint8_t grantPrio, uint32_t seq, uint32_t value)
    {
        HomaHeader h;
        h.type = type;
        h.prio = 0;
        h.grantPrio = grantPrio;
        h.job = m.job;
        h.seq = seq;
        h.packets = uint32_t(m.got.size());
        h.target = m.target;
        h.value = value;
        HomaSend(m_socket, h, 0, m.from);
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        ns3::Address from;
        HomaHeader h;
        while (NextPeerHeader(s, h, &from))
        {
            if (h.type != kHomaData || h.packets == 0 || h.packets > (1u << 24) || h.target > h.packets ||
                h.seq >= h.packets)
            {
                continue;
            }
            auto src = ns3::InetSocketAddress::ConvertFrom(from);
            uint64_t key = (uint64_t(src.GetIpv4().Get()) << 32) | h.job;
            HomaMsg& m = m_flows[key];
            if (m.got.empty())
            {
                m.from = from;
                m.job = h.job;
                m.got.assign(h.packets, false);
                m.target = h.target;
                m.granted = std::min(h.packets, m_rtt);
                m_active.push_back(key);
            }
            if (m.targetNs >= 0)
            {
                Reply(m, kHomaDone, 0, 0, 0);
                continue;
            }
            if (!m.got[h.seq])
            {
                m.got[h.seq] = true;
                m.received++;
                m.inTarget += h.seq < m.target;
                m.progressNs = ns3::Simulator::Now().GetNanoSeconds();
                while (m.contiguous < m.got.size() && m.got[m.contiguous])
                {
                    m.contiguous++;
                }
            }
            if (m.inTarget >= m.target)
            {
                m.targetNs = ns3::Simulator::Now().GetNanoSeconds();
                Reply(m, kHomaDone, 0, 0, 0);
                m_active.erase(std::remove(m_active.begin(), m_active.end(), key), m_active.end());
            }
            Schedule();
        }
    }

    // Grants: the `overcommit` active messages with the fewest packets to come, SRPT levels.
    void Schedule()
    {
        std::vector<std::pair<uint32_t, uint64_t>> order;
        for (uint64_t key : m_active)
        {
            HomaMsg& m = m_flows[key];
            if (m.granted < m.got.size())
            {
                order.push_back({uint32_t(m.got.size()) - m.received, key});
            }
        }
        std::sort(order.begin(), order.end());
        uint32_t n = std::min<uint32_t>(uint32_t(order.size()), m_overcommit);
        m_maxGrantedAtOnce = std::max(m_maxGrantedAtOnce, n);
        for (uint32_t i = 0; i < n; i++)
        {
            HomaMsg& m = m_flows[order[i].second];
            int level = int(kQueues) - int(n) + int(i);
            uint8_t prio = uint8_t(std::max<int>(m_firstSched, level));
            uint32_t limit = std::min<uint32_t>(uint32_t(m.got.size()), m.received + m_rtt);
            if (limit > m.granted)
            {
                m.granted = limit;
                Reply(m, kHomaGrant, prio, 0, limit);
                m_grantsSent++;
                m_grantsAt[prio]++;
            }
        }
        if (!m_active.empty() && !m_timer.IsPending())
        {
            m_timer = ns3::Simulator::Schedule(m_resend, &HomaReceiver::OnResendTimer, this);
        }
    }

    // Messages without progress for a resend interval: ask for the granted packets still missing.
    void OnResendTimer()
    {
        int64_t now = ns3::Simulator::Now().GetNanoSeconds();
        for (uint64_t key : m_active)
        {
            HomaMsg& m = m_flows[key];
            if (now - m.progressNs < m_resend.GetNanoSeconds())
            {
                continue;
            }
            uint32_t limit = std::min<uint32_t>(m.granted, uint32_t(m.got.size()));
            uint32_t first = m.contiguous;
            if (first >= limit)
            {
                continue;
            }
            Reply(m, kHomaResend, 0, first, limit - first);
            m_resends++;
            m.progressNs = now;
        }
        if (!m_active.empty())
        {
            m_timer = ns3::Simulator::Schedule(m_resend, &HomaReceiver::OnResendTimer, this);
        }
    }

    uint32_t m_rtt = 1;
    uint32_t m_overcommit = 1;
    uint8_t m_firstSched = 1;
    ns3::Time m_resend;
    std::vector<uint64_t> m_active;
    uint64_t m_grantsSent = 0;
    uint64_t m_resends = 0;
    uint32_t m_maxGrantedAtOnce = 0;
    uint64_t m_grantsAt[kQueues] = {};
};

// Aeolus (Hu et al., SIGCOMM 2020) on ExpressPass-style credits (Cho et al., SIGCOMM 2017). Its packets are UDP
// datagrams to port kAeolusPort with a 24-byte header:
//   magic 'A' | type (1: DATA, 2: CREDIT, 3: ACK, 4: REQUEST, 5: STOP, 6: DONE, 7: PROBE) |
//   flags (bit 0: DATA unscheduled; ACK: acknowledges a PROBE) | reserved | job (4) |
//   seq (4: DATA the packet index; ACK the packet or PROBE acknowledged; PROBE the first packet after it) |
//   packets (4) | target (4) | value (4: unused)
// - AeolusQueueDisc: per port a credit queue of `creditQueue` credits (drop tail) served at most once per
//   `creditGapNs` (one data packet plus one credit at the port's rate, so the data the credits call back fills
//   the reverse link and no more: ExpressPass's credit rate limiter), and one FIFO of `capacity` packets for
//   everything else. An unscheduled DATA packet finding `threshold` or more packets in the FIFO is dropped
//   (Aeolus' selective dropping); scheduled packets and control use the whole buffer. Counters: the FIFO in
//   queue 0, credits in queue 7.
// - AeolusSender: one message per job. At start a REQUEST (the receiver starts crediting), then, with Aeolus,
//   the first `unschedPackets` (one BDP) at once marked unscheduled followed by a PROBE (scheduled: it is not
//   dropped selectively, so its ACK says every unscheduled packet before it arrived or was dropped). Every
//   CREDIT sends one packet: a lost one first, else the next new one. Losses: an unscheduled packet not
//   acknowledged when the PROBE's ACK arrives (Aeolus' recovery, resent with credits, scheduled); after
//   `timeoutNs` without a new ACK (credits do not count) every unacknowledged packet (then a REQUEST again,
//   and a STOP if that leaves nothing: either may have been lost). A STOP
//   when nothing is left to send; a REQUEST when losses make more to send. Done at the receiver's DONE.
// - AeolusReceiver: acknowledges every DATA packet and PROBE; sends CREDITs one per `creditGapNs` round
//   robin over its flows that asked (REQUEST, or the first packet of a flow) and did not STOP; DONE when the target prefix arrived. No
//   ExpressPass credit feedback control: a flow's credits are limited by the switches' credit queues only.
constexpr uint16_t kAeolusPort = 8000;
constexpr uint8_t kAeMagic = 'A';
constexpr uint8_t kAeData = 1;
constexpr uint8_t kAeCredit = 2;
constexpr uint8_t kAeAck = 3;
constexpr uint8_t kAeRequest = 4;
constexpr uint8_t kAeStop = 5;
constexpr uint8_t kAeDone = 6;
constexpr uint8_t kAeProbe = 7;
constexpr uint8_t kAeUnsched = 1;
constexpr uint8_t kAeProbeAck = 1;
constexpr uint32_t kAeCreditWire = kPeerHeader + kUdpHeader + 20 + 2; // a credit on the wire (IP, PPP)

struct AeHeader : PeerWords
{
    uint8_t type = 0;
    uint8_t flags = 0;
    uint32_t value = 0;

    void Write(uint8_t* b) const
    {
        PutPeerHeader(b, kAeMagic, type, flags, 0, {job, seq, packets, target, value});
    }

    bool Read(const uint8_t* b)
    {
        uint32_t v[5];
        if (!GetPeerHeader(b, kAeMagic, kAeData, kAeProbe, v))
        {
            return false;
        }
        type = b[1];
        flags = b[2];
        job = v[0], seq = v[1], packets = v[2], target = v[3], value = v[4];
        return true;
    }
};

inline void
AeSend(ns3::Ptr<ns3::Socket> s, const AeHeader& h, uint32_t payload, const ns3::Address& to)
{
    std::vector<uint8_t> buf(kPeerHeader + payload, 0);
    h.Write(buf.data());
    s->SendTo(ns3::Create<ns3::Packet>(buf.data(), buf.size()), 0, to);
}

// The gap between two credits on a link of `bps`: one full data packet (`mtu` + PPP) and one credit.
inline int64_t
AeolusCreditGapNs(double bps, uint32_t mtu)
{
    return int64_t(std::ceil((mtu + 2 + kAeCreditWire) * 8.0 / bps * 1e9));
}

class AeolusQueueDisc : public LeveledQueueDisc
{
  public:
    static constexpr int kCreditQ = kQueues - 1;

    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::AeolusQueueDisc")
                                     .SetParent<ns3::QueueDisc>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    // `wake`: the disc sits on a device and restarts itself when a credit waited for its gap (tests: false).
    void Configure(uint32_t port, uint32_t capacity, uint32_t threshold, uint32_t creditQueue, int64_t creditGapNs,
                   bool wake)
    {
        LeveledQueueDisc::Configure(port, capacity);
        m_threshold = threshold;
        m_creditQueue = creditQueue;
        m_gapNs = creditGapNs;
        m_wake = wake;
    }

    uint64_t UnscheduledDrops() const
    {
        return m_unschedDrops;
    }

    uint64_t CreditDrops() const
    {
        return m_counters[kCreditQ].dropped;
    }

    // An Aeolus packet's type and flags, 0 for anything else.
    static uint8_t TypeOf(ns3::Ptr<ns3::QueueDiscItem> item, uint8_t* flags)
    {
        uint8_t b[kUdpHeader + kPeerHeader];
        uint32_t src = 0;
        AeHeader h;
        if (!PeerDatagramOf(item, kAeolusPort, b, &src) || !h.Read(b + kUdpHeader))
        {
            return 0;
        }
        *flags = h.flags;
        return h.type;
    }

  private:
    bool DoEnqueue(ns3::Ptr<ns3::QueueDiscItem> item) override
    {
        Account();
        uint8_t flags = 0;
        uint8_t type = TypeOf(item, &flags);
        int q = type == kAeCredit ? kCreditQ : 0;
        QueueCounters& c = m_counters[q];
        c.enqueued++;
        if (q == kCreditQ && m_len[q] >= m_creditQueue)
        {
            c.dropped++;
            DropBeforeEnqueue(item, "aeolus: credit queue full");
            return false;
        }
        if (q == 0 && type == kAeData && (flags & kAeUnsched) && m_len[0] >= m_threshold)
        {
            c.dropped++;
            m_unschedDrops++;
            DropBeforeEnqueue(item, "aeolus: unscheduled packet above the threshold");
            return false;
        }
        if (q == 0 && m_len[0] >= m_capacity)
        {
            c.dropped++;
            DropBeforeEnqueue(item, "aeolus: port buffer full");
            return false;
        }
        if (!GetInternalQueue(q == 0 ? 0 : 1)->Enqueue(item))
        {
            return false;
        }
        m_len[q]++;
        c.maxBacklog = std::max(c.maxBacklog, m_len[q]);
        return true;
    }

    ns3::Ptr<ns3::QueueDiscItem> Take(int q)
    {
        auto item = GetInternalQueue(q == 0 ? 0 : 1)->Dequeue();
        if (item)
        {
            Account();
            m_len[q]--;
            CountTransmitted(m_counters[q], item);
        }
        return item;
    }

    ns3::Ptr<ns3::QueueDiscItem> DoDequeue() override
    {
        int64_t now = ns3::Simulator::Now().GetNanoSeconds();
        if (m_len[kCreditQ] > 0 && now >= m_nextCreditNs)
        {
            m_nextCreditNs = now + m_gapNs;
            return Take(kCreditQ);
        }
        if (m_len[0] > 0)
        {
            return Take(0);
        }
        if (m_len[kCreditQ] > 0 && m_wake && !m_wakeEvent.IsPending())
        {
            m_wakeEvent = ns3::Simulator::Schedule(ns3::NanoSeconds(m_nextCreditNs - now), &AeolusQueueDisc::Run, this);
        }
        return nullptr;
    }

    bool CheckConfig() override
    {
        return m_creditQueue > 0 && ConfigWith(2, [this] {
            AddFifo(m_capacity + 1);     // the FIFO (queue 0)
            AddFifo(m_creditQueue + 1);  // the credits (kCreditQ)
        });
    }

    void DoDispose() override
    {
        m_wakeEvent.Cancel();
        ns3::QueueDisc::DoDispose();
    }

    uint32_t m_threshold = 1;
    uint32_t m_creditQueue = 8;
    int64_t m_gapNs = 0;
    int64_t m_nextCreditNs = 0;
    bool m_wake = false;
    ns3::EventId m_wakeEvent;
    uint64_t m_unschedDrops = 0;
};

// An Aeolus queue disc on `device`, its credit gap from the device's rate.
inline ns3::Ptr<AeolusQueueDisc>
InstallAeolusQueueDisc(ns3::Ptr<ns3::NetDevice> device, uint32_t port, uint32_t capacity, uint32_t threshold,
                       uint32_t creditQueue)
{
    ns3::DataRateValue rate;
    device->GetAttribute("DataRate", rate);
    auto qd = ns3::CreateObject<AeolusQueueDisc>();
    qd->Configure(port, capacity, threshold, creditQueue,
                  AeolusCreditGapNs(double(rate.Get().GetBitRate()), device->GetMtu()), true);
    return AsRootQueueDisc(device, qd);
}

// An Aeolus packet as a switch port sees it (tests).
inline ns3::Ptr<ns3::QueueDiscItem>
MakeAeolusItem(uint32_t srcIp, uint8_t type, uint8_t flags, uint32_t job, uint32_t payload)
{
    std::vector<uint8_t> buf(kPeerHeader + payload, 0);
    AeHeader h;
    h.type = type;
    h.flags = flags;
    h.job = job;
    h.packets = 1;
    h.target = 1;
    h.Write(buf.data());
    return PeerItem(buf.data(), uint32_t(buf.size()), srcIp, kAeolusPort);
}

inline int
AeolusTypeOf(ns3::Ptr<ns3::QueueDiscItem> item)
{
    uint8_t flags = 0;
    return AeolusQueueDisc::TypeOf(item, &flags);
}

class AeolusSender : public PeerSender<AeolusSender>
{
  public:
    static constexpr const char* kTypeName = "netapprox::AeolusSender";

    // `unschedPackets` 0: ExpressPass (nothing before the first credit).
    void Setup(uint32_t ip, uint32_t job, uint64_t streamBytes, uint64_t targetBytes, uint32_t mss,
               uint32_t unschedPackets, int64_t timeoutNs, bool stopAtTarget)
    {
        SetMessage(ip, kAeolusPort, job, streamBytes, targetBytes, mss);
        m_unsched = std::min(m_packets, unschedPackets);
        m_timeout = ns3::NanoSeconds(timeoutNs);
        m_stopAtTarget = stopAtTarget;
        m_acked.assign(m_packets, false);
        m_queued.assign(m_packets, false);
    }

    uint64_t Credits() const
    {
        return m_credits;
    }

    uint64_t CreditsWasted() const
    {
        return m_wasted;
    }

    uint64_t UnscheduledSent() const
    {
        return m_unschedSent;
    }

    uint64_t ProbeLosses() const
    {
        return m_probeLosses;
    }

  private:
    friend class PeerSender<AeolusSender>; // Timeout()

    void StartApplication() override
    {
        m_startNs = ns3::Simulator::Now().GetNanoSeconds();
        m_socket = BoundUdpSocket(GetNode(), ns3::MakeCallback(&AeolusSender::OnRecv, this));
        Control(kAeRequest, 0, 0);
        m_asking = true;
        for (; m_next < m_unsched; m_next++)
        {
            SendData(m_next, true, false);
        }
        if (m_unsched > 0)
        {
            Control(kAeProbe, 0, m_unsched);
        }
        MaybeStop();
        Arm();
    }

    void Control(uint8_t type, uint8_t flags, uint32_t seq)
    {
        AeHeader h;
        h.type = type;
        h.flags = flags;
        h.job = m_job;
        h.seq = seq;
        h.packets = m_packets;
        h.target = m_target;
        AeSend(m_socket, h, 0, m_peer);
    }

    void SendData(uint32_t seq, bool unsched, bool retx)
    {
        AeHeader h;
        h.type = kAeData;
        h.flags = unsched ? kAeUnsched : 0;
        h.job = m_job;
        h.seq = seq;
        h.packets = m_packets;
        h.target = m_target;
        AeSend(m_socket, h, PayloadOf(seq), m_peer);
        m_sent++;
        m_unschedSent += unsched;
        m_retx += retx;
    }

    void Lose(uint32_t seq)
    {
        if (!m_acked[seq] && !m_queued[seq])
        {
            m_queued[seq] = true;
            m_lost.push_back(seq);
        }
    }

    // Nothing left to send: the receiver may stop crediting; something again: it is asked to resume.
    void MaybeStop()
    {
        bool more = !Finished() && (m_next < m_packets || !m_lost.empty());
        if (more && !m_asking)
        {
            Control(kAeRequest, 0, 0);
            m_asking = true;
        }
        else if (!more && m_asking)
        {
            Control(kAeStop, 0, 0);
            m_asking = false;
        }
    }

    void OnCredit()
    {
        m_credits++;
        while (!m_lost.empty() && m_acked[m_lost.front()])
        {
            m_queued[m_lost.front()] = false;
            m_lost.pop_front();
        }
        if (!m_lost.empty())
        {
            uint32_t seq = m_lost.front();
            m_lost.pop_front();
            m_queued[seq] = false;
            SendData(seq, false, true);
        }
        else if (m_next < m_packets)
        {
            SendData(m_next++, false, false);
        }
        else
        {
            m_wasted++;
        }
        MaybeStop();
    }

    void Timeout()
    {
        for (uint32_t q = 0; q < m_next; q++)
        {
            Lose(q);
        }
        m_asking = false; // the REQUEST or STOP may be what was lost: ask again
        Control(kAeRequest, 0, 0);
        m_asking = true;
        MaybeStop();
        Arm();
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        AeHeader h;
        while (NextOwnHeader(s, h))
        {
            if (h.type == kAeDone)
            {
                NoteDone();
                if (m_asking && m_stopAtTarget)
                {
                    m_asking = false;
                }
                continue;
            }
            if (m_doneNs >= 0 && m_stopAtTarget)
            {
                continue;
            }
            if (h.type == kAeCredit)
            {
                OnCredit(); // credits alone are no progress: a flow whose packets were lost keeps its timer
            }
            else if (h.type == kAeAck && (h.flags & kAeProbeAck))
            {
                Arm();
                // FIFO behind the unscheduled packets: those not acknowledged by now were dropped
                uint32_t end = std::min(h.seq, m_next);
                for (uint32_t q = 0; q < end; q++)
                {
                    if (!m_acked[q] && !m_queued[q])
                    {
                        m_probeLosses++;
                    }
                    Lose(q);
                }
                MaybeStop();
            }
            else if (h.type == kAeAck && h.seq < m_packets && !m_acked[h.seq])
            {
                m_acked[h.seq] = true;
                Arm();
            }
        }
    }

    uint32_t m_unsched = 0;
    uint32_t m_next = 0;
    std::vector<bool> m_acked;
    std::vector<bool> m_queued;
    std::deque<uint32_t> m_lost;
    bool m_asking = false;
    uint64_t m_credits = 0;
    uint64_t m_wasted = 0;
    uint64_t m_unschedSent = 0;
    uint64_t m_probeLosses = 0;
};

// A flow at an Aeolus receiver: which of its packets arrived, how many of the target prefix, whether it is credited.
struct AeolusFlow
{
    ns3::Address from;
    uint32_t job = 0;
    std::vector<bool> got;
    uint32_t inTarget = 0;
    uint32_t target = 0;
    uint32_t contiguous = 0;
    int64_t targetNs = -1;
    bool crediting = false;
};

class AeolusReceiver : public PeerReceiver<AeolusReceiver, AeolusFlow>
{
  public:
    static constexpr const char* kTypeName = "netapprox::AeolusReceiver";

    void Setup(uint32_t ip, int64_t creditGapNs)
    {
        m_ip = ip;
        m_gap = ns3::NanoSeconds(std::max<int64_t>(1, creditGapNs));
    }

    uint64_t CreditsSent() const
    {
        return m_creditsSent;
    }

  private:
    void StartApplication() override
    {
        Listen(kAeolusPort, ns3::MakeCallback(&AeolusReceiver::OnRecv, this));
    }

    void Reply(AeolusFlow& f, uint8_t type, uint8_t flags, uint32_t seq)
    {
        AeHeader h;
        h.type = type;
        h.flags = flags;
        h.job = f.job;
        h.seq = seq;
        h.packets = uint32_t(f.got.size());
        h.target = f.target;
        AeSend(m_socket, h, 0, f.from);
    }

    void Credit(uint64_t key, bool on)
    {
        AeolusFlow& f = m_flows[key];
        if (on == f.crediting)
        {
            return;
        }
        f.crediting = on;
        if (on)
        {
            m_active.push_back(key);
            if (!m_timer.IsPending())
            {
                m_timer = ns3::Simulator::ScheduleNow(&AeolusReceiver::OnCreditTimer, this);
            }
        }
        else
        {
            m_active.erase(std::remove(m_active.begin(), m_active.end(), key), m_active.end());
        }
    }

    void OnCreditTimer()
    {
        if (m_active.empty())
        {
            return;
        }
        m_rr = m_rr % m_active.size();
        Reply(m_flows[m_active[m_rr]], kAeCredit, 0, 0);
        m_creditsSent++;
        m_rr++;
        m_timer = ns3::Simulator::Schedule(m_gap, &AeolusReceiver::OnCreditTimer, this);
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        ns3::Address from;
        AeHeader h;
        while (NextPeerHeader(s, h, &from))
        {
            if (h.type == kAeCredit || h.type == kAeAck || h.type == kAeDone || h.packets == 0 ||
                h.packets > (1u << 24) || h.target > h.packets || (h.type == kAeData && h.seq >= h.packets))
            {
                continue;
            }
            auto src = ns3::InetSocketAddress::ConvertFrom(from);
            uint64_t key = (uint64_t(src.GetIpv4().Get()) << 32) | h.job;
            AeolusFlow& f = m_flows[key];
            bool first = f.got.empty();
            if (first)
            {
                f.from = from;
                f.job = h.job;
                f.got.assign(h.packets, false);
                f.target = h.target;
            }
            if (h.type == kAeData)
            {
                Reply(f, kAeAck, 0, h.seq);
                if (h.seq < f.got.size() && !f.got[h.seq])
                {
                    f.got[h.seq] = true;
                    f.inTarget += h.seq < f.target;
                    while (f.contiguous < f.got.size() && f.got[f.contiguous])
                    {
                        f.contiguous++;
                    }
                }
            }
            else if (h.type == kAeProbe)
            {
                Reply(f, kAeAck, kAeProbeAck, h.seq);
            }
            if (f.targetNs < 0 && f.inTarget >= f.target)
            {
                f.targetNs = ns3::Simulator::Now().GetNanoSeconds();
            }
            if (f.targetNs >= 0)
            {
                Reply(f, kAeDone, 0, 0);
                Credit(key, false);
                continue;
            }
            if (h.type == kAeRequest || (first && h.type != kAeStop))
            {
                Credit(key, true); // a flow whose REQUEST was lost is credited from its first packet
            }
            else if (h.type == kAeStop)
            {
                Credit(key, false);
            }
        }
    }

    ns3::Time m_gap;
    std::vector<uint64_t> m_active;
    size_t m_rr = 0;
    uint64_t m_creditsSent = 0;
};

} // namespace netapprox

#endif // NETAPPROX_PEERS_H
