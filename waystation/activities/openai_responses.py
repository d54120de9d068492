"""The chat backend of OpenAI's Responses API (`POST /responses`), with the `openai` client.

Nothing is left on the provider: every request says `store=False` and sends the whole
conversation, never a `previous_response_id`. A reasoning model's reasoning items come back
with their encrypted content (`include=["reasoning.encrypted_content"]`), travel with the
assistant message (`ChatMessage.reasoning`) and go back, unchanged, before that message's
output on the next call: with `store=False` the API refuses a function call whose reasoning
item is missing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx2
import openai
from temporalio.exceptions import ApplicationError

from waystation.activities.chat import TOOL_CHOICE_MODES, ChatDelta
from waystation.activities.openai_chat import (
    StreamTimeoutError,
    classify_provider_error,
    with_rate_limits_reported,
)
from waystation.activities.stream_clocks import clocked_events
from waystation.workflows import errors
from waystation.workflows.models import ChatMessage, ModelSettings, ReasoningItem, Usage

PROTOCOL = "responses"
ENCRYPTED_REASONING = "reasoning.encrypted_content"
# Models that reason whether asked to or not: their reasoning items must come back.
REASONING_MODEL_PREFIXES = ("o1", "o3", "o4", "gpt-5")
# Codes of a failed response (`response.failed`, an `error` event) that retrying will not
# change; any other code (server_error, rate_limit_exceeded, ...) is an outage.
_REJECTED_CODES = ("invalid_", "content_filter", "bad_request")
_CONTEXT_TOO_LONG_CODE = "context_length_exceeded"
_INCOMPLETE_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


def reasons(model: ModelSettings) -> bool:
    """Whether the model's calls return reasoning items to carry forward."""
    bare = model.name.lower().rsplit("/", 1)[-1]
    return model.reasoning_effort is not None or bare.startswith(REASONING_MODEL_PREFIXES)


def _same_model(item: ReasoningItem, model: ModelSettings) -> bool:
    # The item names the model as the task does (`ENDPOINT:MODEL`); the backend sees only
    # the bare id.
    return item.model == model.name or item.model.partition(":")[2] == model.name


