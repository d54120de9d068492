"""The fold: pure, gap-checked, and folding a prefix then the rest equals folding the whole."""

from __future__ import annotations

import json
import typing
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waystation.vocabulary import FailureKind
from waystation.workflows.conversation import message_digest
from waystation.workflows.events import (
    APPLY_RULES,
    Action,
    AgentEvent,
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    Done,
    ErrorEvent,
    Failed,
    Observation,
    QuotaGranted,
    TaskStarted,
    Thought,
    WaitingQuota,
    WaitingWorker,
    agent_event_adapter,
    apply,
    conversation_of,
    fold,
)
from waystation.workflows.models import AgentTask, ToolCall, Usage

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _started() -> TaskStarted:
    return TaskStarted(seq=0, step=0, at=T0, task_id="t1", task=AgentTask(task="add 2 and 3"))


def _step_events(seq: int, step: int, kind: int) -> list[AgentEvent]:
    """A few events of one step, shaped by `kind` (tool call, approval, error, or none)."""
    at = T0 + timedelta(seconds=seq)
    call = ToolCall(call_id=f"c{step}", tool="calculator", raw_arguments='{"expression":"2+3"}')
    events: list[AgentEvent] = [
        Thought(
            seq=seq,
            step=step,
            at=at,
            content=f"thinking {step}",
            tool_calls=[call] if kind else [],
            usage=Usage(input_tokens=10 * step, output_tokens=step),
        )
    ]
    if kind:
        events.append(Action(seq=seq + 1, step=step, at=at, call_id=call.call_id, tool=call.tool))
    if kind == 2:
        rid = f"{step}-{call.call_id}"
        events.append(
            ApprovalRequested(
                seq=seq + 2,
                step=step,
                at=at,
                request_id=rid,
                call_id=call.call_id,
                tool=call.tool,
                arguments={"expression": "2+3"},
            )
        )
        events.append(
            ApprovalResolved(seq=seq + 3, step=step, at=at, request_id=rid, decision="approve")
        )
    if kind == 3:
        events.append(ErrorEvent(seq=seq + 1 + (kind > 0), step=step, at=at, kind="x", message="y"))
    if kind:
        events.append(
            Observation(
                seq=seq + len(events),
                step=step,
                at=at,
                call_id=call.call_id,
                tool=call.tool,
                output="5",
            )
        )
    return events


def _log(kinds: list[int], ending: int) -> list[AgentEvent]:
    events: list[AgentEvent] = [_started()]
    for step, kind in enumerate(kinds, start=1):
        events += _step_events(len(events), step, kind)
    at = T0 + timedelta(hours=1)
    if ending == 1:
        events.append(Done(seq=len(events), step=len(kinds), at=at, result="5"))
    elif ending == 2:
        events.append(Failed(seq=len(events), step=len(kinds), at=at, kind="max_steps", reason="r"))
    return events


def test_fold_builds_the_conversation_and_usage() -> None:
    events = _log([1, 0], ending=1)
    state = fold(events)
    assert state.status == "done"
    assert state.result == "5"
    assert state.step == 2
    messages = conversation_of(events)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2].tool_calls[0].name == "calculator"
    assert messages[3].tool_call_id == "c1"
    assert [r.digest for r in state.conversation] == [message_digest(m) for m in messages]
    assert state.usage == Usage(input_tokens=30, output_tokens=3)
    assert state.last_seq == len(events) - 1


def test_the_fold_sums_cost_and_unpriced_tokens_and_old_usage_loads_unpriced() -> None:
    priced = Usage(input_tokens=10, output_tokens=2, cost_usd=0.5)
    unpriced = Usage(input_tokens=4, output_tokens=1, unpriced_tokens=5)
    events: list[AgentEvent] = [
        _started(),
        Thought(seq=1, step=1, at=T0, content="a", usage=unpriced),
        Thought(seq=2, step=2, at=T0, content="b", usage=priced),
        Observation(seq=3, step=2, at=T0, call_id="c", tool="agent__x", output="", usage=priced),
    ]
    state = fold(events)
    assert (state.usage.cost_usd, state.usage.unpriced_tokens) == (1.0, 5)
    assert state.step_usage[2].cost_usd == 0.5
    # Recorded before cost: no cost (never a made-up $0), and no tokens said unpriced.
    recorded = {"type": "thought", "seq": 1, "step": 1, "at": T0.isoformat(), "content": ""}
    recorded["usage"] = {"input_tokens": 3, "output_tokens": 1}
    old = agent_event_adapter.validate_python(recorded)
    assert isinstance(old, Thought)
    assert (old.usage.cost_usd, old.usage.unpriced_tokens) == (None, 0)
    assert fold([_started(), old]).usage.cost_usd is None


def test_approval_moves_status_through_waiting_and_back() -> None:
    events = _log([2], ending=0)
    requested = next(i for i, e in enumerate(events) if e.type == "approval_requested")
    waiting = fold(events[: requested + 1])
    assert waiting.status == "waiting_approval"
    assert list(waiting.pending_approvals) == ["1-c1"]
    resumed = fold(events[: requested + 2])
    assert resumed.status == "running"
    assert resumed.pending_approvals == {}
    assert resumed.decisions["1-c1"].decision == "approve"


def _waiting_quota(seq: int, limit: str = "requests_per_minute", attempt: int = 1) -> WaitingQuota:
    at = T0 + timedelta(seconds=seq)
    return WaitingQuota.model_validate(
        {"seq": seq, "step": 1, "at": at, "quota": "openai", "limit": limit}
        | {"expected_seconds": 12.0, "attempt": attempt}
    )


