"""``netapprox-controller --config FILE`` / ``python -m netapprox.controller --config FILE``.

CLI flags override the TOML file; both only fill in ``controller.config.ControllerConfig``, which checks every
value. A mistake in either is one line on stderr naming the key or flag, exit status 2, before anything starts.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path

from netapprox.controller.config import CONTROLLER_KEYS, REPORT_KEYS, ControllerConfig, load_config
from netapprox.controller.errors import ConfigError, ControllerError
from netapprox.controller.runtime import Runtime
from netapprox.hostlib import checks as C

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def build_parser() -> argparse.ArgumentParser:
    p = C.OneLineParser(prog="netapprox-controller", description=__doc__.splitlines()[0])
    p.add_argument("--config", "-c", required=True, help="TOML config file (see controller/examples/)")
    p.add_argument("--epoch-ms", type=C.arg(C.number(gt=0.0, le=3.6e6)),
                   help="epoch length in ms (default from config, else 20)")
    p.add_argument("--report-bind", type=C.arg(REPORT_KEYS["bind"], str), help="address of the UDP report socket")
    p.add_argument("--report-port", type=C.arg(REPORT_KEYS["port"]), help="UDP report port (0: any free port, -1: off)")
    p.add_argument("--report-key-file", help="file holding the shared HMAC key for reports")
    p.add_argument("--metrics-bind", type=C.arg(CONTROLLER_KEYS["metrics_bind"], str),
                   help="address of the Prometheus endpoint (default 127.0.0.1)")
    p.add_argument("--metrics-port", type=C.arg(CONTROLLER_KEYS["metrics_port"]), help="Prometheus port (-1: off)")
    p.add_argument("--decision-log", help="JSON-lines decision log file (appended; its directory is created)")
    p.add_argument("--replica", type=C.arg(CONTROLLER_KEYS["replica"]),
                   help="this process's rank in a replica set of controllers with this config (1, 2, ...; all "
                        "different, the highest live one is primary); default from config, else 0: no replicas")
    p.add_argument("--duration", type=C.arg(C.number(gt=0.0)),
                   help="stop after this many seconds (default: until SIGINT/SIGTERM)")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                   help="DEBUG, INFO, WARNING, ERROR (default INFO)")
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
        try:
            reports["key"] = Path(args.report_key_file).read_bytes().strip()
        except OSError as e:
            raise ConfigError(f"--report-key-file: cannot read {args.report_key_file!r}: {e.strerror}") from None
        if not reports["key"]:
            raise ConfigError(f"--report-key-file: {args.report_key_file!r} is empty")
    if reports:
        top["reports"] = dataclasses.replace(config.reports, **reports)
    return dataclasses.replace(config, **top)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("netapprox.controller")
    try:
        config = apply_flags(load_config(args.config), args)
        if config.decision_log:
            C.output_file(create_dirs=True)(config.decision_log, "[controller] decision_log")
        runtime = Runtime(config)
    except (C.CheckError, ControllerError, OSError) as e:
        print(f"{parser.prog}: error: {C.one_line(e)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    if args.duration is not None:
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    log.info("controller%s: %d switch(es), epoch %.1f ms, reports on %s, metrics on %s",
             f" replica {config.replica}" if config.replica else "", len(config.switches), config.epoch_s * 1000,
             runtime.report_address, runtime.metrics_address)
    try:
        runtime.run(stop)
    finally:
        runtime.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("controller stopped after %d epochs", runtime.epochs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
