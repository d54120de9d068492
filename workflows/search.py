"""What makes tasks findable without a worker: search attributes (`temporal workflow list`,
the Web UI) and the memo, both written by the workflow task that changes them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

from workflows.models import Contract, ParentLink

if TYPE_CHECKING:
    from workflows.events import AgentState, PendingApproval, PendingQuestion

AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
AGENT_STEP = SearchAttributeKey.for_int("AgentStep")
AGENT_MODEL = SearchAttributeKey.for_keyword("AgentModel")
# Since when the oldest pending request (approval or question) waits; unset while none does.
AGENT_WAITING_SINCE = SearchAttributeKey.for_datetime("AgentWaitingSince")

ALL = (AGENT_STATUS, AGENT_STEP, AGENT_MODEL, AGENT_WAITING_SINCE)

# Temporal's own attribute for a workflow whose workflow task keeps failing or timing out
# (a nondeterminism error, a bug in a new version): such a task is stuck. Closed runs keep
# it, so only running ones count.
REPORTED_PROBLEMS = "TemporalReportedProblems"
_STUCK_CATEGORIES = ("category=WorkflowTaskFailed", "category=WorkflowTaskTimedOut")
STUCK_QUERY = (
    f"{REPORTED_PROBLEMS} IN ({', '.join(repr(c) for c in _STUCK_CATEGORIES)})"
    " AND ExecutionStatus = 'Running'"
)


def reports_stuck(attributes: Mapping[str, Sequence[Any]]) -> bool:
    """Whether a listed execution's search attributes say Temporal reports it stuck."""
    return any(c in attributes.get(REPORTED_PROBLEMS, ()) for c in _STUCK_CATEGORIES)


# Memo keys. `pending` lists the requests waiting for a person, as committed by the workflow
# task that made them: what an approver may act on (a query can show a request earlier).
MEMO_STATUS = "status"
MEMO_PENDING = "pending"
MEMO_PARENT = "parent"
MEMO_ARGUMENT_CHARS = 300


def pending_memo(pending: PendingApproval) -> dict[str, Any]:
    """One pending request as the memo shows it (arguments cut short: the memo is small)."""
    arguments = json.dumps(pending.arguments, ensure_ascii=False)
    if len(arguments) > MEMO_ARGUMENT_CHARS:
        arguments = arguments[: MEMO_ARGUMENT_CHARS - 1] + "…"
    return {
        "kind": "approval",
        "request_id": pending.request_id,
        "tool": pending.tool,
        "arguments": arguments,
        "reason": pending.reason,
        "requested_at": pending.requested_at.isoformat(),
        "step": pending.step,
    }


def parent_memo(link: ParentLink) -> dict[str, Any]:
    """Where a sub-agent sits: its caller, the tree's root, the agents from the root."""
    return {"task_id": link.task_id, "root_id": link.root_id, "path": link.path}


def question_memo(pending: PendingQuestion) -> dict[str, Any]:
    """One pending question as the memo shows it (cut short: the memo is small)."""
    question = pending.question
    if len(question) > MEMO_ARGUMENT_CHARS:
        question = question[: MEMO_ARGUMENT_CHARS - 1] + "…"
    return {
        "kind": "question",
        "request_id": pending.request_id,
        "question": question,
        "choices": pending.choices,
        "requested_at": pending.requested_at.isoformat(),
        "step": pending.step,
    }


class Published(Contract):
    """What the search attributes and memo last said, so unchanged values are not rewritten."""

    status: str
    step: int
    pending: list[str]


def visibility_updates(
    state: AgentState, model: str, published: Published | None
) -> tuple[Published, list[SearchAttributeUpdate[Any]], dict[str, Any] | None]:
    """(what is published now, search attribute updates, memo update or None) — empty
    updates when nothing changed. The step is in AgentStep; the memo changes with the
    status and the pending requests only, since every memo write costs history."""
    pending = list(state.pending_approvals.values())
    asked = list(state.pending_questions.values())
    ids = [p.request_id for p in pending] + [q.request_id for q in asked]
    now = Published(status=state.status, step=state.step, pending=ids)
    if now == published:
        return now, [], None
    since = [p.requested_at for p in pending] + [q.requested_at for q in asked]
    waiting_since = min(since, default=None)
    updates: list[SearchAttributeUpdate[Any]] = [
        AGENT_STATUS.value_set(state.status),
        AGENT_STEP.value_set(state.step),
        AGENT_MODEL.value_set(model),
        AGENT_WAITING_SINCE.value_set(waiting_since)
        if waiting_since is not None
        else AGENT_WAITING_SINCE.value_unset(),
    ]
    memo = None
    if published is None or (published.status, published.pending) != (now.status, now.pending):
        listed = [pending_memo(p) for p in pending] + [question_memo(q) for q in asked]
        memo = {MEMO_STATUS: state.status, MEMO_PENDING: listed or None}
    return now, updates, memo


class Visibility:
    """Keeps a run's search attributes and memo in step with the task's state, writing only
    what changed. A sub-agent's memo also names its tree (with its first write)."""

    def __init__(self, parent: ParentLink | None = None) -> None:
        self._published: Published | None = None
        self._parent = parent

    def publish(self, state: AgentState, model: str) -> None:
        first = self._published is None
        self._published, updates, memo = visibility_updates(state, model, self._published)
        if updates:
            workflow.upsert_search_attributes(updates)
        if memo is not None:
            if first and self._parent is not None:
                memo[MEMO_PARENT] = parent_memo(self._parent)
            workflow.upsert_memo(memo)
