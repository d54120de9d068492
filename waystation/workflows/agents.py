"""Sub-agents: a call of `agent__<name>` runs that agent as a child task.

Pure decisions over the folded state. The child is an AgentWorkflow like any task (its
own log, stream, inbox entries and status), started as a child workflow whose id derives
from the parent's id, the step and the call id: a retried, replayed or repaired parent
never starts a second one (and adopts an existing one only if Temporal recorded this
parent as the one that started it: such an id is predictable), and the child's tool calls
get idempotency keys of their own. The child's answer (its validated output, when it has
a schema) is the call's observation, and its tree's usage counts towards the parent's,
whose token budget is shared among the calls of a step. A depth limit and a per-step
limit stop runaway trees with a sentence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.exceptions import ApplicationError, CancelledError

from waystation.vocabulary import AGENT_TOOL_PREFIX
from waystation.workflows.memory import child_namespace
from waystation.workflows.models import (
    AgentSpec,
    AgentTask,
    FailureDetail,
    ParentLink,
    ToolCall,
    ToolResult,
    Usage,
)
from waystation.workflows.run import ChildOutcome
from waystation.workflows.tool_catalog import SEPARATOR

# A parent that meets an existing child asks how it stands this often, doubling.
REJOIN_FIRST_PAUSE = timedelta(seconds=5)
REJOIN_LONGEST_PAUSE = timedelta(minutes=5)

AGENT_ARGUMENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "What the sub-agent should do, with everything it needs to know: "
            "it sees nothing of your conversation.",
        }
    },
    "required": ["task"],
}


@dataclass(frozen=True)
class ChildStart:
    """A sub-agent's task as its start left it: the handle to await, or None when the task
    existed already (a repaired or reset step started it before); `foreign` when the task
    under its id is not one this parent started."""

    child_id: str
    handle: Any | None
    foreign: bool = False


class AgentArgs(BaseModel):
    """What the model gives a sub-agent: its task."""

    task: str = Field(min_length=1, max_length=200_000)


def child_id(task_id: str, step: int, call_id: str) -> str:
    """The child task's id: the same for every replay, retry and repair of the parent."""
    return f"{task_id}/{step}/{call_id}"


def link(task: AgentTask, task_id: str, spec: AgentSpec, call_id: str) -> ParentLink:
    parent = task.parent
    return ParentLink(
        task_id=task_id,
        root_id=parent.root_id if parent is not None else task_id,
        path=[*(parent.path if parent is not None else []), spec.name],
        depth=(parent.depth if parent is not None else 0) + 1,
        call_id=call_id,
    )


@dataclass(frozen=True)
class BudgetShare:
    """What each sub-agent of a step may spend: tokens and US dollars (None: no budget)."""

    tokens: int | None = None
    cost_usd: float | None = None


# A sub-agent's share of a cost budget is never below this (a budget must be above 0).
LEAST_COST_SHARE = 1e-6


