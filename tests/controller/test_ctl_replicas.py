"""Controller replicas on P4Runtime arbitration, against the fake P4Runtime server (controller/p4runtime/fake_server.py),
which arbitrates as the P4Runtime specification says: the fake itself (raw clients), the replica's choice of
election id, two and three replicas in one process (takeover within one epoch, returns in any order, per-switch
primaries), and replica processes with a primary killed by SIGKILL."""
from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2
from netapprox.controller.p4runtime.protos import p4runtime_pb2, p4runtime_pb2_grpc

from netapprox.controller.__main__ import apply_flags, build_parser
from netapprox.controller.config import ControllerConfig, ReportConfig, SwitchConfig, config_from_dict
from netapprox.controller.drivers import build_driver
from netapprox.controller.errors import ConfigError
from netapprox.controller.model import Route
from netapprox.controller.p4runtime.arbitration import claim, initial_id
from netapprox.controller.p4runtime.driver import P4RuntimeDriver
from netapprox.controller.p4runtime.mirror import action_value, entry_identity
from netapprox.controller.p4runtime.options import P4RuntimeOptions
from netapprox.controller.runtime import Runtime
from netapprox.hostlib import api
from netapprox.hostlib.wire import Report
from netapprox.controller.p4runtime.fake_server import FakeP4RuntimeServer
from support.paper_policy import PolicyConfig

from ctl_fixtures import REPO, P4INFO, Hosts, controller_toml, free_udp_port, job_entries, report
from ctl_fixtures import start_controller, stop_process, wait_until

OK, ALREADY_EXISTS, NOT_FOUND = code_pb2.OK, code_pb2.ALREADY_EXISTS, code_pb2.NOT_FOUND
ROUTE = Route("10.0.0.1", 32, 1, "02:00:00:00:01:00", "02:00:00:00:00:01")
JOB_UPDATE = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT, entity=p4runtime_pb2.Entity(
    table_entry=p4runtime_pb2.TableEntry(table_id=33554435, match=[p4runtime_pb2.FieldMatch(
        field_id=1, exact=p4runtime_pb2.FieldMatch.Exact(value=b"\x07"))], action=p4runtime_pb2.TableAction(
        action=p4runtime_pb2.Action(action_id=16777230, params=[p4runtime_pb2.Action.Param(param_id=1,
                                                                                            value=b"\x03")])))))


# --- the fake server arbitrates as the specification says ------------------------------------------------------


class Client:
    """A raw P4Runtime client: one StreamChannel, the arbitration updates it receives, and Writes."""

    def __init__(self, fake: FakeP4RuntimeServer) -> None:
        self.channel = grpc.insecure_channel(fake.address)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.requests: queue.Queue = queue.Queue()
        self.updates: queue.Queue = queue.Queue()
        self.ended: grpc.StatusCode | None = None
        self.stream = self.stub.StreamChannel(iter(self.requests.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.stream:
                self.updates.put(message)
        except grpc.RpcError as e:
            self.ended = e.code()
        self.updates.put(None)

    def arbitrate(self, election: tuple[int, int] | None, device_id: int = 1) -> None:
        update = p4runtime_pb2.MasterArbitrationUpdate(device_id=device_id)
        if election is not None:
            update.election_id.high, update.election_id.low = election
        self.requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=update))

    def next(self) -> tuple[int, tuple[int, int] | None] | None:
        """(status code, election id or None) of the next arbitration update; None when the stream ended."""
        while True:
            message = self.updates.get(timeout=5)
            if message is None:
                return None
            if message.WhichOneof("update") == "arbitration":
                a = message.arbitration
                return a.status.code, ((a.election_id.high, a.election_id.low) if a.HasField("election_id") else None)

    def packets(self) -> list[bytes]:
        out = []
        while not self.updates.empty():
            message = self.updates.get()
            if message is not None and message.WhichOneof("update") == "packet":
                out.append(message.packet.payload)
        return out

    def write(self, election: tuple[int, int]) -> grpc.StatusCode:
        request = p4runtime_pb2.WriteRequest(device_id=1, election_id=p4runtime_pb2.Uint128(
            high=election[0], low=election[1]), updates=[JOB_UPDATE])
        try:
            self.stub.Write(request, timeout=5)
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    def close(self) -> None:
        self.requests.put(None)
        self.stream.cancel()
        self.channel.close()


