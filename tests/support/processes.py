"""Programs and threads the tests start, shared: a program stopped unless it exited, and an ATP receiver that counts
what arrives per job."""
from __future__ import annotations

import subprocess
import threading


def stop_if_running(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and reap it, unless it has exited (a test's ``finally``: every program it started, it stops)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def counting_receiver(dest: str, jobs: int, config, got: dict[int, int], timeout: float = 60) -> threading.Thread:
    """A started thread serving ``jobs`` ATP jobs at ``dest`` with ``config`` (``AtpConfig``) that counts each job's
    delivered messages in ``got`` (job id -> messages); join it."""
    from netapprox.hostlib.api import ReceiverEndpoint

    def serve() -> None:
        with ReceiverEndpoint(dest, config=config, accept_jobs=jobs) as ep:
            ep.serve(jobs=jobs, timeout=timeout, on_message=lambda ev: got.__setitem__(ev.job_id, got.get(ev.job_id, 0) + 1))

    t = threading.Thread(target=serve)
    t.start()
    return t
