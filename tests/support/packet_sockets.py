"""AF_PACKET sockets inside a network namespace (the kernel switch's agreement tests)."""
from __future__ import annotations

import ctypes
import os
import socket
import threading

from netapprox.topo.netns import netns_path


def packet_socket(netns: str, kind: int, proto: int) -> socket.socket:
    """An AF_PACKET socket created inside ``netns`` (a short-lived thread enters it; this thread never moves)."""
    box = {}

    def worker() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path(netns), os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            finally:
                os.close(fd)
            box["sock"] = socket.socket(socket.AF_PACKET, kind, socket.htons(proto))
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]
