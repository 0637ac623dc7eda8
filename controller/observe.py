"""Observation outputs: the JSON-lines decision log and the Prometheus text endpoint."""
from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable


class DecisionLog:
    """Appends one JSON object per line. ``path=None`` discards everything."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), "event": event, **fields}, sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class MetricsServer:
    """Serves ``render()`` as Prometheus text format 0.0.4 on ``http://bind:port/metrics`` from a thread."""

    def __init__(self, bind: str, port: int, render: Callable[[], str]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "try /metrics")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self._server = http.server.ThreadingHTTPServer((bind, port), Handler)
        self._server.daemon_threads = True
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels.items())
    return "{" + inner + "}"


class MetricsText:
    """Builds Prometheus text: ``add(name, kind, help, value, **labels)``; one HELP/TYPE per family."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, value: float, **labels: Any) -> None:
        family = self._families.setdefault(name, (kind, help_text, []))
        family[2].append(f"{name}{_labels(labels)} {value:g}" if isinstance(value, float) else
                         f"{name}{_labels(labels)} {value}")

    def render(self) -> str:
        out = []
        for name, (kind, help_text, samples) in self._families.items():
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(samples)
        return "\n".join(out) + "\n"
