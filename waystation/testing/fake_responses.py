"""The fake endpoint's OpenAI Responses API (`POST /responses`), written from OpenAI's docs.

The scripts are FakeOpenAI's: a request is shown to its model's script in chat-completions
shape (`{"model", "messages", "tools", "protocol": "responses", "raw": body}`), and the
Reply it takes streams back as Responses events (`response.created`, `output_item.added`,
`output_text.delta`, `function_call_arguments.delta`, `output_item.done`,
`response.completed` with its usage). Function call ids are `call_<step>_<index>`, the step
counted from the conversation, so a retried request gets the same ids.

Every request is checked as OpenAI checks it, and a broken rule answers 400
(`invalid_request_error`) before any script sees the request:
- a `function_call_output` needs its `function_call` earlier in the input;
- with `store` false nothing is kept on the server: no `previous_response_id`, and a
  function call that followed a reasoning item in its response comes back after that
  reasoning item, which comes back unchanged (its `encrypted_content` is the fake's own:
  the reasoning's text and an HMAC of the item's id and text, verified here).

A Reply's `reasoning` is sent as a reasoning item, first in the response, when the request
asks a reasoning model (`reasoning` or `include: ["reasoning.encrypted_content"]` in it);
its encrypted content only when included. Automatic prompt caching is counted as OpenAI
documents it: a prompt of 1024 tokens or more is cached, and a later prompt that shares a
prefix with it reads the shared part in 128-token steps from 1024 (a token ~ 4 characters).
A 200 Reply with an `error_message` starts its stream and then fails (`response.failed`);
one whose output tokens exceed the request's `max_output_tokens` ends `response.incomplete`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# FakeOpenAI, its handler and its Reply arrive as arguments, typed Any here: fake_openai
# imports this module, and importing it back (even for types) would be an import cycle.
FakeOpenAI = Any
Reply = Any
_Handler = Any

ENCRYPTED_REASONING = "reasoning.encrypted_content"
CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128
CHARS_PER_TOKEN = 4
_CACHED_PROMPTS = 8  # prompts remembered per model for prefix matches
_KEY = b"fake-responses-reasoning"
GATE_TIMEOUT_SECONDS = 120.0  # as the chat fake's: a gate nobody opens frees its thread


@dataclass
class _Memory:
    """What the fake gave each model: the reasoning item before each function call, and
    the recent prompts (the prompt cache)."""

    reasoning_before: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    prompts: dict[str, deque[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_memories: weakref.WeakKeyDictionary[FakeOpenAI, _Memory] = weakref.WeakKeyDictionary()
_memories_lock = threading.Lock()


def _memory(fake: FakeOpenAI) -> _Memory:
    with _memories_lock:
        return _memories.setdefault(fake, _Memory())


class _Rejected(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def encrypt(item_id: str, text: str) -> str:
    """Opaque to the client, verifiable here: the text and an HMAC of the item id and it."""
    mac = hmac.new(_KEY, f"{item_id}\0{text}".encode(), hashlib.sha256).hexdigest()
    return base64.b64encode(json.dumps({"t": text, "m": mac}).encode()).decode()


def decrypt(item_id: str, encrypted: str) -> str | None:
    """The reasoning's text, or None when the content is not the fake's for this item."""
    try:
        sealed = json.loads(base64.b64decode(encrypted, validate=True))
        text = str(sealed["t"])
        mac = str(sealed["m"])
    except (ValueError, KeyError, TypeError):
        return None
    expected = hmac.new(_KEY, f"{item_id}\0{text}".encode(), hashlib.sha256).hexdigest()
    return text if hmac.compare_digest(mac, expected) else None


def serve_responses(handler: _Handler, body: dict[str, Any]) -> None:
    """Answer one `POST /responses` from the fake's scripts."""
    if handler.headers.get("Authorization") == "Bearer wrong-key":
        _error(handler, 401, "Incorrect API key provided: wrong-key.", code="invalid_api_key")
        return
    fake = handler.fake
    memory = _memory(fake)
    model = str(body.get("model"))
    try:
        _check(body, memory)
    except _Rejected as rejected:
        _error(handler, 400, rejected.message, param=rejected.param, code=rejected.code)
        return
    view = chat_view(body)
    reply = fake._next(model, view, int(handler.client_address[1]))
    request = len(fake.chunks_sent[model]) - 1
    if reply.hang_seconds:
        time.sleep(reply.hang_seconds)
        return
    time.sleep(reply.delay_seconds)
    if reply.status != 200:
        _error(
            handler,
            reply.status,
            reply.error_message,
            kind=_ERROR_TYPES.get(reply.status, "server_error"),
            code=_error_code(reply.status, reply.error_message),
            headers=reply.headers,
        )
        return
    step = 1 + sum(1 for m in view["messages"] if m["role"] == "assistant")
    events = _events(body, reply, step, _usage(body, reply, memory))
    with memory.lock:
        for call_id, item in _reasoning_before_calls(events).items():
            memory.reasoning_before[model, call_id] = item
    if body.get("stream"):
        _stream(handler, model, reply, request, events)
    else:
        handler._json(200, events[-1]["response"])


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
}


