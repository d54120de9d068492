"""How each activity is called: timeouts, heartbeats and retries, as typed configs.

One place, so the docs' tables and the code cannot drift: docs/failures.md, docs/tools.md.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

from waystation.workflows import errors
from waystation.workflows.models import AgentTask, ModelSettings
from waystation.workflows.notice import DeliveryRetry

# How soon a dead worker's call is retried elsewhere: activities heartbeat every third of
# it, so a slow but live call is left alone. Chosen from `python -m bench.heartbeats`:
# 2 s abandoned live model calls under two busy processes; 5 s did not, and a SIGKILL
# still recovers within ~6 s (docs/performance.md).
DEFAULT_HEARTBEAT_TIMEOUT = timedelta(seconds=5)
TOOL_START_TO_CLOSE = timedelta(minutes=15)
LOCAL_TOOL_TIMEOUT = timedelta(seconds=10)
# Saving a run's conversation before it hands over: the store may be restarting, and the
# task waits for it rather than losing what it said.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
)
# No retry of a retry-safe call repeats its effect (the ledger, or an MCP server's own
# annotation), so it outlasts a run of dead workers, workers too starved to heartbeat, or an
# unreachable database (each costs an attempt) rather than coming back to the model as
# lost. The bound ends a tool that takes its worker down every time (~25 minutes at the
# 10 s cap) or a database gone for ~2 hours (an attempt retries it for a minute first).
RETRY_SAFE_TOOL = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=100,
)
# Local tools are pure and bounded (the calculator) and die with their workflow task, which
# Temporal retries on its own: a failing attempt here is the tool's, not the machine's.
LOCAL_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
)
# A tool that cannot tell whether a lost attempt took effect runs at most once.
ONCE_ONLY_TOOL = RetryPolicy(maximum_attempts=1)


def heartbeat_timeout(task: AgentTask) -> timedelta:
    if task.heartbeat_timeout_seconds is None:
        return DEFAULT_HEARTBEAT_TIMEOUT
    return timedelta(seconds=task.heartbeat_timeout_seconds)


MODEL_RETRY_INITIAL = timedelta(seconds=1)
MODEL_RETRY_COEFFICIENT = 2.0
MODEL_RETRY_MAX_INTERVAL = timedelta(seconds=60)


def model_call(
    task: AgentTask, model: ModelSettings | None = None, *, retried_by_workflow: bool = False
) -> workflow.ActivityConfig:
    """An activity that calls the model: retried with backoff, Retry-After honoured (the
    activity sets next_retry_delay), requests the endpoint refused are not retried.

    A model the task can fall back from is tried once per activity: the workflow retries it
    itself (model_retry_delay), as it must see each failure's Retry-After and the time spent
    to move on after fallback_after_seconds. A schedule-to-close timeout would cut a long
    but healthy answer instead."""
    model = model or task.model
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(
            seconds=model.first_chunk_timeout_seconds + 10 * model.request_timeout_seconds
        ),
        heartbeat_timeout=heartbeat_timeout(task),
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        retry_policy=RetryPolicy(
            initial_interval=MODEL_RETRY_INITIAL,
            backoff_coefficient=MODEL_RETRY_COEFFICIENT,
            maximum_interval=MODEL_RETRY_MAX_INTERVAL,
            maximum_attempts=1 if retried_by_workflow else model.max_attempts,
            non_retryable_error_types=errors.NON_RETRYABLE_LLM_ERRORS,
        ),
    )


def model_retry_delay(failures: int, asked: timedelta | None) -> timedelta:
    """The pause before a model call the workflow retries itself, after `failures` failed
    attempts: the endpoint's Retry-After when it gave one, else the retry policy's backoff."""
    if asked is not None:
        return asked
    backoff = MODEL_RETRY_INITIAL * MODEL_RETRY_COEFFICIENT ** (failures - 1)
    return min(backoff, MODEL_RETRY_MAX_INTERVAL)


# A model call made while a task waits for a worker that has what it needs: attempts on
# workers that lack it fail at once and are tried again soon after, however long none comes
# (no attempt adds to history); the call that a capable worker makes is not retried here.
CAPABLE_WORKER_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,
)


def capable_worker_search() -> workflow.ActivityConfig:
    return workflow.ActivityConfig(retry_policy=CAPABLE_WORKER_RETRY)


def tool_call(
    task: AgentTask, retry_safe: bool, runs_for: timedelta | None = None
) -> workflow.ActivityConfig:
    """A tool call; `runs_for` is how long the tool itself may take (an MCP server's call
    timeout), which the activity's own timeout must exceed."""
    longest = max(TOOL_START_TO_CLOSE, (runs_for or timedelta(0)) + timedelta(minutes=1))
    return workflow.ActivityConfig(
        start_to_close_timeout=longest,
        heartbeat_timeout=heartbeat_timeout(task),
        retry_policy=RETRY_SAFE_TOOL if retry_safe else ONCE_ONLY_TOOL,
        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    )


