"""What a fork takes from the task it forks: everything but the decisions on calls not run.

A fork starts a new task from the fold of another task's log at some event. A person's
decision on a tool call belongs to the task it was made in: a fork taken after a call was
approved (or rejected, or left to time out) but before it ran asks again, as it does for a
request still waiting at that point, so nothing runs in the fork without a decision made
in the fork. Calls that ran keep their observations: the fork does not run them again.
"""

from __future__ import annotations

from waystation.workflows.approval import request_id_for
from waystation.workflows.events import AgentState, waiting_status


def fork_start(state: AgentState) -> AgentState:
    """`state` without the decisions and requests of its open step's calls not yet run."""
    step = state.open_step
    if step is None:
        return state
    unrun = {request_id_for(step.step, c.call_id) for c in step.unobserved()}
    pending = {k: v for k, v in state.pending_approvals.items() if k not in unrun}
    changes = {
        "decisions": {k: v for k, v in state.decisions.items() if k not in unrun},
        "pending_approvals": pending,
        "open_step": step.model_copy(update={"timed_out": False}),
    }
    if not state.finished:
        changes["status"] = waiting_status(pending, state.pending_questions)
    return state.model_copy(update=changes)
