"""The chat backend of Anthropic's Messages API, and what its errors mean.

The conversation (OpenAI chat shape) becomes a Messages request: system messages go to
`system`, tool results in a row become one user message of `tool_result` blocks, an
assistant message sends back its thinking blocks (signatures included) before its text and
`tool_use` blocks, and same-role neighbours merge so the roles alternate. The request is a
pure function of the conversation, so each step repeats the last one's bytes as its prefix
and the prompt cache finds it. Provider errors become ApplicationErrors here: the LLM
activity never sees an `anthropic` exception.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anthropic
from temporalio.exceptions import ApplicationError

from waystation.activities.chat import ChatDelta
from waystation.activities.openai_chat import (
    _UNREACHABLE_REASONS,
    retry_after,
    with_rate_limits_reported,
)
from waystation.activities.quotas import rate_limit_reset
from waystation.activities.redaction import url_without_credentials
from waystation.activities.stream_clocks import clocked_events
from waystation.workflows import errors
from waystation.workflows.models import ChatMessage, ModelSettings, ReasoningItem, Usage

DEFAULT_MAX_TOKENS = 4096
# The API caches at most this many breakpoints per request.
MAX_CACHE_BREAKPOINTS = 4
CACHE_CONTROL = {"type": "ephemeral"}
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# A block the API refuses empty stands in for content that is not there.
EMPTY_TEXT = "(empty)"

_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}
# Error types that say "try again later", whatever the status they came with (an `error`
# event arrives in a stream that began with 200).
_UNAVAILABLE_TYPES = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
)
_RETRYABLE_STATUS = frozenset({408, 409, 429})


def same_model(item_model: str, bare_model: str) -> bool:
    """Whether a reasoning item recorded for `item_model` (the task's name, maybe with its
    endpoint prefix) came from the model this request is for (`bare_model`)."""
    return item_model == bare_model or item_model.partition(":")[2] == bare_model


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool_input(raw: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _assistant_blocks(message: ChatMessage, model_name: str) -> list[dict[str, Any]]:
    """Thinking blocks as they came, then text, then tool_use blocks."""
    blocks = [
        dict(item.data)
        for item in message.reasoning
        if item.protocol == "anthropic" and same_model(item.model, model_name)
    ]
    texts = [message.content] if message.content and message.content.strip() else []
    uses: list[dict[str, Any]] = []
    for call in message.tool_calls:
        parsed = _tool_input(call.arguments)
        if parsed is None:
            # The API takes only an object: the call goes as `{}`, what the model wrote as
            # text, so the model still sees it beside the tool's complaint.
            texts.append(f"(arguments of {call.name}, not a JSON object: {call.arguments})")
        uses.append({"type": "tool_use", "id": call.id, "name": call.name, "input": parsed or {}})
    blocks.extend(_text_block(t) for t in texts)
    blocks.extend(uses)
    return blocks


def _tool_result(message: ChatMessage) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
    if message.content:
        block["content"] = message.content
    return block


def _turns(messages: list[ChatMessage], model_name: str) -> list[dict[str, Any]]:
    """Non-system messages as alternating user/assistant turns, starting with the user."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        if message.role == "assistant":
            role, blocks = "assistant", _assistant_blocks(message, model_name)
        elif message.role == "tool":
            role, blocks = "user", [_tool_result(message)]
        else:
            said = message.content if message.content and message.content.strip() else None
            role, blocks = "user", [_text_block(said or EMPTY_TEXT)]
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [_text_block(EMPTY_TEXT)]})
    _answer_every_tool_use(turns)
    return turns