def _error_code(status: int, message: str) -> str | None:
    if "context window" in message or "context length" in message:
        return "context_length_exceeded"
    return {429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}.get(status)


def _error(
    handler: _Handler,
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    handler._json(status, payload, headers)


def _check(body: dict[str, Any], memory: _Memory) -> None:
    """OpenAI's rules for one request; the first broken one is raised as _Rejected."""
    stored = body.get("store", True) is not False
    if body.get("previous_response_id") is not None:
        if not stored:
            raise _Rejected(
                "Previous response cannot be used for this request: responses created with "
                "`store` set to false are not persisted.",
                param="previous_response_id",
            )
        raise _Rejected(
            f"Previous response with id '{body['previous_response_id']}' not found.",
            param="previous_response_id",
        )
    items = body.get("input")
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise _Rejected("Invalid type for 'input': expected a string or an array.", "input")
    calls_seen: set[str] = set()
    reasoning_seen: dict[str, dict[str, Any]] = {}
    for position, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            _check_reasoning(item, position, stored)
            reasoning_seen[str(item.get("id"))] = item
        elif kind == "function_call":
            call_id = str(item.get("call_id"))
            calls_seen.add(call_id)
            with memory.lock:
                before = memory.reasoning_before.get((str(body.get("model")), call_id))
            if not stored and before is not None:
                if reasoning_seen.get(str(before["id"])) != before:
                    raise _Rejected(
                        f"Item with call_id '{call_id}' of type 'function_call' was provided "
                        f"without its required 'reasoning' item: '{before['id']}'.",
                        param=f"input[{position}]",
                    )
        elif kind == "function_call_output":
            call_id = str(item.get("call_id"))
            if call_id not in calls_seen:
                raise _Rejected(
                    f"No tool call found for function call output with call_id {call_id}.",
                    param=f"input[{position}]",
                )


def _check_reasoning(item: dict[str, Any], position: int, stored: bool) -> None:
    item_id = str(item.get("id"))
    encrypted = item.get("encrypted_content")
    if encrypted is None:
        if not stored:
            raise _Rejected(
                f"Item with id '{item_id}' not found. Items are not persisted when `store` "
                "is set to false. Try again with `store` set to true, or remove this item "
                "from your input.",
                param=f"input[{position}]",
            )
        return
    text = decrypt(item_id, str(encrypted))
    if text is None:
        raise _Rejected(
            f"The encrypted content for item {item_id} could not be verified.",
            param=f"input[{position}].encrypted_content",
            code="invalid_encrypted_content",
        )
    if item.get("summary") != _summary(text):
        raise _Rejected(
            f"The summary of reasoning item {item_id} does not match its encrypted content.",
            param=f"input[{position}].summary",
        )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as a chat-completions script reads it: instructions as the system
    message; an assistant's reasoning, text and function calls as one assistant message."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    in_assistant_turn = False
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "reasoning":
            messages.append({"role": "assistant", "content": None})
            in_assistant_turn = True
        elif kind == "function_call":
            if not in_assistant_turn:
                messages.append({"role": "assistant", "content": None})
                in_assistant_turn = True
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            in_assistant_turn = False
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": item["output"]}
            )
        elif item.get("role") == "assistant":
            if in_assistant_turn and messages[-1]["content"] is None:
                messages[-1]["content"] = _text_of(item.get("content"))
            else:
                messages.append({"role": "assistant", "content": _text_of(item.get("content"))})
            in_assistant_turn = True
        else:
            in_assistant_turn = False
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            messages.append({"role": role, "content": _text_of(item.get("content"))})
    view: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "protocol": "responses",
        "raw": body,
        "stream": bool(body.get("stream")),
    }
    if body.get("tools"):
        view["tools"] = [
            {
                "type": "function",
                "function": {
                    key: tool[key] for key in ("name", "description", "parameters") if key in tool
                },
            }
            for tool in body["tools"]
            if tool.get("type") == "function"
        ]
    text_format = (body.get("text") or {}).get("format")
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        view["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                key: text_format[key] for key in ("name", "schema", "strict") if key in text_format
            },
        }
    return view


