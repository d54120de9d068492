"""Chat backends: the same stream of deltas from an OpenAI-compatible endpoint or offline.

The LLM activity assembles deltas into one message whichever backend produced them,
so streaming, heartbeats and tool-call parsing are one code path. The OpenAI backend is
in `activities/openai_chat.py`, imported only where an endpoint is configured: the
`openai` package costs a second of start-up that the CLI and offline workers skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from waystation.workflows.models import ChatMessage, ModelSettings, ReasoningItem, Usage


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
    # A reasoning item or thinking block, complete: sent back with the message next call.
    reasoning: ReasoningItem | None = None


class ChatBackend(Protocol):
    def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        """The deltas of one completion; `response_format` asks for native structured
        output (workflows/outputs.py), which a backend may not support."""
        ...


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


def tool_choice_option(tool_choice: str) -> str | dict[str, Any]:
    """The `tool_choice` request field: a mode, or the one function the model must call."""
    if tool_choice in TOOL_CHOICE_MODES:
        return tool_choice
    return {"type": "function", "function": {"name": tool_choice}}
