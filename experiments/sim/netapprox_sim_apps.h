// NetApprox simulations in ns-3: flow-hash ECMP routing and the baseline applications, all in C++ so that
// nothing but ATP itself (hostlib, in Python) costs Python time per packet.
//
// Loaded by experiments/sim/native.py after controller/sim/netapprox_switch.h (the NA_* macros come from
// hostlib.wire there).
//
// - EcmpRouting: per-switch IPv4 routing. Host routes (/32) with every equal-cost next hop; a packet takes
//   next hop hash(src, dst, protocol, ports, per-switch seed) mod n, so a flow keeps one path (no
//   reordering) and flows spread over all paths.
// - TcpJobSender / TcpJobReceiver: the EarlySend and SampleSend baselines over ns-3 TCP (DCTCP in the
//   experiments). The sender writes a job's byte stream (a 17-byte job header, then per message an
//   8-byte header and its payload; SampleSend only the sampled messages); the receiver answers one byte
//   when the stream holds the target (EarlySend: the first ceil(MSR*N) messages; SampleSend: every
//   sampled one); the sender stops at that byte (EarlySend aborts with RST: unsent data is discarded).
// - FlowSender / FlowSink: non-approximate TCP flows of given sizes at given times; the sink records when
//   each flow's last byte arrived (FCT = that minus the flow's start).
// - UdpBlaster / UdpCounter: UDP datagrams given as bytes (ATP-format DATA packets built by hostlib.wire),
//   paced at a rate; the counter counts complete messages (msg_id, pkt_cnt at the NA_OFF_* offsets) and
//   records when a target count was reached.
#ifndef NETAPPROX_SIM_APPS_H
#define NETAPPROX_SIM_APPS_H

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ns3/applications-module.h"
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"

