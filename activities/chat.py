"""Chat backends: the same stream of deltas from an OpenAI-compatible endpoint or offline.

The LLM activity assembles deltas into one message whichever backend produced them,
so streaming, heartbeats and tool-call parsing are one code path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

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


class OpenAIChat:
    """Chat completions with `stream=True` against any OpenAI-compatible endpoint."""

    def __init__(self, api_key: str | None, base_url: str | None) -> None:
        # Temporal owns retries: the client must not retry behind its back.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed", base_url=base_url, max_retries=0
        )

    async def stream(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]], model: ModelSettings
    ) -> AsyncIterator[ChatDelta]:
        options: dict[str, Any] = {}
        if tools:
            options["tools"] = tools
        if model.temperature is not None:
            options["temperature"] = model.temperature
        if model.max_tokens is not None:
            options["max_tokens"] = model.max_tokens
        timeout = model.request_timeout_seconds
        create: Any = self._client.chat.completions.create  # options vary by endpoint
        response = await create(
            model=model.name,
            messages=to_openai_messages(messages),
            stream=True,
            stream_options={"include_usage": True},
            timeout=openai.Timeout(timeout, connect=min(timeout, 10.0)),
            **options,
        )
        async for chunk in response:
            usage = None
            if chunk.usage is not None:
                usage = Usage(
                    input_tokens=chunk.usage.prompt_tokens or 0,
                    output_tokens=chunk.usage.completion_tokens or 0,
                )
            if not chunk.choices:
                if usage is not None:
                    yield ChatDelta(usage=usage, model=chunk.model)
                continue
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

    async def close(self) -> None:
        await self._client.close()
