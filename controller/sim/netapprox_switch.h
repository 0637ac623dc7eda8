// NetApprox simulated switch: the logical tables of docs/architecture.md as an ns-3 queue disc.
//
// Loaded at run time into ns-3 (cppyy) by controller/sim/native.py, which first defines the NA_* macros
// below from hostlib.wire (ATP port, header length, field offsets, flag bits), so the ATP header is defined
// once, in Python. Every egress port of a switch node gets one NetApproxQueueDisc; the ports of one switch
// share one Tables object (one set of logical tables per switch, as in the P4 program), which
// controller/sim/driver.py programs from SwitchState values.
//
// Per packet (all C++, no Python): Tables::Classify evaluates the tables on the packet's bytes from the
// IPv4 header on, in the order of controller/reference.py (approximate ATP DATA: TLR 1.0 (surplus) to
// queue 7, else queue_by_job, queue_by_tag for TAGGED packets, queue_by_tlr, then queue 7, and the guard
// turns a result of queue 0 into queue 1; everything else: queue_by_class, then queue 0; a fifo switch puts
// every packet in queue 0); the queue disc then
//   - drops the packet when its logical queue already holds its limit (queue k >= 1: 8 - k packets,
//     queue 0: the rest of the port buffer; the traffic manager's configuration, not a table, which the
//     controller's tuner may change: SetLimits),
//   - sets CE on an ECN-capable packet when its queue held at least the ecn_thresholds depth before it
//     (the P4 program's "enq_qdepth >= threshold"; not-ECT packets are never changed or dropped early),
//   - stamps the logical queue into the ATP queue byte of ATP DATA packets (as the P4 egress does),
// and serves the 8 queues in strict priority, queue 0 first. With trimming on (Tables::trim, the traffic
// manager's configuration like the buffers), an approximate ATP DATA packet that finds its queue full is not
// dropped whole: its payload is cut and its header goes on as a non-approximate DATA packet flagged TRIM with
// length 0 (so every switch after this one classifies it as non-approximate traffic: queue 0 by default), and
// its receiver tells the sender at once (NDP's packet trimming; docs/wire-format.md).
#ifndef NETAPPROX_SIM_SWITCH_H
#define NETAPPROX_SIM_SWITCH_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ns3/core-module.h"
#include "ns3/drop-tail-queue.h"
#include "ns3/ipv4-queue-disc-item.h"
#include "ns3/network-module.h"
#include "ns3/queue-disc.h"

