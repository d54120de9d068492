"""A malformed model message (repeated, empty or missing call ids; arguments nested past any
real call) never runs what nobody was shown and never makes a task stuck (issue 37, items 3
and 17): through the fake OpenAI server, the real HTTP API and the dev server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_console_api import APPROVER, Api
from tests.test_plan import Log, call
from waystation.activities.call_ids import unique_call_ids
from waystation.activities.llm import MAX_CALLS_PER_MESSAGE, TOO_MANY_CALLS
from waystation.activities.structured_output import final_answer_call, native_answer
from waystation.activities.text_tool_calls import recover_tool_calls
from waystation.activities.tools import json_object_arguments
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.approval import decision_problem, request_events
from waystation.workflows.calls import Run, verdict
from waystation.workflows.conversation import MAX_CONTEXT_LIMIT
from waystation.workflows.events import ApprovalResolved, draft, request_digest
from waystation.workflows.models import Decision, ToolResult
from waystation.workflows.nesting import MAX_JSON_DEPTH
from waystation.workflows.notice import notice_key


@pytest.fixture
async def http(
    dev_env: WorkflowEnvironment, settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API as an approver, over a worker on the test's queue."""
    approver = settings.model_copy(
        update={"api_tokens": {APPROVER: ApiToken(role="approver", name="ada")}}
    )
    api = Api(AgentRuntime(dev_env.client, approver))
    async with running_worker(dev_env.client, approver), await api.start() as client:
        yield client
    await api.stop()


def effects(settings: Settings) -> list[str]:
    path = settings.workspace_dir / "effects.txt"
    return sorted(path.read_text().splitlines()) if path.exists() else []


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def after_tools(first: Reply, answer: str = "done") -> Any:
    """A model that sends `first`, then answers once it has seen tool results."""

    def reply(body: dict[str, Any]) -> Reply:
        return text(answer) if tool_messages(body) else first

    return reply


