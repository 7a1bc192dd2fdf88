"""sd_notify without libsystemd: READY=1, STATUS=, STOPPING=1, WATCHDOG=1."""

from __future__ import annotations

import os
import socket


def sd_notify(message: str) -> bool:
    """Send `message` to systemd if it started us with NOTIFY_SOCKET; else do nothing."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), path)
        except OSError:
            return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog period systemd expects pings at, or None when off."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6
