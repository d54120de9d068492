"""A local server that speaks the OpenAI chat-completions protocol, scripted per test.

Real HTTP, so the real `openai` client runs in the LLM activity. Each test registers a
script under its own model name; every request for that model takes the next reply.
Replies can stream text and tool-call deltas, or inject faults: an HTTP error with
headers (429 + Retry-After, 401, 500), a hang before the headers, a stream that stalls
before a given chunk or is held open until the test opens a gate, or a stream cut off
mid-way. A request without `"stream": true` gets the same reply as one JSON completion (the
benchmarks' peers ask that way). A model may be put under a provider's quota (`enforce`,
waystation.testing.provider_quota): a request over it is refused with a 429 before its
script sees it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, raw arguments)
    status: int = 200
    error_message: str = ""
    # An error that quotes the request, as some endpoints do: its Authorization header and
    # its last message, after `error_message`.
    echo_request: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    hang_seconds: float = 0.0  # before the response's headers
    delay_seconds: float = 0.0  # a slow model: the whole reply, this much later
    stall_before_chunk: int | None = None  # headers sent: wait before this chunk (0: first)
    stall_seconds: float = 0.0
    cut_after_chunks: int | None = None  # drop the connection after this many chunks
    chunk_delay: float = 0.0
    usage: tuple[int, int] = (11, 7)
    # Of the prompt tokens, those the endpoint's prompt cache served; of the completion
    # tokens, those spent reasoning (sent in the usage's details only when not zero).
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    stamp_chunks: bool = False  # replace each text chunk by the time it is sent (benchmarks)
    # Hold the stream open after this many chunks until `gate` is set (a test's handle on
    # "this request is provably mid-stream"); at most GATE_TIMEOUT_SECONDS.
    hold_after_chunks: int | None = None
    gate: threading.Event | None = None
    # The id each tool call is sent with, in order (None: sent without one); by default
    # `call_<step>_<index>`. A malformed model's ids: repeated, empty, missing.
    call_ids: list[str | None] | None = None
    argument_piece_chars: int = 7  # tool arguments stream in fragments of this size
    # What a reasoning model thinks before it answers: an Anthropic thinking block, a
    # Responses reasoning item (the chat completions fake sends none).
    reasoning: str = ""


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def tools(*calls: tuple[str, dict[str, Any] | str], content: str = "", **kw: Any) -> Reply:
    raw = [(name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls]
    return Reply(content=content, tool_calls=raw, **kw)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, error_message=message, headers=headers or {})


def hang(seconds: float) -> Reply:
    return Reply(hang_seconds=seconds)


def stall(content: str, before_chunk: int, seconds: float) -> Reply:
    """A text reply whose stream (headers already sent) pauses before chunk `before_chunk`:
    0 is the first chunk (the role), 1 the first word, and so on."""
    return Reply(content=content, stall_before_chunk=before_chunk, stall_seconds=seconds)


class Admission(Protocol):
    """What decides whether a chat-completions request is served (provider_quota.ProviderQuota)."""

    def admit(self, body: dict[str, Any]) -> Reply | None:
        """None: served; else the error reply that refuses it."""

    def served(self, reply: Reply) -> dict[str, str]:
        """An admitted request's reply is sent: the headers it is sent with."""


GATE_TIMEOUT_SECONDS = 120.0  # a gate nobody opens must not hold a server thread forever
Script = list[Reply] | Callable[[dict[str, Any]], Reply]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanishes mid-stream (a killed worker) is part of the tests.
        pass