def test_fake_server_arbitration_follows_the_p4runtime_specification(fake_server, make_driver):
    driver = make_driver()  # a pipeline to write to
    driver.connect()
    driver.close()
    a, b, c, d = (Client(fake_server) for _ in range(4))
    try:
        a.arbitrate((0, 1))
        assert a.next() == (OK, (0, 1))
        b.arbitrate((0, 2))  # a higher id: a new primary, announced to every client
        assert a.next() == (ALREADY_EXISTS, (0, 2)) and b.next() == (OK, (0, 2))
        assert a.write((0, 1)) == grpc.StatusCode.PERMISSION_DENIED  # a backup's Write
        assert b.write((0, 2)) == grpc.StatusCode.OK
        assert fake_server.denied == {(0, 1): 1}
        c.arbitrate((0, 2))  # an election id a live client holds: the stream ends
        assert c.next() is None and c.ended == grpc.StatusCode.INVALID_ARGUMENT
        d.arbitrate(None)  # unset: lower than any, never primary; only it is answered
        assert d.next() == (ALREADY_EXISTS, (0, 2)) and a.updates.empty()

        b.close()  # the primary goes away: nobody is primary (no promotion), every client is told
        assert a.next() == (NOT_FOUND, (0, 2)) and d.next() == (NOT_FOUND, (0, 2))
        assert fake_server.primary() is None and a.write((0, 1)) == grpc.StatusCode.PERMISSION_DENIED
        a.arbitrate((0, 1))  # below the highest id ever received: still a backup, answered alone
        assert a.next() == (NOT_FOUND, (0, 2)) and d.updates.empty()
        a.arbitrate((1, 1))  # >= it: primary
        assert d.next() == (ALREADY_EXISTS, (1, 1)) and a.next() == (OK, (1, 1))
        fake_server.send_packet_in(b"to the primary only")
        assert wait_until(lambda: not a.updates.empty(), 5) and a.packets() == [b"to the primary only"]
        assert d.packets() == []
        a.arbitrate((0, 7))  # the primary steps down: every client hears there is none
        assert d.next() == (NOT_FOUND, (1, 1)) and a.next() == (NOT_FOUND, (1, 1))
    finally:
        for client in (a, b, c, d):
            client.close()
    other = Client(fake_server)
    try:
        other.arbitrate((0, 1), device_id=9)  # a device the server does not have
        assert other.next() is None and other.ended == grpc.StatusCode.NOT_FOUND
    finally:
        other.close()


# --- what a replica asks for --------------------------------------------------------------------------------


def test_arbitration_claims_the_smallest_id_of_its_own_that_can_be_primary():
    assert initial_id(2) == (0, 2)
    assert claim(1, (0, 1), OK, (0, 1)) is None  # primary: nothing to ask
    assert claim(1, (0, 1), ALREADY_EXISTS, (0, 2)) is None  # a higher rank is primary
    assert claim(3, (0, 3), ALREADY_EXISTS, (1, 2)) == (1, 3)  # a higher rank returns: it takes over
    assert claim(2, (0, 2), ALREADY_EXISTS, (1, 2)) is None  # the same rank (a misconfiguration): no fight
    assert claim(1, (0, 1), NOT_FOUND, (0, 2)) == (1, 1)  # no primary, a higher past id: next term
    assert claim(3, (0, 3), NOT_FOUND, (2, 2)) == (2, 3)  # a higher rank than the past id: the same term
    assert claim(2, (0, 2), NOT_FOUND, (4, 2)) == (4, 2)  # its own past id (its old stream is gone)
    assert claim(1, (0, 1), NOT_FOUND, None) is None  # already holds the id it would ask for
    assert claim(1, (5, 1), NOT_FOUND, (4, 2)) is None  # a stale update: it asked (5, 1) already


# --- replicas in one process ------------------------------------------------------------------------------------


def replica(fakes: dict[str, FakeP4RuntimeServer], bmv2_json: Path, tmp_path: Path, rank: int) -> Runtime:
    """Replica ``rank`` of a set with one configuration, for the switches ``fakes``; epochs run by hand."""
    switches = tuple(SwitchConfig(name=name, routes=(ROUTE,), options={
        "address": fake.address, "p4info": str(P4INFO), "bmv2_json": str(bmv2_json), "connect_timeout_s": 2.0})
        for name, fake in fakes.items())
    config = ControllerConfig(switches=switches, reports=ReportConfig(port=-1), counters_every=0, replica=rank,
                              policy=PolicyConfig(job_timeout_s=60.0, hysteresis=0.0),
                              decision_log=str(tmp_path / f"decisions-{rank}.jsonl"),
                              reconnect_initial_s=0.05, reconnect_max_s=0.2)
    return Runtime(config, background_connect=False)


