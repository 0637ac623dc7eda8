"""ns-3 adapter: drives a sans-I/O core (``AtpSender`` or ``AtpReceiver``) in simulated time over an ns-3 UDP socket.

The third adapter beside the socket loop (``hostlib.api``) and asyncio (``hostlib.aio``): the same cores, fed
datagrams and *simulated* time, so simulations run exactly the ATP the real hosts run::

    ep = SimEndpoint(node, AtpSender(job, config=cfg, peer=(dst_ip, 7600), now=t), on_event=handle)
    ep.start()                     # at simulated time t (call it from a simulator event)
    ...                            # ns.Simulator.Run(): datagrams and timers drive the core

Addresses are ``(IPv4 address as int, UDP port)`` tuples (``ip_int("10.0.0.1")``). A small C++ shim
(``_SHIM``, compiled into ns-3 once per process) owns each UDP socket and one timer event per endpoint; it
calls Python once per datagram received (its bytes and whether it arrived CE-marked) and once per timer
firing, through three process-wide callbacks assigned once (cppyy compiles a wrapper for every Python
callable stored into a ``std::function``: far too slow per socket or per event). The core's answer goes out
through the same socket. The timer is moved whenever ``get_timer()`` changes, rounded up to the next
nanosecond and never earlier than 1 ns after now, so a core can never spin at one instant.
``call_later(delay_s, fn)`` schedules any Python call in simulated time the same way.

The cost is Python's: hostlib's cores take most of the wall-clock time per datagram; the adapter adds a copy
and two calls into C++ (``ProfiledEndpoint`` times every step; docs/simulation.md has the numbers). ns-3 is
an optional extra (``pip install -e .[sim]``); importing this module does not import it, ``load()`` does.
"""
from __future__ import annotations

import inspect
import ipaddress
import math
from time import perf_counter as _perf
from typing import Any, Callable

from netapprox.hostlib import events

