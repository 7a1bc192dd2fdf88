"""What every worker process the daemon starts has in common."""

import os
import signal

RELAY_LINE_LIMIT = 1 << 20  # the longest output line relayed whole from a worker


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process `pid` is `ancestor` or one of its descendants (a script
    job may report from a child), as /proc says; True where there is no /proc to
    ask (the check is then not made)."""
    if not ancestor:
        return False
    seen = 0
    while pid > 1 and seen < 64:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            return not os.path.isdir("/proc/self")
        except OSError:
            return False
        pid, seen = int(stat.rsplit(")", 1)[1].split()[1]), seen + 1  # the field after the state: ppid
    return False


def exit_name(code: int) -> str:
    """How a process exited, for a message: "code 1", "signal SIGKILL"."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
