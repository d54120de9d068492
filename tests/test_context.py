"""The context window: what gets summarized, a task that stays within its limit by default,
a provider's context-length error, and a worker rebuilding a conversation it saw."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type
from waystation.activities.chat import to_openai_messages
from waystation.activities.conversation_cache import Conversation, ConversationCache
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.workers import running_worker
from waystation.worker import build_worker
from waystation.workflows.conversation import (
    LEGACY_DEFAULT_CONTEXT_WINDOW,
    SUMMARY_PREFIX,
    ConversationDigest,
    MessageRef,
    compaction_range,
    context_limit,
    conversation_digest,
    message_digest,
    ref_of,
    total_tokens,
)
from waystation.workflows.models import ChatMessage, ModelSettings, ToolCallRequest


def conversation(turns: int, size: int = 400) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="task")]
    for i in range(turns):
        call = ToolCallRequest(id=f"c{i}", name="calculator", arguments='{"expression": "1"}')
        messages.append(ChatMessage(role="assistant", content="a" * size, tool_calls=[call]))
        messages.append(ChatMessage(role="tool", content="t" * size, tool_call_id=f"c{i}"))
    return messages


def refs(messages: list[ChatMessage]) -> list[MessageRef]:
    return [ref_of(m) for m in messages]


def test_a_window_that_fits_is_left_alone() -> None:
    messages = refs(conversation(2))
    assert compaction_range(messages, total_tokens(messages)) is None


def test_compaction_keeps_the_task_and_whole_recent_turns() -> None:
    messages = refs(conversation(10))
    limit = 1000
    start, end = compaction_range(messages, limit) or (0, 0)
    assert start == 2  # the system prompt and the task stay
    assert messages[end].role == "assistant"  # a tool result is never cut from its call
    assert total_tokens(messages[end:]) <= limit // 2
    assert end - start >= 2


def test_a_recent_turn_too_big_for_the_window_is_summarized_too() -> None:
    assert compaction_range(refs(conversation(1, size=20_000)), 1000) == (2, 4)


def test_nothing_to_summarize_without_old_turns() -> None:
    messages = [
        ChatMessage(role="system", content="s" * 9000),
        ChatMessage(role="user", content="t"),
    ]
    assert compaction_range(refs(messages), 1000) is None


def test_the_default_limit_comes_from_the_model_window() -> None:
    assert context_limit(None, ModelSettings(name="gpt-4o-mini")) == 128_000 - 4_096
    assert context_limit(None, ModelSettings(name="openai/gpt-4o")) == 128_000 - 4_096
    unknown = ModelSettings(name="my-local-model", max_tokens=1_000)
    assert context_limit(None, unknown) == LEGACY_DEFAULT_CONTEXT_WINDOW - 1_000
    set_window = ModelSettings(name="my-local-model", context_window_tokens=8_192)
    assert context_limit(None, set_window) == 8_192 - 4_096
    assert context_limit(5_000, ModelSettings(name="gpt-4o")) == 5_000


async def test_a_long_task_stays_within_its_context_limit(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    limit = 1200
    sizes: list[int] = []

    def reply(body: dict[str, Any]) -> Reply:
        messages = [ChatMessage.model_validate(m | {"tool_calls": []}) for m in body["messages"]]
        sizes.append(total_tokens(refs(messages)))
        done = sum(m["role"] == "tool" for m in body["messages"])
        if len(sizes) >= 12:
            return text("finished after a long conversation")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="x" * 800)

    model = fake_openai.script(reply)
    handle = await ts_runtime.run(agent_task(model, context_limit_tokens=limit))
    outcome = await handle.result()
    assert outcome.result == "finished after a long conversation"
    events = await handle.events()
    assert len(of_type(events, "context_compacted")) >= 2
    # Without compaction the window would grow by ~450 tokens a step, past 5,000.
    assert max(sizes) < 2 * limit
    last_request = fake_openai.requests[model][-1]["messages"]
    assert last_request[2]["content"].startswith(SUMMARY_PREFIX)
    assert total_tokens((await handle.state()).conversation) < 2 * limit


async def test_a_context_length_error_compacts_and_retries_the_step(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """No limit set, a model whose window is smaller than the table says: the endpoint's
    own 400 makes the task compact and go on instead of failing."""
    window_tokens = 2000
    answered: list[int] = []

    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text("the earlier steps added numbers")  # the summary
        messages = [ChatMessage.model_validate(m | {"tool_calls": []}) for m in body["messages"]]
        if total_tokens(refs(messages)) > window_tokens:
            return error(400, "This model's maximum context length is 2000 tokens")
        answered.append(len(answered))
        if len(answered) > 8:
            return text("done despite a small window")
        return tools(("calculator", {"expression": f"{len(answered)} + 1"}), content="y" * 1000)

    model = fake_openai.script(reply)
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "done despite a small window"
    events = await handle.events()
    notes = [e for e in of_type(events, "error") if e.kind == "context_length_exceeded"]
    assert notes and "maximum context length" in notes[0].message
    assert of_type(events, "context_compacted")


async def test_a_conversation_that_cannot_fit_fails_with_a_sentence(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: error(400, "exceeds the available context size"))
    handle = await ts_runtime.run(agent_task(model))
    with pytest.raises(TaskFailedError) as failure:
        await handle.result()
    assert failure.value.kind == "context_too_long"
    assert "does not fit" in str(failure.value) and "context size" in str(failure.value)


def _chat(role: str, content: str | None = None, **kw: Any) -> ChatMessage:
    return ChatMessage(role=role, content=content, **kw)  # type: ignore[arg-type]


def _known(messages: list[ChatMessage]) -> Conversation:
    return Conversation(messages, [message_digest(m) for m in messages], ["calculator"], {})


def _digest(messages: list[ChatMessage]) -> str:
    return conversation_digest([message_digest(m) for m in messages])


def test_a_worker_rebuilds_a_conversation_only_when_the_digest_proves_it() -> None:
    cache = ConversationCache()
    sent = [_chat("system", "be brief"), _chat("user", "add")]
    reply = _chat(
        "assistant",
        "adding",
        tool_calls=[ToolCallRequest(id="c1", name="calculator", arguments='{"expression":"1+1"}')],
    )
    cache.remember_call("task-1", 1, _known(sent), reply)
    expected = [*sent, reply, _chat("tool", "2", tool_call_id="c1")]
    digest = _digest(expected)

    assert cache.rebuild("task-1", 4, digest) is None  # the tool output is not known yet
    cache.remember_tool_output("task-1/1/c1", "2")
    rebuilt = cache.rebuild("task-1", 4, digest)
    assert rebuilt is not None and rebuilt.messages == expected
    assert rebuilt.tools == ["calculator"]
    # Anything the worker did not see itself misses: another output (an approval note),
    # another count, another task.
    noted = [*sent, reply, _chat("tool", "2\n[approved with a note: ok]", tool_call_id="c1")]
    assert cache.rebuild("task-1", 4, _digest(noted)) is None
    assert cache.rebuild("task-1", 5, digest) is None
    assert cache.rebuild("task-2", 4, digest) is None


async def test_llm_calls_on_the_worker_that_ran_the_step_skip_the_query(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [tools(("calculator", {"expression": f"{i} + 1"}), content=f"step {i}") for i in range(5)]
        + [tools(("list_files", {"path": "."})), text("done")]
    )
    async with running_worker(dev_env.client, settings) as worker:
        handle = await AgentRuntime(dev_env.client, settings).run(agent_task(model))
        await handle.result()
        conversation_now = await handle.conversation()
    # The first call asks the workflow; the next five are rebuilt from what this worker
    # saw; list_files ran as an ordinary activity, which this worker took too.
    assert worker.llm.context_reads == {"queried": 1, "rebuilt": 6}
    # What the model got is the workflow's own conversation, call after call.
    sent = [r["messages"] for r in fake_openai.requests[model]]
    assert sent[-1] == to_openai_messages(conversation_now[:-1])


def test_a_worker_rebuilds_the_conversation_it_summarized() -> None:
    cache = ConversationCache()
    messages = conversation(3)
    cache.remember_compaction("task-1", 4, _known(messages), 2, 6, "added numbers")
    compacted = [*messages[:2], _chat("user", SUMMARY_PREFIX + "added numbers"), *messages[6:]]
    rebuilt = cache.rebuild("task-1", len(compacted), _digest(compacted))
    assert rebuilt is not None and rebuilt.messages == compacted
    assert rebuilt.digests == [message_digest(m) for m in compacted]
    other = [*messages[:2], _chat("user", SUMMARY_PREFIX + "something else"), *messages[6:]]
    assert cache.rebuild("task-1", len(other), _digest(other)) is None


async def test_calls_after_a_summary_this_worker_wrote_skip_the_query(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    steps: list[int] = []

    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text("the earlier steps added numbers")  # the summary
        steps.append(len(steps))
        if len(steps) >= 12:
            return text("done")
        return tools(("calculator", {"expression": f"{len(steps)} + 1"}), content="x" * 800)

    model = fake_openai.script(reply)
    async with running_worker(dev_env.client, settings) as worker:
        task = agent_task(model, context_limit_tokens=1200)
        handle = await AgentRuntime(dev_env.client, settings).run(task)
        await handle.result()
        assert len(of_type(await handle.events(), "context_compacted")) >= 2
    # Only the first call asks the workflow: each summary and each call after one is
    # rebuilt from what this worker saw and wrote.
    calls = len(fake_openai.requests[model])
    assert worker.llm.context_reads == {"queried": 1, "rebuilt": calls - 1}


async def test_a_worker_keeps_the_conversations_of_as_many_tasks_as_it_caches(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A task whose conversation the worker forgot asks for it by query at its next call
    (a replay when its workflow is not cached either)."""
    many = settings.model_copy(update={"worker_cached_tasks": 1500})  # not the default
    assert build_worker(dev_env.client, many).llm.conversations.tasks_kept == 1500


