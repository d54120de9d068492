"""The agent loop on the time-skipping server, against the fake OpenAI-protocol server."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from tests.helpers import agent_task
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError, TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, hang, text, tools
from waystation.workflows.models import AgentTask


async def history_payload_text(handle: TaskHandle, runtime: AgentRuntime) -> str:
    """Every payload in the task's history, decoded, as one text."""
    history = await runtime.client.get_workflow_handle(handle.id).fetch_history()
    texts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "metadata" in node and "data" in node and isinstance(node["data"], str):
                texts.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history.to_json()))
    return "\n".join(texts)


async def llm_attempts(handle: TaskHandle, runtime: AgentRuntime) -> list[int]:
    """The attempt number each call_llm activity finished on, from the history."""
    history = await runtime.client.get_workflow_handle(handle.id).fetch_history()
    scheduled: dict[int, str] = {}
    attempts: list[int] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attrs.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs2 = event.activity_task_started_event_attributes
            if scheduled.get(attrs2.scheduled_event_id) == "call_llm":
                attempts.append(attrs2.attempt)
    return attempts


async def test_multi_step_task_with_two_tool_calls(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(
                ("calculator", {"expression": "12 + 30"}),
                ("calculator", {"expression": "6 * 7"}),
                content="Let me compute both.",
            ),
            text("Both are 42."),
        ]
    )
    handle = await ts_runtime.run(agent_task(model))
    outcome = await handle.result()
    assert outcome.result == "Both are 42."
    assert outcome.steps == 2
    events = await handle.events()
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "task_started",
        "thought",
        "action",
        "action",
        "observation",
        "observation",
        "thought",
        "done",
    ]
    observations = [e for e in events if e.type == "observation"]
    assert [o.output for o in observations] == ["42", "42"]
    # The model's second call saw both tool results, in order, tied to its call ids.
    second = fake_openai.requests[model][1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [m["content"] for m in second[3:]] == ["42", "42"]
    assert [m["tool_call_id"] for m in second[3:]] == [c["id"] for c in second[2]["tool_calls"]]
    state = await handle.state()
    assert state.status == "done" and state.usage.total == 2 * (11 + 7)


async def test_pure_tools_run_locally_and_others_through_the_server(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "6 * 7"}), ("calculator", {"expression": "1/0"})),
            tools(("list_files", {"path": "."})),
            text("done"),
        ]
    )
    handle = await ts_runtime.run(agent_task(model))
    await handle.result()
    observations = [e for e in await handle.events() if e.type == "observation"]
    assert [(o.output, o.is_error) for o in observations[:2]] == [
        ("42", False),
        ("division by zero", True),
    ]
    history = await ts_runtime.client.get_workflow_handle(handle.id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    # The calculator ran in the workflow task (recorded as markers), list_files did not.
    assert scheduled == ["call_llm", "call_llm", "run_tool", "call_llm"]
    local_runs = [
        json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    # (after the run's look at which notifications its worker's webhooks want, and before
    # the seal it leaves for its readers as it closes)
    assert [m["activity_type"] for m in local_runs] == [
        "notification_targets",
        "run_tool",
        "run_tool",
        "seal_run",
    ]


async def test_malformed_tool_arguments_are_fed_back_and_the_model_corrects(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            Reply(tool_calls=[("calculator", '{"expression": "2 +')]),
            tools(("calculator", {"expression": "2 + 2"})),
            text("It is 4."),
        ]
    )
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "It is 4."
    observations = [e for e in await handle.events() if e.type == "observation"]
    assert observations[0].is_error and "not valid JSON" in observations[0].output
    assert not observations[1].is_error and observations[1].output == "4"
    told = fake_openai.requests[model][1]["messages"][-1]
    assert told["role"] == "tool" and "not valid JSON" in told["content"]


async def test_unknown_tool_becomes_an_error_observation(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("teleport", {"to": "mars"})), text("Sorry, I cannot.")])
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "Sorry, I cannot."
    observation = next(e for e in await handle.events() if e.type == "observation")
    assert observation.is_error
    assert "unknown tool 'teleport'" in observation.output


