"""Approvals, one kind of request a person answers (workflows/requests.py has the rule
every kind shares): request ids, what a decision may do, and what the model is told.

Pure functions over the folded state. Decisions reach the workflow through the `decide`
Update and the `approve`/`reject` Signals; their handlers only record them, and the main
loop turns what was recorded into events, in arrival order (see AgentWorkflow). The same
`decision_problem` answers the Update's validator and the client's answer after a task
has closed; the Signal's absorption applies the same check (`shown_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from waystation.workflows import errors, requests
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
    AgentTask,
    ApprovalSettings,
    Contract,
    Decision,
    DecisionOutcome,
    ToolCall,
)
from waystation.workflows.requests import Problem, RequestKind, Via

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
    return requests.problem(APPROVALS, state, decision, recorded or [])


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
    return requests.deadline(APPROVALS, state, request_ids, settings)


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


class Approvals(RequestKind[Decision, RecordedDecision, DecisionOutcome, PendingApproval]):
    """Approval requests: a decision resolves one; a conflicting one is refused."""

    name = "approval"
    early_kept = EARLY_DECISIONS_KEPT
    awaiting = "approval"
    noun = "request"
    unknown_noun = "approval request"

    def pending(self, state: AgentState) -> Mapping[str, PendingApproval]:
        return state.pending_approvals

    def settings(self, task: AgentTask) -> ApprovalSettings:
        return task.approval

    def response(self, entry: RecordedDecision) -> Decision:
        return entry.decision

    def recorded(self, response: Decision, via: Via) -> RecordedDecision:
        return RecordedDecision(decision=response, via=via)

    def outcome_of(
        self, state: AgentState, request_id: str, recorded: list[RecordedDecision]
    ) -> DecisionOutcome | None:
        return outcome_of(state, request_id, recorded)

    def repeat_problem(self, response: Decision, existing: DecisionOutcome) -> Problem | None:
        if response.repeats(existing):
            return None
        by = f" by {existing.approver}" if existing.approver else ""
        return Problem(
            errors.DECISION_CONFLICT,
            f"request {response.request_id} was already decided: {existing.decision}{by}",
        )

    def check(self, response: Decision, pending: PendingApproval) -> Problem | None:
        return shown_problem(response, pending)

    def accepted(self, state: AgentState, response: Decision) -> DecisionOutcome:
        return accepted(response)

    def on_resolved(
        self, state: AgentState, response: Decision, existing: DecisionOutcome
    ) -> AgentEvent | None:
        if response.decision_id is not None and response.repeats(existing):
            return None
        what = "a repeat" if response.repeats(existing) else "a conflicting decision"
        return draft(
            ErrorEvent,
            state.step,
            kind="duplicate_decision",
            message=f"ignored {what} ({response.decision}) for request {response.request_id}, "
            f"already decided: {existing.decision}",
        )

    def refused(self, state: AgentState, response: Decision, problem: Problem) -> ErrorEvent:
        return draft(
            ErrorEvent,
            state.step,
            kind="decision_mismatch",
            message=f"ignored a decision ({response.decision}): {problem.message}",
        )

    def unknown(self, state: AgentState, response: Decision) -> ErrorEvent:
        return draft(
            ErrorEvent,
            state.step,
            kind="unknown_request",
            message=f"ignored a decision for request {response.request_id}: no such request, "
            f"and {EARLY_DECISIONS_KEPT} decisions already wait for theirs",
        )

    def resolved(
        self, state: AgentState, entry: RecordedDecision, pending: PendingApproval
    ) -> ApprovalResolved:
        decision = entry.decision
        return draft(
            ApprovalResolved,
            state.step,
            request_id=decision.request_id,
            decision=decision.decision,
            approver=decision.approver,
            message=decision.message,
            arguments=decision.arguments,
            via=entry.via,
            decision_id=decision.decision_id,
        )

    def timed_out(self, state: AgentState, request_id: str, task: AgentTask) -> ApprovalResolved:
        """Nobody decided in time; the plan then reports or fails as the task says."""
        return draft(
            ApprovalResolved,
            state.step,
            request_id=request_id,
            decision="timeout",
            message=f"no decision within {task.approval.timeout_seconds:g} s",
            via="timeout",
        )

    def to_ask(self, step: OpenStep, state: AgentState) -> list[ToolCall]:
        return to_request(step, state)

    def unresolved(self, step: OpenStep, state: AgentState) -> list[str]:
        return undecided(step, state)

    def request_events(
        self, step: int, calls: list[ToolCall], state: AgentState
    ) -> list[AgentEvent]:
        return list(request_events(step, calls, state))


APPROVALS = Approvals()
