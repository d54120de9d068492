"""OpenAI's Responses API natively: the official `openai` client, through OpenAIResponses,
against the fake's `/responses` (waystation.testing.fake_responses), which checks OpenAI's
rules on every request. Tasks run on the dev server with the backend as a named one."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import openai
import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from tests.helpers import of_type, pending_requests
from waystation.activities.chat import ChatDelta
from waystation.activities.openai_responses import OpenAIResponses, request_body
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, stall, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows import errors
from waystation.workflows.models import (
    AgentTask,
    ChatMessage,
    ModelSettings,
    ReasoningItem,
    ToolCallRequest,
)


@pytest.fixture
async def backend(fake_openai: FakeOpenAI) -> AsyncIterator[OpenAIResponses]:
    responses = OpenAIResponses("test-key", fake_openai.url)
    yield responses
    await responses.close()  # its own HTTP client: the worker closes only the endpoint's


def task(model: str, text: str = "do the thing", **settings: Any) -> AgentTask:
    return AgentTask(
        task=text,
        model=ModelSettings(
            name=model,
            request_timeout_seconds=30,
            first_chunk_timeout_seconds=30,
            **settings,
        ),
    )


def by_step(*replies: Reply) -> Callable[[dict[str, Any]], Reply]:
    """A script that answers each step (counted from the conversation) with its reply, so
    that an attempt retried on a busy machine gets the same answer again."""

    def reply(view: dict[str, Any]) -> Reply:
        return replies[sum(1 for m in view["messages"] if m["role"] == "assistant")]

    return reply


def raw_requests(fake: FakeOpenAI, model: str) -> list[dict[str, Any]]:
    """The requests' bodies as sent, a retried attempt's repeat counted once."""
    bodies: dict[str, dict[str, Any]] = {}
    for view in fake.requests[model]:
        bodies.setdefault(json.dumps(view["raw"]), view["raw"])
    return list(bodies.values())


def items_of(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in body["input"] if item.get("type") == kind]


async def test_a_task_with_tool_calls_an_approval_and_a_follow_up(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    backend: OpenAIResponses,
) -> None:
    model = fake_openai.script(
        by_step(
            tools(
                ("calculator", {"expression": "6 * 7"}),
                ("list_files", {"path": "."}),
                content="Two at once.",
            ),
            tools(("run_shell", {"command": "echo approved > effects.txt"})),
            text("All done."),
            text("It was 42."),
        )
    )
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings, backends={model: backend}):
        handle = await runtime.run(task(model))
        [request] = await pending_requests(handle)
        await handle.approve(request, approver="ann")
        assert (await handle.result()).result == "All done."
        events = await handle.events()
        await handle.send("what was the product?")
        assert (await handle.result()).result == "It was 42."
        [*_, last] = of_type(await handle.events(), "thought")
    assert (settings.workspace_dir / "effects.txt").read_text() == "approved\n"
    actions = of_type(events, "action")
    assert [a.tool for a in actions] == ["calculator", "list_files", "run_shell"]
    assert [a.call_id for a in actions] == ["call_1_0", "call_1_1", "call_2_0"]
    assert actions[2].needs_approval
    assert of_type(events, "observation")[0].output == "42"
    first = of_type(events, "thought")[0]
    assert first.content == "Two at once." and first.finish_reason == "tool_calls"
    bodies = raw_requests(fake_openai, model)
    assert len(bodies) == 4
    # Nothing kept on the provider: the whole conversation each time, store=false.
    assert all(b["store"] is False and "previous_response_id" not in b for b in bodies)
    second = bodies[1]
    assert second["instructions"] == bodies[0]["instructions"]
    assert [(c["call_id"], c["name"]) for c in items_of(second, "function_call")] == [
        ("call_1_0", "calculator"),
        ("call_1_1", "list_files"),
    ]
    outputs = items_of(second, "function_call_output")
    assert [o["call_id"] for o in outputs] == ["call_1_0", "call_1_1"] and outputs[0][
        "output"
    ] == "42"
    tool_entry = next(t for t in second["tools"] if t["name"] == "calculator")
    assert tool_entry["type"] == "function" and tool_entry["strict"] is False
    # Each request begins with the one before it, byte for byte (the prompt cache's prefix).
    for before, after in itertools.pairwise(bodies):
        assert after["tools"] == before["tools"]
        sent_before = json.dumps(before["input"])[:-1]
        assert json.dumps(after["input"]).startswith(sent_before)
    assert bodies[3]["input"][-1] == {"role": "user", "content": "what was the product?"}
    assert last.content == "It was 42."


async def test_reasoning_items_go_back_unchanged_before_their_calls_across_turns(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    backend: OpenAIResponses,
) -> None:
    model = fake_openai.script(
        by_step(
            tools(("calculator", {"expression": "6 * 7"}), reasoning="I should multiply."),
            tools(("calculator", {"expression": "42 + 1"}), reasoning="Now add one."),
            Reply(content="43", reasoning="That is the answer."),
            Reply(content="Still 43.", reasoning="Nothing changed."),
        )
    )
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings, backends={model: backend}):
        handle = await runtime.run(task(model, reasoning_effort="low"))
        assert (await handle.result()).result == "43"
        thoughts = of_type(await handle.events(), "thought")
        await handle.send("and now?")
        assert (await handle.result()).result == "Still 43."
        [*_, last] = of_type(await handle.events(), "thought")
    thoughts.append(last)
    assert [len(t.reasoning) for t in thoughts] == [1, 1, 1, 1]
    given = [t.reasoning[0] for t in thoughts]
    assert all(r.protocol == "responses" and r.model == model for r in given)
    assert given[0].data["summary"] == [{"type": "summary_text", "text": "I should multiply."}]
    assert thoughts[0].usage.reasoning_tokens == len("I should multiply.") // 4
    bodies = raw_requests(fake_openai, model)
    assert all(b["include"] == ["reasoning.encrypted_content"] for b in bodies)
    assert all(b["reasoning"] == {"effort": "low"} for b in bodies)
    # Each reasoning item came back as it was given (the fake verifies its encrypted
    # content and refuses a function call without it), just before what followed it.
    last = bodies[3]["input"]
    sent_back = [item for item in last if item.get("type") == "reasoning"]
    assert sent_back == [r.data for r in given[:3]]
    for reasoning in sent_back[:2]:
        assert last[last.index(reasoning) + 1]["type"] == "function_call"


async def test_a_typed_result_natively_and_through_the_final_answer_tool(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    backend: OpenAIResponses,
) -> None:
    class Invoice(BaseModel):
        customer: str
        total_cents: int

    answer = {"customer": "ACME", "total_cents": 1200}
    native = fake_openai.script(by_step(text(json.dumps(answer))))
    tool = fake_openai.script(by_step(tools(("final_answer", answer))))
    runtime = AgentRuntime(dev_env.client, settings)
    backends = {native: backend, tool: backend}
    async with running_worker(dev_env.client, settings, backends=backends):
        native_task = task(native, structured_output="native")
        by_format = await runtime.run(native_task, output_type=Invoice)
        assert (await by_format.result()).output == Invoice(**answer)
        by_tool = await runtime.run(task(tool, structured_output="tool"), output_type=Invoice)
        assert (await by_tool.result()).output == Invoice(**answer)
    [asked] = raw_requests(fake_openai, native)
    assert asked["text"]["format"]["type"] == "json_schema"
    assert asked["text"]["format"]["name"] == "final_answer"
    assert asked["text"]["format"]["schema"]["required"] == ["customer", "total_cents"]
    [offered] = raw_requests(fake_openai, tool)
    final = next(t for t in offered["tools"] if t["name"] == "final_answer")
    assert final["parameters"]["required"] == ["customer", "total_cents"]
    assert "text" not in offered


async def collect(
    backend: OpenAIResponses, model: ModelSettings, messages: list[ChatMessage] | None = None
) -> list[ChatDelta]:
    sent = messages or [ChatMessage(role="user", content="hi")]
    return [delta async for delta in backend.stream(sent, [], model)]


async def failure_of(backend: OpenAIResponses, model: ModelSettings) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        await collect(backend, model)
    return raised.value


async def test_errors_come_out_classified(
    fake_openai: FakeOpenAI, backend: OpenAIResponses
) -> None:
    limited = fake_openai.script([error(429, "Rate limit reached", {"retry-after": "7"})])
    err = await failure_of(backend, ModelSettings(name=limited))
    assert err.type == errors.LLM_UNAVAILABLE and not err.non_retryable
    assert err.next_retry_delay == timedelta(seconds=7)
    assert "Rate limit reached" in str(err)
    too_long = fake_openai.script(
        [error(400, "Your input exceeds the context window of this model.")]
    )
    err = await failure_of(backend, ModelSettings(name=too_long))
    assert err.type == errors.LLM_CONTEXT_TOO_LONG and err.non_retryable
    failed = fake_openai.script([Reply(error_message="The server had an error.")])
    err = await failure_of(backend, ModelSettings(name=failed))
    assert err.type == errors.LLM_UNAVAILABLE and "server_error" in str(err)
    stalled = fake_openai.script([stall("slow answer", before_chunk=3, seconds=2)])
    err = await failure_of(backend, ModelSettings(name=stalled, request_timeout_seconds=0.2))
    assert err.type == errors.LLM_UNAVAILABLE and "stalled for 0.2 s" in str(err)
    wrong = OpenAIResponses("wrong-key", fake_openai.url)
    try:
        err = await failure_of(wrong, ModelSettings(name=limited))
    finally:
        await wrong.close()
    assert err.type == errors.LLM_REQUEST_REJECTED and err.non_retryable
    assert "Incorrect API key" in str(err)
    cut_short = fake_openai.script([Reply(content="a long answer", usage=(11, 50))])
    deltas = await collect(backend, ModelSettings(name=cut_short, max_tokens=10))
    assert deltas[-1].finish_reason == "length"
    assert raw_requests(fake_openai, cut_short)[0]["max_output_tokens"] == 10


async def test_a_long_stable_prefix_is_read_from_the_cache_as_openai_counts_it(
    fake_openai: FakeOpenAI, backend: OpenAIResponses
) -> None:
    model = fake_openai.script([text("one"), text("two")])
    system = ChatMessage(role="system", content="You are careful. " * 400)  # ~1700 tokens
    first = [system, ChatMessage(role="user", content="first question")]
    [*_, end] = await collect(backend, ModelSettings(name=model), first)
    assert end.usage is not None and end.usage.cache_read_tokens == 0
    assert end.usage.input_tokens > 1024
    second = [
        *first,
        ChatMessage(role="assistant", content="one"),
        ChatMessage(role="user", content="next"),
    ]
    [*_, end] = await collect(backend, ModelSettings(name=model), second)
    assert end.usage is not None
    cached = end.usage.cache_read_tokens
    assert cached >= 1024 and (cached - 1024) % 128 == 0 and cached < end.usage.input_tokens


def test_the_same_conversation_is_the_same_bytes_and_reasoning_stays_with_its_model() -> None:
    call = ToolCallRequest(id="call_1_0", name="calculator", arguments='{"expression": "1"}')
    mine = ReasoningItem(
        protocol="responses", model="openai-responses:o4-mini", data={"id": "rs_1"}
    )
    other_model = ReasoningItem(protocol="responses", model="gpt-5", data={"id": "rs_2"})
    other_protocol = ReasoningItem(protocol="anthropic", model="o4-mini", data={"id": "t"})
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage(role="user", content="add"),
        ChatMessage(
            role="assistant",
            tool_calls=[call],
            reasoning=[mine, other_model, other_protocol],
        ),
        ChatMessage(role="tool", tool_call_id="call_1_0", content="1"),
    ]
    model = ModelSettings(name="o4-mini", tool_choice="calculator")
    schema = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    body = request_body(messages, schema, model)
    assert json.dumps(body) == json.dumps(request_body(messages, schema, model))
    assert body["input"] == [
        {"role": "user", "content": "add"},
        {"id": "rs_1"},
        {
            "type": "function_call",
            "call_id": "call_1_0",
            "name": "calculator",
            "arguments": '{"expression": "1"}',
        },
        {"type": "function_call_output", "call_id": "call_1_0", "output": "1"},
    ]
    # A reasoning model: its encrypted reasoning is asked for even with no effort set.
    assert body["include"] == ["reasoning.encrypted_content"] and "reasoning" not in body
    assert body["tool_choice"] == {"type": "function", "name": "calculator"}
    assert body["instructions"] == "be brief" and body["store"] is False


async def rejected(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as raised:
        await call
    assert raised.value.body is not None
    assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    return raised.value


async def test_the_fake_refuses_what_openai_refuses(fake_openai: FakeOpenAI) -> None:
    model = fake_openai.script([tools(("calculator", {"expression": "1"}), reasoning="add")] * 3)
    client = openai.AsyncOpenAI(api_key="test-key", base_url=fake_openai.url, max_retries=0)
    try:
        asked = "What is 1?"
        first = await client.responses.create(
            model=model, input=asked, store=False, include=["reasoning.encrypted_content"]
        )
        reasoning, call = (item.model_dump(exclude_unset=True) for item in first.output)
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "1"}
        call_back = {k: call[k] for k in ("type", "call_id", "name", "arguments")}
        user = {"role": "user", "content": asked}

        async def send(input: list[dict[str, Any]], **options: Any) -> Any:
            create: Any = client.responses.create  # items as plain dicts, on purpose
            return await create(model=model, input=input, store=False, **options)

        err = await rejected(send([user, output]))
        assert "No tool call found for function call output" in err.message
        err = await rejected(send([user, call_back, output]))
        assert f"without its required 'reasoning' item: '{reasoning['id']}'" in err.message
        tampered = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-4] + "AAA="}
        err = await rejected(send([user, tampered, call_back, output]))
        assert "could not be verified" in err.message
        resummarized = {**reasoning, "summary": [{"type": "summary_text", "text": "other"}]}
        err = await rejected(send([user, resummarized, call_back, output]))
        assert "does not match" in err.message
        without = {k: v for k, v in reasoning.items() if k != "encrypted_content"}
        err = await rejected(send([user, without, call_back, output]))
        assert "Items are not persisted when `store` is set to false" in err.message
        err = await rejected(send([user], previous_response_id=first.id))
        assert "store" in err.message
        # Sent back as it came, the same conversation is answered.
        again = await send([user, reasoning, call_back, output])
        assert again.status == "completed"
        with pytest.raises(openai.AuthenticationError):
            await client.with_options(api_key="wrong-key").responses.create(
                model=model, input=asked
            )
    finally:
        await client.close()
    assert fake_openai.calls(model) == 2  # the refused requests never reached the script
