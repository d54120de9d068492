"""Approvals: request ids, what a decision may do, deadlines, and early decisions.

Pure functions over the folded state. Decisions reach the workflow through the `decide`
Update and the `approve`/`reject` Signals; their handlers only record them, and the main
loop turns what was recorded into events, in arrival order (see AgentWorkflow). The same
`decision_problem` answers the Update's validator, the Signal's absorption and the
client's answer after a task has closed, so the three cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from waystation.workflows import errors
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    ErrorEvent,
    OpenStep,
    PendingApproval,
    call_signature,
    draft,
    request_digest,
)
from waystation.workflows.models import (
    ApprovalSettings,
    Contract,
    Decision,
    DecisionOutcome,
    ToolCall,
)

Via = Literal["update", "signal"]
# Signalled decisions for requests not made yet are kept (and carried to the next run) up
# to this many; a flood of decisions for requests that never come cannot grow the task.
EARLY_DECISIONS_KEPT = 100


class RecordedDecision(Contract):
    """A decision as a handler recorded it, before the main loop turns it into an event."""

    decision: Decision
    via: Via


def signalled(decision: Decision, verdict: Literal["approve", "reject"]) -> RecordedDecision:
    """A decision sent by the `approve` or `reject` Signal, whose name is the verdict."""
    named = decision.model_copy(update={"decision": verdict})
    return RecordedDecision(decision=named, via="signal")


@dataclass(frozen=True)
class Problem:
    """Why a decision cannot take effect: an error type of workflows/errors.py and a sentence."""

    kind: str
    message: str


def request_id_for(step: int, call_id: str) -> str:
    """Approval request ids are predictable, so a decision may arrive before the request."""
    return f"{step}-{call_id}"


def needs_decision(call: ToolCall, state: AgentState) -> bool:
    """A call that runs only once a person approves it (a repeated call is never run)."""
    return call.needs_approval and call.runnable and not repeats_recent_call(call, state)


def repeats_recent_call(call: ToolCall, state: AgentState) -> bool:
    return call_signature(call) in state.recent_calls


def accepted(decision: Decision) -> DecisionOutcome:
    """What the `decide` Update answers for a decision it just recorded."""
    fields = decision.model_dump(exclude={"decision", "shown"})
    return DecisionOutcome(**fields, decision=decision.decision)


def outcome_of(
    state: AgentState, request_id: str, recorded: list[RecordedDecision]
) -> DecisionOutcome | None:
    """The decision that took effect for a request: in the state, or recorded and not yet
    turned into an event."""
    if (outcome := state.decisions.get(request_id)) is not None:
        return outcome
    for entry in recorded:
        d = entry.decision
        if d.request_id == request_id and request_id in state.pending_approvals:
            return DecisionOutcome(
                request_id=request_id,
                decision=d.decision,
                approver=d.approver,
                message=d.message,
                arguments=d.arguments,
                decision_id=d.decision_id,
                shown=state.pending_approvals[request_id].shown,
            )
    return None


def decision_problem(
    state: AgentState, decision: Decision, recorded: list[RecordedDecision] | None = None
) -> Problem | None:
    """Why `decision` cannot take effect now, or None (a repeat of the decision that took
    effect is no problem: it gets the first outcome back)."""
    existing = outcome_of(state, decision.request_id, recorded or [])
    if existing is not None:
        if decision.repeats(existing):
            return None
        by = f" by {existing.approver}" if existing.approver else ""
        return Problem(
            errors.DECISION_CONFLICT,
            f"request {decision.request_id} was already decided: {existing.decision}{by}",
        )
    if (pending := state.pending_approvals.get(decision.request_id)) is not None:
        return shown_problem(decision, pending)
    if state.finished or not state.pending_approvals:
        return Problem(
            errors.TASK_NOT_WAITING,
            f"task is {state.status}, not waiting for approval (request {decision.request_id})",
        )
    return Problem(
        errors.UNKNOWN_REQUEST,
        f"unknown approval request {decision.request_id}; pending: "
        + ", ".join(state.pending_approvals),
    )


def shown_problem(decision: Decision, pending: PendingApproval) -> Problem | None:
    """Why a decision that names the call it was shown cannot apply to this request: the
    request is for another call (a person decides on what they saw, nothing else)."""
    if decision.shown is None or decision.shown == pending.shown:
        return None
    return Problem(
        errors.DECISION_MISMATCH,
        f"request {decision.request_id} is not the {pending.tool} call you were shown; "
        "look at the request again before you decide",
    )


def to_request(step: OpenStep, state: AgentState) -> list[ToolCall]:
    """Calls of the open step that need a person and have not been asked about yet."""
    return [
        c
        for c in step.calls
        if needs_decision(c, state)
        and request_id_for(step.step, c.call_id) not in state.pending_approvals
        and request_id_for(step.step, c.call_id) not in state.decisions
    ]


def undecided(step: OpenStep, state: AgentState) -> list[str]:
    """Request ids of the open step still waiting for a person."""
    return [
        request_id_for(step.step, c.call_id)
        for c in step.calls
        if request_id_for(step.step, c.call_id) in state.pending_approvals
    ]


def deadline(state: AgentState, request_ids: list[str], settings: ApprovalSettings) -> datetime:
    """When the oldest of these requests stops waiting (a carried request keeps its time)."""
    first = min(state.pending_approvals[r].requested_at for r in request_ids)
    return first + timedelta(seconds=settings.timeout_seconds)


def request_reason(call: ToolCall, state: AgentState) -> str | None:
    """Why the policy asks, and whether an identical call was rejected before."""
    reason = call.approval_reason
    rejected = state.rejected_calls.get(call_signature(call))
    if rejected is None:
        return reason
    said = f": {rejected.message!r}" if rejected.message else ""
    note = f"an identical call was rejected at step {rejected.step}{said}"
    return f"{reason}; {note}" if reason else note


def run_outcome(call: ToolCall, outcome: DecisionOutcome | None) -> tuple[str | None, str]:
    """(error to report instead of running, note to add to the output) for a decided call."""
    if outcome is None:
        return None, ""
    if outcome.shown is not None and outcome.shown != request_digest(
        call.tool, call.arguments or {}
    ):
        # Unreachable while call ids are unique within a step; a history recorded before
        # they were held two calls under one request, and one decision must not run both.
        return (
            "No person decided on this call (the decision was for another call); it was not run.",
            "",
        )
    if outcome.decision == "timeout":
        return "Nobody decided on this call in time, so it was not run.", ""
    if outcome.decision == "reject":
        why = f" The reviewer said: {outcome.message}" if outcome.message else ""
        return f"A person rejected this {call.tool} call; it was not run.{why}", ""
    note = f"\n[approved with a note: {outcome.message}]" if outcome.message else ""
    return None, note


KEEP: Final = "keep"  # absorb: wait for the request this decision is for
DROP: Final = "drop"  # absorb: a client's identical repeat, nothing to note


def absorb(
    state: AgentState, entry: RecordedDecision, early: int
) -> AgentEvent | Literal["keep", "drop"]:
    """The event a recorded decision makes now, KEEP to hold it until its request comes
    (`early` decisions already wait; past EARLY_DECISIONS_KEPT a new one is refused), or
    DROP for a waiting client's repeat of the decision that took effect."""
    decision = entry.decision
    request_id = decision.request_id
    if (existing := state.decisions.get(request_id)) is not None:
        if decision.decision_id is not None and decision.repeats(existing):
            return DROP
        what = "a repeat" if decision.repeats(existing) else "a conflicting decision"
        return draft(
            ErrorEvent,
            state.step,
            kind="duplicate_decision",
            message=f"ignored {what} ({decision.decision}) for request {request_id}, "
            f"already decided: {existing.decision}",
        )
    if (pending := state.pending_approvals.get(request_id)) is not None:
        if (problem := shown_problem(decision, pending)) is not None:
            return draft(
                ErrorEvent,
                state.step,
                kind="decision_mismatch",
                message=f"ignored a decision ({decision.decision}): {problem.message}",
            )
        return draft(
            ApprovalResolved,
            state.step,
            request_id=request_id,
            decision=decision.decision,
            approver=decision.approver,
            message=decision.message,
            arguments=decision.arguments,
            via=entry.via,
            decision_id=decision.decision_id,
        )
    if early >= EARLY_DECISIONS_KEPT:
        return draft(
            ErrorEvent,
            state.step,
            kind="unknown_request",
            message=f"ignored a decision for request {request_id}: no such request, "
            f"and {EARLY_DECISIONS_KEPT} decisions already wait for theirs",
        )
    return KEEP


def request_events(step: int, calls: list[ToolCall], state: AgentState) -> list[ApprovalRequested]:
    model_reason = state.open_step.model_reason if state.open_step else None
    return [
        draft(
            ApprovalRequested,
            step,
            request_id=request_id_for(step, call.call_id),
            call_id=call.call_id,
            tool=call.tool,
            arguments=call.arguments or {},
            reason=request_reason(call, state),
            model_reason=model_reason,
        )
        for call in calls
    ]


def timeout_events(
    state: AgentState, request_ids: list[str], settings: ApprovalSettings
) -> list[ApprovalResolved]:
    """Requests nobody decided in time; the plan then reports or fails as the task says."""
    return [
        draft(
            ApprovalResolved,
            state.step,
            request_id=request_id,
            decision="timeout",
            message=f"no decision within {settings.timeout_seconds:g} s",
            via="timeout",
        )
        for request_id in request_ids
        if request_id in state.pending_approvals
    ]