namespace netapprox
{

constexpr int kQueues = 8;
constexpr int kNonApproxQueue = 0;
constexpr int kFirstApproxQueue = 1;
constexpr int kLowestQueue = kQueues - 1;
constexpr int kDropped = -1; // Classify's answer for an ATP packet of another version (controller/reference.py)
constexpr uint32_t kIpv4Header = 20;
constexpr uint32_t kUdpHeader = 8;
constexpr uint32_t kAtpOffset = kIpv4Header + kUdpHeader;
// Bytes of the packet (after the IPv4 header) the classifier and the stamper read: UDP + the ATP header.
constexpr uint32_t kPeek = kUdpHeader + NA_HEADER_LEN;
constexpr uint32_t kInternalQueuePackets = 1u << 24; // above any limit: the limits decide

struct ClassEntry
{
    uint8_t proto, protoMask;
    uint16_t dport, dportMask;
    uint8_t qid;
};

struct TagEntry
{
    uint8_t prioLo, prioHi;
    uint32_t deadlineLo, deadlineHi;
    uint8_t qid;
};

struct TlrEntry
{
    uint16_t lo, hi;
    uint8_t qid;
};

inline uint16_t
Be16(const uint8_t* p)
{
    return (uint16_t(p[0]) << 8) | p[1];
}

inline uint32_t
Be32(const uint8_t* p)
{
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

// One switch's logical tables. Entries of the ordered tables are kept in evaluation order: the driver
// adds them already sorted (controller/reference.py: class_order, tag_order, TlrRule order).
class Tables
{
  public:
    static std::shared_ptr<Tables> Create()
    {
        return std::make_shared<Tables>();
    }

    Tables()
    {
        ClearStatic();
    }

    void ClearStatic()
    {
        fifo = false;
        classes.clear();
        tags.clear();
        tlrs.clear();
        std::fill(ecn, ecn + kQueues, -1);
    }

    void AddClass(uint8_t proto, uint8_t protoMask, uint16_t dport, uint16_t dportMask, uint8_t qid)
    {
        classes.push_back({proto, protoMask, dport, dportMask, qid});
    }

    void AddTag(uint8_t prioLo, uint8_t prioHi, uint32_t deadlineLo, uint32_t deadlineHi, uint8_t qid)
    {
        tags.push_back({prioLo, prioHi, deadlineLo, deadlineHi, qid});
    }

    void AddTlr(uint16_t lo, uint16_t hi, uint8_t qid)
    {
        tlrs.push_back({lo, hi, qid});
    }

    void SetEcn(uint8_t qid, int32_t depthPackets)
    {
        ecn[qid] = depthPackets;
    }

    // The network-oblivious switch (SwitchState.fifo): every packet in queue 0.
    void SetFifo(bool on)
    {
        fifo = on;
    }

    void SetJob(uint32_t job, uint8_t qid)
    {
        jobs[job] = qid;
    }

    void DeleteJob(uint32_t job)
    {
        jobs.erase(job);
    }

    std::size_t NumJobs() const
    {
        return jobs.size();
    }

    // The TCP/UDP destination port the P4 parser extracts (IHL 5, not a non-first fragment), else -1.
    static int32_t L4Dport(const uint8_t* pkt, uint32_t len)
    {
        if (len < kIpv4Header + 4 || (pkt[0] & 0x0F) != 5 || (pkt[9] != 6 && pkt[9] != 17))
        {
            return -1;
        }
        if (Be16(pkt + 6) & 0x1FFF)
        {
            return -1;
        }
        return Be16(pkt + kIpv4Header + 2);
    }

    // True for an ATP packet of another version than this one (controller.reference.other_atp_version): what the
    // P4 parser takes for ATP (IPv4 without options, not a non-first fragment, UDP to the ATP or report port or
    // from the ATP port, a whole ATP header) whose version nibble is not NA_VERSION. Dropped and counted
    // (bad_version), as the P4 program's validation does.
    bool IsOtherAtpVersion(const uint8_t* pkt, uint32_t len) const
    {
        if (len < kAtpOffset + NA_HEADER_LEN || pkt[0] != 0x45 || pkt[9] != 17 || (Be16(pkt + 6) & 0x1FFF))
        {
            return false;
        }
        uint16_t sport = Be16(pkt + kIpv4Header), dport = Be16(pkt + kIpv4Header + 2);
        if (dport != atpPort && dport != NA_REPORT_PORT && sport != atpPort)
        {
            return false;
        }
        return (pkt[kAtpOffset] >> 4) != NA_VERSION;
    }

    // True for an ATP DATA packet (UDP to the ATP port, a complete DATA header of this version): the packets
    // whose queue byte the switch stamps.
    bool IsAtpData(const uint8_t* pkt, uint32_t len) const
    {
        return L4Dport(pkt, len) == atpPort && pkt[9] == 17 && len >= kAtpOffset + NA_HEADER_LEN &&
               pkt[kAtpOffset + NA_OFF_TYPE] == NA_DATA_V1;
    }

    // The logical queue of a packet given as bytes from its IPv4 header on (controller/reference.py).
    int Classify(const uint8_t* pkt, uint32_t len) const
    {
        if (len < kIpv4Header || (pkt[0] >> 4) != 4 || fifo)
        {
            return kNonApproxQueue;
        }
        if (IsOtherAtpVersion(pkt, len))
        {
            return kDropped;
        }
        if (IsAtpData(pkt, len) && (pkt[kAtpOffset + NA_OFF_FLAGS] & NA_FLAG_APPROX))
        {
            // The guard after classification: approximate traffic never enters queue 0.
            int q = ApproxQueue(pkt + kAtpOffset);
            return q == kNonApproxQueue ? kFirstApproxQueue : q;
        }
        uint8_t proto = pkt[9];
        int32_t d = L4Dport(pkt, len);
        uint16_t dport = d < 0 ? 0 : uint16_t(d);
        for (const auto& c : classes)
        {
            if ((proto & c.protoMask) == (c.proto & c.protoMask) &&
                (dport & c.dportMask) == (c.dport & c.dportMask))
            {
                return c.qid;
            }
        }
        return kNonApproxQueue;
    }

    // Surplus, queue_by_job, queue_by_tag, queue_by_tlr, lowest queue: the first that decides.
    int ApproxQueue(const uint8_t* atp) const
    {
        uint16_t tlr = Be16(atp + NA_OFF_TLR);
        if (tlr == NA_TLR_ONE)
        {
            return kLowestQueue; // surplus: the sender does not need this packet
        }
        auto job = jobs.find(Be32(atp + NA_OFF_JOB_ID));
        if (job != jobs.end())
        {
            return job->second;
        }
        if (atp[NA_OFF_FLAGS] & NA_FLAG_TAGGED)
        {
            uint8_t prio = atp[NA_OFF_PRIORITY];
            uint32_t deadline = Be32(atp + NA_OFF_DEADLINE_US);
            for (const auto& t : tags)
            {
                if (t.prioLo <= prio && prio <= t.prioHi && t.deadlineLo <= deadline &&
                    deadline <= t.deadlineHi)
                {
                    return t.qid;
                }
            }
        }
        for (const auto& t : tlrs)
        {
            if (t.lo <= tlr && tlr <= t.hi)
            {
                return t.qid;
            }
        }
        return kLowestQueue;
    }

    // For tests and tools: Classify on a byte string.
    int ClassifyBytes(const char* pkt, uint32_t len) const
    {
        return Classify(reinterpret_cast<const uint8_t*>(pkt), len);
    }

    uint16_t atpPort = NA_ATP_PORT;
    bool fifo = false;
    bool trim = false; // traffic manager: trim approximate DATA that finds its queue full instead of dropping it
    std::unordered_map<uint32_t, uint8_t> jobs;
    std::vector<ClassEntry> classes;
    std::vector<TagEntry> tags;
    std::vector<TlrEntry> tlrs;
    int32_t ecn[kQueues];
};

// The first bytes after the IPv4 header (UDP + ATP header) as an ns-3 header, to rewrite the ATP queue
// byte in place (ns-3 packets have no API to write payload bytes).
class RawPrefix : public ns3::Header
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid =
            ns3::TypeId("netapprox::RawPrefix").SetParent<ns3::Header>().SetGroupName("NetApprox");
        return tid;
    }

