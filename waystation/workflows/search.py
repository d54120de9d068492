"""What makes tasks findable without a worker: search attributes (`temporal workflow list`,
the Web UI) and the memo, both written by the workflow task that changes them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

from waystation.workflows.models import Contract, ParentLink

if TYPE_CHECKING:
    from waystation.workflows.events import AgentState, PendingApproval, PendingQuestion

AGENT_STATUS = SearchAttributeKey.for_keyword("AgentStatus")
AGENT_STEP = SearchAttributeKey.for_int("AgentStep")
AGENT_MODEL = SearchAttributeKey.for_keyword("AgentModel")
# Since when the oldest pending request (approval or question) waits; unset while none does.
AGENT_WAITING_SINCE = SearchAttributeKey.for_datetime("AgentWaitingSince")

ALL = (AGENT_STATUS, AGENT_STEP, AGENT_MODEL, AGENT_WAITING_SINCE)
# When the task first started, set by the client on each run it starts (a follow-up's carries
# the task's) and kept by a run continued as new: visibility's StartTime is the run's, and a
# task is listed by its own.
AGENT_TASK_STARTED = SearchAttributeKey.for_datetime("AgentTaskStarted")
# Who the task is for (AgentTask.tenant), set at its start only: by the client on each run it
# starts, by the parent on a sub-agent's; a run continued as new keeps it. Unset without one.
AGENT_TENANT = SearchAttributeKey.for_keyword("AgentTenant")
# What a namespace must have registered: the workflow's own attributes and the client's.
REGISTERED = (*ALL, AGENT_TASK_STARTED, AGENT_TENANT)

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
# The conversation's turns (the task's own, then one per follow-up): a follow-up changes the
# status, so the memo is rewritten with it at no extra write.
MEMO_TURNS = "turns"
# The task's tokens as of its latest change of status: a list shows them without a query.
MEMO_USAGE = "usage"
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
    model: str = ""
    waiting_since: datetime | None = None
    step_at: datetime | None = None
    """When AgentStep was last written (by the time of the event that wrote it)."""


# While its status stays the same, a task rewrites AgentStep at most this often: a search
# attribute upsert is a visibility write on the server, and one a step was the largest cost
# of a step beyond the floor (bench.many_tasks: 1.6x the floor's server CPU at 20 tasks at
# once, 1.1x without). A status change writes the step with it at once.
STEP_REFRESH = timedelta(seconds=10)
# Runs recorded before it upserted every attribute at every change of the step.
STEP_REFRESH_PATCH = "visibility-step-refresh"

_Updates = tuple[Published, list[SearchAttributeUpdate[Any]], dict[str, Any] | None]


class _Pending:
    """The requests waiting for a person: approvals, then questions."""

    def __init__(self, state: AgentState) -> None:
        self.approvals: list[PendingApproval] = list(state.pending_approvals.values())
        self.questions: list[PendingQuestion] = list(state.pending_questions.values())
        self.ids = [p.request_id for p in self.approvals]
        self.ids += [q.request_id for q in self.questions]
        since = [p.requested_at for p in self.approvals]
        since += [q.requested_at for q in self.questions]
        self.waiting_since = min(since, default=None)


def _memo(state: AgentState, pending: _Pending) -> dict[str, Any]:
    listed = [pending_memo(p) for p in pending.approvals]
    listed += [question_memo(q) for q in pending.questions]
    return {
        MEMO_STATUS: state.status,
        MEMO_PENDING: listed or None,
        MEMO_TURNS: state.turn + 1,
        MEMO_USAGE: state.usage.model_dump(),
    }


def _waiting_since(value: datetime | None) -> SearchAttributeUpdate[Any]:
    if value is None:
        return AGENT_WAITING_SINCE.value_unset()
    return AGENT_WAITING_SINCE.value_set(value)


def visibility_updates(
    state: AgentState, model: str, published: Published | None, at: datetime | None = None
) -> _Updates:
    """(what is published now, search attribute updates, memo update or None) — empty
    updates when nothing changed. The memo changes with the status and the pending
    requests only, since every memo write costs history.

    With `at` (the time of the event that changed the state), only the attributes that
    changed are written, and a new step alone only once STEP_REFRESH has passed since the
    step was last written. Without it, as runs recorded before STEP_REFRESH_PATCH did: every
    attribute at every change of the status, the pending requests or the step."""
    if at is None:
        return _every_change(state, model, published)
    pending = _Pending(state)
    requests, waiting_since = pending.ids, pending.waiting_since
    if published is None:
        now = Published(
            status=state.status,
            step=state.step,
            pending=requests,
            model=model,
            waiting_since=waiting_since,
            step_at=at,
        )
        every: list[SearchAttributeUpdate[Any]] = [
            AGENT_STATUS.value_set(state.status),
            AGENT_STEP.value_set(state.step),
            AGENT_MODEL.value_set(model),
            _waiting_since(waiting_since),
        ]
        return now, every, _memo(state, pending)
    changed = (state.status, requests) != (published.status, published.pending)
    step_due = state.step != published.step and (
        changed or published.step_at is None or at - published.step_at >= STEP_REFRESH
    )
    updates: list[SearchAttributeUpdate[Any]] = []  # only what changed
    if state.status != published.status:
        updates.append(AGENT_STATUS.value_set(state.status))
    if step_due:
        updates.append(AGENT_STEP.value_set(state.step))
    if model != published.model:
        updates.append(AGENT_MODEL.value_set(model))
    if waiting_since != published.waiting_since:
        updates.append(_waiting_since(waiting_since))
    now = Published(
        status=state.status,
        step=state.step if step_due else published.step,
        pending=requests,
        model=model,
        waiting_since=waiting_since,
        step_at=at if step_due else published.step_at,
    )
    return now, updates, _memo(state, pending) if changed else None


def _every_change(state: AgentState, model: str, published: Published | None) -> _Updates:
    pending = _Pending(state)
    waiting_since = pending.waiting_since
    now = Published(status=state.status, step=state.step, pending=pending.ids)
    if published is not None and (now.status, now.step, now.pending) == (
        published.status,
        published.step,
        published.pending,
    ):
        return published, [], None
    updates: list[SearchAttributeUpdate[Any]] = [
        AGENT_STATUS.value_set(state.status),
        AGENT_STEP.value_set(state.step),
        AGENT_MODEL.value_set(model),
        _waiting_since(waiting_since),
    ]
    memo = None
    if published is None or (published.status, published.pending) != (now.status, now.pending):
        memo = _memo(state, pending)
    return now, updates, memo


class Visibility:
    """Keeps a run's search attributes and memo in step with the task's state, writing only
    what changed. A sub-agent's memo also names its tree (with its first write)."""

    def __init__(self, parent: ParentLink | None = None) -> None:
        self._published: Published | None = None
        self._parent = parent
        self._refreshes_steps: bool | None = None

    def begin(self) -> None:
        """At the start of the run, before its first await. The patch is decided there, at
        one fixed point: decided at the first change instead, a replay could meet it a
        workflow task earlier than the run did (after a local activity's result) and fail
        on the marker."""
        self._refreshes_steps = workflow.patched(STEP_REFRESH_PATCH)

    def publish(self, state: AgentState, model: str, at: datetime) -> None:
        """After an event stamped `at` changed `state` (in the workflow's main loop only)."""
        if self._refreshes_steps is None:
            raise RuntimeError("Visibility.publish before Visibility.begin")
        when = at if self._refreshes_steps else None
        first = self._published is None
        self._published, updates, memo = visibility_updates(state, model, self._published, when)
        if updates:
            workflow.upsert_search_attributes(updates)
        if memo is not None:
            if first and self._parent is not None:
                memo[MEMO_PARENT] = parent_memo(self._parent)
            workflow.upsert_memo(memo)
