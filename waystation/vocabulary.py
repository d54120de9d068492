"""The words every layer shares: names and closed sets of values that workflows, settings,
activities, the client, the servers and the CLI all speak.

A leaf: it imports nothing of waystation, so the lowest layers (workflows, settings) read
it without reaching above themselves (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

OFFLINE_MODEL = "offline"
"""The model name of the built-in offline model (no endpoint needed)."""

AGENT_TOOL_PREFIX = "agent__"
"""A sub-agent is offered to its parent as a tool named with this prefix."""

ApprovalRule = Literal["always", "never", "outside_scratch"]
"""When a tool call waits for a person's approval."""

NotifiableKind = Literal["approval_requested", "question_asked", "done", "failed", "stuck"]
"""What a webhook endpoint may subscribe to."""
NOTIFIABLE_KINDS: tuple[str, ...] = get_args(NotifiableKind)

ActiveStatus = Literal[
    "running", "waiting_approval", "waiting_input", "waiting_worker", "waiting_quota"
]
"""A task at work: running, or waiting for an approver, for an answer, for a worker that
has what it needs (its tools, sub-agents or model endpoint), or for its turn under a model
endpoint's quota (requests or tokens a minute, concurrent requests, a provider's pause)."""
TerminalStatus = Literal["done", "failed", "cancelled"]
"""A task that ended its turn (a failed one may still be resumed, a done one followed up)."""
TaskStatus = Literal["pending", ActiveStatus, TerminalStatus]
"""A task's status (its state's `status`, its AgentStatus search attribute); `pending` only
before its first event."""
TASK_STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)
TERMINAL_STATUSES: frozenset[str] = frozenset(get_args(TerminalStatus))

STUCK = "stuck"
"""A task whose workflow task keeps failing (Temporal reports it): a search, not a status
the task records."""
StatusFilter = Literal[ActiveStatus, TerminalStatus, "stuck"]
"""What a task listing filters on: a status a task records, or `stuck`."""
STATUS_FILTERS: tuple[StatusFilter, ...] = get_args(StatusFilter)


class FailureKind(StrEnum):
    """Why a task failed: the `kind` of its `failed` event and of its failure's details."""

    MAX_STEPS = "max_steps"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    INVALID_OUTPUT = "invalid_output"
    APPROVAL_TIMEOUT = "approval_timeout"
    LLM_ERROR = "llm_error"
    CONTEXT_TOO_LONG = "context_too_long"
    REPEATED_CALLS = "repeated_calls"
    """The model kept repeating an identical tool call (the repeat guard)."""
    # Ends Temporal gives a run, not the workflow: what a resume says it resumes from.
    TERMINATED = "terminated"
    TIMED_OUT = "timed_out"

    @classmethod
    def read(cls, recorded: str) -> FailureKind | str:
        """The kind a recorded failure names, by its current name: runs recorded before the
        repeat guard had its own name called it `stuck`, which now means a task whose
        workflow task keeps failing. A kind this version does not know stays as recorded."""
        if recorded in _RENAMED_FAILURE_KINDS:
            return _RENAMED_FAILURE_KINDS[recorded]
        try:
            return cls(recorded)
        except ValueError:
            return recorded


_RENAMED_FAILURE_KINDS = {STUCK: FailureKind.REPEATED_CALLS}


QuotaLimitKind = Literal[
    "requests_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "concurrent_requests",
    "paused",
]
"""What a model call waits for under a quota: one of its limits, or (`paused`) the pause a
provider's 429 or rate-limit headers put on the whole endpoint."""
