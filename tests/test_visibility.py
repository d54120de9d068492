"""What a task writes to Temporal's visibility (search attributes, memo) and how often: every
status change at once, with the step; a new step alone at most every STEP_REFRESH."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.common import SearchAttributeUpdate
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.workflows import search
from waystation.workflows.events import AgentState, PendingApproval
from waystation.workflows.models import Usage

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def written(updates: list[SearchAttributeUpdate[Any]]) -> dict[str, Any]:
    """The attributes an upsert writes, by name (None for one it unsets)."""
    return {u.key.name: getattr(u, "value", None) for u in updates}


def asked(step: int, at: datetime) -> PendingApproval:
    return PendingApproval(
        request_id=f"{step}-call",
        call_id="call",
        tool="run_shell",
        arguments={},
        requested_at=at,
        step=step,
    )


def test_the_first_write_says_everything() -> None:
    state = AgentState(status="running", step=0)
    _, updates, memo = search.visibility_updates(state, "gpt-4o", None, T0)
    assert written(updates) == {
        "AgentStatus": "running",
        "AgentStep": 0,
        "AgentModel": "gpt-4o",
        "AgentWaitingSince": None,
    }
    assert memo == {
        search.MEMO_STATUS: "running",
        search.MEMO_PENDING: None,
        search.MEMO_TURNS: 1,
        search.MEMO_USAGE: Usage().model_dump(),
    }


def test_a_new_step_alone_is_written_once_the_refresh_interval_has_passed() -> None:
    published, _, _ = search.visibility_updates(AgentState(status="running"), "m", None, T0)
    soon = T0 + search.STEP_REFRESH - timedelta(milliseconds=1)
    published, updates, memo = search.visibility_updates(
        AgentState(status="running", step=1), "m", published, soon
    )
    assert (updates, memo) == ([], None)
    later = T0 + search.STEP_REFRESH
    published, updates, memo = search.visibility_updates(
        AgentState(status="running", step=2), "m", published, later
    )
    assert (written(updates), memo) == ({"AgentStep": 2}, None)
    # The interval counts from that write.
    _, updates, _ = search.visibility_updates(
        AgentState(status="running", step=3), "m", published, later + timedelta(seconds=1)
    )
    assert updates == []


def test_a_status_change_is_written_at_once_with_its_step_and_the_memo() -> None:
    published, _, _ = search.visibility_updates(AgentState(status="running"), "m", None, T0)
    moment = T0 + timedelta(seconds=1)
    waiting = AgentState(
        status="waiting_approval", step=4, pending_approvals={"4-call": asked(4, moment)}
    )
    published, updates, memo = search.visibility_updates(waiting, "m", published, moment)
    assert written(updates) == {
        "AgentStatus": "waiting_approval",
        "AgentStep": 4,
        "AgentWaitingSince": moment,
    }
    assert memo is not None and [p["tool"] for p in memo[search.MEMO_PENDING]] == ["run_shell"]
    used = Usage(input_tokens=900, output_tokens=40, cache_read_tokens=800)
    done = AgentState(status="done", step=4, usage=used)
    _, updates, memo = search.visibility_updates(done, "m", published, moment)
    assert written(updates) == {"AgentStatus": "done", "AgentWaitingSince": None}
    assert memo == {
        search.MEMO_STATUS: "done",
        search.MEMO_PENDING: None,
        search.MEMO_TURNS: 1,
        search.MEMO_USAGE: used.model_dump(),  # a list shows a task's tokens without a query
    }


def test_a_follow_up_rewrites_the_memo_with_the_conversation_s_turns() -> None:
    """A follow-up begins a turn and changes the status with it: the memo a task list reads
    counts the turns without a write of its own."""
    published, _, _ = search.visibility_updates(AgentState(status="done", step=2), "m", None, T0)
    follow_up = AgentState(status="running", step=2, turn=1)
    _, _, memo = search.visibility_updates(follow_up, "m", published, T0 + timedelta(seconds=1))
    assert memo is not None and memo[search.MEMO_TURNS] == 2


def test_runs_recorded_before_the_refresh_write_everything_at_every_step() -> None:
    """Without the event's time (a run recorded before STEP_REFRESH_PATCH), the commands a
    replay must give again: every attribute, at every new step."""
    published, _, _ = search.visibility_updates(AgentState(status="running"), "m", None)
    _, updates, memo = search.visibility_updates(
        AgentState(status="running", step=1), "m", published
    )
    assert written(updates) == {
        "AgentStatus": "running",
        "AgentStep": 1,
        "AgentModel": "m",
        "AgentWaitingSince": None,
    }
    assert memo is None


async def test_a_fast_task_writes_its_step_at_its_status_changes_not_at_every_step(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    steps = 12
    calls = [tools(("calculator", {"expression": f"{n} + 1"})) for n in range(steps - 1)]
    model = fake_openai.script([*calls, text("done")])
    handle = await dev_runtime.run(agent_task(model, max_steps=steps + 1))
    outcome = await handle.result()
    assert outcome.steps == steps
    history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
    ours = {a.name for a in search.ALL}  # not the SDK's TemporalChangeVersion (a patch)
    upserts = [
        ours
        & set(
            event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        )
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    upserts = [names for names in upserts if names]
    # The first says everything; the last (done) comes with the last step; any between is a
    # step alone, written because STEP_REFRESH passed (only on a very slow machine).
    assert len(upserts) < steps, upserts
    assert upserts[0] == ours
    assert {"AgentStatus", "AgentStep"} <= upserts[-1]
    assert all(names == {"AgentStep"} for names in upserts[1:-1]), upserts
    listed = (
        await dev_env.client.get_workflow_handle(handle.id).describe()
    ).typed_search_attributes
    assert listed.get(search.AGENT_STATUS) == "done"
    assert listed.get(search.AGENT_STEP) == steps
