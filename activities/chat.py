"""Chat backends: the same stream of deltas from an OpenAI-compatible endpoint or offline.

The LLM activity assembles deltas into one message whichever backend produced them,
so streaming, heartbeats and tool-call parsing are one code path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2
import openai

from workflows.models import ChatMessage, ModelSettings, Usage


@dataclass
class ChatDelta:
    """One piece of a streamed assistant message."""

    text: str = ""
    tool_call_index: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_arguments: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None


class ChatBackend(Protocol):
    def stream(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]], model: ModelSettings
    ) -> AsyncIterator[ChatDelta]: ...


def to_openai_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    converted: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            converted.append(
                {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""}
            )
        elif m.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            converted.append(entry)
        else:
            converted.append({"role": m.role, "content": m.content or ""})
    return converted


TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})


class StreamTimeoutError(openai.APITimeoutError):
    """No first chunk in time, or a stream that stalled: retryable like any timeout."""

    def __init__(self, message: str, request: httpx2.Request) -> None:
        openai.APIConnectionError.__init__(self, message=message, request=request)


def tool_choice_option(tool_choice: str) -> str | dict[str, Any]:
    """The `tool_choice` request field: a mode, or the one function the model must call."""
    if tool_choice in TOOL_CHOICE_MODES:
        return tool_choice
    return {"type": "function", "function": {"name": tool_choice}}


class OpenAIChat:
    """Chat completions with `stream=True` against any OpenAI-compatible endpoint.

    Two clocks guard a stream: `first_chunk_timeout_seconds` from sending the request to
    the first chunk (a CPU-served model reads the whole prompt before it answers), then
    `request_timeout_seconds` between chunks. Either one running out raises
    `StreamTimeoutError`, an `openai.APITimeoutError`, so the attempt is retried.
    """

    def __init__(self, api_key: str | None, base_url: str | None) -> None:
        # Temporal owns retries: the client must not retry behind its back.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed", base_url=base_url, max_retries=0
        )

    def _options(self, tools: list[dict[str, Any]], model: ModelSettings) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if tools:
            options["tools"] = tools
            if model.tool_choice is not None:  # endpoints refuse tool_choice without tools
                options["tool_choice"] = tool_choice_option(model.tool_choice)
        if model.temperature is not None:
            options["temperature"] = model.temperature
        if model.max_tokens is not None:
            options["max_tokens"] = model.max_tokens
        return options

    async def stream(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]], model: ModelSettings
    ) -> AsyncIterator[ChatDelta]:
        first_wait = model.first_chunk_timeout_seconds
        idle_wait = model.request_timeout_seconds
        # The client's own read timeout only backs up the two clocks enforced here.
        backstop = max(first_wait, idle_wait) + 5.0
        create: Any = self._client.chat.completions.create  # options vary by endpoint
        request = httpx2.Request("POST", self._client.base_url.join("chat/completions"))
        response: Any = None
        try:
            try:
                async with asyncio.timeout(first_wait):
                    response = await create(
                        model=model.name,
                        messages=to_openai_messages(messages),
                        stream=True,
                        stream_options={"include_usage": True},
                        timeout=openai.Timeout(backstop, connect=min(first_wait, 10.0)),
                        **self._options(tools, model),
                    )
                    chunks = aiter(response)
                    chunk = await anext(chunks, None)
            except TimeoutError as err:
                message = f"no first chunk from the model within {first_wait:g} s"
                raise StreamTimeoutError(message, request) from err
            while chunk is not None:
                for delta in _deltas(chunk):
                    yield delta
                try:
                    async with asyncio.timeout(idle_wait):
                        chunk = await anext(chunks, None)
                except TimeoutError as err:
                    message = f"the model's stream stalled for {idle_wait:g} s"
                    raise StreamTimeoutError(message, request) from err
        finally:
            if response is not None:
                await response.close()

    async def close(self) -> None:
        await self._client.close()


def _deltas(chunk: Any) -> Iterator[ChatDelta]:
    """Our deltas from one streamed chunk of the OpenAI protocol."""
    usage = None
    if chunk.usage is not None:
        usage = Usage(
            input_tokens=chunk.usage.prompt_tokens or 0,
            output_tokens=chunk.usage.completion_tokens or 0,
        )
    if not chunk.choices:
        if usage is not None:
            yield ChatDelta(usage=usage, model=chunk.model)
        return
    choice = chunk.choices[0]
    delta = choice.delta
    if delta is not None and delta.content:
        yield ChatDelta(text=delta.content, model=chunk.model)
    for call in (delta.tool_calls if delta is not None else None) or []:
        function = call.function
        yield ChatDelta(
            tool_call_index=call.index,
            tool_call_id=call.id,
            tool_name=function.name if function else None,
            tool_arguments=(function.arguments or "") if function else "",
            model=chunk.model,
        )
    if choice.finish_reason is not None or usage is not None:
        yield ChatDelta(finish_reason=choice.finish_reason, usage=usage, model=chunk.model)