def _prompt(body: dict[str, Any]) -> str:
    """The prompt as the cache sees it: everything before the model's answer, in order."""
    parts = {key: body.get(key) for key in ("instructions", "tools", "input")}
    return json.dumps(parts, separators=(",", ":"))


def _usage(body: dict[str, Any], reply: Reply, memory: _Memory) -> dict[str, Any]:
    """The usage of this answer: input tokens at least the prompt's (~ chars / 4), those
    read from the cache, and the reasoning among the output tokens."""
    model = str(body.get("model"))
    prompt = _prompt(body)
    tokens = len(prompt) // CHARS_PER_TOKEN
    with memory.lock:
        earlier = memory.prompts.setdefault(model, deque(maxlen=_CACHED_PROMPTS))
        shared = max((_shared_prefix(prompt, p) for p in earlier), default=0)
        if tokens >= CACHE_MIN_TOKENS:
            earlier.append(prompt)
    shared_tokens = shared // CHARS_PER_TOKEN
    cached = 0
    if shared_tokens >= CACHE_MIN_TOKENS:
        steps = (shared_tokens - CACHE_MIN_TOKENS) // CACHE_STEP_TOKENS
        cached = CACHE_MIN_TOKENS + steps * CACHE_STEP_TOKENS
    input_tokens = max(reply.usage[0], tokens)
    reasoning = len(reply.reasoning) // CHARS_PER_TOKEN if _reasons(body) else 0
    output_tokens = reply.usage[1] + reasoning
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": min(cached, input_tokens)},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def _shared_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _reasons(body: dict[str, Any]) -> bool:
    return body.get("reasoning") is not None or ENCRYPTED_REASONING in (body.get("include") or [])


def _summary(text: str) -> list[dict[str, Any]]:
    return [{"type": "summary_text", "text": text}]


def _events(
    body: dict[str, Any], reply: Reply, step: int, usage: dict[str, Any]
) -> list[dict[str, Any]]:
    """The whole stream of one reply, `response.completed` last (or `response.failed`)."""
    response_id = f"resp_{step}"
    model = body.get("model")
    base: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "store": body.get("store", True),
        "usage": None,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": dict(base)},
        {"type": "response.in_progress", "response": dict(base)},
    ]
    if reply.error_message:
        failed = {
            **base,
            "status": "failed",
            "error": {
                "code": _error_code(500, reply.error_message) or "server_error",
                "message": reply.error_message,
            },
        }
        events.append({"type": "response.failed", "response": failed})
        return _numbered(events)
    output: list[dict[str, Any]] = []
    if reply.reasoning and _reasons(body):
        output.append(_reasoning_item(body, reply, step, events))
    if reply.content:
        output.append(_message_item(reply, step, len(output), events))
    for call_index, (name, raw) in enumerate(reply.tool_calls):
        call = _function_call_item(reply, step, call_index, name, raw, len(output), events)
        output.append(call)
    limit = body.get("max_output_tokens")
    if isinstance(limit, int) and usage["output_tokens"] > limit:
        cut = {"reason": "max_output_tokens"}
        ended = {**base, "status": "incomplete", "incomplete_details": cut, "output": output}
        events.append({"type": "response.incomplete", "response": {**ended, "usage": usage}})
        return _numbered(events)
    completed = {**base, "status": "completed", "output": output, "usage": usage}
    events.append({"type": "response.completed", "response": completed})
    return _numbered(events)