def _answer_every_tool_use(turns: list[dict[str, Any]]) -> None:
    """Each user turn after an assistant turn answers exactly its tool_use blocks, results
    first (as the API demands): a missing result is sent as an error result, a result for
    no call of that turn as text."""
    for index, turn in enumerate(turns):
        if turn["role"] != "user":
            continue
        asked: list[str] = []
        if index > 0:
            asked = [b["id"] for b in turns[index - 1]["content"] if b["type"] == "tool_use"]
        results: dict[str, dict[str, Any]] = {}
        others: list[dict[str, Any]] = []
        for block in turn["content"]:
            use_id = block.get("tool_use_id")
            if block["type"] == "tool_result" and use_id in asked and use_id not in results:
                results[use_id] = block
            elif block["type"] == "tool_result":
                said = block.get("content", "")
                others.append(_text_block(f"(result of tool call {use_id}: {said})"))
            else:
                others.append(block)
        answered = [
            results.get(use_id)
            or {
                "type": "tool_result",
                "tool_use_id": use_id,
                "content": "(no result)",
                "is_error": True,
            }
            for use_id in asked
        ]
        turn["content"] = answered + others


def _mark(blocks: list[dict[str, Any]]) -> bool:
    """Put a cache breakpoint on the last block that can take one."""
    if not blocks or blocks[-1].get("type") in THINKING_BLOCKS:
        return False
    blocks[-1] = {**blocks[-1], "cache_control": CACHE_CONTROL}
    return True


def _add_cache_breakpoints(
    system: list[dict[str, Any]], tools: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> None:
    """Breakpoints at the ends of the tools, the system prompt, the last message, and the
    message before the newest assistant message: the last request's final breakpoint, so its
    cached prefix is found even when this step added more than the API's 20-block lookback."""
    marked = int(_mark(tools)) + int(_mark(system))
    last_assistant = max(
        (i for i, turn in enumerate(turns) if turn["role"] == "assistant"), default=None
    )
    positions = [len(turns) - 1]
    if last_assistant is not None and last_assistant >= 1:
        positions.append(last_assistant - 1)
    for position in positions:
        if marked < MAX_CACHE_BREAKPOINTS and _mark(turns[position]["content"]):
            marked += 1


def _tool_choice(tool_choice: str | None, thinking: bool) -> dict[str, Any] | None:
    if tool_choice is None:
        return None
    if tool_choice in ("auto", "none"):
        return {"type": tool_choice}
    # With thinking on the API takes only auto or none: a forced call is left to the model.
    if thinking:
        return {"type": "auto"}
    if tool_choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": tool_choice}


def request_body(
    messages: list[ChatMessage], tools: list[dict[str, Any]], model: ModelSettings
) -> dict[str, Any]:
    """The Messages request for a conversation, keys in a fixed order: the same
    conversation gives the same bytes, and a longer one repeats them as its prefix."""
    thinking = model.thinking_budget_tokens
    system = [_text_block(m.content) for m in messages if m.role == "system" and m.content]
    anthropic_tools = [
        {
            "name": tool["function"]["name"],
            "description": tool["function"].get("description", ""),
            "input_schema": tool["function"].get("parameters") or {"type": "object"},
        }
        for tool in tools
    ]
    turns = _turns(messages, model.name)
    _add_cache_breakpoints(system, anthropic_tools, turns)
    body: dict[str, Any] = {
        "model": model.name,
        "max_tokens": (model.max_tokens or DEFAULT_MAX_TOKENS) + (thinking or 0),
    }
    if system:
        body["system"] = system
    body["messages"] = turns
    if anthropic_tools:
        body["tools"] = anthropic_tools
        if (choice := _tool_choice(model.tool_choice, thinking is not None)) is not None:
            body["tool_choice"] = choice
    if thinking is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": thinking}
    elif model.temperature is not None:
        body["temperature"] = model.temperature
    return body


def _error_fields(err: anthropic.APIStatusError) -> tuple[str, str]:
    """The error's type and message as the API gave them in its body."""
    body = err.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict):
        return str(inner.get("type", "")), str(inner.get("message", err.message))
    return "", err.message