def local_tool_call() -> workflow.LocalActivityConfig:
    return workflow.LocalActivityConfig(
        start_to_close_timeout=LOCAL_TOOL_TIMEOUT, retry_policy=LOCAL_TOOL_RETRY
    )


def tool_listing(task: AgentTask) -> workflow.ActivityConfig:
    """Listing MCP tools: a server that cannot start is an entry of the catalog, not a
    failure, so retries only cover a worker that died."""
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=3),
        heartbeat_timeout=heartbeat_timeout(task),
        retry_policy=RetryPolicy(maximum_attempts=5),
    )


def memory_recall(task: AgentTask) -> workflow.ActivityConfig:
    """Loading memory at a task's start: a read, retried a few times; past them the task
    starts without it, and its event says why."""
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=1),
        heartbeat_timeout=heartbeat_timeout(task),
        retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10)),
    )


def conversation_save(task: AgentTask) -> workflow.ActivityConfig:
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=2),
        heartbeat_timeout=heartbeat_timeout(task),
        retry_policy=STORE_RETRY,
    )


# Archiving is a shortcut for readers, never worth holding a hand-over up: a few tries.
ARCHIVE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_attempts=3,
)


def events_archive() -> workflow.ActivityConfig:
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=1), retry_policy=ARCHIVE_RETRY
    )


def run_seal() -> workflow.LocalActivityConfig:
    """Sealing a closing run: a local activity, a few quick tries (readers fall back to a
    query on the run when it is not sealed)."""
    return workflow.LocalActivityConfig(
        start_to_close_timeout=timedelta(seconds=20), retry_policy=ARCHIVE_RETRY
    )


# A workflow task taken by a worker that then dies is retried elsewhere after this
# (Temporal's default is 10 s); tasks, follow-ups and sub-agents all start with it.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=3)


def child_lookup(task: AgentTask) -> workflow.ActivityConfig:
    """Reading a sub-agent's end from Temporal: one describe and one history page."""
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=1),
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
        ),
    )


def turn_claim(task: AgentTask) -> workflow.ActivityConfig:
    """Claiming a follow-up's turn: a read of the answer it follows and one row in the
    ledger, retried while the storage or Temporal is away (the turn waits for them)."""
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(minutes=1),
        heartbeat_timeout=heartbeat_timeout(task),
        retry_policy=RetryPolicy(
            initial_interval=timedelta(milliseconds=200),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=10),
            maximum_attempts=100,
            non_retryable_error_types=[errors.NOTHING_TO_FOLLOW, errors.TASK_NOT_TAKING_MESSAGES],
        ),
    )


def local_notification_targets() -> workflow.LocalActivityConfig:
    """Asking the worker in hand which events its webhook endpoints want: its settings."""
    return workflow.LocalActivityConfig(
        start_to_close_timeout=timedelta(seconds=10), retry_policy=RetryPolicy(maximum_attempts=3)
    )


def notification_targets() -> workflow.ActivityConfig:
    """Asking a worker which events its webhook endpoints want: settings in its memory,
    retried while no worker serves the queue's activities (the run waits for one anyway)."""
    return workflow.ActivityConfig(
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(
            initial_interval=timedelta(milliseconds=200),
            maximum_interval=timedelta(seconds=10),
            maximum_attempts=100,
        ),
    )


def notification_delivery(retry: DeliveryRetry) -> workflow.ActivityConfig:
    """One webhook delivery: retried with backoff for `retry.hours` in all (Retry-After
    honoured), a refusal not at all; heartbeats while the endpoint answers, so a dead
    worker's attempt is made again within `retry.heartbeat_seconds`."""
    return workflow.ActivityConfig(
        schedule_to_close_timeout=timedelta(hours=retry.hours),
        start_to_close_timeout=timedelta(seconds=retry.timeout_seconds + 10),
        heartbeat_timeout=timedelta(seconds=retry.heartbeat_seconds),
        retry_policy=RetryPolicy(
            initial_interval=timedelta(seconds=retry.initial_seconds),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=retry.max_interval_seconds),
            non_retryable_error_types=[errors.WEBHOOK_REJECTED, errors.WEBHOOK_NOT_CONFIGURED],
        ),
    )