async def test_max_steps_fails_with_a_reason_and_keeps_everything(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: tools(("calculator", {"expression": "1 + 1"})))
    handle = await ts_runtime.run(agent_task(model, max_steps=3))
    with pytest.raises(TaskFailedError) as failure:
        await handle.result()
    assert failure.value.kind == "max_steps"
    assert "max_steps=3" in str(failure.value)
    state = await handle.state()
    assert state.status == "failed" and state.failure_kind == "max_steps"
    assert state.step == 3
    assert sum(1 for r in state.conversation if r.role == "tool") == 3
    assert fake_openai.calls(model) == 3


async def test_token_budget_fails_the_task_before_the_next_call(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        lambda body: tools(("calculator", {"expression": "1"}), usage=(400, 100))
    )
    handle = await ts_runtime.run(agent_task(model, token_budget=1200))
    with pytest.raises(TaskFailedError, match="token_budget of 1200") as failure:
        await handle.result()
    assert failure.value.kind == "token_budget"
    assert fake_openai.calls(model) == 3  # 500, 1000, 1500 tokens: the third crossed it


async def test_429_with_retry_after_is_retried_once(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [error(429, "Rate limit reached", {"Retry-After": "1"}), text("done after a wait")]
    )
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "done after a wait"
    assert fake_openai.calls(model) == 2
    assert await llm_attempts(handle, ts_runtime) == [2]


async def test_500_and_a_cut_stream_are_retried(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            error(500, "upstream exploded"),
            Reply(content="partial words that never finish", cut_after_chunks=3),
            text("third time lucky"),
        ]
    )
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "third time lucky"
    assert await llm_attempts(handle, ts_runtime) == [3]
    thought = next(e for e in await handle.events() if e.type == "thought")
    assert thought.content == "third time lucky" and thought.attempt == 3


async def test_a_hanging_endpoint_times_out_and_is_retried(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Only the first request hangs: the 0.5 s clock bounds each retry too, and a busy
    # machine may answer a retry later than that, which is then retried again.
    asked = 0

    def hanging_once(body: dict[str, Any]) -> Reply:
        nonlocal asked
        asked += 1
        return hang(3) if asked == 1 else text("back again")

    model = fake_openai.script(hanging_once)
    handle = await ts_runtime.run(agent_task(model, timeout=0.5))
    assert (await handle.result()).result == "back again"
    [attempt] = await llm_attempts(handle, ts_runtime)
    assert attempt >= 2 and fake_openai.calls(model) == attempt


async def test_401_fails_at_once_with_the_providers_message(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([error(401, "Incorrect API key provided: sk-te****")])
    handle = await ts_runtime.run(agent_task(model))
    with pytest.raises(TaskFailedError, match="401: Incorrect API key provided") as failure:
        await handle.result()
    assert failure.value.kind == "llm_error"
    assert fake_openai.calls(model) == 1
    assert await llm_attempts(handle, ts_runtime) == [1]
    assert (await handle.state()).status == "failed"


async def test_unknown_model_404_is_not_retried(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    handle = await ts_runtime.run(agent_task("no-such-model"))
    with pytest.raises(TaskFailedError, match="404"):
        await handle.result()


async def test_content_enters_history_once(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    marker = "UNIQUE-TASK-TEXT-" + "x" * 2000
    answer = "UNIQUE-ANSWER-" + "y" * 500
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "1 + 1"})),
            tools(("calculator", {"expression": "2"})),
            text(answer),
        ]
    )
    handle = await ts_runtime.run(agent_task(model, task=marker))
    await handle.result()
    raw = await history_payload_text(handle, ts_runtime)
    # The task is in the workflow input once (the Web UI summary holds only its first
    # 200 characters); no LLM input repeats the conversation.
    assert raw.count(marker) == 1
    # The answer is in the LLM result; the token stream carries it in batches too.
    assert raw.count("UNIQUE-ANSWER") <= 2


async def test_offline_model_completes_the_readme_task(
    ts_runtime: AgentRuntime, settings: Settings
) -> None:
    handle = await ts_runtime.run(
        AgentTask(task="What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt")
    )
    outcome = await handle.result()
    assert outcome.result.startswith("[offline model]")
    assert "294" in outcome.result and "1024" in outcome.result
    written = (settings.workspace_dir / "scratch" / "answer.txt").read_text()
    assert written == "(12 + 30) * 7 = 294\n2^10 = 1024\n"