namespace netapprox
{

inline uint32_t
Mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

class EcmpRouting : public ns3::Ipv4RoutingProtocol
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid = ns3::TypeId("netapprox::EcmpRouting")
                                     .SetParent<ns3::Ipv4RoutingProtocol>()
                                     .SetGroupName("NetApprox");
        return tid;
    }

    void SetSeed(uint32_t seed)
    {
        m_seed = seed;
    }

    // One equal-cost next hop towards host address dst: leave through interface iface to gateway gw.
    void AddRoute(uint32_t dst, uint32_t iface, uint32_t gw)
    {
        m_routes[dst].push_back({iface, gw, nullptr});
    }

    std::size_t NumRoutes() const
    {
        return m_routes.size();
    }

    uint64_t Unroutable() const
    {
        return m_unroutable;
    }

    ns3::Ptr<ns3::Ipv4Route> RouteOutput(ns3::Ptr<ns3::Packet> p,
                                         const ns3::Ipv4Header& header,
                                         ns3::Ptr<ns3::NetDevice> oif,
                                         ns3::Socket::SocketErrno& sockerr) override
    {
        auto rt = Lookup(header, p);
        sockerr = rt ? ns3::Socket::ERROR_NOTERROR : ns3::Socket::ERROR_NOROUTETOHOST;
        return rt;
    }

    bool RouteInput(ns3::Ptr<const ns3::Packet> p,
                    const ns3::Ipv4Header& header,
                    ns3::Ptr<const ns3::NetDevice> idev,
                    const UnicastForwardCallback& ucb,
                    const MulticastForwardCallback& mcb,
                    const LocalDeliverCallback& lcb,
                    const ErrorCallback& ecb) override
    {
        int32_t iif = m_ipv4->GetInterfaceForDevice(idev);
        if (m_ipv4->IsDestinationAddress(header.GetDestination(), iif))
        {
            if (!lcb.IsNull())
            {
                lcb(p, header, iif);
                return true;
            }
            return false;
        }
        auto rt = Lookup(header, p);
        if (!rt)
        {
            m_unroutable++;
            ecb(p, header, ns3::Socket::ERROR_NOROUTETOHOST);
            return true;
        }
        ucb(rt, p, header);
        return true;
    }

    void NotifyInterfaceUp(uint32_t) override
    {
    }

    void NotifyInterfaceDown(uint32_t) override
    {
    }

    void NotifyAddAddress(uint32_t, ns3::Ipv4InterfaceAddress) override
    {
    }

    void NotifyRemoveAddress(uint32_t, ns3::Ipv4InterfaceAddress) override
    {
    }

    void SetIpv4(ns3::Ptr<ns3::Ipv4> ipv4) override
    {
        m_ipv4 = ipv4;
    }

    void PrintRoutingTable(ns3::Ptr<ns3::OutputStreamWrapper> stream, ns3::Time::Unit) const override
    {
        *stream->GetStream() << "EcmpRouting: " << m_routes.size() << " destinations\n";
    }

  private:
    struct NextHop
    {
        uint32_t iface;
        uint32_t gw;
        ns3::Ptr<ns3::Ipv4Route> route; // built on first use; IPv4 forwarding only reads it
    };

    ns3::Ptr<ns3::Ipv4Route> Lookup(const ns3::Ipv4Header& header, ns3::Ptr<const ns3::Packet> p)
    {
        auto it = m_routes.find(header.GetDestination().Get());
        if (it == m_routes.end() || it->second.empty())
        {
            return nullptr;
        }
        auto& hops = it->second;
        std::size_t i = 0;
        if (hops.size() > 1)
        {
            uint32_t h = Mix32(m_seed ^ header.GetSource().Get());
            h = Mix32(h ^ header.GetDestination().Get());
            h = Mix32(h ^ header.GetProtocol());
            uint8_t ports[4] = {0, 0, 0, 0};
            if (p && (header.GetProtocol() == 6 || header.GetProtocol() == 17) && header.GetFragmentOffset() == 0)
            {
                p->CopyData(ports, 4);
            }
            uint32_t pp;
            std::memcpy(&pp, ports, 4);
            h = Mix32(h ^ pp);
            i = h % hops.size();
        }
        NextHop& hop = hops[i];
        if (!hop.route)
        {
            hop.route = ns3::Create<ns3::Ipv4Route>();
            hop.route->SetDestination(header.GetDestination());
            hop.route->SetGateway(ns3::Ipv4Address(hop.gw));
            hop.route->SetSource(m_ipv4->GetAddress(hop.iface, 0).GetLocal());
            hop.route->SetOutputDevice(m_ipv4->GetNetDevice(hop.iface));
        }
        return hop.route;
    }

    std::unordered_map<uint32_t, std::vector<NextHop>> m_routes;
    ns3::Ptr<ns3::Ipv4> m_ipv4;
    uint32_t m_seed = 0;
    uint64_t m_unroutable = 0;
};

inline void
InstallEcmp(ns3::Ptr<ns3::Node> node, ns3::Ptr<EcmpRouting> routing)
{
    node->GetObject<ns3::Ipv4>()->SetRoutingProtocol(routing);
}

// An ns-3 Application known to the TypeId system as Derived::kTypeName.
template <typename Derived>
class RegisteredApp : public ns3::Application
{
  public:
    static ns3::TypeId GetTypeId()
    {
        static ns3::TypeId tid =
            ns3::TypeId(Derived::kTypeName).SetParent<ns3::Application>().SetGroupName("NetApprox");
        return tid;
    }
};

// An application that owns one socket (a connection, a listener or a datagram socket), closed when the
// application stops.
template <typename Derived>
class SocketApp : public RegisteredApp<Derived>
{
  protected:
    void StopApplication() override
    {
        if (m_socket)
        {
            m_socket->Close();
        }
    }

    ns3::Ptr<ns3::Socket> m_socket;
};