def _reasoning_item(
    body: dict[str, Any], reply: Reply, step: int, events: list[dict[str, Any]]
) -> dict[str, Any]:
    """A reasoning item, first of the output (encrypted when the request includes it)."""
    item_id = f"rs_{step}"
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    events.append({"type": "response.output_item.added", "output_index": 0, "item": item})
    done = {"id": item_id, "type": "reasoning", "summary": _summary(reply.reasoning)}
    if ENCRYPTED_REASONING in (body.get("include") or []):
        done["encrypted_content"] = encrypt(item_id, reply.reasoning)
    events.append({"type": "response.output_item.done", "output_index": 0, "item": done})
    return done


def _message_item(
    reply: Reply, step: int, index: int, events: list[dict[str, Any]]
) -> dict[str, Any]:
    """The reply's text as a message item, its words as output_text deltas."""
    message_id = f"msg_{step}"
    added = {
        "id": message_id,
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    where = {"item_id": message_id, "output_index": index, "content_index": 0}
    events.append({"type": "response.output_item.added", "output_index": index, "item": added})
    empty = {"type": "output_text", "text": "", "annotations": []}
    events.append({"type": "response.content_part.added", **where, "part": empty})
    words = reply.content.split(" ")
    for i, word in enumerate(words):
        if word or i:
            piece = word + (" " if i < len(words) - 1 else "")
            events.append({"type": "response.output_text.delta", **where, "delta": piece})
    part = {"type": "output_text", "text": reply.content, "annotations": []}
    events.append({"type": "response.output_text.done", **where, "text": reply.content})
    events.append({"type": "response.content_part.done", **where, "part": part})
    message = {**added, "status": "completed", "content": [part]}
    events.append({"type": "response.output_item.done", "output_index": index, "item": message})
    return message


def _function_call_item(
    reply: Reply,
    step: int,
    call_index: int,
    name: str,
    raw: str,
    index: int,
    events: list[dict[str, Any]],
) -> dict[str, Any]:
    """One function call item, its arguments in fragments."""
    item_id = f"fc_{step}_{call_index}"
    call = {
        "id": item_id,
        "type": "function_call",
        "status": "in_progress",
        "call_id": f"call_{step}_{call_index}",
        "name": name,
        "arguments": "",
    }
    events.append({"type": "response.output_item.added", "output_index": index, "item": call})
    size = reply.argument_piece_chars
    for start in range(0, len(raw), size):
        piece = raw[start : start + size]
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item_id,
                "output_index": index,
                "delta": piece,
            }
        )
    events.append(
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": index,
            "arguments": raw,
        }
    )
    finished = {**call, "status": "completed", "arguments": raw}
    events.append({"type": "response.output_item.done", "output_index": index, "item": finished})
    return finished


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def _reasoning_before_calls(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each function call of the response, and the reasoning item that came before it."""
    last = events[-1]
    if last["type"] != "response.completed":
        return {}
    before: dict[str, dict[str, Any]] = {}
    reasoning: dict[str, Any] | None = None
    for item in last["response"]["output"]:
        if item["type"] == "reasoning":
            reasoning = item
        elif item["type"] == "function_call" and reasoning is not None:
            before[item["call_id"]] = reasoning
    return before


def _stream(
    handler: _Handler, model: str, reply: Reply, request: int, events: list[dict[str, Any]]
) -> None:
    """The events as server-sent events, with the Reply's faults (stall, hold, cut)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for index, event in enumerate(events):
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
            handler.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            handler.wfile.flush()
        except OSError:
            return  # the client is gone (a killed worker)
        handler.fake._count_chunk(model, request)
        if reply.chunk_delay:
            time.sleep(reply.chunk_delay)