    ns3::TypeId GetInstanceTypeId() const override
    {
        return GetTypeId();
    }

    uint32_t GetSerializedSize() const override
    {
        return kPeek;
    }

    void Serialize(ns3::Buffer::Iterator it) const override
    {
        it.Write(bytes, kPeek);
    }

    uint32_t Deserialize(ns3::Buffer::Iterator it) override
    {
        it.Read(bytes, kPeek);
        return kPeek;
    }

    void Print(std::ostream& os) const override
    {
        os << "raw prefix";
    }

    uint8_t bytes[kPeek];
};

// Per (port, logical queue) counters and queue-length statistics.
struct QueueCounters
{
    uint64_t enqueued = 0;    // classified into this queue (including those then dropped)
    uint64_t transmitted = 0; // left the queue
    uint64_t transmittedBytes = 0;
    uint64_t dropped = 0;     // tail drops
    uint64_t trimmed = 0;     // trimmed instead of dropped (their headers are enqueued in the queue they classify to)
    uint64_t marked = 0;      // CE marks
    uint32_t maxBacklog = 0;  // packets
    double backlogIntegral = 0; // packet-seconds, for the time-average backlog
};

// Adds the time since `*last`, at the lengths `len` of `n` queues, to their time-weighted backlogs; `*last` = now.
inline void
AccountBacklog(QueueCounters* counters, const uint32_t* len, int n, double* last)
{
    double now = ns3::Simulator::Now().GetSeconds();
    double dt = now - *last;
    if (dt > 0)
    {
        for (int q = 0; q < n; q++)
        {
            counters[q].backlogIntegral += dt * len[q];
        }
    }
    *last = now;
}

// `item` left the queue that `c` counts.
inline void
CountTransmitted(QueueCounters& c, ns3::Ptr<const ns3::QueueDiscItem> item)
{
    c.transmitted++;
    c.transmittedBytes += item->GetSize();
}