// A TCP socket of `node` listening on `port`; every accepted connection goes to `onAccept`.
inline ns3::Ptr<ns3::Socket>
ListenTcp(ns3::Ptr<ns3::Node> node, uint16_t port, ns3::Callback<void, ns3::Ptr<ns3::Socket>, const ns3::Address&> onAccept)
{
    auto listener = ns3::Socket::CreateSocket(node, ns3::TcpSocketFactory::GetTypeId());
    listener->Bind(ns3::InetSocketAddress(ns3::Ipv4Address::GetAny(), port));
    listener->Listen();
    listener->SetAcceptCallback(ns3::MakeNullCallback<bool, ns3::Ptr<ns3::Socket>, const ns3::Address&>(), onAccept);
    return listener;
}

// Writes up to `left` bytes of filler into TCP `socket`, as much as its send buffer takes now; returns what
// it wrote (the rest goes when the socket calls for more).
inline uint64_t
WriteFiller(ns3::Ptr<ns3::Socket> socket, uint64_t left)
{
    uint64_t written = 0;
    while (written < left)
    {
        uint32_t space = socket->GetTxAvailable();
        if (space == 0)
        {
            break;
        }
        uint64_t n = std::min<uint64_t>({space, left - written, 65536});
        int sent = socket->Send(ns3::Create<ns3::Packet>(uint32_t(n)));
        if (sent <= 0)
        {
            break;
        }
        written += sent;
    }
    return written;
}

// TcpSocketBase::SendRST is protected; this derived type only lends its address (a well-defined use of
// a protected member through a pointer to member), to abort an EarlySend connection as the emulated
// baseline does with SO_LINGER 0.
struct TcpAbort : ns3::TcpSocketBase
{
    static void Abort(ns3::Ptr<ns3::TcpSocketBase> socket)
    {
        void (ns3::TcpSocketBase::*rst)() = &TcpAbort::SendRST;
        ((*socket).*rst)();
    }
};

// What a TCP sender saw: data segments sent, retransmitted, retransmission timeouts (entries into loss
// recovery by RTO), ECN-echo reductions.
struct TcpStats
{
    uint64_t segments = 0;
    uint64_t retransmissions = 0;
    uint64_t timeouts = 0;
    uint64_t cwr = 0;
};

class TcpStatsTracer
{
  public:
    void Attach(ns3::Ptr<ns3::Socket> socket)
    {
        auto base = ns3::DynamicCast<ns3::TcpSocketBase>(socket);
        if (!base)
        {
            return;
        }
        base->TraceConnectWithoutContext("Tx", ns3::MakeCallback(&TcpStatsTracer::OnTx, this));
        base->TraceConnectWithoutContext("CongState", ns3::MakeCallback(&TcpStatsTracer::OnCongState, this));
    }

    TcpStats stats;

  private:
    void OnTx(ns3::Ptr<const ns3::Packet> p, const ns3::TcpHeader& h, ns3::Ptr<const ns3::TcpSocketBase>)
    {
        if (p->GetSize() == 0)
        {
            return;
        }
        stats.segments++;
        ns3::SequenceNumber32 end = h.GetSequenceNumber() + p->GetSize();
        if (m_any && end <= m_highest)
        {
            stats.retransmissions++;
        }
        else
        {
            m_highest = end;
            m_any = true;
        }
    }

    void OnCongState(ns3::TcpSocketState::TcpCongState_t, ns3::TcpSocketState::TcpCongState_t now)
    {
        if (now == ns3::TcpSocketState::CA_LOSS)
        {
            stats.timeouts++;
        }
        else if (now == ns3::TcpSocketState::CA_CWR)
        {
            stats.cwr++;
        }
    }

    ns3::SequenceNumber32 m_highest;
    bool m_any = false;
};

// Writes `streamBytes` of a job to peer; done when the receiver's stop byte arrives.
class TcpJobSender : public SocketApp<TcpJobSender>
{
  public:
    static constexpr const char* kTypeName = "netapprox::TcpJobSender";

    void Setup(uint32_t ip, uint16_t port, uint64_t streamBytes, bool abortAtStop)
    {
        m_peer = ns3::InetSocketAddress(ns3::Ipv4Address(ip), port);
        m_total = streamBytes;
        m_abort = abortAtStop;
    }

