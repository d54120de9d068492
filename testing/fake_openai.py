"""A local server that speaks the OpenAI chat-completions protocol, scripted per test.

Real HTTP, so the real `openai` client runs in the LLM activity. Each test registers a
script under its own model name; every request for that model takes the next reply.
Replies can stream text and tool-call deltas, or inject faults: an HTTP error with
headers (429 + Retry-After, 401, 500), a hang, or a stream cut off mid-way.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, raw arguments)
    status: int = 200
    error_message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    hang_seconds: float = 0.0
    cut_after_chunks: int | None = None  # drop the connection after this many chunks
    chunk_delay: float = 0.0
    usage: tuple[int, int] = (11, 7)
    stamp_chunks: bool = False  # replace each text chunk by the time it is sent (benchmarks)
    # Hold the stream open after `gate_after_chunks` chunks until the test sets `gate`:
    # a test can act while a stream is provably under way.
    gate: threading.Event | None = None
    gate_after_chunks: int = 0


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def tools(*calls: tuple[str, dict[str, Any] | str], content: str = "", **kw: Any) -> Reply:
    raw = [(name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls]
    return Reply(content=content, tool_calls=raw, **kw)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, error_message=message, headers=headers or {})


def hang(seconds: float) -> Reply:
    return Reply(hang_seconds=seconds)


GATE_TIMEOUT_SECONDS = 120.0  # a gate nobody opens must not hold a server thread forever
Script = list[Reply] | Callable[[dict[str, Any]], Reply]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanishes mid-stream (a killed worker) is part of the tests.
        pass


class FakeOpenAI:
    """The server and its scripts. `url` is the base URL for OPENAI_BASE_URL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, Script] = {}
        self.requests: dict[str, list[dict[str, Any]]] = {}
        server = _QuietServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, replies: Script, model: str | None = None) -> str:
        """Register replies for a new model name and return that name."""
        model = model or f"fake-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self._scripts[model] = replies if callable(replies) else list(replies)
            self.requests[model] = []
        return model

    def calls(self, model: str) -> int:
        with self._lock:
            return len(self.requests.get(model, []))

    def _next(self, model: str, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.setdefault(model, []).append(body)
            script = self._scripts.get(model)
            if script is None:
                return error(404, f"The model `{model}` does not exist")
            if callable(script):
                return script(body)
            if not script:
                return error(500, f"fake server: the script for {model} is exhausted")
            return script.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if self.headers.get("Authorization") == "Bearer wrong-key":
                    self._json(401, {"error": {"message": "Incorrect API key provided"}})
                    return
                reply = fake._next(str(body.get("model")), body)
                if reply.hang_seconds:
                    time.sleep(reply.hang_seconds)
                    return
                if reply.status != 200:
                    self._json(
                        reply.status,
                        {"error": {"message": reply.error_message, "type": "fake"}},
                        reply.headers,
                    )
                    return
                step = 1 + sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
                self._stream(str(body.get("model")), reply, step)

            def _json(
                self, status: int, payload: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, model: str, reply: Reply, number: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for index, chunk in enumerate(_chunks(model, reply, number)):
                    if reply.gate is not None and index == reply.gate_after_chunks:
                        self.wfile.flush()
                        reply.gate.wait(GATE_TIMEOUT_SECONDS)
                    if reply.cut_after_chunks is not None and index >= reply.cut_after_chunks:
                        self.wfile.flush()
                        self.connection.close()
                        return
                    if reply.stamp_chunks and chunk["choices"]:
                        delta = chunk["choices"][0]["delta"]
                        if delta.get("content"):
                            delta["content"] = f"{time.time():.6f} "
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if reply.chunk_delay:
                        time.sleep(reply.chunk_delay)
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler


def _chunks(model: str, reply: Reply, number: int) -> list[dict[str, Any]]:
    """The stream of one reply; tool call ids are `call_<step>_<index>`, the step counted
    from the conversation, so a retried request gets the same ids."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    words = reply.content.split(" ")
    for i, word in enumerate(words):
        if word or i:
            chunks.append(chunk({"content": word + (" " if i < len(words) - 1 else "")}))
    for index, (name, raw) in enumerate(reply.tool_calls):
        call_id = f"call_{number}_{index}"
        head = {"index": index, "id": call_id, "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        )
        for start in range(0, len(raw), 7):  # arguments arrive in fragments
            piece = raw[start : start + 7]
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    prompt, completion = reply.usage
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    chunks.append({**base, "choices": [], "usage": usage})
    return chunks
