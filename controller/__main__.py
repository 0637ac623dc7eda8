"""``netapprox-controller --config FILE`` / ``python -m netapprox.controller --config FILE``.

CLI flags override the TOML file; both only fill in ``controller.config.ControllerConfig``, which checks every
value. A mistake in either is one line on stderr naming the key or flag, exit status 2, before anything starts
(a report or metrics port in use too). Exit status 1, one line naming them, when no switch ever connected.
``--dry-run``: every switch is an in-process fake P4Runtime server (controller/dry_run.py); each epoch with
reports, decisions or writes is printed on stdout.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path

from netapprox.controller.config import CONTROLLER_KEYS, REPORT_KEYS, ControllerConfig, load_config, report_key
from netapprox.controller.errors import ConfigError, ControllerError
from netapprox.controller.dry_run import FakeSwitches, format_arrivals, format_epoch, read_recorded_reports, replay_epochs
from netapprox.controller.runtime import EpochResult, Runtime
from netapprox.hostlib import checks as C

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def build_parser() -> argparse.ArgumentParser:
    p = C.OneLineParser(prog="netapprox-controller", description=__doc__.splitlines()[0])
    p.add_argument("--config", "-c", required=True, help="TOML config file (see controller/examples/)")
    p.add_argument("--epoch-ms", type=C.arg(C.number(gt=0.0, le=3.6e6)),
                   help="epoch length in ms (default from config, else 20)")
    p.add_argument("--report-bind", type=C.arg(REPORT_KEYS["bind"], str), help="address of the UDP report socket (default from config, else 0.0.0.0)")
    p.add_argument("--report-port", type=C.arg(REPORT_KEYS["port"]), help="UDP report port, 0: any free port, -1: off (default from config, else 7601)")
    p.add_argument("--report-key-file", help="file holding the shared HMAC key for reports, given to the hosts too "
                                             "(atp-send --report-key-file); default from config, else none")
    p.add_argument("--create-report-key", action="store_true",
                   help="with --report-key-file: create that file with a new key (mode 0600) if it is missing")
    p.add_argument("--report-unauthenticated", action="store_true",
                   help="accept unsigned reports on a report socket beyond loopback (default: refused without a "
                        "key; anyone who reaches the port could then move jobs between queues)")
    p.add_argument("--metrics-bind", type=C.arg(CONTROLLER_KEYS["metrics_bind"], str),
                   help="address of the Prometheus endpoint (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=C.arg(CONTROLLER_KEYS["metrics_port"]), help="Prometheus port, -1: off (default from config, else -1)")
    p.add_argument("--decision-log", help="JSON-lines decision log file, appended, its directory created (default from config, else none)")
    p.add_argument("--replica", type=C.arg(CONTROLLER_KEYS["replica"]),
                   help="this process's rank in a replica set of controllers with this config (1, 2, ...; all "
                        "different, the highest live one is primary); default from config, else 0: no replicas")
    p.add_argument("--duration", type=C.arg(C.number(gt=0.0)),
                   help="stop after this many seconds (default: until SIGINT/SIGTERM)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                   help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    p.add_argument("--dry-run", "--fake-switch", action="store_true",
                   help="no switch: each switch of the config is a fake P4Runtime server started here; print "
                        "each epoch's decisions and writes")
    p.add_argument("--replay", metavar="FILE",
                   help="with --dry-run: feed this recorded report stream (JSON lines t, src, report; .gz too) "
                        "epoch by epoch on its own clock instead of listening for reports, then stop (default: "
                        "reports from the hosts)")
    return p


def apply_flags(config: ControllerConfig, args: argparse.Namespace) -> ControllerConfig:
    """The config with CLI overrides applied."""
    top: dict = {}
    reports: dict = {}
    if args.epoch_ms is not None:
        top["epoch_s"] = args.epoch_ms / 1000.0
    if args.metrics_bind is not None:
        top["metrics_bind"] = args.metrics_bind
    if args.metrics_port is not None:
        top["metrics_port"] = args.metrics_port
    if args.decision_log is not None:
        top["decision_log"] = args.decision_log
    if args.replica is not None:
        top["replica"] = args.replica
    if args.report_bind is not None:
        reports["bind"] = args.report_bind
    if args.report_port is not None:
        reports["port"] = args.report_port
    if args.report_key_file is not None:
        reports["key"] = report_key(Path(args.report_key_file), create=args.create_report_key,
                                    where="--report-key-file")
    elif args.create_report_key:
        raise ConfigError("--create-report-key needs --report-key-file (the path of the key to create)")
    if args.report_unauthenticated:
        reports["unauthenticated"] = True
    if reports:
        top["reports"] = dataclasses.replace(config.reports, **reports)
    return dataclasses.replace(config, **top)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("netapprox.controller")
    if args.replay is not None and not args.dry_run:
        parser.error("--replay needs --dry-run (a replay writes to fake switches only)")
    fakes = None
    try:
        config = apply_flags(load_config(args.config), args)
        if args.dry_run:
            fakes = FakeSwitches(config)
            config = fakes.config
            if args.replay is not None:
                stream = read_recorded_reports(args.replay)
                config = dataclasses.replace(config, reports=dataclasses.replace(config.reports, port=-1))
        if config.decision_log:
            C.output_file(create_dirs=True)(config.decision_log, "[controller] decision_log")
        runtime = Runtime(config, on_epoch=_print_epoch if args.dry_run else None)
        if args.dry_run:
            runtime.on_arrivals = _print_arrivals
    except (C.CheckError, ControllerError, OSError) as e:
        if fakes is not None:
            fakes.close()
        print(f"{parser.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    try:
        if args.replay is not None:
            return _replay(runtime, stream, config, log, parser.prog)
        return _serve(runtime, config, args, log, parser.prog,
                      f"dry run, fake switches: {fakes.describe()}" if fakes is not None else None)
    finally:
        runtime.close()
        if fakes is not None:
            fakes.close()


_STARTED: list[float] = []


def _print_epoch(result: EpochResult) -> None:
    if not _STARTED:
        _STARTED.append(result.now)
    text = format_epoch(result, _STARTED[0])
    if text is not None:
        print(text, flush=True)


def _print_arrivals(*args: object) -> None:
    text = format_arrivals(*args)
    if text is not None:
        print(text, flush=True)


def _never_connected(runtime: Runtime, prog: str) -> int:
    """0, or 1 with one line naming the switches when none of them ever connected."""
    down = runtime.never_connected()
    if down and len(down) == len(runtime.config.switches):
        print(f"{prog}: error: no switch ever connected: "
              + "; ".join(f"{name} ({why or 'no answer'})" for name, why in down.items()), file=sys.stderr)
        return 1
    return 0


def _replay(runtime: Runtime, stream: list, config: ControllerConfig, log: logging.Logger, prog: str) -> int:
    if not runtime.connect(timeout_s=10.0):
        return _never_connected(runtime, prog) or 1
    runtime.epoch(0.0)
    for now, batch in replay_epochs(stream, config.epoch_s):
        for t, src, data in batch:
            runtime.ingest(data, src, t)
        runtime.epoch(now)
    log.info("replayed %d reports in %d epochs", len(stream), runtime.epochs)
    return 0


def _serve(runtime: Runtime, config: ControllerConfig, args: argparse.Namespace, log: logging.Logger, prog: str,
           dry_run: str | None) -> int:
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    if args.duration is not None:
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    where = lambda addr: "off" if addr is None else f"{addr[0]}:{addr[1]}"  # noqa: E731
    log.info("controller%s: %d switch(es)%s, epoch %.1f ms, reports on %s, metrics on %s",
             f" replica {config.replica}" if config.replica else "", len(config.switches),
             f" ({dry_run})" if dry_run else "", config.epoch_s * 1000, where(runtime.report_address),
             where(runtime.metrics_address))
    if dry_run:
        runtime.connect(timeout_s=5.0)  # the fake servers answer at once: the first epoch finds them up
    try:
        runtime.run(stop)
    finally:
        runtime.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("controller stopped after %d epochs", runtime.epochs)
    return _never_connected(runtime, prog)


if __name__ == "__main__":
    raise SystemExit(main())
