"""A malformed model message (repeated, empty or missing call ids; arguments nested past any
real call) never runs what nobody was shown and never makes a task stuck (issue 37, items 3
and 17): through the fake OpenAI server, the real HTTP API and the dev server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from activities.call_ids import unique_call_ids
from runtime.agent_runtime import AgentRuntime
from runtime.settings import ApiToken, Settings
from testing.fake_openai import FakeOpenAI, Reply, text, tools
from testing.workers import running_worker
from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_console_api import APPROVER, Api
from tests.test_plan import Log, call
from workflows.approval import decision_problem, request_events
from workflows.calls import Run, verdict
from workflows.events import ApprovalResolved, draft, request_digest
from workflows.models import Decision, ToolResult
from workflows.notice import notice_key

DEEP = 100_000


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