_SHIM = r"""
#include "ns3/core-module.h"
#include "ns3/internet-module.h"
#include "ns3/network-module.h"
#include <functional>
#include <vector>

namespace netapprox_host
{

// Python is called through three process-wide functions assigned once (a std::function assigned from
// Python costs cppyy a JIT compile, too slow to do per socket or per event): a datagram arrived on endpoint
// `id`, the timer of endpoint `id` fired, scheduled call `token` is due. Simulated time in ns.
struct Dispatch
{
    inline static std::function<void(uint32_t, uint64_t, uint32_t, uint32_t, uint16_t, bool)> receive;
    inline static std::function<void(uint32_t, uint64_t)> timer;
    inline static std::function<void(uint64_t, uint64_t)> call;
};

inline void
CallLater(uint64_t delayNs, uint64_t token)
{
    ns3::Simulator::Schedule(ns3::NanoSeconds(delayNs), [token]() {
        if (Dispatch::call)
        {
            Dispatch::call(token, ns3::Simulator::Now().GetNanoSeconds());
        }
    });
}

// One UDP socket of a simulated host: every received datagram is copied out and handed to Python with
// its length, source address and port and CE mark; one timer event per endpoint.
class DatagramEndpoint
{
  public:
    DatagramEndpoint(ns3::Ptr<ns3::Node> node, uint32_t ip, uint16_t port, uint32_t id)
        : m_id(id)
    {
        m_socket = ns3::Socket::CreateSocket(node, ns3::UdpSocketFactory::GetTypeId());
        m_socket->SetAttribute("RcvBufSize", ns3::UintegerValue(64u << 20));
        m_socket->SetIpRecvTos(true);
        if (m_socket->Bind(ns3::InetSocketAddress(ns3::Ipv4Address(ip), port)) != 0)
        {
            m_bound = false;
        }
        ns3::Address local;
        m_socket->GetSockName(local);
        m_port = ns3::InetSocketAddress::ConvertFrom(local).GetPort();
        m_socket->SetRecvCallback(ns3::MakeCallback(&DatagramEndpoint::OnReceive, this));
    }

    ~DatagramEndpoint()
    {
        Close();
    }

    bool Bound() const
    {
        return m_bound;
    }

    uint16_t Port() const
    {
        return m_port;
    }

    const uint8_t* Data() const
    {
        return m_buf.data();
    }

    // 0 when the datagram left, -1 when the host dropped it (a full NIC queue): ATP sees a loss.
    int SendTo(const char* data, uint32_t len, uint32_t ip, uint16_t port)
    {
        if (!m_socket)
        {
            return -1;
        }
        auto p = ns3::Create<ns3::Packet>(reinterpret_cast<const uint8_t*>(data), len);
        m_sent++;
        return m_socket->SendTo(p, 0, ns3::InetSocketAddress(ns3::Ipv4Address(ip), port)) < 0 ? -1 : 0;
    }

    void ArmTimer(uint64_t atNs)
    {
        uint64_t now = ns3::Simulator::Now().GetNanoSeconds();
        if (atNs <= now)
        {
            atNs = now + 1;
        }
        if (m_timer.IsPending())
        {
            if (m_timerAt == atNs)
            {
                return;
            }
            m_timer.Cancel();
        }
        m_timerAt = atNs;
        m_timer = ns3::Simulator::Schedule(ns3::NanoSeconds(atNs - now), &DatagramEndpoint::OnTimer, this);
    }

    void CancelTimer()
    {
        m_timer.Cancel();
    }

    void Close()
    {
        m_timer.Cancel();
        if (m_socket)
        {
            m_socket->SetRecvCallback(ns3::MakeNullCallback<void, ns3::Ptr<ns3::Socket>>());
            m_socket->Close();
            m_socket = nullptr;
        }
    }

    uint64_t Received() const
    {
        return m_received;
    }

    uint64_t Sent() const
    {
        return m_sent;
    }

  private:
    void OnReceive(ns3::Ptr<ns3::Socket> socket)
    {
        ns3::Address from;
        ns3::Ptr<ns3::Packet> p;
        while (m_socket && (p = socket->RecvFrom(from)))
        {
            uint32_t len = p->GetSize();
            m_buf.resize(len);
            p->CopyData(m_buf.data(), len);
            ns3::SocketIpTosTag tos;
            bool ce = p->PeekPacketTag(tos) && (tos.GetTos() & 0x3) == 0x3;
            auto addr = ns3::InetSocketAddress::ConvertFrom(from);
            m_received++;
            if (Dispatch::receive)
            {
                Dispatch::receive(m_id, ns3::Simulator::Now().GetNanoSeconds(), len, addr.GetIpv4().Get(),
                                  addr.GetPort(), ce);
            }
        }
    }

    void OnTimer()
    {
        if (Dispatch::timer)
        {
            Dispatch::timer(m_id, ns3::Simulator::Now().GetNanoSeconds());
        }
    }

    uint32_t m_id;
    ns3::Ptr<ns3::Socket> m_socket;
    std::vector<uint8_t> m_buf;
    ns3::EventId m_timer;
    uint64_t m_timerAt = 0;
    uint16_t m_port = 0;
    bool m_bound = true;
    uint64_t m_received = 0;
    uint64_t m_sent = 0;
};

} // namespace netapprox_host
"""

_loaded: list[Any] = []
_endpoints: dict[int, "SimEndpoint"] = {}
_calls: dict[int, Callable[[], None]] = {}
_next_id = [1]
_errors: list[BaseException] = []


class SimulationError(RuntimeError):
    """Python code called from the simulator raised; the simulation was stopped at that instant."""


def _failed(err: BaseException) -> None:
    # An exception cannot cross ns-3's C++ event loop: keep the first one, stop the simulation, and let the
    # owner re-raise it after Simulator::Run returns (raise_pending).
    if not _errors:
        _errors.append(err)
        from ns import ns  # noqa: PLC0415

        ns.Simulator.Stop()


def _dispatch_receive(eid: int, now_ns: int, length: int, ip: int, port: int, ce: bool) -> None:
    ep = _endpoints.get(eid)
    if ep is not None:
        try:
            ep._on_receive(now_ns, length, ip, port, ce)
        except BaseException as e:  # noqa: BLE001 - re-raised by raise_pending
            _failed(e)


def _dispatch_timer(eid: int, now_ns: int) -> None:
    ep = _endpoints.get(eid)
    if ep is not None:
        try:
            ep._on_timer(now_ns)
        except BaseException as e:  # noqa: BLE001
            _failed(e)