def paired(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The call ids of the assistant message sent back to the model, and of its results."""
    [assistant] = [m for m in body["messages"] if m["role"] == "assistant"]
    return [c["id"] for c in assistant["tool_calls"]], [
        m["tool_call_id"] for m in tool_messages(body)
    ]


async def test_two_calls_with_one_id_are_each_shown_decided_and_run_as_shown(
    http: httpx.AsyncClient,
    dev_env: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    shown, hidden = "echo shown >> effects.txt", "echo hidden >> effects.txt"
    first = tools(("run_shell", {"command": shown}), ("run_shell", {"command": hidden}))
    first.call_ids = ["dup", "dup"]
    model = fake_openai.script(after_tools(first))
    handle = await AgentRuntime(dev_env.client, settings).run(agent_task(model))
    task_id = handle.id
    await wait_for_state(handle, lambda s: s.status == "waiting_approval")

    inbox = (await http.get("/approvals")).json()["approvals"]
    asked = {i["arguments"]["command"]: i["request_id"] for i in inbox if i["task_id"] == task_id}
    assert sorted(asked) == sorted([shown, hidden])
    requested = of_type(await handle.events(), "approval_requested")
    keys = {notice_key(task_id, event) for event in requested}
    assert len(requested) == len(keys) == 2  # one notice each, under its own Idempotency-Key

    digests = {i["request_id"]: i["digest"] for i in inbox if i["task_id"] == task_id}
    elsewhere = {"request_id": asked[shown], "shown": digests[asked[hidden]]}
    refused = await http.post(f"/tasks/{task_id}/approve", json=elsewhere)
    assert (refused.status_code, refused.json()["error"]) == (409, "decision_mismatch")
    deep: dict[str, Any] = {"command": "echo edited"}
    for _ in range(MAX_JSON_DEPTH):
        deep = {"nested": deep}
    edited = {"request_id": asked[shown], "arguments": deep}
    too_deep = await http.post(f"/tasks/{task_id}/approve", json=edited)
    assert too_deep.status_code == 422
    assert "more than 64 deep" in too_deep.text
    seen = {"request_id": asked[shown], "shown": digests[asked[shown]]}
    approved = await http.post(f"/tasks/{task_id}/approve", json=seen)
    rejected = await http.post(f"/tasks/{task_id}/reject", json={"request_id": asked[hidden]})
    assert (approved.status_code, rejected.status_code) == (200, 200)
    assert (await handle.result()).result == "done"
    assert effects(settings) == ["shown"]
    observations = of_type(await handle.events(), "observation")
    assert len(observations) == 2 and len({o.call_id for o in observations}) == 2
    said, answered = paired(fake_openai.requests[model][-1])
    assert len(set(said)) == 2 and answered == said


async def test_missing_empty_and_colliding_ids_get_one_observation_each(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # The first call's missing id would be named call_1_0, the id the third call sends.
    first = tools(
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2+2"}),
        ("calculator", {"expression": "3+3"}),
    )
    first.call_ids = [None, "", "call_1_0"]
    model = fake_openai.script(after_tools(first))
    handle = await dev_runtime.run(agent_task(model))
    assert (await handle.result()).result == "done"
    observations = of_type(await handle.events(), "observation")
    assert sorted(o.output for o in observations) == ["2", "4", "6"]
    said, answered = paired(fake_openai.requests[model][-1])
    assert len(set(said)) == 3 and answered == said


def test_ids_are_kept_when_well_formed_and_made_unique_otherwise() -> None:
    assert unique_call_ids(["call_a", "toolu_b", "functions.f:0"], "call_1") == [
        "call_a",
        "toolu_b",
        "functions.f:0",
    ]
    assert unique_call_ids(["dup", "dup", "dup_2", "dup"], "call_1") == [
        "dup",
        "dup_3",
        "dup_2",
        "dup_4",
    ]
    assert unique_call_ids([None, "", "call_1_0", "x" * 65, "a\x1b[2Kb"], "call_1") == [
        "call_1_0",
        "call_1_1",
        "call_1_0_2",
        "call_1_3",
        "call_1_4",
    ]


def test_a_decision_runs_only_the_call_its_request_showed() -> None:
    """A history recorded before ids were unique: two calls under one request, whose
    inbox showed the second. The approval runs the second and never the first."""
    log = Log()
    shown = call("dup", needs_approval=True, command="echo shown")
    hidden = call("dup", needs_approval=True, command="echo hidden")
    log.thought(1, shown, hidden)
    for event in request_events(1, [shown, hidden], log.state):
        log.add(event)
    [(request_id, pending)] = log.state.pending_approvals.items()
    assert pending.arguments == hidden.arguments
    other = Decision(
        request_id=request_id, shown=request_digest("run_shell", shown.arguments or {})
    )
    assert decision_problem(log.state, other) is not None
    log.add(draft(ApprovalResolved, 1, request_id=request_id, decision="approve", via="update"))
    ran = verdict("t", 1, hidden, log.state)
    assert isinstance(ran, Run) and ran.request.arguments == hidden.arguments
    refused = verdict("t", 1, shown, log.state)
    assert isinstance(refused, ToolResult) and refused.is_error and "not run" in refused.output


DEEP = 100_000
DEEP_ARGUMENTS = '{"expression": ' + "[" * DEEP + "]" * DEEP + "}"


async def test_arguments_nested_100000_deep_are_an_error_the_model_can_correct(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    deep = tools(("calculator", DEEP_ARGUMENTS), argument_piece_chars=20_000)
    model = fake_openai.script(after_tools(deep, "corrected"))
    # A window the 200 KB call fits in: the model sees its own call and the error.
    handle = await dev_runtime.run(agent_task(model, context_limit_tokens=MAX_CONTEXT_LIMIT))
    assert (await handle.result()).result == "corrected"
    [observation] = of_type(await handle.events(), "observation")
    assert observation.is_error
    assert observation.output == (
        "the arguments of calculator are nested more than 64 levels deep; send them flatter"
    )
    assert tool_messages(fake_openai.requests[model][-1])[0]["content"] == observation.output


async def test_a_call_written_in_text_with_arguments_nested_deep_is_not_taken_as_a_call(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    written = json.dumps({"name": "calculator", "arguments": DEEP_ARGUMENTS})
    model = fake_openai.script([text(f"<tool_call>{written}</tool_call>")])
    task = agent_task(model)
    recovering = task.model.model_copy(update={"recover_text_tool_calls": True})
    handle = await dev_runtime.run(task.model_copy(update={"model": recovering}))
    outcome = await handle.result()
    assert outcome.result.startswith("<tool_call>")
    assert of_type(await handle.events(), "observation") == []


def test_no_parser_of_model_json_recurses_on_deep_nesting() -> None:
    """Every place that reads JSON a model wrote: tool arguments, the final answer's, a
    native structured answer, calls written in text (bare, fenced, tagged, string-held)."""
    deep_list = "[" * DEEP + "]" * DEEP
    schema = {"type": "object", "properties": {"x": {}}}
    assert "nested more than 64" in str(json_object_arguments("calculator", DEEP_ARGUMENTS))
    answer = final_answer_call("c", '{"x": ' + deep_list + "}", schema, alone=True)
    assert answer.problem is not None and "nested more than 64" in answer.problem
    assert native_answer('{"x": ' + deep_list + "}", schema) == (
        None,
        "the answer is nested more than 64 levels deep",
    )
    held = json.dumps({"name": "calculator", "arguments": DEEP_ARGUMENTS})
    bare = '{"name": "calculator", "arguments": {"expression": ' + deep_list + "}}"
    for written in (held, bare, f"```json\n{bare}\n```", f"<tool_call>{bare}</tool_call>"):
        assert recover_tool_calls(written, ["calculator"]) == []


async def test_calls_past_the_limit_of_one_message_are_answered_not_run(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    sums = [("calculator", {"expression": f"{n}+0"}) for n in range(MAX_CALLS_PER_MESSAGE + 2)]
    model = fake_openai.script(after_tools(tools(*sums)))
    handle = await dev_runtime.run(agent_task(model))
    assert (await handle.result()).result == "done"
    observations = of_type(await handle.events(), "observation")
    assert [o.output for o in observations[:MAX_CALLS_PER_MESSAGE]] == [
        str(n) for n in range(MAX_CALLS_PER_MESSAGE)
    ]
    assert [o.output for o in observations[MAX_CALLS_PER_MESSAGE:]] == [TOO_MANY_CALLS] * 2
