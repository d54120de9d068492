"""A real PostgreSQL for tests: `initdb` into a temporary directory and a server on a free
loopback port, run as an unprivileged user (initdb refuses root), stopped at the end.

The server binaries come from the machine (Debian's `postgresql` package puts them in
/usr/lib/postgresql/<version>/bin); `.ci/run` installs the package when they are missing.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from waystation.testing.proc import free_port

# Debian's server account; created (without a home or a shell) when the package is absent.
SERVER_ACCOUNT = "postgres"
SUPERUSER = "waystation"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")
START_TIMEOUT_SECONDS = 60


def server_binaries() -> Path:
    """The folder holding initdb, pg_ctl and postgres: the newest Debian version, else PATH."""
    versions = sorted(
        (d for d in DEBIAN_BINARIES.glob("*/bin") if (d / "initdb").exists()),
        key=lambda d: int(re.sub(r"\D", "", d.parent.name) or 0),
    )
    if versions:
        return versions[-1]
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    raise RuntimeError(
        "the PostgreSQL server binaries are missing: `make test` installs them with apt"
        " (scripts/system-packages), or run `sudo apt-get install postgresql`"
    )


def _server_account() -> str | None:
    """The account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_ACCOUNT,
            ],
            check=True,
        )
    return SERVER_ACCOUNT


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, which a test may stop and restart."""

    def __init__(self) -> None:
        self.bindir = server_binaries()
        self.account = _server_account()
        self.root = Path(tempfile.mkdtemp(prefix="waystation-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if self.account is not None:
            entry = pwd.getpwnam(self.account)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "--pgdata",
            str(self.data),
            "--username",
            SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-sync",
        )

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if self.account is not None:
            command = ["runuser", "-u", self.account, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} "
            # A process that dies keeps its writes in the OS cache; only a machine crash would
            # need fsync, and these clusters do not outlive the test run.
            "-c fsync=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "start",
            "--pgdata",
            str(self.data),
            "--log",
            str(self.log),
            "--wait",
            f"--timeout={START_TIMEOUT_SECONDS}",
            "-o",
            options,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clean), or `immediate` (like a crash)."""
        self._run("pg_ctl", "stop", "--pgdata", str(self.data), "--mode", mode, "--wait")

    def running(self) -> bool:
        command = [str(self.bindir / "pg_ctl"), "status", "--pgdata", str(self.data)]
        if self.account is not None:
            command = ["runuser", "-u", self.account, "--", *command]
        return subprocess.run(command, capture_output=True).returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database on this server; its URL."""
        name = f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        if self.running():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
