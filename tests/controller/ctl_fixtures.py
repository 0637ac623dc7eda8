"""Shared constants of the controller tests (a uniquely named module, so test files can import it whatever
other conftest.py files the test run has loaded)."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
P4INFO = FIXTURES / "p4info.txtpb"
BMV2_JSON_BYTES = b'{"program": "netapprox-test"}'



def controller_toml(*, address: str, p4info: object, bmv2_json: object, report_port: int, decision_log: object,
                    routes: list[tuple[str, int, str]], controller: str = "", policy: str = "",
                    options: str = "") -> str:
    """The TOML of a controller process for one P4Runtime switch ``s1`` (the tests that run the CLI). ``routes``:
    (prefix, port, destination MAC); ``controller``, ``policy``, ``options``: more lines of those tables."""
    route_lines = "".join(f'  {{ prefix = "{prefix}", port = {port}, src_mac = "02:00:00:00:01:00", '
                          f'dst_mac = "{dst_mac}" }},\n' for prefix, port, dst_mac in routes)
    return f"""
[controller]
epoch_ms = 20
decision_log = "{decision_log}"
reconnect_initial_s = 0.05
reconnect_max_s = 0.5
{controller}
[reports]
bind = "127.0.0.1"
port = {report_port}

[policy]
{policy}
[[switch]]
name = "s1"
kind = "p4runtime"
routes = [
{route_lines}]

[switch.options]
address = "{address}"
p4info = "{p4info}"
bmv2_json = "{bmv2_json}"
{options}"""


def stop_process(proc: subprocess.Popen) -> None:
    """Stop a process this test started, if it still runs: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