class FakeOpenAI:
    """The server and its scripts. `url` is the base URL for OPENAI_BASE_URL.

    With `lists_models`, `GET /models` lists the scripted models (as a real endpoint lists
    its own, so a start refuses a name it does not offer); without, it answers 404, as an
    endpoint that cannot list them, and a task with any model name starts."""

    def __init__(self, *, lists_models: bool = False) -> None:
        self.lists_models = lists_models
        self._lock = threading.Lock()
        self._scripts: dict[str, Script] = {}
        self.requests: dict[str, list[dict[str, Any]]] = {}
        # Chunks each request has sent so far, by model: the test's view of a live stream.
        self.chunks_sent: dict[str, list[int]] = {}
        # The client's port of each request, by model: which process asked
        # (see waystation.testing.proc).
        self.client_ports: dict[str, list[int]] = {}
        self._progress = threading.Condition(self._lock)
        self._counts: dict[str, int] = {}
        self._unrecorded: set[str] = set()
        self._admissions: dict[str, Admission] = {}
        server = _QuietServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def anthropic_url(self) -> str:
        """The base URL for ANTHROPIC_BASE_URL (the client adds `/v1/messages`)."""
        return self.url.removesuffix("/v1")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, replies: Script, model: str | None = None, *, record: bool = True) -> str:
        """Register replies for a new model name and return that name. With `record=False`
        requests are only counted: a long benchmark resends its whole conversation each
        step, and keeping every body would grow with the square of its length."""
        model = model or f"fake-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self._scripts[model] = replies if callable(replies) else list(replies)
            self.requests[model] = []
            self.chunks_sent[model] = []
            self.client_ports[model] = []
            self._counts[model] = 0
            if not record:
                self._unrecorded.add(model)
        return model

    def enforce(self, admission: Admission, model: str) -> None:
        """Put `model`'s chat-completions requests under `admission` (a provider's quota)."""
        with self._lock:
            self._admissions[model] = admission

    def admission(self, model: str) -> Admission | None:
        with self._lock:
            return self._admissions.get(model)

    def serve(self, double: Callable[[dict[str, Any]], Reply], name: str | None = None) -> str:
        """Serve a model double (waystation.testing.models: TestModel, ScriptedModel) under a
        new model name, returned: a task that names it is answered by the double."""
        return self.script(double, name)

    def models(self) -> list[str]:
        with self._lock:
            return sorted(self._scripts)

    def calls(self, model: str) -> int:
        with self._lock:
            return self._counts.get(model, 0)

    def request_log(self, model: str) -> list[tuple[dict[str, Any], int, int]]:
        """Each request of a recorded `model` so far: its body, the chunks it has sent and
        its client's port, read at one moment."""
        with self._lock:
            return list(
                zip(
                    self.requests.get(model, []),
                    self.chunks_sent.get(model, []),
                    self.client_ports.get(model, []),
                    strict=True,
                )
            )

    def streaming(self, model: str, chunks: int, request: int | None = None) -> bool:
        """Whether a request (the latest if None) of `model` has sent at least `chunks`."""
        with self._lock:
            sent = self.chunks_sent.get(model, [])
            if not sent:
                return False
            return sent[request if request is not None else -1] >= chunks

    async def until_streaming(
        self, model: str, chunks: int, request: int | None = None, within: float = 60.0
    ) -> None:
        """Wait until a request of `model` has sent `chunks` (bounded: fails after `within`)."""

        def wait() -> bool:
            with self._progress:
                return self._progress.wait_for(
                    lambda: self._sent_enough(model, chunks, request), within
                )

        if not await asyncio.to_thread(wait):
            raise TimeoutError(f"no request of {model} streamed {chunks} chunks in {within:g} s")

    def _sent_enough(self, model: str, chunks: int, request: int | None) -> bool:
        sent = self.chunks_sent.get(model, [])
        if request is not None:
            return len(sent) > request and sent[request] >= chunks
        return bool(sent) and sent[-1] >= chunks

    def _count_chunk(self, model: str, request: int) -> None:
        with self._progress:
            self.chunks_sent[model][request] += 1
            self._progress.notify_all()

    def _next(self, model: str, body: dict[str, Any], port: int) -> Reply:
        with self._lock:
            self._counts[model] = self._counts.get(model, 0) + 1
            if model not in self._unrecorded:
                self.requests.setdefault(model, []).append(body)
            self.chunks_sent.setdefault(model, []).append(0)
            self.client_ports.setdefault(model, []).append(port)
            self._progress.notify_all()  # a request arrived: `until_streaming(model, 0)`
            script = self._scripts.get(model)
            if script is None:
                return error(404, f"The model `{model}` does not exist")
            if callable(script):
                return script(body)
            if not script:
                return error(500, f"fake server: the script for {model} is exhausted")
            return script.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"fake": self})


