"""A model that answers at once, in-process: benchmarks measure the runtime, not a model.

The task text says how long to go on: "<steps> steps of <size> bytes". Each answer before
the last calls the calculator with a message of <size> bytes; the last one is the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from waystation.activities.chat import ChatDelta
from waystation.workflows.models import ChatMessage, ModelSettings, Usage

INSTANT_MODEL = "instant"
_TASK = re.compile(r"(\d+) steps of (\d+) bytes")
# Summaries of older turns (context compaction) say how many tool results they replace.
_SO_FAR = re.compile(r"\[(\d+) tool results so far\]")


def instant_task_text(steps: int, size: int = 16) -> str:
    return f"{steps} steps of {size} bytes"


def so_far(done: int) -> str:
    """How a summary (or the floor's constant-size request) says `done` tool results came."""
    return f"[{done} tool results so far]"


def parse_task(messages: list[ChatMessage]) -> tuple[int, int]:
    for message in messages:
        if message.role == "user" and message.content:
            found = _TASK.search(message.content)
            if found:
                return int(found.group(1)), int(found.group(2))
    raise ValueError("the instant model needs a task '<steps> steps of <size> bytes'")


def steps_done(messages: list[ChatMessage]) -> int:
    """Tool results in the conversation, counting those a summary (or the floor) stands for."""
    done = sum(m.role == "tool" for m in messages)
    return done + sum(int(n) for m in messages for n in _SO_FAR.findall(m.content or ""))


class InstantModel:
    """A ChatBackend whose every answer is ready at once."""

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        usage = Usage(input_tokens=10, output_tokens=10)
        if not tools:  # a summary request: one user message holding the transcript
            transcript = messages[-1].content or ""
            replaced = transcript.count("\ntool: ") + transcript.startswith("tool: ")
            replaced += sum(int(n) for n in _SO_FAR.findall(transcript))
            yield ChatDelta(text=so_far(replaced), finish_reason="stop")
            return
        steps, size = parse_task(messages)
        done = steps_done(messages)
        if done >= steps - 1:
            yield ChatDelta(text=f"done after {done + 1} steps", finish_reason="stop", usage=usage)
            return
        yield ChatDelta(text="x" * size)
        yield ChatDelta(
            tool_call_index=0,
            tool_call_id=f"call_{done}",
            tool_name="calculator",
            tool_arguments=json.dumps({"expression": f"{done} + 1"}),
        )
        yield ChatDelta(finish_reason="tool_calls", usage=usage)