def ingest(replicas, *reports: tuple[int, int, float], now: float) -> None:
    """The hosts report to every replica."""
    for rt in replicas:
        for job, seq, tlr in reports:
            rt.ingest(report(job, seq, tlr), "10.0.0.1", now=now)


def primaries(replicas: dict[int, Runtime], name: str) -> list[int]:
    """The ranks whose driver says it is the primary of switch ``name``."""
    return [rank for rank, rt in replicas.items() if rt.driver(name).is_primary()]


def desired_entries(rt: Runtime, name: str) -> set:
    """(identity, action) of every entry of switch ``name``'s desired state, as a controller that installed
    nothing would write them."""
    fresh = P4RuntimeDriver(name, P4RuntimeOptions(p4info=str(P4INFO), check_bmv2_version=False))
    changes = fresh.pending_changes(rt.core.desired_state(name))
    return {(entry_identity(c.entry), action_value(c.entry.action)) for c in changes}


def held_entries(fake: FakeP4RuntimeServer) -> set:
    return {(entry_identity(e), action_value(e.action)) for e in fake.entries()}


def test_two_replicas_one_primary_and_a_takeover_within_one_epoch(fake_server, bmv2_json, tmp_path):
    """Replica 2 is primary and writes; replica 1 runs the same epochs on the same reports and writes nothing.
    Replica 2 dies with a job move it has not written: after the arbitration round trip, replica 1's first epoch
    as primary reconciles with the switch and writes the move; the tables then hold exactly its desired state."""
    fakes = {"s1": fake_server}
    r1, r2 = replica(fakes, bmv2_json, tmp_path, 1), replica(fakes, bmv2_json, tmp_path, 2)
    try:
        assert r1.connect(5) and r2.connect(5)
        assert wait_until(lambda: primaries({1: r1, 2: r2}, "s1") == [2], 5)
        ingest((r1, r2), (5, 1, 0.30), (6, 1, 0.80), now=0.0)
        first = [rt.epoch(now=0.02) for rt in (r1, r2)]
        r2.driver("s1").flush()
        assert "s1" not in first[0].writes and first[1].writes["s1"].inserted == 12  # route, 8 TLR, ECN, 2 jobs
        assert job_entries(fake_server) == {5: 2, 6: 6} and held_entries(fake_server) == desired_entries(r2, "s1")

        ingest((r1, r2), (5, 2, 0.55), now=0.03)  # job 5 moves to queue 4 ...
        r2.close()  # ... and the primary dies before its next epoch
        assert wait_until(lambda: r1.driver("s1").is_primary(), 5)  # the arbitration round trip
        assert fake_server.primary() == (1, 1)  # no primary is made by the switch: replica 1 asked for the next term
        takeover = r1.epoch(now=0.04)  # one epoch
        r1.driver("s1").flush()
        assert takeover.writes["s1"].modified == 1 and job_entries(fake_server) == {5: 4, 6: 6}
        assert held_entries(fake_server) == desired_entries(r1, "s1")
        assert len(fake_server.pipelines) == 1  # reconciled by reading back, not by pushing the pipeline again
        assert not fake_server.denied  # no Write of a backup, ever
        ingest((r1,), (6, 2, 0.15), now=0.05)  # the job moves resume
        r1.epoch(now=0.06)
        r1.driver("s1").flush()
        assert job_entries(fake_server) == {5: 4, 6: 1}
        text = r1.metrics_text()
        assert 'netapprox_switch_primary{switch="s1"} 1.0' in text
        assert 'netapprox_switch_primary_replica{switch="s1"} 1.0' in text
        events = [json.loads(line)["event"] for line in (tmp_path / "decisions-1.jsonl").read_text().splitlines()]
        assert events.index("backup") < events.index("primary")
    finally:
        r1.close()
        r2.close()