class _Handler(BaseHTTPRequestHandler):
    """The fake endpoint's HTTP side: each request goes to `fake`'s script."""

    fake: FakeOpenAI
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if not (self.path.endswith("/models") and self.fake.lists_models):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        listed = [
            {"id": name, "object": "model", "owned_by": "fake"} for name in self.fake.models()
        ]
        self._json(200, {"object": "list", "data": listed})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        # The other protocols' fakes share the scripts: each shows a script the request in
        # chat-completions shape and sends the reply in its own.
        if self.path.endswith("/v1/messages"):
            from waystation.testing.fake_anthropic import serve_messages

            serve_messages(self, body)
            return
        if self.path.endswith("/responses"):
            from waystation.testing.fake_responses import serve_responses

            serve_responses(self, body)
            return
        if not self.path.endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if self.headers.get("Authorization") == "Bearer wrong-key":
            self._json(401, {"error": {"message": "Incorrect API key provided"}})
            return
        model = str(body.get("model"))
        admission = self.fake.admission(model)
        refusal = admission.admit(body) if admission is not None else None
        if refusal is not None:  # refused as a provider does: the script never sees it
            refused = {"message": refusal.error_message, "code": "rate_limit_exceeded"}
            self._json(refusal.status, {"error": refused}, refusal.headers)
            return
        reply = self.fake._next(model, body, int(self.client_address[1]))
        request = len(self.fake.chunks_sent[model]) - 1
        if reply.hang_seconds:
            time.sleep(reply.hang_seconds)
            return
        time.sleep(reply.delay_seconds)
        limits = admission.served(reply) if admission is not None else {}
        if reply.status != 200:
            message = reply.error_message
            if reply.echo_request:
                said = (body.get("messages") or [{}])[-1].get("content")
                message += (
                    f" (you sent Authorization: {self.headers.get('Authorization')}; "
                    f"your last message: {said})"
                )
            self._json(
                reply.status,
                {"error": {"message": message, "type": "fake"}},
                {**limits, **reply.headers},
            )
            return
        step = 1 + sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if body.get("stream"):
            self._stream(model, reply, step, request, limits)
        else:
            self._json(200, _completion(model, reply, step), limits)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _stream(
        self, model: str, reply: Reply, number: int, request: int, headers: dict[str, str]
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        for index, chunk in enumerate(_chunks(model, reply, number)):
            if reply.gate is not None and index == reply.hold_after_chunks:
                self.wfile.flush()
                reply.gate.wait(GATE_TIMEOUT_SECONDS)
            if index == reply.stall_before_chunk:
                time.sleep(reply.stall_seconds)
            if reply.cut_after_chunks is not None and index >= reply.cut_after_chunks:
                self.wfile.flush()
                self.connection.close()
                return
            if reply.stamp_chunks and chunk["choices"]:
                delta = chunk["choices"][0]["delta"]
                if delta.get("content"):
                    delta["content"] = f"{time.time():.6f} "
            try:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            except OSError:
                return  # the client is gone (a killed worker)
            self.fake._count_chunk(model, request)
            if reply.chunk_delay:
                time.sleep(reply.chunk_delay)
        self.wfile.write(b"data: [DONE]\n\n")


def _call_id(number: int, index: int) -> str:
    return f"call_{number}_{index}"


def _id_field(reply: Reply, number: int, index: int) -> dict[str, str]:
    """The `id` of a tool call as the reply sends it: none at all for a scripted None."""
    if reply.call_ids is None:
        return {"id": _call_id(number, index)}
    given = reply.call_ids[index]
    return {} if given is None else {"id": given}


def _usage(reply: Reply) -> dict[str, Any]:
    prompt, completion = reply.usage
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reply.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    if reply.reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
    return usage


def _completion(model: str, reply: Reply, number: int) -> dict[str, Any]:
    """The reply as one non-streamed chat completion, with the ids the stream would give."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                **_id_field(reply, number, index),
                "type": "function",
                "function": {"name": name, "arguments": raw},
            }
            for index, (name, raw) in enumerate(reply.tool_calls)
        ]
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if reply.tool_calls else "stop",
    }
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [choice],
        "usage": _usage(reply),
    }


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
        head = {"index": index, **_id_field(reply, number, index), "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        )
        size = reply.argument_piece_chars
        for start in range(0, len(raw), size):  # arguments arrive in fragments
            piece = raw[start : start + size]
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    chunks.append({**base, "choices": [], "usage": _usage(reply)})
    return chunks
