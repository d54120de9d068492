"""Memory across tasks: what every layer shares about it, pure (no I/O).

A memory item lives in a namespace: `TENANT:AGENT` for a task with a tenant, `AGENT` for one
without (a root task's agent is `main`; a sub-agent's is its name, unless its definition
shares its caller's memory). The namespace is resolved when a task starts and stored with
it (`AgentTask.memory_namespace`), so a replay reads no setting. A namespace's tenant is the
part before `:`: a token bound to a tenant reaches only the namespaces that name it.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from waystation.workflows.models import MEMORY_NAMESPACE_PATTERN, AgentSpec, AgentTask, Contract

REMEMBER_TOOL = "remember"
RECALL_TOOL = "recall"
FORGET_TOOL = "forget"
MEMORY_TOOLS = frozenset({REMEMBER_TOOL, RECALL_TOOL, FORGET_TOOL})
ROOT_AGENT = "main"
"""The agent name of a task that is not a sub-agent, in its default namespace."""

NAMESPACE_PATTERN = MEMORY_NAMESPACE_PATTERN
KEY_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"
RECALL_LIMIT = 5
"""Items a recall returns (and `--recall` loads) unless it asks for another number."""
MOST_RECALLED = 50


class MemoryItem(Contract):
    """One item of a namespace, as the store returns it."""

    namespace: str
    key: str
    value: str
    metadata: dict[str, Any] | None = None
    created_at: float = Field(description="Seconds since the epoch.")
    updated_at: float
    expires_at: float | None = Field(default=None, description="None: it never expires.")
    revision: int = Field(default=1, description="Writes the item has had (1: its first).")


class RecalledItem(Contract):
    """An item loaded into a task's system prompt at its start (the `memory_recalled` event)."""

    key: str
    value: str


class RecallRequest(Contract):
    """Input of the `recall_memory` activity: what `--recall` loads at a task's start."""

    namespace: str
    query: str
    limit: int = RECALL_LIMIT


class RecallResult(Contract):
    items: list[RecalledItem] = Field(default_factory=list)


def is_namespace(name: str) -> bool:
    return re.fullmatch(NAMESPACE_PATTERN, name) is not None


def tenant_of(namespace: str) -> str | None:
    """The tenant a namespace belongs to (None: a namespace of tasks without a tenant)."""
    tenant, colon, _ = namespace.partition(":")
    return tenant if colon else None


def namespace_for(tenant: str | None, agent: str) -> str:
    """The default namespace of `agent`'s tasks for `tenant`."""
    return f"{tenant}:{agent}" if tenant is not None else agent


def with_namespace(task: AgentTask) -> AgentTask:
    """The task with its memory namespace resolved (its own when it names one)."""
    if task.memory_namespace is not None:
        return task
    return task.model_copy(update={"memory_namespace": namespace_for(task.tenant, ROOT_AGENT)})


def child_namespace(parent: AgentTask, spec: AgentSpec) -> str | None:
    """A sub-agent's namespace: its own (its caller's tenant, its name) unless its definition
    shares its caller's. None for a caller started before tasks carried one."""
    if parent.memory_namespace is None or spec.shared_memory:
        return parent.memory_namespace
    return namespace_for(parent.tenant, spec.name)


def recalled_prompt(items: list[RecalledItem]) -> str:
    """What `--recall` adds to the system prompt."""
    lines = [f"- {item.key}: {item.value}" for item in items]
    return "What you remember from earlier tasks (your memory):\n" + "\n".join(lines)