@pytest.mark.parametrize("order", list(itertools.permutations((1, 2, 3))))
def test_three_replicas_returning_in_any_order_converge_to_one_primary_per_switch(order, bmv2_json, tmp_path):
    """Three replicas, two switches. Replicas start in ``order``; the primary is killed, then returns. After
    every step each switch has exactly one primary, the highest live rank, every replica agrees, and no replica
    that was not primary ever sent a Write."""
    with FakeP4RuntimeServer() as fa, FakeP4RuntimeServer() as fb:
        fakes = {"a": fa, "b": fb}
        live: dict[int, Runtime] = {}

        def settle(now: float) -> None:
            top = max(live)
            for name, fake in fakes.items():
                assert wait_until(lambda: fake.primary() is not None and fake.primary()[1] == top
                                  and primaries(live, name) == [top], 5), (name, fake.primary(), primaries(live, name))
            for rt in live.values():
                rt.epoch(now=now)
            live[top].driver("a").flush()
            live[top].driver("b").flush()

        try:
            for step, rank in enumerate(order):
                live[rank] = replica(fakes, bmv2_json, tmp_path, rank)
                assert live[rank].connect(5)
                ingest(live.values(), (5, step + 1, 0.30 + 0.1 * step), now=step)
                settle(now=step + 0.5)
                assert job_entries(fa) == job_entries(fb) == {5: 2 + step}
            live.pop(3).close()  # kill the primary
            ingest(live.values(), (5, 9, 0.95), now=10)
            settle(now=10.5)
            assert job_entries(fa) == job_entries(fb) == {5: 7}
            live[3] = replica(fakes, bmv2_json, tmp_path, 3)  # it returns, knowing nothing yet
            assert live[3].connect(5)
            ingest(live.values(), (5, 10, 0.15), now=11)
            settle(now=11.5)
            assert job_entries(fa) == job_entries(fb) == {5: 1}
            assert not fa.denied and not fb.denied
        finally:
            for rt in live.values():
                rt.close()


def test_replica_primaries_are_per_switch(bmv2_json, tmp_path):
    """Replica 2 loses its connection to switch b only (a partition): replica 1 takes over b while replica 2 stays
    primary of a; each switch's metrics say who is primary. When replica 2 is back, it takes b over again and
    replica 1 steps down without a refused Write."""
    with FakeP4RuntimeServer() as fa, FakeP4RuntimeServer() as fb:
        fakes = {"a": fa, "b": fb}
        r1, r2 = replica(fakes, bmv2_json, tmp_path, 1), replica(fakes, bmv2_json, tmp_path, 2)
        try:
            assert r1.connect(5) and r2.connect(5)
            ingest((r1, r2), (5, 1, 0.30), now=0.0)
            for rt in (r1, r2):
                rt.epoch(now=0.02)
            fb.drop_client((0, 2))
            assert wait_until(lambda: r1.driver("b").is_primary(), 5)
            r1.epoch(now=0.04)
            assert fa.primary() == (0, 2) and fb.primary() == (1, 1)
            r1.epoch(now=0.06)
            r2.epoch(now=0.06)
            assert not r2.switch_up("b")  # its connection to b broke
            one, two = r1.metrics_text(), r2.metrics_text()
            assert 'netapprox_switch_primary{switch="a"} 0.0' in one
            assert 'netapprox_switch_primary{switch="b"} 1.0' in one
            assert 'netapprox_switch_primary{switch="a"} 1.0' in two
            assert 'netapprox_switch_primary_replica{switch="a"} 2.0' in one + two
            assert 'netapprox_switch_primary_replica{switch="b"} 1.0' in one
            assert wait_until(lambda: r2.connect(0.5, names=("b",)), 5)  # back: it reconnects ...
            assert wait_until(lambda: fb.primary() == (1, 2), 5)  # ... and takes over (a higher rank)
            assert wait_until(lambda: primaries({1: r1, 2: r2}, "b") == [2], 5)  # replica 1 heard it
            for rt in (r1, r2):
                rt.epoch(now=0.08)
            assert not fa.denied and not fb.denied
            assert job_entries(fa) == job_entries(fb) == {5: 2}
        finally:
            r1.close()
            r2.close()


# --- configuration -------------------------------------------------------------------------------------------


def test_replica_configuration_and_command_line(tmp_path):
    switch = {"name": "s1", "options": {"p4info": str(P4INFO)}}
    config = config_from_dict({"controller": {"replica": 2}, "switch": [switch]})
    assert config.replica == 2
    driver = build_driver(config.switches[0], replica=config.replica)
    assert driver.options.replica == 2 and driver.session.election == (0, 2)
    with pytest.raises(ConfigError, match="replica: switch 'k' has no arbiter"):
        ControllerConfig(switches=(SwitchConfig(name="k", kind="kernel", options={"ports": ["p1"]}),), replica=1)
    path = tmp_path / "c.toml"
    path.write_text('[[switch]]\nname = "s1"\n')
    args = build_parser().parse_args(["--config", str(path), "--replica", "3"])
    assert apply_flags(config_from_dict({"switch": [switch]}), args).replica == 3


# --- replica processes: SIGKILL of the primary -------------------------------------------------------------------