    int64_t StartNs() const
    {
        return m_startNs;
    }

    int64_t DoneNs() const
    {
        return m_doneNs;
    }

    uint64_t Written() const
    {
        return m_written;
    }

    const TcpStats& Stats() const
    {
        return m_tracer.stats;
    }

  private:
    void StartApplication() override
    {
        m_startNs = ns3::Simulator::Now().GetNanoSeconds();
        m_socket = ns3::Socket::CreateSocket(GetNode(), ns3::TcpSocketFactory::GetTypeId());
        m_tracer.Attach(m_socket);
        m_socket->Bind();
        m_socket->SetConnectCallback(ns3::MakeCallback(&TcpJobSender::OnConnected, this),
                                     ns3::MakeCallback(&TcpJobSender::OnFailed, this));
        m_socket->SetSendCallback(ns3::MakeCallback(&TcpJobSender::OnSpace, this));
        m_socket->SetRecvCallback(ns3::MakeCallback(&TcpJobSender::OnRecv, this));
        m_socket->Connect(m_peer);
    }

    void OnConnected(ns3::Ptr<ns3::Socket>)
    {
        Fill();
    }

    void OnFailed(ns3::Ptr<ns3::Socket>)
    {
    }

    void OnSpace(ns3::Ptr<ns3::Socket>, uint32_t)
    {
        Fill();
    }

    void Fill()
    {
        if (m_doneNs < 0)
        {
            m_written += WriteFiller(m_socket, m_total - m_written);
        }
    }

    void OnRecv(ns3::Ptr<ns3::Socket> socket)
    {
        while (auto p = socket->Recv())
        {
            if (p->GetSize() > 0 && m_doneNs < 0)
            {
                m_doneNs = ns3::Simulator::Now().GetNanoSeconds();
                if (m_abort)
                {
                    TcpAbort::Abort(ns3::DynamicCast<ns3::TcpSocketBase>(m_socket));
                }
                else
                {
                    m_socket->Close();
                }
            }
        }
    }

    ns3::Address m_peer;
    TcpStatsTracer m_tracer;
    uint64_t m_total = 0;
    uint64_t m_written = 0;
    bool m_abort = true;
    int64_t m_startNs = -1;
    int64_t m_doneNs = -1;
};

// Listens on one port for one job; answers one byte when `targetBytes` of the stream arrived.
class TcpJobReceiver : public SocketApp<TcpJobReceiver>
{
  public:
    static constexpr const char* kTypeName = "netapprox::TcpJobReceiver";

    void Setup(uint16_t port, uint64_t targetBytes)
    {
        m_port = port;
        m_target = targetBytes;
    }

    uint64_t Received() const
    {
        return m_received;
    }

    int64_t TargetNs() const
    {
        return m_targetNs;
    }

  private:
    void StartApplication() override
    {
        m_socket = ListenTcp(GetNode(), m_port, ns3::MakeCallback(&TcpJobReceiver::OnAccept, this));
    }

    void OnAccept(ns3::Ptr<ns3::Socket> s, const ns3::Address&)
    {
        m_conn = s;
        s->SetRecvCallback(ns3::MakeCallback(&TcpJobReceiver::OnRecv, this));
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        while (auto p = s->Recv())
        {
            m_received += p->GetSize();
        }
        if (m_targetNs < 0 && m_received >= m_target)
        {
            m_targetNs = ns3::Simulator::Now().GetNanoSeconds();
            uint8_t stop = 1;
            s->Send(ns3::Create<ns3::Packet>(&stop, 1));
        }
    }

    uint16_t m_port = 0;
    uint64_t m_target = 0;
    uint64_t m_received = 0;
    int64_t m_targetNs = -1;
    ns3::Ptr<ns3::Socket> m_conn;
};

// Non-approximate TCP flows from one host: each flow is one connection carrying a 16-byte header (flow id,
// size) and `size` bytes.
class FlowSender : public RegisteredApp<FlowSender>
{
  public:
    static constexpr const char* kTypeName = "netapprox::FlowSender";

