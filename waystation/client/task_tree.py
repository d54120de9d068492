"""A task's place in its tree of agents: the sub-agents below it, nested, each with its
status, and the task that called it. Read from Temporal, no worker needed.

Temporal keeps the tree itself: a sub-agent is a child workflow, and visibility lists a
tree's executions by the system attributes RootWorkflowId and ParentWorkflowId, one listing
for the whole tree. Visibility may lag a moment behind, so the executions still running,
whose status may change, are described one by one (a description is current); the pending
children a description names, and the sub-agents the task's state has just started, add
those visibility has not listed yet. (A server too old for RootWorkflowId gets descriptions
only: the task's own sub-agents and the running ones below them.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import WorkflowExecution as ExecutionRef
from temporalio.api.workflow.v1 import WorkflowExecutionInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from waystation.client.busy import reading
from waystation.vocabulary import STUCK, TERMINAL_STATUSES
from waystation.workflows import search
from waystation.workflows.events import ChildAgent

TREE_NODES_READ = 1_000  # a tree shows this many sub-agents at most
DESCRIBES_AT_ONCE = 8
# How a closed execution's end reads when the task's own status cannot say it.
_CLOSED_AS = {
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
}


class PendingRequest(BaseModel):
    """A request of a sub-agent waiting for a person."""

    kind: Literal["approval", "question"]
    request_id: str


class TreeNode(BaseModel):
    """A sub-agent: a task of its own, started by a call of its caller."""

    task_id: str
    agent: str
    step: int | None = Field(default=None, description="Its caller's step that started it.")
    call_id: str | None = Field(default=None, description="The call it answers.")
    status: str = Field(
        description="Its own status: running, waiting_approval, waiting_input, waiting_worker, "
        "waiting_quota, done, failed, cancelled, stuck, terminated, timed_out, or starting "
        "(not started yet)."
    )
    waiting: list[PendingRequest] = Field(
        default_factory=list, description="Its requests waiting for a person."
    )
    children: list[TreeNode] = Field(default_factory=list)


class ParentRef(BaseModel):
    """Where a sub-agent sits: the task that called it, the tree's root, the agents from the
    root down to it."""

    task_id: str
    root_id: str
    path: list[str]


class TaskTree(BaseModel):
    parent: ParentRef | None = Field(
        default=None, description="The task that called this one (a sub-agent's)."
    )
    children: list[TreeNode] = Field(
        default_factory=list,
        description="The sub-agents it started, in the order of its calls, nested.",
    )
    truncated: bool = Field(
        default=False, description=f"The tree has more than {TREE_NODES_READ} sub-agents."
    )


def parent_of(memo: Mapping[str, Any]) -> ParentRef | None:
    """The caller a task's memo names (a sub-agent's), or None."""
    said = memo.get(search.MEMO_PARENT)
    if said is None:
        return None
    try:
        return ParentRef.model_validate(said)
    except ValidationError:
        return None


@dataclass
class _Seen:
    """One execution of the tree as Temporal shows it."""

    task_id: str
    parent_id: str | None
    started: tuple[int, int]
    running: bool
    status: str
    agent: str | None
    waiting: list[PendingRequest]
    pending_children: list[str]


async def read_tree(
    client: Client, task_id: str, memo: Mapping[str, Any], started: Mapping[str, ChildAgent]
) -> TaskTree:
    """The tree below `task_id` (whose memo and state's `children` are given) and its caller."""
    parent = parent_of(memo)
    if not started:
        return TaskTree(parent=parent)  # a task that never started a sub-agent has none
    root = parent.root_id if parent is not None else task_id
    seen, truncated = await _listed(client, root)
    below = task_id + "/"
    asked: set[str] = set()
    wanted = {c.task_id for c in started.values() if c.task_id not in seen}
    wanted |= {i for i, s in seen.items() if s.running and i.startswith(below)}
    while wanted:
        asked |= wanted
        found = await _described(client, sorted(wanted))
        seen.update(found)
        wanted = {
            child
            for s in found.values()
            for child in s.pending_children
            if child not in seen and child not in asked
        }
    agents = {c.task_id: c for c in started.values()}
    # The task's own sub-agents in the order its calls started them; deeper ones as they
    # started (the order of their callers' calls is in their callers' states).
    called = {task: n for n, task in enumerate(agents)}
    by_parent: dict[str, list[_Seen]] = {}
    for s in seen.values():
        if s.parent_id is not None and s.task_id.startswith(below):
            by_parent.setdefault(s.parent_id, []).append(s)

    def nodes(caller: str) -> list[TreeNode]:
        listed = sorted(
            by_parent.get(caller, []),
            key=lambda s: (called.get(s.task_id, len(called)), s.started, s.task_id),
        )
        return [_node(s, caller, agents.get(s.task_id), nodes(s.task_id)) for s in listed]

    children = nodes(task_id)
    shown = {n.task_id for n in children}
    for child in started.values():  # started, not yet known to Temporal
        if child.task_id not in shown:
            children.append(
                TreeNode(
                    task_id=child.task_id,
                    agent=child.agent,
                    step=child.step,
                    call_id=child.call_id,
                    status="starting" if child.status == "running" else child.status,
                )
            )
    return TaskTree(parent=parent, children=children, truncated=truncated)


def _node(
    seen: _Seen, caller: str, started: ChildAgent | None, children: list[TreeNode]
) -> TreeNode:
    step_text, _, call_id = seen.task_id[len(caller) + 1 :].partition("/")
    agent = seen.agent or (started.agent if started is not None else "sub-agent")
    return TreeNode(
        task_id=seen.task_id,
        agent=agent,
        step=int(step_text) if step_text.isascii() and step_text.isdigit() else None,
        call_id=call_id or None,
        status=seen.status,
        waiting=seen.waiting,
        children=children,
    )


async def _listed(client: Client, root: str) -> tuple[dict[str, _Seen], bool]:
    """The tree's executions as visibility lists them, each task once (its latest run)."""
    quote = "'" if '"' in root else '"'
    if quote in root:
        return {}, False  # an id visibility's query cannot quote: descriptions only
    query = f"RootWorkflowId = {quote}{root}{quote}"
    seen: dict[str, _Seen] = {}
    truncated = False
    try:
        async for execution in client.list_workflows(query, page_size=200):
            truncated = await _add(client, seen, execution.raw_info, root)
            if truncated:
                break
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT:
            raise
        return {}, False  # a server older than RootWorkflowId: descriptions only
    return seen, truncated


async def _add(
    client: Client, seen: dict[str, _Seen], info: WorkflowExecutionInfo, root: str
) -> bool:
    """Add a listed execution (its task's latest run); True once the tree is too large."""
    if info.execution.workflow_id == root:
        return False
    if len(seen) >= TREE_NODES_READ and info.execution.workflow_id not in seen:
        return True
    found = await _seen(client, info, [])
    earlier = seen.get(found.task_id)
    if earlier is None or found.started >= earlier.started:
        seen[found.task_id] = found
    return False


async def _described(client: Client, task_ids: list[str]) -> dict[str, _Seen]:
    """The executions as their descriptions show them now (a task not started yet is not)."""
    gate = asyncio.Semaphore(DESCRIBES_AT_ONCE)

    async def describe(task_id: str) -> _Seen | None:
        request = DescribeWorkflowExecutionRequest(
            namespace=client.namespace, execution=ExecutionRef(workflow_id=task_id)
        )
        async with gate:
            try:
                raw = await reading(
                    lambda: client.workflow_service.describe_workflow_execution(request)
                )
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return None
                raise
        children = [c.workflow_id for c in raw.pending_children]
        return await _seen(client, raw.workflow_execution_info, children)

    found = await asyncio.gather(*(describe(t) for t in task_ids))
    return {s.task_id: s for s in found if s is not None}


async def _seen(client: Client, info: WorkflowExecutionInfo, children: list[str]) -> _Seen:
    status = WorkflowExecutionStatus(info.status) if info.status else None
    running = status == WorkflowExecutionStatus.RUNNING
    memo = await _memo(client, info)
    parent = parent_of(memo)
    waiting = [
        PendingRequest(kind=p["kind"], request_id=p["request_id"])
        for p in memo.get(search.MEMO_PENDING) or []
        if isinstance(p, dict) and p.get("kind") in ("approval", "question")
    ]
    return _Seen(
        task_id=info.execution.workflow_id,
        parent_id=info.parent_execution.workflow_id if info.HasField("parent_execution") else None,
        started=(info.start_time.seconds, info.start_time.nanos),
        running=running,
        status=_status(info, status),
        agent=parent.path[-1] if parent is not None and parent.path else None,
        waiting=waiting if running else [],
        pending_children=children,
    )


def _status(info: WorkflowExecutionInfo, status: WorkflowExecutionStatus | None) -> str:
    """The task's own status (AgentStatus); for a run that ended without saying so (a
    termination, a timeout), how Temporal ended it."""
    attributes = info.search_attributes.indexed_fields
    if status == WorkflowExecutionStatus.RUNNING:
        problems = _attribute(attributes, search.REPORTED_PROBLEMS) or []
        if search.reports_stuck({search.REPORTED_PROBLEMS: problems}):
            return STUCK
    said = _attribute(attributes, search.AGENT_STATUS.name)
    ended = _CLOSED_AS.get(status) if status is not None else None
    if ended is not None and said not in TERMINAL_STATUSES:
        return ended
    return str(said) if said else "running"


def _attribute(attributes: Mapping[str, Any], name: str) -> Any:
    payload = attributes.get(name)
    if payload is None:
        return None
    try:
        return PayloadConverter.default.from_payload(payload)
    except Exception:  # a value this side cannot read: as if unset
        return None


async def _memo(client: Client, info: WorkflowExecutionInfo) -> dict[str, Any]:
    fields = dict(info.memo.fields)
    if not fields:
        return {}
    try:
        values = await client.data_converter.decode(list(fields.values()))
    except Exception:  # sealed with a key this side lacks: the tree shows what it can
        return {}
    return dict(zip(fields, values, strict=True))