def classify_anthropic_error(err: Exception) -> ApplicationError:
    """Map an `anthropic` error onto retryable or not, keeping the provider's own message."""
    if isinstance(err, anthropic.APIStatusError):
        status = err.status_code
        kind, message = _error_fields(err)
        detail = f"the Anthropic endpoint answered {status} {kind or 'error'}: {message}"
        if "prompt is too long" in message.lower() or status == 413:
            return ApplicationError(detail, type=errors.LLM_CONTEXT_TOO_LONG, non_retryable=True)
        if (
            kind in _UNAVAILABLE_TYPES
            or status in _RETRYABLE_STATUS
            or status >= 500
            or status < 400
        ):
            return ApplicationError(
                detail,
                type=errors.LLM_UNAVAILABLE,
                next_retry_delay=retry_after(err.response.headers)
                or rate_limit_reset(err.response.headers),
            )
        return ApplicationError(detail, type=errors.LLM_REQUEST_REJECTED, non_retryable=True)
    if isinstance(err, anthropic.APITimeoutError):
        return ApplicationError("the Anthropic endpoint timed out", type=errors.LLM_UNAVAILABLE)
    if isinstance(err, anthropic.APIConnectionError):
        return ApplicationError(unreachable_sentence(err), type=errors.LLM_UNAVAILABLE)
    if isinstance(err, anthropic.APIError):
        return ApplicationError(
            f"malformed answer from the Anthropic endpoint: {err}",
            type=errors.LLM_MALFORMED_RESPONSE,
        )
    raise err


def unreachable_sentence(err: anthropic.APIConnectionError) -> str:
    """The endpoint that cannot be reached, by its URL (credentials redacted), and why."""
    url = str(err.request.url).removesuffix("/v1/messages")
    cause = str(err.__cause__ or err).lower()
    reason = next((said for piece, said in _UNREACHABLE_REASONS if piece in cause), "no connection")
    return (
        f"cannot reach the Anthropic endpoint at {url_without_credentials(url)} "
        f"(ANTHROPIC_BASE_URL): {reason}"
    )


def _usage(start: Any, final: Any) -> Usage:
    """Usage from message_start's counts, with message_delta's cumulative ones over them."""

    def count(name: str) -> int:
        value = getattr(final, name, None)
        if value is None:
            value = getattr(start, name, None)
        return int(value or 0)

    read = count("cache_read_input_tokens")
    written = count("cache_creation_input_tokens")
    return Usage(
        input_tokens=count("input_tokens") + read + written,
        output_tokens=count("output_tokens"),
        cache_read_tokens=read,
        cache_write_tokens=written,
    )


class _StreamReader:
    """Our deltas from the Messages API's stream events, one event at a time."""

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self._model: str | None = None
        self._start_usage: Any = None
        # Per content block index: its tool call index, or its thinking block in the making.
        self._tool_index: dict[int, int] = {}
        self._tool_arguments_sent: set[int] = set()
        self._thinking: dict[int, dict[str, Any]] = {}
        self.stopped = False  # message_stop came: the answer is whole

    def deltas(self, event: Any) -> list[ChatDelta]:
        kind = event.type
        if kind == "message_start":
            self._model = event.message.model
            self._start_usage = event.message.usage
        elif kind == "content_block_start":
            return self._block_start(event.index, event.content_block)
        elif kind == "content_block_delta":
            return self._block_delta(event.index, event.delta)
        elif kind == "content_block_stop":
            return self._block_stop(event.index)
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "message_delta":
            reason = event.delta.stop_reason
            return [
                ChatDelta(
                    finish_reason=_FINISH_REASONS.get(reason, reason) if reason else None,
                    usage=_usage(self._start_usage, event.usage),
                    model=self._model,
                )
            ]
        return []

    def _block_start(self, index: int, block: Any) -> list[ChatDelta]:
        if block.type == "text" and block.text:
            return [ChatDelta(text=block.text, model=self._model)]
        if block.type == "tool_use":
            call = self._tool_index[index] = len(self._tool_index)
            return [
                ChatDelta(
                    tool_call_index=call,
                    tool_call_id=block.id,
                    tool_name=block.name,
                    model=self._model,
                )
            ]
        if block.type == "thinking":
            self._thinking[index] = {
                "type": "thinking",
                "thinking": block.thinking,
                "signature": block.signature,
            }
        elif block.type == "redacted_thinking":
            self._thinking[index] = {"type": "redacted_thinking", "data": block.data}
        return []

    def _block_delta(self, index: int, delta: Any) -> list[ChatDelta]:
        if delta.type == "text_delta":
            return [ChatDelta(text=delta.text, model=self._model)]
        if delta.type == "input_json_delta" and index in self._tool_index:
            if not delta.partial_json:
                return []
            self._tool_arguments_sent.add(index)
            return [
                ChatDelta(
                    tool_call_index=self._tool_index[index],
                    tool_arguments=delta.partial_json,
                    model=self._model,
                )
            ]
        block = self._thinking.get(index)
        if block is not None and delta.type == "thinking_delta":
            block["thinking"] += delta.thinking
        elif block is not None and delta.type == "signature_delta":
            block["signature"] = (block.get("signature") or "") + delta.signature
        return []

    def _block_stop(self, index: int) -> list[ChatDelta]:
        if index in self._tool_index and index not in self._tool_arguments_sent:
            # A call without arguments streams none: its input is the empty object.
            return [ChatDelta(tool_call_index=self._tool_index[index], tool_arguments="{}")]
        block = self._thinking.pop(index, None)
        if block is None:
            return []
        item = ReasoningItem(protocol="anthropic", model=self._model_name, data=block)
        return [ChatDelta(reasoning=item, model=self._model)]


