"""The inbox: every pending approval and question across tasks, oldest request first.

Tasks waiting for approval come from Temporal's visibility; each one's pending requests
from its state. A task whose history has not grown since it was last read is not asked
again, so a console polling every second costs one describe per waiting task, not a query.
A request raised inside a sub-agent names its chain (the tree's root, the task that called
the sub-agent, the agents between), read from the sub-agent's memo.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, ValidationError
from temporalio.client import WorkflowExecutionDescription
from temporalio.service import RPCError

from waystation.client.agent_runtime import AgentRuntime, TaskError
from waystation.servers.api.auth import Reader, Runtime
from waystation.servers.api.overview import bounded, read_task_text, remembered, task_text
from waystation.workflows.events import PendingApproval, PendingQuestion
from waystation.workflows.search import MEMO_PARENT

router = APIRouter(tags=["console"])

WAITING_TASKS_READ = 1_000  # the inbox shows the requests of this many waiting tasks at most
READS_AT_ONCE = 8
# One dead or slow task must not hold up the inbox: it is listed as unreachable instead.
TASK_READ_TIMEOUT_SECONDS = 3.0
READS_KEPT = 10_000


class Chain(BaseModel):
    """Where a request raised inside a sub-agent comes from: the tree's root task, the task
    whose call started the sub-agent, and the agents from the root down to the one asking
    (the parent is the root when `path` has one name)."""

    root_id: str
    root_task: str = Field(description="The root task's text (shortened).")
    parent_id: str
    parent_task: str = Field(description="The parent task's text (shortened).")
    path: list[str] = Field(description="The agents from the root down to the one asking.")


class _ParentMemo(BaseModel):
    """The memo key a sub-agent's task names its tree with (workflows/search.py)."""

    task_id: str
    root_id: str
    path: list[str]


class InboxItem(BaseModel):
    """One pending approval request, with the task it belongs to."""

    task_id: str
    task: str = Field(description="The task's text (shortened).")
    request_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str | None = Field(default=None, description="Why the policy asks.")
    model_reason: str | None = Field(default=None, description="What the model said with it.")
    requested_at: datetime
    step: int
    digest: str = Field(
        description="The call as shown, as a digest: send it as `shown` with the decision."
    )
    chain: Chain | None = Field(default=None, description="Set when a sub-agent asks.")


class QuestionItem(BaseModel):
    """One question the model asked a person, with the task it belongs to."""

    task_id: str
    task: str = Field(description="The task's text (shortened).")
    request_id: str
    call_id: str
    question: str
    choices: list[str] | None = Field(default=None, description="The answers it takes.")
    details: str | None = None
    requested_at: datetime
    step: int
    chain: Chain | None = Field(default=None, description="Set when a sub-agent asks.")


class Inbox(BaseModel):
    approvals: list[InboxItem] = Field(description="Oldest request first.")
    questions: list[QuestionItem] = Field(
        default_factory=list, description="Questions waiting for an answer, oldest first."
    )
    unreachable: list[str] = Field(
        default_factory=list,
        description="Tasks waiting for approval whose state could not be read in time "
        "(no worker answering?).",
    )
    truncated: bool = Field(
        default=False, description="More tasks are waiting than the inbox reads at once."
    )


@dataclass(frozen=True)
class _Read:
    """A task's pending requests as read at one point of its history."""

    run_id: str | None
    history_length: int
    task: str
    pending: list[PendingApproval]
    asked: list[PendingQuestion]
    parent: _ParentMemo | None


async def _parent_of(description: WorkflowExecutionDescription) -> _ParentMemo | None:
    """The tree a sub-agent's task sits in, from its memo (None for a task of its own, or a
    memo this side cannot read: the request is still listed, without its chain)."""
    try:
        found = await description.memo_value(MEMO_PARENT, None)
        return None if found is None else _ParentMemo.model_validate(found)
    except (ValueError, ValidationError):
        return None


