"""Which process is which, read from /proc (Linux): tests kill the worker that provably
holds a model stream or runs a tool, not one picked at random."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def free_port() -> int:
    """A loopback port free at the moment of asking (a server binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _socket_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets whose local port is `port` (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                inodes.add(fields[9])
    return inodes


def pid_with_local_port(port: int, among: list[int]) -> int | None:
    """The process among `among` that owns a socket bound locally to `port`."""
    inodes = _socket_inodes(port)
    for pid in among:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            for fd in fd_dir.iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return pid
        except (FileNotFoundError, PermissionError):
            continue
    return None


def parent_of(pid: int) -> int:
    """The parent process id of `pid`."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def pids_with_argument(argument: str) -> list[int]:
    """The processes whose command line has `argument` as one of its words."""
    wanted = argument.encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if wanted in words:
            found.append(int(entry.name))
    return found