def _dispatch_call(token: int, now_ns: int) -> None:
    fn = _calls.pop(token, None)
    if fn is not None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            _failed(e)


def raise_pending() -> None:
    """Re-raise (as ``SimulationError``, chained) the first exception a simulator callback raised, if any."""
    if _errors:
        err = _errors.pop(0)
        _errors.clear()
        raise SimulationError(f"simulation stopped: {type(err).__name__}: {err}") from err


def load() -> Any:
    """ns-3 (``from ns import ns``) with the endpoint shim compiled in; once per process."""
    if _loaded:
        return _loaded[0]
    try:
        from ns import ns  # noqa: PLC0415 - optional extra, slow import
        import cppyy  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"hostlib.sim needs ns-3: pip install -e '.[sim]' ({e})") from e
    if not hasattr(cppyy.gbl, "netapprox_host"):
        cppyy.cppdef(_SHIM)
    d = cppyy.gbl.netapprox_host.Dispatch
    d.receive, d.timer, d.call = _dispatch_receive, _dispatch_timer, _dispatch_call
    _loaded.append(ns)
    return ns


def call_later(delay_s: float, fn: Callable[[], None]) -> None:
    """Run ``fn()`` after ``delay_s`` of simulated time (rounded to the nanosecond)."""
    if not _loaded:
        load()
    import cppyy  # noqa: PLC0415

    token = _next_id[0]
    _next_id[0] += 1
    _calls[token] = fn
    cppyy.gbl.netapprox_host.CallLater(max(0, int(round(delay_s * 1e9))), token)


def reset() -> None:
    """Forget every endpoint, pending call and error (after ``Simulator::Destroy``, before the next simulation)."""
    _endpoints.clear()
    _calls.clear()
    _errors.clear()


def ip_int(address: str) -> int:
    """``"10.0.0.1"`` -> the int ns-3's ``Ipv4Address`` holds."""
    return int(ipaddress.IPv4Address(address))