    void AddFlow(uint64_t id, int64_t startNs, uint32_t ip, uint16_t port, uint64_t size)
    {
        m_flows.push_back({id, startNs, ip, port, size});
    }

    const TcpStats& Stats() const
    {
        return m_tracer.stats;
    }

  private:
    struct Flow
    {
        uint64_t id;
        int64_t startNs;
        uint32_t ip;
        uint16_t port;
        uint64_t size;
        ns3::Ptr<ns3::Socket> socket;
        uint64_t written = 0;
    };

    void StartApplication() override
    {
        int64_t now = ns3::Simulator::Now().GetNanoSeconds();
        for (std::size_t i = 0; i < m_flows.size(); i++)
        {
            ns3::Simulator::Schedule(ns3::NanoSeconds(std::max<int64_t>(0, m_flows[i].startNs - now)),
                                     &FlowSender::Open, this, i);
        }
    }

    void StopApplication() override
    {
    }

    void Open(std::size_t i)
    {
        Flow& f = m_flows[i];
        f.socket = ns3::Socket::CreateSocket(GetNode(), ns3::TcpSocketFactory::GetTypeId());
        m_tracer.Attach(f.socket);
        m_index[ns3::PeekPointer(f.socket)] = i;
        f.socket->Bind();
        f.socket->SetConnectCallback(ns3::MakeCallback(&FlowSender::OnConnected, this),
                                     ns3::MakeCallback(&FlowSender::OnFailed, this));
        f.socket->SetSendCallback(ns3::MakeCallback(&FlowSender::OnSpace, this));
        f.socket->Connect(ns3::InetSocketAddress(ns3::Ipv4Address(f.ip), f.port));
    }

    void OnConnected(ns3::Ptr<ns3::Socket> s)
    {
        Flow& f = m_flows[m_index[ns3::PeekPointer(s)]];
        uint8_t hdr[16];
        for (int k = 0; k < 8; k++)
        {
            hdr[k] = uint8_t(f.id >> (56 - 8 * k));
            hdr[8 + k] = uint8_t(f.size >> (56 - 8 * k));
        }
        s->Send(ns3::Create<ns3::Packet>(hdr, 16));
        Fill(f);
    }

    void OnFailed(ns3::Ptr<ns3::Socket>)
    {
    }

    void OnSpace(ns3::Ptr<ns3::Socket> s, uint32_t)
    {
        auto it = m_index.find(ns3::PeekPointer(s));
        if (it != m_index.end())
        {
            Fill(m_flows[it->second]);
        }
    }

    void Fill(Flow& f)
    {
        f.written += WriteFiller(f.socket, f.size - f.written);
        if (f.written >= f.size)
        {
            f.socket->Close();
        }
    }

    std::vector<Flow> m_flows;
    std::unordered_map<ns3::Socket*, std::size_t> m_index;
    TcpStatsTracer m_tracer;
};

class FlowSink : public SocketApp<FlowSink>
{
  public:
    static constexpr const char* kTypeName = "netapprox::FlowSink";

    void Setup(uint16_t port)
    {
        m_port = port;
    }

    // Flows whose every byte arrived: id -> arrival time of the last byte (ns).
    const std::map<uint64_t, int64_t>& Done() const
    {
        return m_done;
    }

  private:
    struct Conn
    {
        uint8_t hdr[16];
        uint32_t hdrLen = 0;
        uint64_t id = 0;
        uint64_t size = 0;
        uint64_t got = 0;
    };

    void StartApplication() override
    {
        m_socket = ListenTcp(GetNode(), m_port, ns3::MakeCallback(&FlowSink::OnAccept, this));
    }

