"""A real HTTP server that takes webhook notices, as an endpoint of WAYSTATION_WEBHOOKS does.

Each endpoint of a test is a path of it. It records every request as it arrives (before it
answers), answers with the statuses a test scripts for a path (then 200), and can hold the
answer to a path's next request until the test opens a gate: a test's handle on "this
delivery is provably in flight". `signature_valid` checks a request the way the README's
receiver does, written from the documented rule, not from the sender's code.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD_SECONDS = 120.0  # a held answer is sent at the latest after this
SIGNATURE_TOLERANCE_SECONDS = 300


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    arrived: float  # time.time() when its body had been read

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def key(self) -> str:
        return self.headers["idempotency-key"]

    @property
    def attempt(self) -> int:
        return int(self.headers["x-waystation-attempt"])


def signature_valid(secret: str, request: Received, now: float | None = None) -> bool:
    """The documented check: HMAC-SHA256 of `timestamp + "." + body` with the secret, as
    `sha256=<hex>` in X-Waystation-Signature, and a timestamp near the receiver's clock."""
    timestamp = request.headers.get("x-waystation-timestamp", "")
    if not timestamp.isdigit():
        return False
    if abs((now or time.time()) - int(timestamp)) > SIGNATURE_TOLERANCE_SECONDS:
        return False
    signed = timestamp.encode() + b"." + request.body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, request.headers.get("x-waystation-signature", ""))


@dataclass
class _Answer:
    status: int
    body: str = ""
    headers: dict[str, str] | None = None


class WebhookReceiver:
    """The server. `url(path)` is an endpoint's URL; `requests(path)` what it received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._received: list[Received] = []
        self._scripts: dict[str, list[_Answer]] = {}
        self._holds: dict[str, threading.Event] = {}
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        self._server = server
        self.base = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        for gate in self._holds.values():
            gate.set()
        self._server.shutdown()
        self._server.server_close()

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"

    def answer(
        self, path: str, *statuses: int, body: str = "", headers: dict[str, str] | None = None
    ) -> None:
        """Answer the path's next requests with these statuses, in order (then 200), each
        with `body` and `headers`."""
        with self._lock:
            self._scripts[_path(path)] = [_Answer(s, body, headers) for s in statuses]

    def hold(self, path: str) -> threading.Event:
        """Hold the answer to the path's next request until the returned gate is set."""
        gate = threading.Event()
        with self._lock:
            self._holds[_path(path)] = gate
        return gate

    def requests(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return self._select(path)

    def _select(self, path: str | None) -> list[Received]:
        return [r for r in self._received if path is None or r.path == _path(path)]

    def wait_for(
        self, check: Callable[[list[Received]], bool], path: str | None, within: float
    ) -> list[Received]:
        """Block until `check` holds of the requests (to `path`); TimeoutError after `within`."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: check(self._select(path)), within):
                raise TimeoutError(f"the receiver's requests to {path} never got there")
            return self._select(path)

    async def until(
        self,
        check: Callable[[list[Received]], bool],
        path: str | None = None,
        within: float = 60.0,
    ) -> list[Received]:
        """The requests (to `path`) once `check` holds of them (bounded by `within`)."""
        return await asyncio.to_thread(self.wait_for, check, path, within)

    def _take(self, request: Received) -> tuple[_Answer, threading.Event | None]:
        with self._lock:
            self._received.append(request)
            self._arrived.notify_all()
            script = self._scripts.get(request.path)
            answer = script.pop(0) if script else _Answer(200, "ok")
            gate = self._holds.pop(request.path, None)
        return answer, gate

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Received(_path(self.path), headers, body, time.time())
                answer, gate = receiver._take(request)
                if gate is not None:
                    gate.wait(HOLD_SECONDS)
                payload = answer.body.encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in (answer.headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender died while the answer was held

        return Handler


def _path(path: str) -> str:
    return "/" + path.lstrip("/")