async def read_pending(runtime: AgentRuntime, task_id: str, known: _Read | None) -> _Read:
    """The task's pending requests (the one place that knows where they come from: the
    state query, skipped when the history is as long as when `known` was read)."""
    handle = runtime.get(task_id)
    description = await handle.describe()
    if (
        known is not None
        and known.run_id == description.run_id
        and known.history_length == description.history_length
    ):
        return known
    state = await handle.state()
    return _Read(
        run_id=description.run_id,
        history_length=description.history_length,
        task=await read_task_text(runtime, task_id),
        pending=list(state.pending_approvals.values()),
        asked=list(state.pending_questions.values()),
        parent=await _parent_of(description),
    )


async def _waiting_task_ids(runtime: AgentRuntime, tenant: str | None) -> tuple[list[str], bool]:
    """Tasks that wait for a person: for a decision, or for an answer (`tenant`'s only)."""
    ids: list[str] = []
    for status in ("waiting_approval", "waiting_input"):
        token: bytes | None = None
        while len(ids) < WAITING_TASKS_READ:
            page, token = await runtime.list_tasks(status, 200, token, tenant=tenant)
            ids += [t.id for t in page if t.id not in ids]
            if token is None:
                break
        if len(ids) >= WAITING_TASKS_READ:
            return ids[:WAITING_TASKS_READ], True
    return ids, False


@router.get("/approvals", response_model=Inbox)
async def approvals(request: Request, runtime: Runtime, who: Reader) -> Inbox:
    """Every pending approval request and question across tasks, oldest first (the
    console's inbox); those of a sub-agent name its chain. A token bound to a tenant sees
    that tenant's only."""
    reads: OrderedDict[str, _Read] = remembered(request, "console_inbox_reads")
    task_ids, truncated = await _waiting_task_ids(runtime, who.tenant)

    async def read(task_id: str) -> _Read | None:
        try:
            async with asyncio.timeout(TASK_READ_TIMEOUT_SECONDS):
                done = await read_pending(runtime, task_id, reads.get(task_id))
        except (TimeoutError, RPCError, TaskError):
            return None
        reads[task_id] = done
        reads.move_to_end(task_id)
        while len(reads) > READS_KEPT:
            reads.popitem(last=False)
        return done

    results = await bounded((read(i) for i in task_ids), READS_AT_ONCE)
    read_ok = [(i, got) for i, got in zip(task_ids, results, strict=True) if got is not None]
    chains = await _chains(request, runtime, [got.parent for _, got in read_ok])
    items = [
        InboxItem(
            task_id=task_id,
            task=got.task,
            chain=chain,
            **{**pending.model_dump(), "digest": pending.shown},
        )
        for (task_id, got), chain in zip(read_ok, chains, strict=True)
        for pending in got.pending
    ]
    items.sort(key=lambda item: (item.requested_at, item.task_id, item.request_id))
    asked = [
        QuestionItem(task_id=task_id, task=got.task, chain=chain, **question.model_dump())
        for (task_id, got), chain in zip(read_ok, chains, strict=True)
        for question in got.asked
    ]
    asked.sort(key=lambda item: (item.requested_at, item.task_id, item.request_id))
    unreachable = [i for i, got in zip(task_ids, results, strict=True) if got is None]
    return Inbox(approvals=items, questions=asked, unreachable=unreachable, truncated=truncated)


async def _chains(
    request: Request, runtime: AgentRuntime, parents: list[_ParentMemo | None]
) -> list[Chain | None]:
    """Each sub-agent's chain with its root's and parent's texts (remembered per process: a
    task's text never changes)."""
    ids = sorted({i for p in parents if p is not None for i in (p.root_id, p.task_id)})
    read = await bounded((task_text(request, runtime, i) for i in ids), READS_AT_ONCE)
    texts = dict(zip(ids, read, strict=True))
    return [
        None
        if p is None
        else Chain(
            root_id=p.root_id,
            root_task=texts[p.root_id],
            parent_id=p.task_id,
            parent_task=texts[p.task_id],
            path=p.path,
        )
        for p in parents
    ]
