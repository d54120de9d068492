"""The context window: what gets summarized, and a task that stays within its limit."""

from __future__ import annotations

from typing import Any

from runtime.agent_runtime import AgentRuntime
from tests.fake_openai import FakeOpenAI, Reply, text, tools
from tests.helpers import agent_task, of_type
from workflows.context import SUMMARY_PREFIX, compaction_range, estimate_tokens
from workflows.models import ChatMessage, ToolCallRequest


def conversation(turns: int, size: int = 400) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="task")]
    for i in range(turns):
        call = ToolCallRequest(id=f"c{i}", name="calculator", arguments='{"expression": "1"}')
        messages.append(ChatMessage(role="assistant", content="a" * size, tool_calls=[call]))
        messages.append(ChatMessage(role="tool", content="t" * size, tool_call_id=f"c{i}"))
    return messages


def test_a_window_that_fits_is_left_alone() -> None:
    messages = conversation(2)
    assert compaction_range(messages, estimate_tokens(messages)) is None


def test_compaction_keeps_the_task_and_whole_recent_turns() -> None:
    messages = conversation(10)
    limit = 1000
    start, end = compaction_range(messages, limit) or (0, 0)
    assert start == 2  # the system prompt and the task stay
    assert messages[end].role == "assistant"  # a tool result is never cut from its call
    kept = messages[end:]
    assert estimate_tokens(kept) <= limit // 2
    assert end - start >= 2


def test_a_recent_turn_too_big_for_the_window_is_summarized_too() -> None:
    messages = conversation(1, size=20_000)
    assert compaction_range(messages, 1000) == (2, 4)  # the window must fit


def test_nothing_to_summarize_without_old_turns() -> None:
    messages = [
        ChatMessage(role="system", content="s" * 9000),
        ChatMessage(role="user", content="t"),
    ]
    assert compaction_range(messages, 1000) is None


async def test_a_long_task_stays_within_its_context_limit(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    limit = 1200
    sizes: list[int] = []

    def reply(body: dict[str, Any]) -> Reply:
        messages = [ChatMessage.model_validate(m | {"tool_calls": []}) for m in body["messages"]]
        sizes.append(estimate_tokens(messages))
        done = sum(m["role"] == "tool" for m in body["messages"])
        if len(sizes) >= 12:
            return text("finished after a long conversation")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="x" * 800)

    model = fake_openai.script(reply)
    handle = await ts_runtime.run(agent_task(model, context_limit_tokens=limit))
    outcome = await handle.result()
    assert outcome.result == "finished after a long conversation"
    events = await handle.events()
    compactions = of_type(events, "context_compacted")
    assert len(compactions) >= 2
    # Without compaction the window would grow by ~450 tokens a step, past 5,000.
    assert max(sizes) < 2 * limit
    last_request = fake_openai.requests[model][-1]["messages"]
    assert last_request[2]["content"].startswith(SUMMARY_PREFIX)
    state = await handle.state()
    assert estimate_tokens(state.messages) < 2 * limit
