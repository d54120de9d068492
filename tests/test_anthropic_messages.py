"""Anthropic's Messages API natively (issue 40): the official `anthropic` client through
AnthropicMessages against the fake endpoint's /v1/messages, which refuses, as the API does,
a request that breaks its rules. Tasks run on the dev server with the backend as the
worker's named backend for the test's model."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anthropic
import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, pending_requests
from waystation.activities.anthropic_messages import AnthropicMessages, request_body
from waystation.activities.chat import ChatDelta
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_anthropic import signature
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, hang, stall, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows import errors
from waystation.workflows.models import (
    AgentTask,
    ChatMessage,
    ModelSettings,
    ReasoningItem,
    ToolCallRequest,
)


def claude(fake: FakeOpenAI, replies: list[Reply]) -> str:
    return fake.script(replies, f"claude-test-{uuid.uuid4().hex[:8]}")


@asynccontextmanager
async def anthropic_runtime(
    env: WorkflowEnvironment, settings: Settings, fake: FakeOpenAI, model: str
) -> AsyncIterator[AgentRuntime]:
    """A worker that serves `model` through AnthropicMessages at the fake endpoint."""
    backend = AnthropicMessages("sk-ant-test", fake.anthropic_url)
    try:
        async with running_worker(env.client, settings, backends={model: backend}):
            yield AgentRuntime(env.client, settings)
    finally:
        await backend.close()


def raw(fake: FakeOpenAI, model: str) -> list[dict[str, Any]]:
    """The Messages requests of `model`, as the fake received them."""
    return [view["raw"] for view in fake.requests[model]]


def breakpoints(body: dict[str, Any]) -> int:
    blocks = [*body.get("tools", []), *body.get("system", [])]
    blocks += [b for m in body["messages"] for b in m["content"]]
    return sum("cache_control" in b for b in blocks)


# --- tasks through the backend -------------------------------------------------------------


async def test_a_task_with_parallel_calls_an_approval_and_a_follow_up(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    settings.workspace_dir.mkdir(parents=True, exist_ok=True)
    (settings.workspace_dir / "notes.txt").write_text("remember the milk\n")
    model = claude(
        fake_openai,
        [
            tools(("read_file", {"path": "notes.txt"}), ("list_files", {}), content="Looking."),
            tools(("run_shell", {"command": "echo bought >> effects.txt"})),
            text("Bought the milk."),
            text("Yes, it is done."),
        ],
    )
    async with anthropic_runtime(dev_env, settings, fake_openai, model) as runtime:
        handle = await runtime.run(agent_task(model, task="check my notes"))
        [request] = await pending_requests(handle)
        await handle.approve(request, approver="alice")
        assert (await handle.result()).result == "Bought the milk."
        await handle.send("Is it done?")
        assert (await handle.result()).result == "Yes, it is done."
    first, second, third, fourth = raw(fake_openai, model)
    assert first["max_tokens"] == 4096 and first["system"][-1]["cache_control"]
    assert [m["role"] for m in fourth["messages"]] == ["user", "assistant"] * 3 + ["user"]
    # The two calls of one message: tool_use blocks after the text, answered in one message.
    asked = second["messages"][1]["content"]
    assert [b["type"] for b in asked] == ["text", "tool_use", "tool_use"]
    assert asked[1] == {
        "type": "tool_use",
        "id": "toolu_1_0",
        "name": "read_file",
        "input": {"path": "notes.txt"},
    }
    answers = second["messages"][2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in answers] == [
        ("tool_result", "toolu_1_0"),
        ("tool_result", "toolu_1_1"),
    ]
    assert "remember the milk" in answers[0]["content"]
    assert (settings.workspace_dir / "effects.txt").read_text() == "bought\n"
    # The follow-up is one more user message after the answer; never more than 4 breakpoints.
    assert fourth["messages"][-1]["content"][-1]["text"] == "Is it done?"
    assert all(breakpoints(body) <= 4 for body in (first, second, third, fourth))


class Invoice(BaseModel):
    customer: str
    total_cents: int


async def test_a_typed_result_comes_through_the_final_answer_tool(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = claude(fake_openai, [tools(("final_answer", {"customer": "ACME", "total_cents": 12}))])
    async with anthropic_runtime(dev_env, settings, fake_openai, model) as runtime:
        handle = await runtime.run(agent_task(model, task="read it"), output_type=Invoice)
        assert (await handle.result()).output == Invoice(customer="ACME", total_cents=12)
    [body] = raw(fake_openai, model)
    [final] = [t for t in body["tools"] if t["name"] == "final_answer"]
    assert final["input_schema"]["required"] == ["customer", "total_cents"]
    assert "response_format" not in body


async def test_thinking_blocks_go_back_byte_for_byte_on_the_next_step(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = claude(
        fake_openai,
        [
            tools(("calculator", {"expression": "6*7"}), reasoning="Multiply, then say it."),
            text("42", reasoning="The tool said 42."),
        ],
    )
    thinking = ModelSettings(name=model, thinking_budget_tokens=2048, temperature=0.3)
    async with anthropic_runtime(dev_env, settings, fake_openai, model) as runtime:
        handle = await runtime.run(AgentTask(task="what is 6*7?", model=thinking))
        assert (await handle.result()).result == "42"
        thoughts = of_type(await handle.events(), "thought")
    first, second = raw(fake_openai, model)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 4096 + 2048 and "temperature" not in first
    sent = {
        "type": "thinking",
        "thinking": "Multiply, then say it.",
        "signature": signature("Multiply, then say it."),
    }
    assert thoughts[0].reasoning == [ReasoningItem(protocol="anthropic", model=model, data=sent)]
    # The fake checks the signature and that a tool-use turn keeps its thinking: it took it.
    assert second["messages"][1]["content"][0] == sent
    assert thoughts[1].reasoning[0].data["thinking"] == "The tool said 42."


async def test_cached_tokens_grow_step_by_step_on_a_twenty_step_task(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    steps = [tools(("calculator", {"expression": f"{n}*{n}"})) for n in range(19)]
    model = claude(fake_openai, [*steps, text("done")])
    task = agent_task(model, task="square the numbers " + "carefully " * 400, max_steps=30)
    async with anthropic_runtime(dev_env, settings, fake_openai, model) as runtime:
        handle = await runtime.run(task)
        assert (await handle.result()).result == "done"
        usages = [t.usage for t in of_type(await handle.events(), "thought")]
    assert len(usages) == 20
    # The first step writes the prefix; each later one reads the last one's whole request.
    assert usages[0].cache_read_tokens == 0 and usages[0].cache_write_tokens > 1024
    reads = [u.cache_read_tokens for u in usages]
    assert all(later > earlier for earlier, later in itertools.pairwise(reads))
    for before, after in itertools.pairwise(usages):
        assert after.cache_read_tokens == before.cache_read_tokens + before.cache_write_tokens
    share = sum(u.cache_read_tokens for u in usages) / sum(u.input_tokens for u in usages)
    assert share > 0.9, share  # 0.94: a 1,800-token prompt growing by ~40 tokens a step


# --- the request ---------------------------------------------------------------------------


def conversation(*calls_per_step: int) -> list[ChatMessage]:
    messages = [
        ChatMessage(role="system", content="You are careful. " * 300),
        ChatMessage(role="user", content="go"),
    ]
    for step, count in enumerate(calls_per_step):
        calls = [
            ToolCallRequest(id=f"t{step}_{n}", name="calculator", arguments='{"x": 1}')
            for n in range(count)
        ]
        messages.append(ChatMessage(role="assistant", content=f"step {step}", tool_calls=calls))
        messages += [ChatMessage(role="tool", tool_call_id=c.id, content="1") for c in calls]
    return messages


CALCULATOR = {
    "type": "function",
    "function": {"name": "calculator", "description": "Adds.", "parameters": {"type": "object"}},
}


def unmarked(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]


def test_the_request_is_byte_stable_and_each_step_repeats_the_last_as_its_prefix() -> None:
    model = ModelSettings(name="claude-x")
    earlier = request_body(conversation(2, 2, 2), [CALCULATOR], model)
    again = request_body(conversation(2, 2, 2), [CALCULATOR], model)
    assert json.dumps(earlier) == json.dumps(again)
    later = request_body(conversation(2, 2, 2, 2), [CALCULATOR], model)
    for old, new in zip(earlier["messages"], later["messages"], strict=False):
        assert unmarked(old["content"]) == unmarked(new["content"])
    # Breakpoints: tools, system, the last message, and where the last request ended.
    assert later["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert later["system"][-1]["cache_control"] == {"type": "ephemeral"}
    marked = [i for i, m in enumerate(later["messages"]) if "cache_control" in m["content"][-1]]
    assert marked == [len(earlier["messages"]) - 1, len(later["messages"]) - 1]


def test_roles_alternate_from_the_user_and_every_call_is_answered() -> None:
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(
            role="assistant",
            content="Hello.",
            tool_calls=[
                ToolCallRequest(id="a", name="calc", arguments="{}"),
                ToolCallRequest(id="b", name="calc", arguments="{}"),
            ],
        ),
        ChatMessage(role="user", content="  "),
        ChatMessage(role="tool", tool_call_id="a", content="1"),
        ChatMessage(role="tool", tool_call_id="z", content="stray"),
    ]
    body = request_body(messages, [], ModelSettings(name="claude-x"))
    opening, asked, answered = body["messages"]
    assert opening["role"] == "user"
    assert unmarked(opening["content"]) == [{"type": "text", "text": "(empty)"}]
    assert asked["role"] == "assistant"
    assert unmarked(answered["content"]) == [
        {"type": "tool_result", "tool_use_id": "a", "content": "1"},
        {"type": "tool_result", "tool_use_id": "b", "content": "(no result)", "is_error": True},
        {"type": "text", "text": "(empty)"},
        {"type": "text", "text": "(result of tool call z: stray)"},
    ]


def test_unparsable_arguments_go_as_an_empty_input_with_the_text_kept() -> None:
    messages = [
        ChatMessage(role="user", content="go"),
        ChatMessage(
            role="assistant", tool_calls=[ToolCallRequest(id="a", name="calc", arguments="{x")]
        ),
        ChatMessage(role="tool", tool_call_id="a", content="arguments are not JSON"),
    ]
    body = request_body(messages, [], ModelSettings(name="claude-x"))
    text_block, use = body["messages"][1]["content"]
    assert use == {"type": "tool_use", "id": "a", "name": "calc", "input": {}}
    assert "{x" in text_block["text"]


async def test_a_step_that_adds_more_than_twenty_blocks_still_reads_the_last_prefix(
    fake_openai: FakeOpenAI,
) -> None:
    model = claude(fake_openai, [text("one"), text("two")])
    backend = AnthropicMessages("sk-ant-test", fake_openai.anthropic_url)
    settings = ModelSettings(name=model)
    try:
        first = [d async for d in backend.stream(conversation(1), [CALCULATOR], settings)]
        second = [d async for d in backend.stream(conversation(1, 30), [CALCULATOR], settings)]
    finally:
        await backend.close()
    [used_first] = [d.usage for d in first if d.usage]
    [used_second] = [d.usage for d in second if d.usage]
    assert used_second.cache_read_tokens == used_first.cache_write_tokens > 1024


# --- errors --------------------------------------------------------------------------------


async def failure(
    fake: FakeOpenAI,
    reply: Reply,
    *,
    key: str = "sk-ant-test",
    url: str | None = None,
    model: ModelSettings | None = None,
    response_format: dict[str, Any] | None = None,
) -> ApplicationError:
    name = claude(fake, [reply])
    backend = AnthropicMessages(key, url or fake.anthropic_url)
    settings = (model or ModelSettings(name=name)).model_copy(update={"name": name})
    messages = [ChatMessage(role="user", content="hi")]
    deltas: list[ChatDelta] = []
    try:
        with pytest.raises(ApplicationError) as caught:
            async for delta in backend.stream(
                messages, [], settings, response_format=response_format
            ):
                deltas.append(delta)
    finally:
        await backend.close()
    return caught.value


async def test_overloaded_and_rate_limited_are_retried_after_the_wait_asked(
    fake_openai: FakeOpenAI,
) -> None:
    limited = await failure(fake_openai, error(429, "slow down", {"retry-after": "7"}))
    assert limited.type == errors.LLM_UNAVAILABLE and not limited.non_retryable
    assert limited.next_retry_delay == timedelta(seconds=7)
    assert "rate_limit_error: slow down" in str(limited)
    overloaded = await failure(fake_openai, error(529, "Overloaded"))
    assert overloaded.type == errors.LLM_UNAVAILABLE
    assert "529 overloaded_error: Overloaded" in str(overloaded)
    broken = await failure(fake_openai, error(500, "Internal server error"))
    assert broken.type == errors.LLM_UNAVAILABLE
    # Overloaded mid-answer: an `error` event in a stream that began with 200.
    mid_stream = await failure(fake_openai, Reply(content="partial", error_message="Overloaded"))
    assert mid_stream.type == errors.LLM_UNAVAILABLE and "overloaded_error" in str(mid_stream)


async def test_a_prompt_too_long_is_context_too_long(fake_openai: FakeOpenAI) -> None:
    err = await failure(
        fake_openai, error(400, "prompt is too long: 210000 tokens > 200000 maximum")
    )
    assert err.type == errors.LLM_CONTEXT_TOO_LONG and err.non_retryable


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (403, "permission_error"), (404, "not_found_error")],
)
async def test_refusals_are_rejected_with_the_providers_message(
    fake_openai: FakeOpenAI, status: int, kind: str
) -> None:
    err = await failure(fake_openai, error(status, "not for you"))
    assert err.type == errors.LLM_REQUEST_REJECTED and err.non_retryable
    assert err.message == f"the Anthropic endpoint answered {status} {kind}: not for you"


async def test_a_wrong_key_is_rejected(fake_openai: FakeOpenAI) -> None:
    err = await failure(fake_openai, text("never"), key="wrong-key")
    assert err.type == errors.LLM_REQUEST_REJECTED
    assert (
        err.message == "the Anthropic endpoint answered 401 authentication_error: invalid x-api-key"
    )


async def test_an_unreachable_endpoint_is_named_without_its_credentials(
    fake_openai: FakeOpenAI,
) -> None:
    err = await failure(fake_openai, text("never"), url="http://user:secret@127.0.0.1:9")
    assert err.type == errors.LLM_UNAVAILABLE
    assert ":secret@" not in err.message
    assert err.message.startswith("cannot reach the Anthropic endpoint at http://")
    assert "127.0.0.1:9 (ANTHROPIC_BASE_URL): nothing answers there" in str(err)


async def test_a_silent_or_stalled_endpoint_runs_out_its_clocks(fake_openai: FakeOpenAI) -> None:
    quick = ModelSettings(request_timeout_seconds=0.3, first_chunk_timeout_seconds=0.3)
    silent = await failure(fake_openai, hang(3), model=quick)
    assert silent.type == errors.LLM_UNAVAILABLE
    assert "no first chunk from the model within 0.3 s" in str(silent)
    stalled = await failure(fake_openai, stall("a b c", before_chunk=4, seconds=3), model=quick)
    assert "stream stalled for 0.3 s" in str(stalled)


async def test_a_stream_cut_off_mid_answer_is_retried(fake_openai: FakeOpenAI) -> None:
    err = await failure(fake_openai, Reply(content="a b c d", cut_after_chunks=5))
    assert err.type == errors.LLM_UNAVAILABLE and "ended before message_stop" in err.message


async def test_a_response_format_is_refused_for_the_final_answer_tool(
    fake_openai: FakeOpenAI,
) -> None:
    err = await failure(fake_openai, text("never"), response_format={"type": "json_schema"})
    assert err.type == errors.LLM_REQUEST_REJECTED and "final_answer tool" in str(err)


# --- the fake refuses what the API refuses -------------------------------------------------


USER: Any = {"role": "user", "content": "hi"}
USE: Any = {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}
RESULT: Any = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}
THOUGHT: Any = {"type": "thinking", "thinking": "Hm.", "signature": signature("Hm.")}
MARK: Any = {"cache_control": {"type": "ephemeral"}}
THINKING: Any = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 2048}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"messages": [USER]}, "max_tokens: Field required"),
        ({"max_tokens": 9, "messages": [{"role": "assistant", "content": "x"}]}, "alternate"),
        ({"max_tokens": 9, "messages": [USER, USER]}, "alternate"),
        (
            {"max_tokens": 9, "messages": [USER, {"role": "assistant", "content": [USE]}, USER]},
            "without `tool_result` blocks",
        ),
        (
            {
                "max_tokens": 9,
                "messages": [
                    USER,
                    {"role": "assistant", "content": [USE]},
                    {"role": "user", "content": [{"type": "text", "text": "x"}, RESULT]},
                ],
            },
            "must come first",
        ),
        (
            {
                **THINKING,
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{**THOUGHT, "thinking": "Hm!"}, USE]},
                    {"role": "user", "content": [RESULT]},
                ],
            },
            "Invalid `signature` in `thinking` block",
        ),
        (
            {
                **THINKING,
                "messages": [
                    USER,
                    {"role": "assistant", "content": [USE]},
                    {"role": "user", "content": [RESULT]},
                ],
            },
            "must start with a thinking block",
        ),
        ({**THINKING, "temperature": 0.2, "messages": [USER]}, "temperature"),
        (
            {
                "max_tokens": 9,
                "system": [{"type": "text", "text": "s", **MARK}],
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": t, **MARK} for t in "abcd"],
                    }
                ],
            },
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
    ],
)
def test_the_fake_refuses_a_request_that_breaks_the_apis_rules(
    fake_openai: FakeOpenAI, body: dict[str, Any], said: str
) -> None:
    model = claude(fake_openai, [text("never")])
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=fake_openai.anthropic_url)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", body={"model": model, **body}, cast_to=object)
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert said in caught.value.body["error"]["message"]  # type: ignore[index]
    assert fake_openai.calls(model) == 0


def test_the_fake_takes_thinking_sent_back_unchanged(fake_openai: FakeOpenAI) -> None:
    model = claude(fake_openai, [text("fine")])
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=fake_openai.anthropic_url)
    message = client.messages.create(
        model=model,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [THOUGHT, USE]},
            {"role": "user", "content": [RESULT]},
        ],
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert fake_openai.calls(model) == 1


def test_the_fake_refuses_a_wrong_key(fake_openai: FakeOpenAI) -> None:
    client = anthropic.Anthropic(api_key="wrong-key", base_url=fake_openai.anthropic_url)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="claude-x", max_tokens=9, messages=[USER])