class NetApproxQueueDisc : public ns3::QueueDisc
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::NetApproxQueueDisc")
                                     .SetParent<ns3::QueueDisc>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    NetApproxQueueDisc()
        : ns3::QueueDisc(ns3::QueueDiscSizePolicy::NO_LIMITS)
    {
        std::fill(m_limits, m_limits + kQueues, 1u);
        std::fill(m_len, m_len + kQueues, 0u);
    }

    // limits[q]: the buffer of logical queue q, packets (controller.model.queue_buffer_packets).
    void Configure(std::shared_ptr<Tables> tables, uint32_t port, const std::vector<uint32_t>& limits)
    {
        m_tables = tables;
        m_port = port;
        for (int q = 0; q < kQueues; q++)
        {
            m_limits[q] = limits.at(q);
        }
    }

    // New buffers (the controller's tuner): packets already queued stay; a queue above its new limit takes
    // nothing until it has drained below it.
    void SetLimits(const std::vector<uint32_t>& limits)
    {
        for (int q = 0; q < kQueues; q++)
        {
            m_limits[q] = limits.at(q);
        }
    }

    uint32_t Port() const
    {
        return m_port;
    }

    uint32_t Limit(int q) const
    {
        return m_limits[q];
    }

    uint32_t Backlog(int q) const
    {
        return m_len[q];
    }

    // Counters, with the backlog integral brought up to now.
    const QueueCounters& Counters(int q)
    {
        Account();
        return m_counters[q];
    }

    // ATP packets of another version dropped (malformed, bad_version), since the start.
    uint64_t BadVersion() const
    {
        return m_badVersion;
    }

    double CountersSince() const
    {
        return m_since;
    }

    void ResetCounters()
    {
        Account();
        for (auto& c : m_counters)
        {
            c = QueueCounters();
        }
        m_since = ns3::Simulator::Now().GetSeconds();
    }

  private:
    void Account()
    {
        AccountBacklog(m_counters, m_len, kQueues, &m_last);
    }

    bool DoEnqueue(ns3::Ptr<ns3::QueueDiscItem> item) override
    {
        Account();
        uint8_t buf[kIpv4Header + kPeek];
        std::memset(buf, 0, kIpv4Header);
        uint32_t n = 0;
        auto ip = ns3::DynamicCast<ns3::Ipv4QueueDiscItem>(item);
        ns3::Ptr<ns3::Packet> packet = item->GetPacket();
        if (ip)
        {
            const ns3::Ipv4Header& h = ip->GetHeader();
            buf[0] = 0x45; // ns-3 IPv4 headers carry no options
            buf[1] = h.GetTos();
            uint16_t frag = (h.GetFragmentOffset() / 8) & 0x1FFF;
            if (!h.IsLastFragment())
            {
                frag |= 0x2000;
            }
            buf[6] = frag >> 8;
            buf[7] = frag & 0xFF;
            buf[9] = h.GetProtocol();
            n = kIpv4Header + packet->CopyData(buf + kIpv4Header, kPeek);
        }
        int q = m_tables ? m_tables->Classify(buf, n) : kNonApproxQueue;
        if (q == kDropped)
        {
            m_badVersion++;
            DropBeforeEnqueue(item, "ATP version");
            return false;
        }
        QueueCounters& c = m_counters[q];
        c.enqueued++;
        if (m_len[q] >= m_limits[q])
        {
            bool trim = ip && m_tables && m_tables->trim && q != kNonApproxQueue && n == kIpv4Header + kPeek &&
                        m_tables->IsAtpData(buf, n) && (buf[kAtpOffset + NA_OFF_FLAGS] & NA_FLAG_APPROX);
            (trim ? c.trimmed : c.dropped)++;
            // the original is dropped first, so that the queue disc's counts (received = dropped + enqueued) hold
            // when its trimmed header is enqueued through Enqueue
            DropBeforeEnqueue(item, "logical queue full");
            if (trim)
            {
                Trim(ip, buf);
            }
            return false;
        }
        if (m_tables && m_tables->ecn[q] >= 0 && m_len[q] >= uint32_t(m_tables->ecn[q]))
        {
            if (Mark(item, "ecn threshold"))
            {
                c.marked++;
            }
        }
        if (m_tables && n == kIpv4Header + kPeek && m_tables->IsAtpData(buf, n) &&
            buf[kAtpOffset + NA_OFF_QUEUE] != q)
        {
            RawPrefix prefix;
            packet->RemoveHeader(prefix);
            prefix.bytes[kUdpHeader + NA_OFF_QUEUE] = uint8_t(q);
            prefix.bytes[6] = 0; // UDP checksum: zero = none (RFC 768), as the P4 program does
            prefix.bytes[7] = 0;
            packet->AddHeader(prefix);
        }
        m_len[q]++;
        if (m_len[q] > c.maxBacklog)
        {
            c.maxBacklog = m_len[q];
        }
        bool ok = GetInternalQueue(q)->Enqueue(item);
        if (!ok)
        {
            m_len[q]--; // cannot happen: the internal queue holds more than any limit
        }
        return ok;
    }

    // The trimmed copy of an approximate ATP DATA packet whose first bytes (IPv4, UDP, ATP headers) are `buf`:
    // the headers alone, the ATP header flagged TRIM, not APPROX, length 0 (UDP length and IPv4 payload size to
    // match, UDP checksum 0). Enqueued through this queue disc's own Enqueue, so it is classified like any packet
    // and counted as received and enqueued (the original is counted as dropped).
    void Trim(ns3::Ptr<ns3::Ipv4QueueDiscItem> ip, uint8_t* buf)
    {
        uint8_t* udp = buf + kIpv4Header;
        uint8_t* atp = udp + kUdpHeader;
        udp[4] = uint8_t(kPeek >> 8);
        udp[5] = uint8_t(kPeek & 0xFF);
        udp[6] = udp[7] = 0;
        atp[NA_OFF_FLAGS] = uint8_t((atp[NA_OFF_FLAGS] | NA_FLAG_TRIM) & ~NA_FLAG_APPROX);
        atp[NA_OFF_LENGTH] = atp[NA_OFF_LENGTH + 1] = 0;
        ns3::Ipv4Header h = ip->GetHeader();
        h.SetPayloadSize(kPeek);
        auto header = ns3::Create<ns3::Ipv4QueueDiscItem>(ns3::Create<ns3::Packet>(udp, kPeek), ip->GetAddress(),
                                                           ip->GetProtocol(), h);
        header->SetTxQueueIndex(ip->GetTxQueueIndex());
        Enqueue(header);
    }

    ns3::Ptr<ns3::QueueDiscItem> DoDequeue() override
    {
        for (int q = 0; q < kQueues; q++)
        {
            if (m_len[q] == 0)
            {
                continue;
            }
            ns3::Ptr<ns3::QueueDiscItem> item = GetInternalQueue(q)->Dequeue();
            if (item)
            {
                Account();
                m_len[q]--;
                CountTransmitted(m_counters[q], item);
                return item;
            }
        }
        return nullptr;
    }

    bool CheckConfig() override
    {
        if (GetNQueueDiscClasses() > 0 || GetNPacketFilters() > 0)
        {
            return false;
        }
        if (GetNInternalQueues() == 0)
        {
            for (int q = 0; q < kQueues; q++)
            {
                // m_limits decide (DoEnqueue); the internal queue only has to hold them, also after SetLimits
                auto queue = ns3::CreateObjectWithAttributes<ns3::DropTailQueue<ns3::QueueDiscItem>>(
                    "MaxSize",
                    ns3::QueueSizeValue(ns3::QueueSize(ns3::QueueSizeUnit::PACKETS, kInternalQueuePackets)));
                AddInternalQueue(queue);
            }
        }
        return GetNInternalQueues() == kQueues;
    }

    void InitializeParams() override
    {
        m_last = m_since = ns3::Simulator::Now().GetSeconds();
    }

    std::shared_ptr<Tables> m_tables;
    uint32_t m_port = 0;
    uint32_t m_limits[kQueues];
    uint32_t m_len[kQueues];
    QueueCounters m_counters[kQueues];
    uint64_t m_badVersion = 0;
    double m_last = 0;
    double m_since = 0;
};

// Install a NetApproxQueueDisc as the root queue disc of an egress device (before addresses are assigned,
// so that ns-3 does not install its default one).
inline ns3::Ptr<NetApproxQueueDisc>
InstallQueueDisc(ns3::Ptr<ns3::NetDevice> device,
                 std::shared_ptr<Tables> tables,
                 uint32_t port,
                 const std::vector<uint32_t>& limits)
{
    auto tc = device->GetNode()->GetObject<ns3::TrafficControlLayer>();
    auto qd = ns3::CreateObject<NetApproxQueueDisc>();
    qd->Configure(tables, port, limits);
    tc->SetRootQueueDiscOnDevice(device, qd);
    return qd;
}

} // namespace netapprox

#endif // NETAPPROX_SIM_SWITCH_H
