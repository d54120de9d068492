"""The fake endpoint's Messages API (`POST /v1/messages`), written from Anthropic's docs.

It refuses, with 400 `invalid_request_error` as the API does, a request that breaks the
API's rules: no `max_tokens`; roles that do not alternate or do not start with the user; a
`tool_use` not answered by a `tool_result` at the start of the next user message (or a
result for no call); a thinking block changed on its way back (each one the fake sends is
signed with an HMAC of its text); with thinking on, a temperature, a forced tool choice,
or a tool-use turn sent back without its thinking; more than 4 `cache_control` blocks. The
key `wrong-key` (as `x-api-key`, or the bearer token current clients send) gets 401
`authentication_error`.

A script sees the request in chat-completions shape (`messages`, `tools` as OpenAI's, with
`protocol: "anthropic"` and the request itself as `raw`), so the chat fake's scripts serve
this protocol unchanged, and its Reply goes out as the Messages stream. An error Reply goes
out with Anthropic's error body and its headers (529 is `overloaded_error`); an error Reply
with status 200 starts the stream and then sends an `error` event (`overloaded_error`), as
the API does when it is overloaded mid-answer. With thinking on, each answer starts with a
signed thinking block (the Reply's `reasoning`, or a line of its own).

The prompt cache is counted as Anthropic documents it: the prefix (tools, system,
messages, in that order) up to each `cache_control` breakpoint is written, and a later
request reads the longest prefix, with the same bytes, that ends at a breakpoint an earlier
request wrote, looking back at most 20 blocks before each of its own breakpoints. Tokens
are estimated as characters / 4 (the request's JSON); a prefix shorter than 1024 tokens
(the minimum of Claude's Sonnet and Opus models) is not cached.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import weakref
from typing import Any

# The chat fake (waystation.testing.fake_openai) imports this module to serve /v1/messages:
# its handler, server and Reply come in as arguments (typed Any), never imported back.
Handler = Any
Reply = Any
FakeOpenAI = Any

# As the chat fake's: a gate nobody opens must not hold a server thread forever.
GATE_TIMEOUT_SECONDS = 120.0
MIN_CACHEABLE_TOKENS = 1024
CACHE_LOOKBACK_BLOCKS = 20
MAX_CACHE_BREAKPOINTS = 4
_SIGNING_KEY = b"waystation fake anthropic"
_DEFAULT_THOUGHT = "The request is clear; I answer it."
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def signature(thinking: str) -> str:
    """The fake's signature of a thinking block: only the text it signed verifies."""
    digest = hmac.new(_SIGNING_KEY, thinking.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


class PromptCache:
    """The prefixes earlier requests wrote, by the hash of their bytes (per fake server)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: set[str] = set()

    def count(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """(uncached input, cache read, cache write) tokens of a request, and write its
        breakpoints' prefixes."""
        hashes, tokens, breakpoints = _prefix(body)
        total = tokens[-1] if tokens else 0
        with self._lock:
            read_at = -1
            for point in breakpoints:
                for at in range(point, max(point - CACHE_LOOKBACK_BLOCKS, -1), -1):
                    if hashes[at] in self._written:
                        read_at = max(read_at, at)
                        break
            read = tokens[read_at] if read_at >= 0 else 0
            written_to = read
            for point in breakpoints:
                if tokens[point] >= MIN_CACHEABLE_TOKENS and point > read_at:
                    self._written.add(hashes[point])
                    written_to = max(written_to, tokens[point])
        return total - written_to, read, written_to - read


_caches: weakref.WeakKeyDictionary[Any, PromptCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def prompt_cache(fake: FakeOpenAI) -> PromptCache:
    with _caches_lock:
        return _caches.setdefault(fake, PromptCache())


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _prefix(body: dict[str, Any]) -> tuple[list[str], list[int], list[int]]:
    """Per block of the prompt (tools, system, messages): the hash of the prefix ending
    there, its tokens so far, and which blocks are breakpoints. A breakpoint's own marker is
    not part of the bytes: the same prefix is found whether or not it was marked there."""
    hashes: list[str] = []
    tokens: list[int] = []
    breakpoints: list[int] = []
    chain = hashlib.sha256(json.dumps([body.get("model"), body.get("thinking")]).encode())
    so_far = 0

    def add(tag: str, block: dict[str, Any]) -> None:
        nonlocal so_far
        if "cache_control" in block:
            breakpoints.append(len(hashes))
        data = json.dumps({k: v for k, v in block.items() if k != "cache_control"})
        chain.update(f"{tag}:{data}\n".encode())
        so_far += max(1, len(data) // 4)
        hashes.append(chain.hexdigest())
        tokens.append(so_far)

    for tool in body.get("tools") or []:
        add("tool", tool)
    for block in _blocks(body.get("system")):
        add("system", block)
    for number, message in enumerate(body.get("messages") or []):
        for block in _blocks(message.get("content")):
            add(f"{number}.{message.get('role')}", block)
    return hashes, tokens, breakpoints


def request_problem(body: dict[str, Any]) -> str | None:
    """Why the Messages API would refuse this request (None: it takes it)."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Field required"
    if not body.get("model"):
        return "model: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    thinking = body.get("thinking") or {}
    thinking_on = thinking.get("type") == "enabled"
    if thinking_on:
        if problem := _thinking_settings_problem(body, thinking, max_tokens):
            return problem
    marked = sum("cache_control" in tool for tool in body.get("tools") or [])
    marked += sum("cache_control" in block for block in _blocks(body.get("system")))
    for number, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{number}.role: Input should be 'user' or 'assistant'"
        expected = "user" if number % 2 == 0 else "assistant"
        if role != expected:
            return (
                'messages: roles must alternate between "user" and "assistant", '
                'starting with "user"'
            )
        blocks = _blocks(message.get("content"))
        if not blocks:
            return f"messages.{number}: all messages must have non-empty content"
        for index, block in enumerate(blocks):
            if problem := _block_problem(block, f"messages.{number}.content.{index}"):
                return problem
        marked += sum("cache_control" in block for block in blocks)
        before = _blocks(messages[number - 1].get("content")) if number else []
        if problem := _tool_result_problem(number, blocks, before):
            return problem
    if marked > MAX_CACHE_BREAKPOINTS:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {marked}."
    if thinking_on and (problem := _last_turn_thinking_problem(messages)):
        return problem
    return None


def _thinking_settings_problem(
    body: dict[str, Any], thinking: dict[str, Any], max_tokens: int
) -> str | None:
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if budget >= max_tokens:
        return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if "temperature" in body and body["temperature"] != 1:
        return "`temperature` may only be set to 1 when thinking is enabled"
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    return None


def _block_problem(block: dict[str, Any], where: str) -> str | None:
    kind = block.get("type")
    if kind == "text" and not str(block.get("text", "")).strip():
        return f"{where}: text content blocks must contain non-whitespace text"
    if kind == "thinking":
        if "cache_control" in block:
            return f"{where}: cache_control cannot be set for thinking blocks"
        if block.get("signature") != signature(str(block.get("thinking", ""))):
            return f"{where}: Invalid `signature` in `thinking` block"
    if kind == "tool_use" and not isinstance(block.get("input"), dict):
        return f"{where}.input: Input should be a valid dictionary"
    return None


def _tool_result_problem(
    number: int, blocks: list[dict[str, Any]], before: list[dict[str, Any]]
) -> str | None:
    asked = [b.get("id") for b in before if b.get("type") == "tool_use"]
    results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
    leading = 0
    while leading < len(blocks) and blocks[leading].get("type") == "tool_result":
        leading += 1
    if asked and sorted(map(str, results)) != sorted(map(str, asked)):
        return (
            f"messages.{number}: `tool_use` ids were found without `tool_result` blocks "
            f"immediately after: {', '.join(str(a) for a in asked if a not in results)}. Each "
            "`tool_use` block must have a corresponding `tool_result` block in the next message."
        )
    if results and not asked:
        return (
            f"messages.{number}.content.0: unexpected `tool_use_id` found in `tool_result` "
            "blocks. Each `tool_result` block must have a corresponding `tool_use` block in "
            "the previous message."
        )
    if leading != len(results):
        return f"messages.{number}: `tool_result` blocks must come first in the user message"
    return None


def _last_turn_thinking_problem(messages: list[dict[str, Any]]) -> str | None:
    """In a tool-use loop with thinking on, the last assistant turn keeps its thinking."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return None
    last = _blocks(messages[-2].get("content"))
    uses_tools = any(b.get("type") == "tool_use" for b in last)
    if uses_tools and last[0].get("type") not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{last[0].get('type')}`. When `thinking` is "
            "enabled, a final `assistant` message must start with a thinking block."
        )
    return None


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as a chat-completions script reads it."""
    messages: list[dict[str, Any]] = []
    system = "\n\n".join(b.get("text", "") for b in _blocks(body.get("system")))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or []:
        blocks = _blocks(message.get("content"))
        texts = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        if message.get("role") == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": texts or None}
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
            continue
        for b in blocks:
            if b.get("type") == "tool_result":
                said = b.get("content", "")
                if isinstance(said, list):
                    said = "".join(p.get("text", "") for p in said if isinstance(p, dict))
                messages.append(
                    {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": said}
                )
        if texts:
            messages.append({"role": "user", "content": texts})
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema"),
            },
        }
        for t in body.get("tools") or []
    ]
    view: dict[str, Any] = {"model": body.get("model"), "messages": messages, "tools": tools}
    if "tool_choice" in body:
        view["tool_choice"] = body["tool_choice"]
    view.update(protocol="anthropic", raw=body)
    return view


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def serve_messages(handler: Handler, body: dict[str, Any]) -> None:
    """Answer one Messages request on the fake endpoint."""
    keys = (handler.headers.get("x-api-key"), handler.headers.get("Authorization"))
    if "wrong-key" in keys or "Bearer wrong-key" in keys:
        handler._json(401, _error_body(401, "invalid x-api-key"))
        return
    if problem := request_problem(body):
        handler._json(400, _error_body(400, problem))
        return
    fake = handler.fake
    model = str(body["model"])
    reply = fake._next(model, chat_view(body), int(handler.client_address[1]))
    request = len(fake.chunks_sent[model]) - 1
    if reply.hang_seconds:
        time.sleep(reply.hang_seconds)
        return
    time.sleep(reply.delay_seconds)
    if reply.status != 200:
        handler._json(reply.status, _error_body(reply.status, reply.error_message), reply.headers)
        return
    uncached, read, written = prompt_cache(fake).count(body)
    usage = {
        "input_tokens": uncached,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }
    step = 1 + sum(1 for m in body["messages"] if m.get("role") == "assistant")
    thinking = (body.get("thinking") or {}).get("type") == "enabled"
    blocks = _answer_blocks(reply, step, thinking)
    stop_reason = "tool_use" if reply.tool_calls else "end_turn"
    if not body.get("stream"):
        message = _message(model, blocks, usage, reply.usage[1])
        handler._json(200, {**message, "stop_reason": stop_reason})
        return
    events = _events(model, blocks, reply, usage, stop_reason)
    _send_events(handler, model, reply, request, events)


def _answer_blocks(reply: Reply, step: int, thinking: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if thinking:
        thought = reply.reasoning or _DEFAULT_THOUGHT
        blocks.append({"type": "thinking", "thinking": thought, "signature": signature(thought)})
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for index, (name, raw) in enumerate(reply.tool_calls):
        given = reply.call_ids[index] if reply.call_ids is not None else None
        use_id = given if reply.call_ids is not None else f"toolu_{step}_{index}"
        blocks.append({"type": "tool_use", "id": use_id or "", "name": name, "raw": raw})
    return blocks


def _tool_input(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {}


def _message(
    model: str, blocks: list[dict[str, Any]], usage: dict[str, int], output_tokens: int
) -> dict[str, Any]:
    content = [
        {"type": "tool_use", "id": b["id"], "name": b["name"], "input": _tool_input(b["raw"])}
        if b["type"] == "tool_use"
        else b
        for b in blocks
    ]
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": output_tokens},
    }


def _events(
    model: str,
    blocks: list[dict[str, Any]],
    reply: Reply,
    usage: dict[str, int],
    stop_reason: str,
) -> list[tuple[str, dict[str, Any]]]:
    """The Messages stream of one answer, as (event name, data)."""
    start = _message(model, [], usage, 1)
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]

    def delta(index: int, piece: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": piece},
        )

    for index, block in enumerate(blocks):
        kind = block["type"]
        opening = {
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
            "text": {"type": "text", "text": ""},
            "tool_use": {
                "type": "tool_use",
                "id": block.get("id"),
                "name": block.get("name"),
                "input": {},
            },
        }[kind]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        if kind == "thinking":
            events.append(delta(index, {"type": "thinking_delta", "thinking": block["thinking"]}))
            events.append(
                delta(index, {"type": "signature_delta", "signature": block["signature"]})
            )
        elif kind == "text":
            words = block["text"].split(" ")
            for i, word in enumerate(words):
                piece = word + (" " if i < len(words) - 1 else "")
                if piece:
                    events.append(delta(index, {"type": "text_delta", "text": piece}))
        else:
            raw, size = block["raw"], reply.argument_piece_chars
            for at in range(0, len(raw), size):
                events.append(
                    delta(index, {"type": "input_json_delta", "partial_json": raw[at : at + size]})
                )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if reply.error_message:
        overloaded = _error_body(529, reply.error_message)
        events.append(("error", overloaded))
        return events
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": reply.usage[1]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _send_events(
    handler: Handler,
    model: str,
    reply: Reply,
    request: int,
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for index, (name, data) in enumerate(events):
        if reply.gate is not None and index == reply.hold_after_chunks:
            handler.wfile.flush()
            reply.gate.wait(GATE_TIMEOUT_SECONDS)
        if index == reply.stall_before_chunk:
            time.sleep(reply.stall_seconds)
        if reply.cut_after_chunks is not None and index >= reply.cut_after_chunks:
            handler.wfile.flush()
            handler.connection.close()
            return
        try:
            handler.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            handler.wfile.flush()
        except OSError:
            return  # the client is gone (a killed worker)
        handler.fake._count_chunk(model, request)
        if reply.chunk_delay:
            time.sleep(reply.chunk_delay)