    void OnAccept(ns3::Ptr<ns3::Socket> s, const ns3::Address&)
    {
        m_conns[ns3::PeekPointer(s)] = Conn();
        m_keep.push_back(s);
        s->SetRecvCallback(ns3::MakeCallback(&FlowSink::OnRecv, this));
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        Conn& c = m_conns[ns3::PeekPointer(s)];
        while (auto p = s->Recv())
        {
            uint32_t len = p->GetSize();
            uint32_t off = 0;
            if (c.hdrLen < 16)
            {
                uint8_t buf[16];
                uint32_t take = std::min<uint32_t>(16 - c.hdrLen, len);
                p->CopyData(buf, take);
                std::memcpy(c.hdr + c.hdrLen, buf, take);
                c.hdrLen += take;
                off = take;
                if (c.hdrLen == 16)
                {
                    for (int k = 0; k < 8; k++)
                    {
                        c.id = (c.id << 8) | c.hdr[k];
                        c.size = (c.size << 8) | c.hdr[8 + k];
                    }
                }
            }
            c.got += len - off;
            if (c.hdrLen == 16 && c.got >= c.size && !m_done.count(c.id))
            {
                m_done[c.id] = ns3::Simulator::Now().GetNanoSeconds();
            }
        }
    }

    uint16_t m_port = 0;
    std::unordered_map<ns3::Socket*, Conn> m_conns;
    std::vector<ns3::Ptr<ns3::Socket>> m_keep;
    std::map<uint64_t, int64_t> m_done;
};

// Sends datagrams (bytes given up front) to one address at `rateBps` (bits of IP packet per second),
// cycling through them until `stopNs` when `cycle` is set, else each once.
class UdpBlaster : public SocketApp<UdpBlaster>
{
  public:
    static constexpr const char* kTypeName = "netapprox::UdpBlaster";

    // rateBps counts each datagram plus overheadBytes (IP, UDP and link headers).
    void Setup(uint32_t ip, uint16_t port, double rateBps, uint32_t overheadBytes, bool cycle, int64_t stopNs)
    {
        m_peer = ns3::InetSocketAddress(ns3::Ipv4Address(ip), port);
        m_rate = rateBps;
        m_overhead = overheadBytes;
        m_cycle = cycle;
        m_stopNs = stopNs;
    }

    void AddDatagram(const char* data, uint32_t len)
    {
        m_data.emplace_back(reinterpret_cast<const uint8_t*>(data), reinterpret_cast<const uint8_t*>(data) + len);
    }

    uint64_t Sent() const
    {
        return m_sent;
    }

    uint64_t SendFailures() const
    {
        return m_failed;
    }

    int64_t StartNs() const
    {
        return m_startNs;
    }

    // When the last datagram left (once-through blasters), else -1.
    int64_t LastNs() const
    {
        return m_lastNs;
    }

  private:
    void StartApplication() override
    {
        m_startNs = ns3::Simulator::Now().GetNanoSeconds();
        m_socket = ns3::Socket::CreateSocket(GetNode(), ns3::UdpSocketFactory::GetTypeId());
        m_socket->Bind();
        Next();
    }

    void StopApplication() override
    {
        m_event.Cancel();
        SocketApp::StopApplication();
    }

    void Next()
    {
        if (m_data.empty() || (!m_cycle && m_i >= m_data.size()))
        {
            return;
        }
        if (m_stopNs >= 0 && ns3::Simulator::Now().GetNanoSeconds() >= m_stopNs)
        {
            return;
        }
        const auto& d = m_data[m_i % m_data.size()];
        m_i++;
        if (m_socket->SendTo(ns3::Create<ns3::Packet>(d.data(), d.size()), 0, m_peer) < 0)
        {
            m_failed++;
        }
        m_sent++;
        if (!m_cycle && m_i >= m_data.size())
        {
            m_lastNs = ns3::Simulator::Now().GetNanoSeconds();
        }
        double bits = 8.0 * (d.size() + m_overhead);
        m_event = ns3::Simulator::Schedule(ns3::Seconds(bits / m_rate), &UdpBlaster::Next, this);
    }

