"""How a task goes on after something went wrong: pure decisions over the folded state.

A context-length error from the model endpoint compacts and retries the step while that
shrinks the conversation; a resumption of a failed task raises its limits. AgentWorkflow
carries the results out; everything here is unit-tested without Temporal.
"""

from __future__ import annotations

from waystation.vocabulary import FailureKind
from waystation.workflows.events import AgentState, ErrorEvent, Resumed, draft
from waystation.workflows.models import AgentTask, Resumption
from waystation.workflows.plan import Fail

# A conversation the endpoint refused is compacted to this share of its size, then retried.
SHRINK_AFTER_OVERFLOW = 0.7


def after_context_overflow(state: AgentState, step: int, message: str) -> ErrorEvent | Fail:
    """Compact to what the endpoint takes and try the step again, while that shrinks; fail
    with a sentence that says so once even a compacted conversation does not fit."""
    fits = int(sum(r.tokens for r in state.conversation) * SHRINK_AFTER_OVERFLOW)
    cap = state.context_limit_cap
    if cap is not None and fits >= cap:
        reason = (
            f"the conversation does not fit the model's context even after compacting it "
            f"({message}); use a model with a larger context, or fork with a shorter task"
        )
        return Fail(FailureKind.CONTEXT_TOO_LONG, reason)
    return draft(
        ErrorEvent,
        step,
        kind="context_length_exceeded",
        message=f"{message}; compacting to {fits} tokens and retrying",
        context_limit=fits,
    )


def resumed(task: AgentTask, resumption: Resumption, step: int) -> tuple[AgentTask, Resumed]:
    """(the task with the raised limits, the `resumed` event)."""
    limits = {
        "max_steps": resumption.max_steps,
        "token_budget": resumption.token_budget,
        "cost_budget": resumption.cost_budget,
    }
    task = task.model_copy(update={k: v for k, v in limits.items() if v})
    event = draft(
        Resumed,
        step,
        failure=resumption.failure,
        failure_kind=resumption.failure_kind,
        max_steps=task.max_steps,
        token_budget=task.token_budget,
        cost_budget=task.cost_budget,
    )
    return task, event