class AnthropicMessages:
    """The Messages API with `stream=True`, through the official `anthropic` client.

    The same two clocks as OpenAIChat guard a stream: `first_chunk_timeout_seconds` to the
    first event, then `request_timeout_seconds` between events; either running out is a
    retryable LLM_UNAVAILABLE. A reasoning item carries `model.name` as this backend was
    given it (the bare model id): `same_model` matches it, or the task's prefixed name.
    """

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Temporal owns retries: the client must not retry behind its back.
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key or "not-needed",
            base_url=base_url,
            default_headers=dict(headers or {}),
            max_retries=0,
        )

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        """The deltas of one streamed message; a provider error comes out classified."""
        if response_format is not None:
            raise ApplicationError(
                "the Anthropic Messages API takes no response_format: a typed result comes "
                "through the final_answer tool (structured_output 'tool')",
                type=errors.LLM_REQUEST_REJECTED,
                non_retryable=True,
            )
        try:
            async for delta in self._deltas(request_body(messages, tools, model), model):
                yield delta
        except anthropic.AnthropicError as err:
            raise classify_anthropic_error(err) from err

    async def _deltas(self, body: dict[str, Any], model: ModelSettings) -> AsyncIterator[ChatDelta]:
        first_wait = model.first_chunk_timeout_seconds
        idle_wait = model.request_timeout_seconds
        # The client's own read timeout only backs up the two clocks enforced here.
        backstop = max(first_wait, idle_wait) + 5.0
        create: Any = self._client.messages.create
        reader = _StreamReader(model.name)

        async def open_stream() -> Any:
            # The body goes as `extra_body`, sent as it is, in our key order: the typed
            # parameters would be walked and re-serialised for the same bytes.
            opened = await create(
                model=body["model"],
                max_tokens=body["max_tokens"],
                messages=[],
                stream=True,
                timeout=anthropic.Timeout(backstop, connect=min(first_wait, 10.0)),
                extra_body=body,
            )
            return with_rate_limits_reported(opened)

        def timed_out(sentence: str) -> ApplicationError:
            return ApplicationError(sentence, type=errors.LLM_UNAVAILABLE)

        async for event in clocked_events(open_stream, first_wait, idle_wait, timed_out):
            for delta in reader.deltas(event):
                yield delta
        if not reader.stopped:
            # A connection closed mid-answer ends the stream as if it were done.
            raise ApplicationError(
                "the Anthropic endpoint's stream ended before message_stop",
                type=errors.LLM_UNAVAILABLE,
            )

    async def close(self) -> None:
        await self._client.close()