    ns3::Address m_peer;
    double m_rate = 1e9;
    uint32_t m_overhead = 0;
    bool m_cycle = false;
    int64_t m_stopNs = -1;
    std::vector<std::vector<uint8_t>> m_data;
    std::size_t m_i = 0;
    uint64_t m_sent = 0;
    uint64_t m_failed = 0;
    int64_t m_startNs = -1;
    int64_t m_lastNs = -1;
    ns3::EventId m_event;
};

// Counts ATP-format DATA datagrams per (job, message) on a port; a message is complete when all its
// pkt_cnt packets arrived. Records when `target` messages of a job were complete.
class UdpCounter : public SocketApp<UdpCounter>
{
  public:
    static constexpr const char* kTypeName = "netapprox::UdpCounter";

    void Setup(uint32_t ip, uint16_t port)
    {
        m_ip = ip;
        m_port = port;
    }

    uint64_t Datagrams() const
    {
        return m_datagrams;
    }

    void SetTarget(uint32_t job, uint32_t target)
    {
        m_jobs[job].target = target;
    }

    uint64_t Packets(uint32_t job) const
    {
        auto it = m_jobs.find(job);
        return it == m_jobs.end() ? 0 : it->second.packets;
    }

    uint64_t Complete(uint32_t job) const
    {
        auto it = m_jobs.find(job);
        return it == m_jobs.end() ? 0 : it->second.complete;
    }

    int64_t TargetNs(uint32_t job) const
    {
        auto it = m_jobs.find(job);
        return it == m_jobs.end() ? -1 : it->second.targetNs;
    }

    // Datagrams that arrived with ATP queue byte q (the last switch's stamp; 0xFF: none).
    uint64_t QueueSeen(uint32_t q) const
    {
        return q < 256 ? m_queueSeen[q] : 0;
    }

  private:
    struct Job
    {
        uint32_t target = 0;
        uint64_t packets = 0;
        uint64_t complete = 0;
        int64_t targetNs = -1;
        std::unordered_map<uint32_t, uint32_t> got;
        std::unordered_set<uint64_t> seen; // (msg_id, pkt_idx)
    };

    void StartApplication() override
    {
        m_socket = ns3::Socket::CreateSocket(GetNode(), ns3::UdpSocketFactory::GetTypeId());
        m_socket->SetAttribute("RcvBufSize", ns3::UintegerValue(64u << 20));
        m_socket->Bind(ns3::InetSocketAddress(ns3::Ipv4Address(m_ip), m_port));
        m_socket->SetRecvCallback(ns3::MakeCallback(&UdpCounter::OnRecv, this));
    }

    void OnRecv(ns3::Ptr<ns3::Socket> s)
    {
        while (auto p = s->Recv())
        {
            uint8_t h[NA_HEADER_LEN];
            if (p->CopyData(h, NA_HEADER_LEN) < NA_HEADER_LEN || h[NA_OFF_TYPE] != NA_DATA_V1)
            {
                continue;
            }
            m_datagrams++;
            m_queueSeen[h[NA_OFF_QUEUE]]++;
            uint32_t job = Be32(h + NA_OFF_JOB_ID);
            uint32_t msg = Be32(h + NA_OFF_MSG_ID);
            uint16_t idx = Be16(h + NA_OFF_PKT_IDX);
            uint16_t cnt = Be16(h + NA_OFF_PKT_CNT);
            Job& j = m_jobs[job];
            j.packets++;
            if (!j.seen.insert((uint64_t(msg) << 16) | idx).second)
            {
                continue;
            }
            if (++j.got[msg] == cnt)
            {
                j.complete++;
                if (j.targetNs < 0 && j.target > 0 && j.complete >= j.target)
                {
                    j.targetNs = ns3::Simulator::Now().GetNanoSeconds();
                }
            }
        }
    }

    uint32_t m_ip = 0;
    uint16_t m_port = 0;
    uint64_t m_datagrams = 0;
    std::unordered_map<uint32_t, Job> m_jobs;
    uint64_t m_queueSeen[256] = {};
};

} // namespace netapprox

#endif // NETAPPROX_SIM_APPS_H