def test_the_conversation_cache_keeps_to_its_budget() -> None:
    cache = ConversationCache(tasks=3, outputs=4, budget=30_000)
    reply = _chat("assistant", "r")
    for i in range(10):
        cache.remember_call(f"task-{i}", 1, _known([_chat("user", "x" * 3000)]), reply)
        cache.remember_tool_output(f"task-{i}/1/c", "y" * 500)
        assert cache.bytes_held <= 30_000
    # The newest task is still there in full; the oldest are gone.
    expected = [_chat("user", "x" * 3000), reply]
    assert cache.rebuild("task-9", 2, _digest(expected)) is not None
    assert cache.rebuild("task-0", 2, _digest(expected)) is None
    # One conversation past an eighth of the budget is not kept, and pushes nobody out.
    huge = [_chat("user", "z" * 5000)]
    cache.remember_call("task-huge", 1, _known(huge), reply)
    assert cache.rebuild("task-huge", 2, _digest([*huge, reply])) is None
    assert cache.rebuild("task-9", 2, _digest(expected)) is not None


def test_the_running_digest_equals_the_digest_from_scratch() -> None:
    running = ConversationDigest()
    digests = [message_digest(m) for m in conversation(3)]
    assert running.of(digests) == conversation_digest(digests)
    grown = [*digests, message_digest(_chat("user", "more"))]  # appended: only the new one
    assert running.of(grown) == conversation_digest(grown)
    summarized = [grown[0], grown[1], message_digest(_chat("user", "summary")), *grown[-2:]]
    assert running.of(summarized) == conversation_digest(summarized)
    edited = [*summarized[:-1], message_digest(_chat("user", "other"))]
    assert running.of(edited) == conversation_digest(edited)
    assert conversation_digest(edited) != conversation_digest(summarized)