def to_responses_input(
    messages: list[ChatMessage], model: ModelSettings
) -> tuple[str | None, list[dict[str, Any]]]:
    """`instructions` (the system messages) and the `input` items of a conversation, in its
    order: an assistant message's reasoning items first, then its text, then its calls."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            instructions.append(m.content or "")
        elif m.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m.tool_call_id,
                    "output": m.content or "",
                }
            )
        elif m.role == "assistant":
            items.extend(
                r.data for r in m.reasoning if r.protocol == PROTOCOL and _same_model(r, model)
            )
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            items.extend(
                {
                    "type": "function_call",
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
                for c in m.tool_calls
            )
        else:
            items.append({"role": "user", "content": m.content or ""})
    return ("\n\n".join(instructions) if instructions else None), items


def to_responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat `tools` entries as Responses function tools (flat, not strict)."""
    converted = []
    for tool in tools:
        function = tool.get("function", tool)
        entry: dict[str, Any] = {"type": "function", "name": function["name"]}
        if function.get("description") is not None:
            entry["description"] = function["description"]
        entry["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
        entry["strict"] = False
        converted.append(entry)
    return converted


def tool_choice_option(tool_choice: str) -> str | dict[str, Any]:
    if tool_choice in TOOL_CHOICE_MODES:
        return tool_choice
    return {"type": "function", "name": tool_choice}


def text_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """Chat's `response_format` (json_schema) as the Responses `text.format`."""
    schema = response_format.get("json_schema", {})
    return {
        "format": {
            "type": "json_schema",
            "name": schema.get("name", "final_answer"),
            "schema": schema.get("schema", {}),
            "strict": bool(schema.get("strict", False)),
        }
    }


def request_body(
    messages: list[ChatMessage],
    tools: list[dict[str, Any]],
    model: ModelSettings,
    response_format: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The request, in wire form. Built from the conversation alone, in a fixed order, so
    that the same conversation prefix gives the same bytes (the provider's prompt cache)."""
    instructions, items = to_responses_input(messages, model)
    body: dict[str, Any] = {"model": model.name, "store": False}
    if instructions is not None:
        body["instructions"] = instructions
    if tools:
        body["tools"] = to_responses_tools(tools)
        if model.tool_choice is not None:
            body["tool_choice"] = tool_choice_option(model.tool_choice)
    body["input"] = items
    if reasons(model):
        body["include"] = [ENCRYPTED_REASONING]
    if model.reasoning_effort is not None:
        body["reasoning"] = {"effort": model.reasoning_effort}
    if response_format is not None:
        body["text"] = text_format(response_format)
    if model.temperature is not None:
        body["temperature"] = model.temperature
    if model.max_tokens is not None:
        body["max_output_tokens"] = model.max_tokens
    return body


def failure(code: str | None, message: str) -> ApplicationError:
    """A response that failed after its stream began (`response.failed`, `error`)."""
    detail = f"model endpoint failed the response ({code or 'no code'}): {message}"
    code = code or ""
    if code == _CONTEXT_TOO_LONG_CODE:
        return ApplicationError(detail, type=errors.LLM_CONTEXT_TOO_LONG, non_retryable=True)
    if code.startswith(_REJECTED_CODES):
        return ApplicationError(detail, type=errors.LLM_REQUEST_REJECTED, non_retryable=True)
    return ApplicationError(detail, type=errors.LLM_UNAVAILABLE)


def _classify(err: openai.OpenAIError) -> ApplicationError:
    # The client raises a bare APIError for an SSE event whose data holds an `error` object.
    if type(err) is openai.APIError and isinstance(err.body, dict):
        return failure(err.body.get("code"), str(err.body.get("message") or err.message))
    return classify_provider_error(err)


class OpenAIResponses:
    """`POST /responses` with `stream=True`; the same two clocks as OpenAIChat: the first
    event within `first_chunk_timeout_seconds`, then at most `request_timeout_seconds`
    between events, else a retryable StreamTimeoutError."""

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Temporal owns retries: the client must not retry behind its back.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url,
            max_retries=0,
            default_headers=dict(headers) if headers else None,
        )

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        """The deltas of one streamed response; a provider error comes out classified."""
        try:
            async for delta in self._deltas(messages, tools, model, response_format):
                yield delta
        except openai.OpenAIError as err:
            raise _classify(err) from err

    async def _deltas(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        response_format: dict[str, Any] | None,
    ) -> AsyncIterator[ChatDelta]:
        first_wait = model.first_chunk_timeout_seconds
        idle_wait = model.request_timeout_seconds
        # The client's own read timeout only backs up the two clocks enforced here.
        backstop = max(first_wait, idle_wait) + 5.0
        create: Any = self._client.responses.create
        request = httpx2.Request("POST", self._client.base_url.join("responses"))
        body = request_body(messages, tools, model, response_format)
        reading = _StreamReader(model.name)

        async def open_stream() -> Any:
            # The body goes as `extra_body`, sent as it is (see OpenAIChat).
            opened = await create(
                stream=True,
                timeout=openai.Timeout(backstop, connect=min(first_wait, 10.0)),
                extra_body=body,
            )
            return with_rate_limits_reported(opened)

        def timed_out(sentence: str) -> StreamTimeoutError:
            return StreamTimeoutError(sentence, request)

        async for event in clocked_events(open_stream, first_wait, idle_wait, timed_out):
            for delta in reading.deltas(event):
                yield delta

    async def close(self) -> None:
        await self._client.close()


class _StreamReader:
    """Our deltas from the events of one response. A function call's index is its place
    among the response's function calls; its argument deltas name it by output index."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._calls: dict[int, int] = {}  # output_index -> tool call index

    def deltas(self, event: Any) -> Iterator[ChatDelta]:
        kind = getattr(event, "type", None)
        if kind == "response.output_text.delta":
            if event.delta:
                yield ChatDelta(text=event.delta, model=self._model)
        elif kind == "response.output_item.added" and event.item.type == "function_call":
            index = self._calls.setdefault(event.output_index, len(self._calls))
            yield ChatDelta(
                tool_call_index=index,
                tool_call_id=event.item.call_id,
                tool_name=event.item.name,
                tool_arguments=event.item.arguments or "",
                model=self._model,
            )
        elif kind == "response.function_call_arguments.delta":
            call = self._calls.get(event.output_index)
            if call is not None and event.delta:
                yield ChatDelta(tool_call_index=call, tool_arguments=event.delta, model=self._model)
        elif kind == "response.output_item.done" and event.item.type == "reasoning":
            data = event.item.model_dump(mode="json", exclude_unset=True)
            yield ChatDelta(
                reasoning=ReasoningItem(protocol=PROTOCOL, model=self._model, data=data),
                model=self._model,
            )
        elif kind == "response.completed":
            finish = "tool_calls" if self._calls else "stop"
            yield self._end(event.response, finish)
        elif kind == "response.incomplete":
            details = event.response.incomplete_details
            reason = getattr(details, "reason", None) or ""
            yield self._end(event.response, _INCOMPLETE_FINISH.get(reason, "length"))
        elif kind == "response.failed":
            error = event.response.error
            raise failure(
                getattr(error, "code", None),
                getattr(error, "message", None) or "the response failed",
            )
        elif kind == "error":
            raise failure(event.code, event.message)

    def _end(self, response: Any, finish_reason: str) -> ChatDelta:
        return ChatDelta(
            finish_reason=finish_reason, usage=_usage(response.usage), model=self._model
        )


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    cached = getattr(usage.input_tokens_details, "cached_tokens", None) or 0
    reasoning = getattr(usage.output_tokens_details, "reasoning_tokens", None) or 0
    return Usage(
        input_tokens=usage.input_tokens or 0,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )
