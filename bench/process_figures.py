"""What /proc says about a process (Linux): CPU seconds, resident memory, and which child
of this process is the Temporal dev server."""

from __future__ import annotations

import os
from pathlib import Path

from waystation.testing.proc import parent_of, pid_with_local_port

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def rss_mb(pid: int) -> float:
    """Resident set size now."""
    return _status_kb(pid, "VmRSS") / 1024


def peak_rss_mb(pid: int) -> float:
    """The largest resident set size the process has had (VmHWM)."""
    return _status_kb(pid, "VmHWM") / 1024


def children() -> list[int]:
    """Processes whose parent is this one."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_of(int(entry.name)) == me:
                    found.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def server_pid(address: str) -> int:
    """The child process listening on the dev server's port."""
    port = int(address.rsplit(":", 1)[1])
    pid = pid_with_local_port(port, children())
    if pid is None:
        raise RuntimeError(f"no child process of this one listens on port {port}")
    return pid