def budget_shares(task: AgentTask, used: Usage, calls: int) -> BudgetShare:
    """Each of a step's `calls` gets an equal share of what is left of each budget, so the
    tree together stays within it."""
    tokens = cost = None
    if task.token_budget is not None:
        tokens = max(1, (task.token_budget - used.total) // max(1, calls))
    if task.cost_budget is not None:
        left = task.cost_budget - (used.cost_usd or 0.0)
        cost = max(LEAST_COST_SHARE, left / max(1, calls))
    return BudgetShare(tokens, cost)


# The fields of a sub-agent's task that its spec and its call set; every other field is
# its caller's, so a setting added to AgentTask is inherited without a line here.
AGENT_OWNS = frozenset(
    {"task", "system_prompt", "model", "tools", "max_steps", "token_budget", "cost_budget"}
    | {"output_schema", "mcp_servers", "parent", "requires", "memory_namespace", "recall"}
    | {"agents"}
)


def reachable(
    specs: Sequence[AgentSpec], names: Sequence[str] | None, levels: int
) -> list[AgentSpec]:
    """The sub-agents of `specs` a task whose tools are `names` (None: every one) may call,
    and those they may call in turn, `levels` deep at most (in the order of `specs`)."""
    by_tool = {spec.tool_name: spec for spec in specs}
    found: set[str] = set()
    wave = list(by_tool) if names is None else [n for n in names if n in by_tool]
    for _ in range(levels):
        wave = [name for name in dict.fromkeys(wave) if name not in found]
        if not wave:
            break
        found.update(wave)
        wave = [
            name
            for spec in (by_tool[n] for n in wave)
            for name in (spec.tools if spec.tools is not None else by_tool)
            if name in by_tool
        ]
    return [spec for spec in specs if spec.tool_name in found]


def levels_offered(task: AgentTask, depth: int) -> int:
    """How many levels of sub-agents a task at `depth` of a tree holds: those that may run
    below it within max_agent_depth, and the level past them, offered so that a model that
    calls one is told the limit (`refusal`) rather than that no such tool exists."""
    return task.max_agent_depth - depth + 1


def agents_in_turn(parent: AgentTask, spec: AgentSpec, depth: int) -> list[AgentSpec] | None:
    """The sub-agents a child at `depth` may call in turn: those of its caller's that its own
    tools reach, as deep as the tree may grow (`levels_offered`); None for a caller that
    holds none (a task created before tasks held them: every worker offers its own)."""
    if parent.agents is None:
        return None
    return reachable(parent.agents, spec.tools, levels_offered(parent, depth))


def child_task(
    parent: AgentTask, spec: AgentSpec, instruction: str, share: BudgetShare, at: ParentLink
) -> AgentTask:
    """The child's task: its caller's, with the agent's own prompt, tools, limits and schema
    over it; the caller's model and MCP servers unless the agent names its own."""
    budgets = [b for b in (spec.token_budget, share.tokens) if b is not None]
    own: dict[str, Any] = {
        "task": instruction,
        "system_prompt": spec.system_prompt,
        "model": spec.model or parent.model,
        "tools": spec.tools,
        "max_steps": spec.max_steps,
        "token_budget": min(budgets) if budgets else None,
        "cost_budget": share.cost_usd,
        "output_schema": spec.output_schema,
        "mcp_servers": spec.mcp_servers if spec.mcp_servers is not None else parent.mcp_servers,
        "parent": at,
        "requires": own_needs(parent, spec),
        "memory_namespace": child_namespace(parent, spec),
        "recall": None,  # the caller's loaded its own memory; a sub-agent recalls with a tool
        "agents": agents_in_turn(parent, spec, at.depth),
    }
    return parent.model_copy(update=own)


def own_needs(parent: AgentTask, spec: AgentSpec) -> list[str] | None:
    """What a worker must offer the child: its own tools (an MCP server's excepted: those
    come with the server; a sub-agent's too when the task holds their definitions: any
    worker offers those), or its caller's needs when it names none."""
    if spec.tools is None or parent.requires is None:
        return parent.requires
    offered = AGENT_TOOL_PREFIX if parent.agents is None else None
    return [n for n in spec.tools if SEPARATOR not in n or (offered and n.startswith(offered))]


def refusal(task: AgentTask, call: ToolCall, index: int) -> ToolResult | None:
    """The observation of a sub-agent call a limit refuses (the `index`th of its step),
    or None when it may run."""
    depth = (task.parent.depth if task.parent is not None else 0) + 1
    if depth > task.max_agent_depth:
        return ToolResult(
            output=f"{call.tool} was not started: sub-agents may nest {task.max_agent_depth} "
            "deep and this one would be deeper; do the work yourself",
            is_error=True,
        )
    if index >= task.max_agent_calls:
        return ToolResult(
            output=f"{call.tool} was not started: a step may call {task.max_agent_calls} "
            "sub-agents at most; call the rest in a later step",
            is_error=True,
        )
    return None


def not_adopted(call: ToolCall, child_id: str) -> ToolResult:
    """The observation of a sub-agent call whose id a task this parent did not start holds
    (someone created it under the predictable id first): that task's answer is not the
    call's, and it is not this task's child."""
    return ToolResult(
        output=f"{call.tool} was not started: a task with its id {child_id} exists that this "
        "task did not start, so its answer is not this call's; do the work another way",
        is_error=True,
    )


def answered(outcome_output: Any | None, result: str, usage: Any) -> ToolResult:
    """The observation of a sub-agent that answered: its data, or its text."""
    text = result if outcome_output is None else json.dumps(outcome_output, ensure_ascii=False)
    return ToolResult(output=text, usage=usage, agent_status="done")


def ended(
    name: str, how: Literal["failed", "cancelled"], reason: str, usage: Any | None = None
) -> ToolResult:
    """The observation of a sub-agent that did not answer: the parent's model decides."""
    return ToolResult(
        output=f"the sub-agent {name} {how} without an answer: {reason}",
        is_error=True,
        usage=usage,
        agent_status=how,
    )


def child_ended(name: str, cause: BaseException | None) -> ToolResult:
    """The observation of a child workflow that failed or was cancelled (its tree's usage
    comes with its failure, which carries its state)."""
    if isinstance(cause, CancelledError):
        return ended(name, "cancelled", "it was cancelled")
    if isinstance(cause, ApplicationError):
        detail = FailureDetail.of(cause.details)
        return ended(name, "failed", cause.message, detail.usage if detail else None)
    return ended(name, "failed", str(cause) if cause else "its task ended")


def rejoined(name: str, seen: ChildOutcome) -> ToolResult:
    """The observation of a child found closed by asking Temporal."""
    if seen.outcome is not None:
        return answered(seen.outcome.output, seen.outcome.result, seen.outcome.usage)
    return ended(name, seen.ended or "failed", seen.reason, seen.usage)
