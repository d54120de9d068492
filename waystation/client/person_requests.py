"""The kinds of request a task puts to a person (an approval, a question), as the client
answers them: one table row a kind, read by the one way to respond (TaskHandle.respond).

A kind says where its requests wait and its outcomes land in the task's state, which rule
refuses a response (the workflow's own: waystation/workflows/approval.py, questions.py), and
which Signal carries a response. Every refusal is a DecisionError whose `kind` is an error
type of waystation/workflows/errors.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from temporalio.service import RPCError, RPCStatusCode

from waystation.client.task_errors import DecisionError
from waystation.workflows import approval, errors, questions, requests
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.approval import decision_problem
from waystation.workflows.events import AgentState
from waystation.workflows.models import Answer, AnswerOutcome, Decision, DecisionOutcome
from waystation.workflows.questions import answer_problem
from waystation.workflows.requests import Problem

Response = TypeVar("Response", Decision, Answer)
Outcome = TypeVar("Outcome", DecisionOutcome, AnswerOutcome)


@dataclass(frozen=True)
class RequestKind(Generic[Response, Outcome]):
    """One kind of person-request, as the client responds to it."""

    workflow_kind: requests.AnyKind  # the kind as the workflow knows it: its words, its map
    pending_named: str  # "task T has 2 <these>; name one"
    outcome_named: str  # what a read-back waits for
    id_field: str  # the id a response and its outcome share
    outcomes: Callable[[AgentState], Mapping[str, Outcome]]
    problem: Callable[[AgentState, Response], Problem | None]
    signal: Callable[[Response], Any]  # the AgentWorkflow Signal that carries it

    def only_pending(self, task_id: str, state: AgentState) -> str:
        """The request a response that names none is for: the only pending one, or (none
        pending) the latest one responded to, whose outcome a repeat gets back."""
        pending = list(self.workflow_kind.pending(state))
        if len(pending) > 1:
            raise DecisionError(
                task_id,
                f"task {task_id} has {len(pending)} {self.pending_named}; name one: "
                + ", ".join(pending),
                errors.UNKNOWN_REQUEST,
            )
        outcomes = self.outcomes(state)
        if not pending and not outcomes:
            raise DecisionError(
                task_id,
                f"task {task_id} is {state.status}, not waiting for {self.workflow_kind.awaiting}",
                errors.TASK_NOT_WAITING,
            )
        return pending[0] if pending else list(outcomes)[-1]

    def settled(self, task_id: str, state: AgentState, response: Response) -> Outcome | None:
        """The outcome `state` holds for `response`'s request (marked `duplicate` when an
        earlier response made it), None while it holds none; DecisionError when the
        response is refused (the workflow's rule, on this state)."""
        outcome = self.outcomes(state).get(response.request_id)
        if outcome is not None and getattr(outcome, self.id_field) == getattr(
            response, self.id_field
        ):
            return outcome  # this very response took effect
        if (problem := self.problem(state, response)) is not None:
            raise DecisionError(task_id, problem.message, problem.kind)
        return outcome.model_copy(update={"duplicate": True}) if outcome is not None else None

    def not_waiting(self, task_id: str, state: AgentState, request_id: str) -> DecisionError:
        problem = requests.not_waiting(self.workflow_kind, state, request_id)
        return DecisionError(task_id, problem.message, problem.kind)


APPROVALS: RequestKind[Decision, DecisionOutcome] = RequestKind(
    workflow_kind=approval.APPROVALS,
    pending_named="pending approval requests",
    outcome_named="decision",
    id_field="decision_id",
    outcomes=lambda state: state.decisions,
    problem=decision_problem,
    signal=lambda d: AgentWorkflow.reject if d.decision == "reject" else AgentWorkflow.approve,
)

QUESTIONS: RequestKind[Answer, AnswerOutcome] = RequestKind(
    workflow_kind=questions.QUESTIONS,
    pending_named="pending questions",
    outcome_named="answer",
    id_field="answer_id",
    outcomes=lambda state: state.answers,
    problem=answer_problem,
    signal=lambda _: AgentWorkflow.answer_signal,
)


def closed_under(err: RPCError) -> bool:
    """Temporal refused a Signal because the task's run has closed (not: no such task)."""
    return err.status == RPCStatusCode.NOT_FOUND and "completed" in err.message
