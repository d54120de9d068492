"""What building one model request costs as the conversation grows: `python -m bench.request_body`.

Our chat backend (`OpenAIChat`) hands the `openai` client a body already in wire form; the
client's typed `chat.completions.create(messages=...)` first walks every message against its
schema. Both send the same JSON to the same local fake endpoint; calls are interleaved so they
share the noise. Reported: ms per model call (request to last chunk), typed / ours.
"""

from __future__ import annotations

import time

import openai

from bench.common import Bench, Row, median, run_alone, say
from waystation.activities.openai_chat import OpenAIChat
from waystation.testing.fake_openai import text
from waystation.testing.typed_openai import CALCULATOR_TOOL, typed_stream
from waystation.workflows.models import ChatMessage, ModelSettings, ToolCallRequest

SIZES = (10, 60, 120, 240)
CALLS = 15


def conversation(length: int) -> list[ChatMessage]:
    """A system prompt, a task, then tool calls with 2 KB of text and their results."""
    messages = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="go")]
    while len(messages) < length:
        call = ToolCallRequest(id=f"c{len(messages)}", name="calculator", arguments='{"e": "1+1"}')
        messages.append(ChatMessage(role="assistant", content="x" * 2048, tool_calls=[call]))
        messages.append(ChatMessage(role="tool", tool_call_id=call.id, content="2"))
    return messages[:length]


async def ours(chat: OpenAIChat, messages: list[ChatMessage], model: ModelSettings) -> float:
    started = time.perf_counter()
    async for _ in chat.stream(messages, [CALCULATOR_TOOL], model):
        pass
    return (time.perf_counter() - started) * 1000


async def typed(
    client: openai.AsyncOpenAI, messages: list[ChatMessage], model: ModelSettings
) -> float:
    started = time.perf_counter()
    await typed_stream(client, model.name, messages, [CALCULATOR_TOOL])
    return (time.perf_counter() - started) * 1000


async def measure(bench: Bench) -> list[Row]:
    model = ModelSettings(name=bench.fake.script(lambda body: text("ok"), record=False))
    chat = OpenAIChat("sk-bench", bench.fake.url)
    client = openai.AsyncOpenAI(api_key="sk-bench", base_url=bench.fake.url, max_retries=0)
    rows: list[Row] = []
    try:
        for size in SIZES:
            messages = conversation(size)
            await ours(chat, messages, model)  # warm both connections
            await typed(client, messages, model)
            mine: list[float] = []
            theirs: list[float] = []
            for _ in range(CALLS):
                mine.append(await ours(chat, messages, model))
                theirs.append(await typed(client, messages, model))
            say(f"{size} messages: ours {median(mine):.1f} ms, typed {median(theirs):.1f} ms")
            rows.append(
                Row(
                    f"model call, {size} messages (half of them 2 KB)",
                    f"{median(mine):.1f} ms",
                    f"typed create {median(theirs):.1f} ms ({median(theirs) / median(mine):.1f}x)",
                )
            )
    finally:
        await chat.close()
        await client.close()
    return rows


if __name__ == "__main__":
    run_alone(measure)
