"""Command line: ``python -m netapprox.hostlib send ...`` / ``python -m netapprox.hostlib recv ...`` (also ``atp-send``, ``atp-recv``).

Exit status: 0 success, 1 the job failed or timed out (a destination port nobody listens on fails at its first
ICMP port unreachable, not after ``--idle-timeout``), 2 bad input or a port that cannot be bound (one line on
stderr, ``PROG: error: ...``, naming the option, before any packet is sent; output files are checked then too).
Quiet unless ``-v``: the job summary goes to stdout, diagnostics to stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from netapprox.hostlib import api, events, link, wire
from netapprox.hostlib import checks as C
from netapprox.hostlib.reporting import read_report_key
from netapprox.hostlib.config import (
    COMPLETION_POLICIES,
    MAX_MESSAGES,
    MODE_ALIASES,
    MODES,
    AtpConfig,
    ConfigError,
    JobSpec,
    Tags,
    parse_rate,
)

log = logging.getLogger("hostlib")


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise _Interrupted(signum)


def _group(text: str) -> tuple[int, float, int]:
    try:
        gid, msr, count = text.split(":")
        g, m, c = int(gid), float(msr), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected GROUP:MSR:MESSAGES, e.g. 1:0.9:200") from None
    if not 0 < g <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"{text!r}: group id must be 1..65535 (0 is the global group)")
    if not 0.0 <= m <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: MSR must be in [0, 1]")
    if c < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a group needs at least one message")
    return g, m, c


def _rate(text: str) -> float:
    try:
        return parse_rate(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _msr(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"MSR {text!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"MSR {text} must be in [0, 1]")
    return v


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return v
    return parse


def _address(option: str, text: str, default_port: int) -> tuple[str, int]:
    try:
        return api.parse_address(text, default_port)
    except ValueError as err:
        raise ConfigError(f"{option}: {err}") from None


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)


def _install_signal_handlers() -> None:
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)


# --- send -----------------------------------------------------------------------------------------

def send_parser() -> argparse.ArgumentParser:
    p = C.OneLineParser(prog="atp-send", description="Send one ATP job and print its summary.")
    p.add_argument("dest", help="receiver HOST or HOST:PORT")
    p.add_argument("--port", type=C.arg(C.port()), default=wire.DEFAULT_ATP_PORT,
                   help="receiver ATP port if DEST has none")
    p.add_argument("--job-id", type=C.arg(C.integer(ge=1, le=0xFFFFFFFF)), default=None,
                   help="job id, 1..2^32-1 (default: random)")
    p.add_argument("--messages", type=C.arg(C.integer(ge=0, le=MAX_MESSAGES)), default=None,
                   help="messages in the global group 0 (default 100, or 0 when --group is given)")
    p.add_argument("--size", type=C.arg(C.integer(ge=0, le=1 << 30)), default=1368,
                   help="bytes per message (default 1368: one packet)")
    p.add_argument("--msr", type=_msr, default=1.0, help="global MSR, for group 0 (default 1.0)")
    p.add_argument("--group", type=_group, action="append", default=[], metavar="ID:MSR:MESSAGES",
                   help="an extra group, e.g. 1:0.9:200 (repeatable)")
    p.add_argument("--vector", type=C.arg(C.integer(ge=1, le=MAX_MESSAGES)), default=None, metavar="N",
                   help="send a float32 vector of N random values instead (bounded-loss mode; default: messages, not a vector)")
    p.add_argument("--rate", type=_rate, default=None,
                   help="R_max, e.g. 10G (bit/s; default: the speed of the interface the route to DEST leaves by, "
                        "10G to this host, 1G when the interface reports none; the summary says which)")
    p.add_argument("--initial-rate", type=_rate, default=None, help="starting rate (default R_max)")
    p.add_argument("--gain", type=C.arg(C.number(gt=0.0, le=1.0)), default=AtpConfig.gain,
                   help="m of eq. 2 (default %(default)s)")
    p.add_argument("--mode", choices=[*MODES, *MODE_ALIASES], default="adaptive",
                   help="adaptive (default), paper (the paper's eq. 2/3; alias full), fixtlr, base")
    p.add_argument("--no-mrdf", action="store_true", help="send messages in id order instead of MRDF")
    p.add_argument("--completion", choices=list(COMPLETION_POLICIES), default="early",
                   help="early (default): done when every MSR is met; all_sent: also every message sent once")
    p.add_argument("--packet-size", type=C.arg(C.integer(ge=wire.HEADER_LEN + 16, le=65507)),
                   default=AtpConfig.packet_size, help="max ATP datagram bytes (48..65507)")
    p.add_argument("--epoch-ms", type=_positive(float), default=None, help="fixed epoch (default: one srtt)")
    p.add_argument("--min-epoch-ms", type=_positive(float), default=AtpConfig.min_epoch_s * 1e3,
                   help="shortest epoch when it follows the srtt")
    p.add_argument("--priority", type=C.arg(C.integer(ge=0, le=255)), default=None,
                   help="CadentFlow priority 0..255, 0 most urgent (default: untagged; 0 if --weight or --deadline-ms is given)")
    p.add_argument("--weight", type=C.arg(C.integer(ge=1, le=255)), default=None, help="CadentFlow weight 1..255 (default: untagged; 1 if --priority or --deadline-ms is given)")
    p.add_argument("--deadline-ms", type=C.arg(C.number(ge=0.0)), default=None,
                   help="CadentFlow deadline after job start (default: none)")
    p.add_argument("--report-to", action="append", default=None, metavar="HOST[:PORT]",
                   help="controller (port 7601 default); repeat it for each controller of a replica set (default: no reports)")
    p.add_argument("--report-key-file", type=Path, default=None, help="file holding the report HMAC key (default: unsigned reports)")
    p.add_argument("--admission-key-file", type=Path, default=None,
                   help="file holding the receiver's shared admission key (signs the job announce; default: unsigned)")
    p.add_argument("--timeout", type=_positive(float), default=None, help="give up after this many seconds (default: no limit but --idle-timeout)")
    p.add_argument("--idle-timeout", type=_positive(float), default=AtpConfig.idle_timeout_s,
                   help="give up when nothing is acknowledged for this long (default %(default)s s)")
    p.add_argument("--seed", type=C.arg(C.integer()), default=None, help="seed for --vector values (default: random)")
    p.add_argument("--json", type=C.arg(C.output_file(), str), default=None, metavar="FILE",
                   help="write the summary as JSON (default: stdout only)")
    p.add_argument("--timeline", type=C.arg(C.output_file(), str), default=None, metavar="FILE",
                   help="per-epoch JSON lines (default: none written)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v progress, -vv every epoch, on stderr")
    return p


def _build_job(args: argparse.Namespace) -> JobSpec:
    tags = None
    if args.priority is not None or args.weight is not None or args.deadline_ms is not None:
        tags = Tags(priority=args.priority or 0, weight=args.weight or 1,
                    deadline_s=None if args.deadline_ms is None else args.deadline_ms / 1e3)
    job_id = args.job_id if args.job_id is not None else random.SystemRandom().randint(1, 0x7FFFFFFF)
    if args.vector is not None:
        if args.group or args.messages is not None:
            raise ConfigError("--vector sends one float vector; it cannot be combined with --messages/--group")
        if args.vector < 1:
            raise ConfigError("--vector needs N >= 1")
        rng = random.Random(args.seed)
        values = [rng.uniform(-1.0, 1.0) for _ in range(args.vector)]
        return JobSpec.from_vector(job_id, values, msr=args.msr,
                                   floats_per_message=wire.floats_per_packet(args.packet_size - wire.HEADER_LEN),
                                   tags=tags)
    messages = args.messages if args.messages is not None else (0 if args.group else 100)
    if messages < 0 or args.size < 0:
        raise ConfigError("--messages and --size must be >= 0")
    if messages == 0 and not args.group:
        raise ConfigError("nothing to send: give --messages N or at least one --group")
    ids = [g for g, _, _ in args.group]
    if len(set(ids)) != len(ids):
        raise ConfigError("each --group id may appear once")
    return JobSpec.uniform(job_id, messages=messages, size=args.size, msr=args.msr, groups=args.group, tags=tags)


def _read_key(path: Path | None, flag: str) -> bytes | None:
    return None if path is None else read_report_key(path, flag)


def _send_config(args: argparse.Namespace) -> AtpConfig:
    key = _read_key(args.report_key_file, "--report-key-file")
    return AtpConfig(admission_key=_read_key(args.admission_key_file, "--admission-key-file"),
                     mode=args.mode, mrdf=not args.no_mrdf, completion=args.completion,
                     max_rate_bps=args.rate, initial_rate_bps=args.initial_rate, gain=args.gain,
                     packet_size=args.packet_size, epoch_s=None if args.epoch_ms is None else args.epoch_ms / 1e3,
                     min_epoch_s=args.min_epoch_ms / 1e3, idle_timeout_s=args.idle_timeout, report_key=key)


def format_send_summary(s) -> str:
    """The job's summary. A group's "not delivered" counts the messages the receiver lacks: lost in the network,
    or never sent because the MSR was met first (completion ``early``); the packets line says how many packets
    were declared lost in the network, so the difference was skipped. The rate is the pacer's, which runs
    above R_max in adaptive mode (``AtpConfig.pacing_gain``) to catch up after a stall."""
    lines = [f"job {s.job_id}: {'MSR met' if s.msr_met() else 'MSR NOT met'} in JCT {s.jct_s * 1e3:.1f} ms "
             f"(mode {s.mode}, mrdf {'on' if s.mrdf else 'off'}, completion {s.completion}, "
             f"receiver {'confirmed' if s.receiver_confirmed else 'did not confirm'})"]
    for g in s.groups:
        lines.append(f"  group {g.group_id}: delivered {g.delivered}/{g.total} (need {g.required}), not delivered "
                     f"{g.lost}, {g.measured_loss:.3f} vs 1-MSR {g.target_loss:.3f}, final TLR {g.final_tlr:.3f}, "
                     f"retransmissions {g.retransmissions}")
    missing = sum(g.lost for g in s.groups)
    if missing > s.packets_lost:
        lines.append(f"  not delivered {missing}: at least {missing - s.packets_lost} never sent (skipped once the "
                     f"MSR was met), at most {s.packets_lost} lost in the network")
    lines.append(f"  packets sent {s.packets_sent}, acked {s.packets_acked}, declared lost in the network "
                 f"{s.packets_lost}, retransmissions {s.retransmissions}, epochs {s.epochs}, final pacing rate "
                 f"{s.final_rate_bps / 1e6:.2f} Mbit/s, srtt {s.srtt_s * 1e3:.2f} ms")
    if s.rejected:
        lines.append(f"  rejected {sum(s.rejected.values())} datagram(s): {_counts(s.rejected)}")
    return "\n".join(lines)


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def send_main(argv: Sequence[str] | None = None) -> int:
    parser = send_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        job = _build_job(args)
        config = _send_config(args)
        dest = _address("DEST", args.dest, args.port)
        report_to = None if args.report_to is None else [_address("--report-to", a, wire.DEFAULT_REPORT_PORT)
                                                         for a in args.report_to]
        config, rmax = link.resolve_rate(config, dest)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    _install_signal_handlers()

    def on_event(ev: events.Event) -> None:
        if isinstance(ev, events.EpochEnded) and log.isEnabledFor(logging.DEBUG):
            log.debug("epoch %d group %d: tlr %.3f rate %.2f Mbit/s loss %.3f", ev.epoch, ev.group_id, ev.tlr,
                      ev.rate_bps / 1e6, ev.loss)

    log.info("sending job %d (%d messages) to %s:%d", job.job_id, len(job.messages), *dest)
    try:
        summary = api.send_job(dest, job, config=config, report_to=report_to, timeline=args.timeline,
                               timeout=args.timeout, on_event=on_event)
    except _Interrupted as sig:
        print(f"atp-send: error: interrupted ({sig}), job {job.job_id} not finished", file=sys.stderr)
        return 1
    except api.BindError as err:
        print(f"atp-send: error: {C.one_line(err)}", file=sys.stderr)
        return 2
    except (api.AtpError, OSError) as err:
        print(f"atp-send: error: {C.one_line(err)}", file=sys.stderr)
        return 1
    print(format_send_summary(summary))
    gain = config.pacing_gain if config.mode == "adaptive" else 1.0
    print(f"  R_max {rmax.describe()}" + (f"; the pacer runs at up to {gain:g} x R_max to catch up after a stall"
                                          if gain > 1.0 else ""))
    if args.json is not None:
        return _save("atp-send", args.json, {**summary.as_dict(), "max_rate_bps": rmax.rate_bps,
                                             "max_rate_source": rmax.source})
    return 0


# --- recv -----------------------------------------------------------------------------------------

def recv_parser() -> argparse.ArgumentParser:
    p = C.OneLineParser(prog="atp-recv", description="Receive ATP jobs and print a summary of each.")
    p.add_argument("--bind", type=C.arg(C.host(), str), default="0.0.0.0", help="local address (default 0.0.0.0)")
    p.add_argument("--port", type=C.arg(C.port(allow=(0,))), default=wire.DEFAULT_ATP_PORT,
                   help="ATP port (default %(default)s; 0: any free port)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", dest="once", action="store_true", default=True,
                      help="serve one job, then exit (default)")
    mode.add_argument("--serve", dest="once", action="store_false", help="keep serving jobs until signalled")
    p.add_argument("--timeout", type=_positive(float), default=None,
                   help="--once: fail if no job finished within this many seconds; --serve: stop after it "
                        "(default: no limit)")
    p.add_argument("--idle-timeout", type=_positive(float), default=AtpConfig.idle_timeout_s,
                   help="forget a job silent for this long (default %(default)s s)")
    p.add_argument("--max-messages", type=C.arg(C.integer(ge=1, le=MAX_MESSAGES)), default=AtpConfig.max_messages,
                   help="largest N accepted")
    p.add_argument("--memory-budget-mb", "--max-buffer-mb", type=_positive(float),
                   default=AtpConfig.memory_budget_bytes / 2**20,
                   help="everything the receiver holds for jobs, payload included (default %(default)s MiB)")
    p.add_argument("--max-jobs", type=C.arg(C.integer(ge=1)), default=AtpConfig.max_jobs,
                   help="job slots (default %(default)s)")
    p.add_argument("--max-jobs-per-source", type=C.arg(C.integer(ge=1)), default=AtpConfig.max_jobs_per_source,
                   help="job slots one source host may hold (default %(default)s)")
    p.add_argument("--admission-key-file", type=Path, default=None,
                   help="file holding a shared admission key: announces not signed with it are dropped "
                        "(default: none, announces admitted by address validation)")
    p.add_argument("--json", type=C.arg(C.output_file(), str), default=None, metavar="FILE",
                   help="write the job summary as JSON (--serve: one JSON line per job, appended as it finishes; "
                        "default: stdout only)")
    p.add_argument("--vector-out", type=C.arg(C.output_file(), str), default=None, metavar="FILE",
                   help="--once, vector jobs: write the float32 vector (little-endian raw) here (default: not "
                        "written)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v progress, -vv more, on stderr")
    return p


def format_receive_result(r: api.ReceiveResult) -> str:
    lines = [f"job {r.job_id} from {r.peer[0]}:{r.peer[1]}: delivered {r.delivered}/{r.total}, "
             f"not delivered {r.lost} (lost, or skipped by the sender once the MSR was met), {r.packets} packets "
             f"({r.duplicates} duplicates) in {r.elapsed_s * 1e3:.1f} ms"]
    for g in r.groups:
        lines.append(f"  group {g.group_id}: delivered {g.delivered}/{g.total}, not delivered {g.lost}, "
                     f"{g.lost / g.total if g.total else 0:.3f} vs 1-MSR {1 - g.msr:.3f}")
    if r.vector_len is not None:
        ranges = r.lost_ranges
        lines.append(f"  vector of {r.vector_len} floats, {sum(b - a for a, b in ranges)} zero-filled in "
                     f"{len(ranges)} range(s)")
    lines.append("  " + format_receiver_stats(r.malformed, r.dropped, r.admission, r.memory))
    return "\n".join(lines)


def format_receiver_stats(malformed: dict[str, int], dropped: dict[str, int], admission: dict[str, int],
                          memory: dict[str, int]) -> str:
    """One line: what the receiver refused, by reason, and its memory against the budget."""
    at_once = admission.get("admitted_without_token", 0)
    retries = admission.get("retries", 0)
    by_address = admission.get("admitted_by_address_token", 0)
    parts = [f"admitted {admission.get('admitted', 0)} job(s)" + (f" ({at_once} without a token)" if at_once else "")
             + (f", {by_address} by address-validation token" if by_address else "") + f", {retries} RETRY(s)" + (" (address validation: a job's first announce gets a token to echo)"
                                          if retries else "")]
    switches = {k[3:]: v for k, v in admission.items() if k in ("to_tokens", "to_open")}
    if switches:
        parts.append("switched to " + ", ".join(f"{k} {v}x" for k, v in switches.items()))
    evicted = {k[8:]: v for k, v in admission.items() if k.startswith("evicted_")}
    if evicted:
        parts.append(f"evicted {sum(evicted.values())} ({_counts(evicted)})")
    if malformed:
        parts.append(f"malformed {sum(malformed.values())} ({_counts(malformed)})")
    if dropped:
        why = ("; unknown_job: of a job not admitted yet, e.g. sent before the RETRY's token came back, or "
               "already closed") if "unknown_job" in dropped else ""
        parts.append(f"dropped {sum(dropped.values())} ({_counts(dropped)}{why})")
    if memory:
        parts.append(f"memory peak {memory['peak'] / 2**20:.1f} of {memory['budget'] / 2**20:.1f} MiB")
    return "receiver: " + "; ".join(parts)


def recv_main(argv: Sequence[str] | None = None) -> int:
    parser = recv_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        config = AtpConfig(idle_timeout_s=args.idle_timeout, max_messages=args.max_messages,
                           memory_budget_bytes=int(args.memory_budget_mb * 2**20), max_jobs=args.max_jobs,
                           max_jobs_per_source=args.max_jobs_per_source,
                           admission_key=_read_key(args.admission_key_file, "--admission-key-file"))
        bind = _address("--bind", args.bind, args.port)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    _install_signal_handlers()
    done: list[dict] = []  # --once: the job's summary
    lines = None if args.once or args.json is None else _JsonLines(args.json)

    def on_job(res: api.ReceiveResult) -> None:
        print(format_receive_result(res), flush=True)
        if args.once:
            done.append(res.as_dict())
            if args.vector_out is not None and res.vector is not None:
                args.vector_out.write_bytes(res.vector.tobytes())
        elif lines is not None:  # --serve keeps nothing per job: one bounded line, written by another thread
            lines.put(res.as_dict())

    ep = None
    try:
        with api.ReceiverEndpoint(bind, config=config, accept_jobs=1 if args.once else None) as ep:
            log.info("serving ATP on %s:%d", *ep.bound)
            ep.serve(jobs=1 if args.once else None, timeout=args.timeout, on_job=on_job)
    except _Interrupted as sig:
        log.info("stopping on %s", sig)
        if args.once and not done:
            print(f"atp-recv: error: interrupted ({sig}) before a job finished", file=sys.stderr)
            return 1
    except api.BindError as err:
        print(f"atp-recv: error: {C.one_line(err)}", file=sys.stderr)
        return 2
    except (api.AtpError, OSError) as err:
        print(f"atp-recv: error: {C.one_line(err)}", file=sys.stderr)
        return 1
    finally:
        if ep is not None and not args.once:
            st = ep.core.stats()
            print(format_receiver_stats(st["malformed"], st["dropped"], st["admission"], st["memory"]), flush=True)
        if lines is not None:
            lines.close()
    if lines is not None and lines.error is not None:
        print(f"atp-recv: error: --json {str(args.json)!r}: {lines.error}", file=sys.stderr)
        return 1
    if args.once and args.json is not None:
        return _save("atp-recv", args.json, done[0] if done else [])
    return 0


class _JsonLines:
    """``atp-recv --serve --json``: appends one JSON line per finished job and flushes it, in a thread of its own,
    so a slow disk never stalls the receive loop; if ``max_waiting`` lines are waiting, newer ones are counted
    in ``dropped`` (and said on stderr at the end) instead of growing memory."""

    def __init__(self, path: Path, max_waiting: int = 256) -> None:
        self.file = open(path, "a", encoding="utf-8")
        self.queue: queue.Queue[dict | None] = queue.Queue(max_waiting)
        self.dropped = 0
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="atp-recv-json", daemon=True)
        self.thread.start()

    def put(self, summary: dict) -> None:
        try:
            self.queue.put_nowait(summary)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.file.write(json.dumps(item, separators=(",", ":")) + "\n")
                    self.file.flush()
                except OSError as err:
                    self.error = err.strerror or str(err)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self.file.close()
        if self.dropped:
            print(f"atp-recv: error: {self.dropped} job summaries not written to --json (the disk fell behind)",
                  file=sys.stderr)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _save(prog: str, path: Path, obj: Any) -> int:
    """Write the summary (already printed): 0, or 1 with one line on stderr if the file cannot be written now
    (it was checked before the job started)."""
    try:
        _write_json(path, obj)
    except OSError as err:
        print(f"{prog}: error: --json {str(path)!r}: {err.strerror}", file=sys.stderr)
        return 1
    return 0


USAGE = """usage: python -m netapprox.hostlib {send,recv} [OPTIONS]

Send or receive ATP jobs over UDP.

commands:
  send    send one ATP job and print its summary (also installed as atp-send)
  recv    receive ATP jobs and print a summary of each (also installed as atp-recv)

python -m netapprox.hostlib send --help (or recv --help) lists a command's options and their defaults."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if not argv or argv[0] not in ("send", "recv"):
        got = f"unknown command {argv[0]!r}" if argv else "no command"
        print(f"python -m netapprox.hostlib: error: {got}; usage: python -m netapprox.hostlib {{send,recv}} "
              "[OPTIONS] (--help lists them)", file=sys.stderr)
        return 2
    return send_main(argv[1:]) if argv[0] == "send" else recv_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