def test_a_wait_for_the_quota_shows_until_the_call_has_its_turn_or_ends() -> None:
    started = _started()
    waiting = fold([started, _waiting_quota(1)])
    assert waiting.status == "waiting_quota" and waiting.quota_wait is not None
    assert (waiting.quota_wait.quota, waiting.quota_wait.limit) == ("openai", "requests_per_minute")
    assert (waiting.quota_wait.attempt, waiting.quota_wait.since) == (1, T0 + timedelta(seconds=1))
    # Told to wait for another limit, the call still waits since it first did.
    tokens = apply(waiting, _waiting_quota(2, "input_tokens_per_minute"))
    assert tokens.quota_wait is not None and tokens.quota_wait.since == waiting.quota_wait.since
    assert tokens.quota_wait.limit == "input_tokens_per_minute"
    # The next attempt's wait is its own.
    again = apply(tokens, _waiting_quota(3, attempt=2))
    assert again.quota_wait is not None and again.quota_wait.since == T0 + timedelta(seconds=3)
    granted = QuotaGranted(seq=4, step=1, at=T0, quota="openai", waited_seconds=2.5)
    over = apply(again, granted)
    assert (over.status, over.quota_wait) == ("running", None)
    # A log without quota_granted still leaves the wait with whatever ended the call.
    thought = _step_events(4, 1, 0)[0]
    assert (apply(again, thought).status, apply(again, thought).quota_wait) == ("running", None)
    lacks = WaitingWorker(seq=4, step=1, at=T0, missing=["agent__math"], message="lacks it")
    assert (apply(again, lacks).status, apply(again, lacks).quota_wait) == ("waiting_worker", None)
    failed = Failed(seq=4, step=1, at=T0, kind="llm_error", reason="r")
    assert (apply(again, failed).status, apply(again, failed).quota_wait) == ("failed", None)
    # A granted with no wait shown changes nothing but the seq.
    calm = fold([started])
    unasked = apply(calm, granted.model_copy(update={"seq": 1}))
    assert unasked.model_dump(exclude={"last_seq", "step"}) == calm.model_dump(
        exclude={"last_seq", "step"}
    )
    for event in (_waiting_quota(1), granted):
        assert agent_event_adapter.validate_json(agent_event_adapter.dump_json(event)) == event
    assert AgentState.model_validate_json(again.model_dump_json()) == again


def test_a_gap_in_seq_is_refused() -> None:
    events = _log([1], ending=1)
    with pytest.raises(ValueError, match="gap"):
        fold([events[0], *events[2:]])


def test_apply_does_not_modify_its_input() -> None:
    events = _log([1], ending=1)
    before = fold(events[:2])
    snapshot = before.model_dump()
    apply(before, events[2])
    assert before.model_dump() == snapshot


def test_every_event_type_has_an_apply_rule() -> None:
    """A new event without a rule would fail every fold that meets it: CI says so first."""
    [union, _] = typing.get_args(AgentEvent)
    types = {typing.get_args(c.model_fields["type"].annotation)[0] for c in typing.get_args(union)}
    assert len(types) == len(typing.get_args(union)) > 10
    assert types == set(APPLY_RULES)


def test_apply_refuses_a_change_to_a_field_the_state_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """model_copy(update=...) would keep a misspelled key, and the field it meant would
    silently keep its old value."""
    events = _log([1], ending=1)
    before = fold(events[:-1])
    monkeypatch.setitem(APPLY_RULES, "done", lambda state, event: {"stauts": "done"})
    with pytest.raises(ValueError, match=r"the done rule changes fields the state lacks.*stauts"):
        apply(before, events[-1])


def test_a_failure_of_the_repeat_guard_recorded_as_stuck_reads_as_repeated_calls() -> None:
    """`stuck` means a task whose workflow task keeps failing; runs recorded before the
    repeat guard had its own name still fold, under that name."""
    *events, ending = _log([1], ending=2)
    recorded = {**ending.model_dump(mode="json"), "kind": "stuck"}
    failed = agent_event_adapter.validate_json(json.dumps(recorded))
    assert isinstance(failed, Failed) and failed.kind == FailureKind.REPEATED_CALLS
    state = fold([*events, failed])
    assert (state.status, state.failure_kind) == ("failed", "repeated_calls")
    assert AgentState.model_validate_json(state.model_dump_json()) == state
    # A kind this version does not know is kept as recorded.
    unknown = Failed(seq=0, step=0, at=T0, kind="gone_kind", reason="x")
    assert unknown.kind == "gone_kind"


def test_events_round_trip_through_json() -> None:
    for event in _log([1, 2, 3], ending=2):
        assert agent_event_adapter.validate_json(agent_event_adapter.dump_json(event)) == event


# No deadline: an example is pure and quick, but not within 200 ms on a machine kept busy.
@settings(deadline=None)
@given(
    kinds=st.lists(st.integers(min_value=0, max_value=3), max_size=8),
    ending=st.integers(min_value=0, max_value=2),
    data=st.data(),
)
def test_folding_a_prefix_then_the_rest_equals_folding_the_whole(
    kinds: list[int], ending: int, data: st.DataObject
) -> None:
    events = _log(kinds, ending)
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    assert fold(events[cut:], fold(events[:cut])) == fold(events)