def test_replica_processes_failover_after_sigkill_of_the_primary(fake_server, bmv2_json, tmp_path):
    """Two controller processes with one TOML (``--replica 1`` and ``--replica 2``, each its own report port), hosts
    reporting to both. SIGKILL the primary: replica 1 becomes primary, the tables still hold the desired state,
    the job moves resume, and replica 1 never had a Write refused."""
    ports = free_udp_port(), free_udp_port()
    config = tmp_path / "controller.toml"
    config.write_text(controller_toml(
        address=fake_server.address, p4info=P4INFO, bmv2_json=bmv2_json, report_port=0,
        decision_log=tmp_path / "decisions.jsonl",
        routes=[("10.0.0.1/32", 1, "02:00:00:00:00:01")], policy="job_timeout_s = 2.0",
        options="connect_timeout_s = 3.0"))
    logs = [tmp_path / "replica-1.log", tmp_path / "replica-2.log"]
    procs = {}
    try:
        with Hosts(*ports) as hosts:
            for rank in (2, 1):  # replica 1 is never primary before the kill: no Write of it may be refused
                procs[rank] = start_controller(config, logs[rank - 1], "--replica", str(rank), "--report-port",
                                               str(ports[rank - 1]),
                                               "--decision-log", str(tmp_path / f"decisions-{rank}.jsonl"))
                assert wait_until(lambda: fake_server.primary() == (0, 2) and len(fake_server.arbitrations) >= 3 - rank,
                                  15), logs[rank - 1].read_text()[-2000:]
            assert wait_until(lambda: job_entries(fake_server) == {5: 2, 6: 6}, 15), logs[1].read_text()[-2000:]
            procs[2].send_signal(signal.SIGKILL)
            hosts.tlrs[5] = 0.55  # a move the new primary must make
            assert wait_until(lambda: job_entries(fake_server) == {5: 4, 6: 6}, 10), logs[0].read_text()[-2000:]
            assert fake_server.primary() == (1, 1) and procs[1].poll() is None
            hosts.tlrs[6] = 0.15
            assert wait_until(lambda: job_entries(fake_server) == {5: 4, 6: 1}, 10), logs[0].read_text()[-2000:]
            assert len(fake_server.entries(33554433)) == 1 and len(fake_server.pipelines) == 1
        assert not fake_server.denied
    finally:
        for proc in procs.values():
            stop_process(proc)
    text = logs[0].read_text()
    assert "taking over as primary" in text and "entries read back to reconcile" in text, text[-2000:]


# --- the same inputs: hosts report to every replica -----------------------------------------------------------


def test_a_sender_reports_to_every_replica(tmp_path):
    """hostlib's ``report_to`` takes a list, and ``atp-send`` takes ``--report-to`` once per replica: every
    replica gets every REPORT."""
    ctls = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    port = free_udp_port()
    try:
        for ctl in ctls:
            ctl.bind(("127.0.0.1", 0))
        receiver = threading.Thread(target=lambda: api.receive_job(("127.0.0.1", port), timeout=20), daemon=True)
        receiver.start()
        time.sleep(0.2)  # the receiver binds its socket
        res = subprocess.run([sys.executable, "-m", "netapprox.hostlib", "send", "127.0.0.1", "--port", str(port),
                              "--job-id", "41", "--messages", "300", "--size", "1000", "--msr", "0.9",
                              "--rate", "20M", "--epoch-ms", "10",  # ~0.12 s of sending, a REPORT every 10 ms
                              *[a for ctl in ctls for a in ("--report-to", f"127.0.0.1:{ctl.getsockname()[1]}")]],
                             capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
        receiver.join(20)
        assert res.returncode == 0, res.stderr[-2000:]
        got = []
        for ctl in ctls:
            ctl.setblocking(False)
            reports = []
            while True:
                try:
                    reports.append(Report.decode(ctl.recv(2048)))
                except BlockingIOError:
                    break
            got.append([(r.job_id, r.group_id, r.seq, r.tlr) for r in reports])
        assert got[0] and got[0] == got[1] and {job for job, *_ in got[0]} == {41}
        assert api.report_addresses([("10.0.0.1", 7601), "10.0.0.2", "ctl3:7700"]) == [
            ("10.0.0.1", 7601), ("10.0.0.2", 7601), ("ctl3", 7700)]
        assert api.report_addresses("10.0.0.1") == [("10.0.0.1", 7601)] and api.report_addresses(None) == []
    finally:
        for ctl in ctls:
            ctl.close()