def ip_str(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


class SimEndpoint:
    """One sans-I/O ATP core on one UDP socket of an ns-3 node. ``on_event`` gets every event of the core."""

    def __init__(self, node: Any, core: Any, *, port: int = 0, ip: int = 0,
                 on_event: Callable[[events.Event], None] | None = None) -> None:
        """``port``, ``ip``: the local address to bind (0: any)."""
        load()
        import cppyy  # noqa: PLC0415

        self.core = core
        self.on_event = on_event
        self._id = _next_id[0]
        _next_id[0] += 1
        self._ep = cppyy.gbl.netapprox_host.DatagramEndpoint(node, ip, port, self._id)
        if not self._ep.Bound():
            raise OSError(f"UDP {ip_str(ip)}:{port} is already bound on this simulated node")
        self.port = int(self._ep.Port())
        _endpoints[self._id] = self
        self._send = self._ep.SendTo
        self._arm = self._ep.ArmTimer
        self._cancel = self._ep.CancelTimer
        self._timer: float | None = None
        self.closed = False
        self.send_failures = 0
        # the receiver takes the CE mark; the sender's receive_datagram has no such argument
        self._takes_ce = _accepts_ce(core)

    def start(self, now_ns: int | None = None) -> None:
        """Run the core once at the current simulated time (a sender's job starts here)."""
        if now_ns is None:
            from ns import ns  # noqa: PLC0415

            now_ns = ns.Simulator.Now().GetNanoSeconds()
        self._pump(now_ns * 1e-9)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _endpoints.pop(self._id, None)
            self._ep.Close()

    @property
    def received(self) -> int:
        return int(self._ep.Received())

    # -- the loop, as in hostlib.aio.AtpProtocol.pump ----------------------------------------------

    def _on_receive(self, now_ns: int, length: int, src_ip: int, src_port: int, ce: bool) -> None:
        if self.closed:
            return
        data = self._take(length)
        now = now_ns * 1e-9
        if self._takes_ce:
            self.core.receive_datagram(data, (src_ip, src_port), now, ce=ce)
        else:
            self.core.receive_datagram(data, (src_ip, src_port), now)
        self._pump(now)

    def _on_timer(self, now_ns: int) -> None:
        if self.closed:
            return
        now = now_ns * 1e-9
        self._timer = None
        self.core.handle_timer(now)
        self._pump(now)

    def _take(self, length: int) -> bytes:
        """The datagram the shim holds, copied out of ns-3."""
        view = self._ep.Data()
        view.reshape((length,))
        return bytes(view)

    def _pump(self, now: float) -> None:
        core = self.core
        send = self._send
        for data, (ip, port) in core.datagrams_to_send(now):
            if send(data, len(data), ip, port) != 0:
                self.send_failures += 1
        on_event = self.on_event
        while (ev := core.next_event()) is not None:
            if on_event is not None:
                on_event(ev)
        if self.closed:
            return
        at = core.get_timer()
        if at != self._timer:
            self._timer = at
            if at is None:
                self._cancel()
            else:
                self._arm(math.ceil(at * 1e9 - 1e-3))


class ProfiledEndpoint(SimEndpoint):
    """A ``SimEndpoint`` that adds the wall-clock time of each step of its loop to ``ProfiledEndpoint.seconds``
    (shared by all instances; ``reset_profile()`` clears it): ``copy`` (the datagram out of ns-3),
    ``core_receive`` / ``core_timer`` / ``core_send`` / ``core_timer_query`` / ``core_events`` (the sans-I/O
    core: receive_datagram, handle_timer, datagrams_to_send, get_timer, next_event and the owner's event
    handler), ``ns3_send`` (SendTo: cppyy and ns-3's UDP/IP/NIC path) and ``ns3_timer`` (moving the timer
    event). ``calls`` counts datagrams received, timer firings and datagrams sent.

    It runs ``SimEndpoint``'s loop unchanged: each step the loop calls (the core, the owner's event handler,
    the copy, the shim's send and timer) is wrapped in a timer of its own."""

    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}

    @classmethod
    def reset_profile(cls) -> None:
        cls.seconds = dict.fromkeys(("copy", "core_receive", "core_timer", "core_send", "ns3_send", "core_events",
                                     "core_timer_query", "ns3_timer"), 0.0)
        cls.calls = {"received": 0, "timers": 0, "sent": 0}

    def __init__(self, node: Any, core: Any, **kwargs: Any) -> None:
        super().__init__(node, core, **kwargs)
        self.core = _TimedCore(core)
        if self.on_event is not None:
            self.on_event = _timed(self.on_event, "core_events")
        self._send = _timed(self._send, "ns3_send")
        self._arm = _timed(self._arm, "ns3_timer")
        self._cancel = _timed(self._cancel, "ns3_timer")

    def _take(self, length: int) -> bytes:
        t0 = _perf()
        data = super()._take(length)
        ProfiledEndpoint.seconds["copy"] += _perf() - t0
        ProfiledEndpoint.calls["received"] += 1
        return data


def _timed(fn: Callable[..., Any], step: str) -> Callable[..., Any]:
    """``fn`` adding its wall-clock time to ``ProfiledEndpoint.seconds[step]``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = _perf()
        try:
            return fn(*args, **kwargs)
        finally:
            ProfiledEndpoint.seconds[step] += _perf() - t0
    return call


class _TimedCore:
    """A sans-I/O core whose loop-facing methods are timed (``ProfiledEndpoint``); the rest passes through."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.receive_datagram = _timed(core.receive_datagram, "core_receive")
        self.get_timer = _timed(core.get_timer, "core_timer_query")
        self.next_event = _timed(core.next_event, "core_events")
        self._handle_timer = _timed(core.handle_timer, "core_timer")
        self._datagrams_to_send = _timed(core.datagrams_to_send, "core_send")

    def handle_timer(self, now: float) -> None:
        ProfiledEndpoint.calls["timers"] += 1
        self._handle_timer(now)

    def datagrams_to_send(self, now: float) -> list:
        out = self._datagrams_to_send(now)
        ProfiledEndpoint.calls["sent"] += len(out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


ProfiledEndpoint.reset_profile()


def _accepts_ce(core: Any) -> bool:
    try:
        return "ce" in inspect.signature(core.receive_datagram).parameters
    except (TypeError, ValueError):
        return False
