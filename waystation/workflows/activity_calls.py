"""The agent workflow's activity calls, each with the options it takes.

Cancel wins: an activity that fails once the task's cancellation was asked (or because of
it) raises CancelledError, so a call failing meanwhile never turns a cancel into a failure.
Other failures come back as ActivityError for the workflow to log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeout

from waystation.workflows import activity_contracts as contracts
from waystation.workflows import errors, options
from waystation.workflows.calls import Run, lost_call
from waystation.workflows.events import MemoryRecalled, draft
from waystation.workflows.memory import MEMORY_TOOLS, RecallRequest
from waystation.workflows.models import (
    AgentTask,
    ConversationSnapshot,
    LlmRequest,
    LlmResult,
    SummaryRequest,
    SummaryResult,
    ToolResult,
)
from waystation.workflows.run import (
    ArchiveRequest,
    ChildOutcome,
    ClaimedTurn,
    SealRequest,
    TurnClaim,
)
from waystation.workflows.tool_catalog import ListToolsRequest, ToolCatalog, unlisted

LISTING_FAILURE_PATCH = "mcp-listing-failure"


def cancelled(err: BaseException) -> bool:
    """A cancelled activity, or any activity failure once the task's cancel was asked."""
    if isinstance(err, ActivityError) and isinstance(err.cause, CancelledError):
        return True
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def detail(err: ActivityError) -> str:
    """The sentence an activity failed with."""
    cause = err.cause
    return cause.message if isinstance(cause, ApplicationError) else str(cause or err)


@contextmanager
def cancel_wins() -> Iterator[None]:
    try:
        yield
    except ActivityError as err:
        if cancelled(err):
            raise asyncio.CancelledError() from None
        raise


def start_model_call(
    task: AgentTask, request: LlmRequest, *, retried_by_workflow: bool = False
) -> workflow.ActivityHandle[LlmResult]:
    """The model call as a handle the loop can cancel (a message that interrupts it)."""
    config = options.model_call(task, request.model, retried_by_workflow=retried_by_workflow)
    if request.wait_for_capable_worker:
        config = {**config, **options.capable_worker_search()}
    return workflow.start_activity(contracts.call_llm, request, **config)


def retryable(err: ActivityError) -> bool:
    """A model call's failure that another attempt may not meet (not a refusal, nor a worker
    that lacks what the task needs)."""
    cause = err.cause
    if not isinstance(cause, ApplicationError):
        return True
    stops = [*errors.NON_RETRYABLE_LLM_ERRORS, errors.WORKER_LACKS]
    return not cause.non_retryable and cause.type not in stops


def outage(err: ActivityError) -> bool:
    """A model call that failed because the model is down, overloaded or not answering."""
    cause = err.cause
    if isinstance(cause, ActivityTimeout):
        return True
    return isinstance(cause, ApplicationError) and cause.type in errors.OUTAGE_LLM_ERRORS


def retry_after(err: ActivityError) -> timedelta | None:
    """How long the endpoint asked to wait before the next attempt (Retry-After)."""
    cause = err.cause
    return cause.next_retry_delay if isinstance(cause, ApplicationError) else None


def task_cancelling() -> bool:
    """Whether this task's own cancellation was asked (its main coroutine is cancelling)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def child_outcome(task: AgentTask, child_id: str) -> ChildOutcome:
    return await workflow.execute_activity(
        contracts.child_outcome, child_id, **options.child_lookup(task)
    )


def cancelled_by_request(err: ActivityError) -> bool:
    """The activity ended because the workflow cancelled it (not the task's own cancel)."""
    task = asyncio.current_task()
    own_cancel = task is not None and task.cancelling() > 0
    return isinstance(err.cause, CancelledError) and not own_cancel


async def cancelled_call(call: workflow.ActivityHandle[LlmResult]) -> None:
    """Cancel a call as the task itself is cancelled, and wait until it has stopped."""
    call.cancel()
    try:
        await call
    except (ActivityError, asyncio.CancelledError):
        pass


async def claim_turn(task: AgentTask, claim: TurnClaim) -> ClaimedTurn:
    return await workflow.execute_activity(contracts.claim_turn, claim, **options.turn_claim(task))


async def summarize(task: AgentTask, request: SummaryRequest) -> SummaryResult:
    with cancel_wins():
        return await workflow.execute_activity(
            contracts.summarize_context, request, **options.model_call(task, request.model)
        )


# How often a tool call that met a worker without the tool is tried again (about 15 minutes
# in all, each try a few events of history) before the model is told it did not run.
TOOL_WORKER_SEARCHES = 35


async def run_tool(task: AgentTask, run: Run, catalog: ToolCatalog | None) -> ToolResult:
    """A tool call: pure local tools as local activities, the rest as activities (an MCP
    tool's for as long as its server's call timeout). A call that failed for good is an
    observation saying it may or may not have taken effect."""
    spec = catalog.get(run.request.tool) if catalog else None
    runs_for = timedelta(seconds=spec.timeout_seconds) if spec else None
    request = run.request
    if request.tool in MEMORY_TOOLS and task.memory_namespace is not None:
        request = request.model_copy(update={"memory_namespace": task.memory_namespace})
    for search in range(TOOL_WORKER_SEARCHES + 1):
        try:
            with cancel_wins():
                if run.local:
                    config = options.local_tool_call()
                    result = await workflow.execute_local_activity(
                        contracts.run_tool, request, **config
                    )
                else:
                    retried = options.tool_call(task, run.retry_safe, runs_for)
                    result = await workflow.execute_activity(contracts.run_tool, request, **retried)
        except ActivityError as err:
            if not worker_lacks(err):
                return lost_call(request.tool, detail(err))
            if search == TOOL_WORKER_SEARCHES:
                said = f"{request.tool} was not run: no worker that took it has it ({detail(err)})"
                return ToolResult(output=said, is_error=True)
            # Nothing ran: the worker that took it lacks the tool. Another is asked after a
            # pause (a fleet mid-deploy: a worker that has it takes it soon).
            await workflow.sleep(min(2.0**search, 30.0))
            continue
        return result.model_copy(update={"output": result.output + run.note})
    raise AssertionError("unreachable: the last search returns")


async def recall_memory(task: AgentTask) -> MemoryRecalled | None:
    """The memory a task asked to start with (`recall`), as the event that states it; None
    when it asked for none. A store that stays unreachable is said in the event: the task
    starts without it rather than not at all."""
    if task.recall is None or task.memory_namespace is None:
        return None
    request = RecallRequest(namespace=task.memory_namespace, query=task.recall)
    stated = {"namespace": request.namespace, "query": request.query}
    try:
        with cancel_wins():
            found = await workflow.execute_activity(
                contracts.recall_memory, request, **options.memory_recall(task)
            )
    except ActivityError as err:
        return draft(MemoryRecalled, 0, **stated, problem=f"memory was not read: {detail(err)}")
    return draft(MemoryRecalled, 0, **stated, items=found.items)


def worker_lacks(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == errors.WORKER_LACKS


async def list_tools(task: AgentTask, servers: list[str]) -> ToolCatalog:
    """The servers' tools. A listing that failed past its retries (workers dying in it, a
    worker without the activity) is a catalog of servers without tools, saying why: the task
    goes on without them, as without a server that cannot start."""
    request = ListToolsRequest(servers=servers)
    config = options.tool_listing(task)
    try:
        return await workflow.execute_activity(contracts.list_tools, request, **config)
    except ActivityError as err:
        # Before the patch, such a failure failed the task itself (and replays so).
        if cancelled(err) or not workflow.patched(LISTING_FAILURE_PATCH):
            raise
        return unlisted(servers, f"listing its tools failed past every retry: {detail(err)}")


async def save_conversation(task: AgentTask, snapshot: ConversationSnapshot) -> None:
    config = options.conversation_save(task)
    await workflow.execute_activity(contracts.save_conversation, snapshot, **config)


async def seal_run(request: SealRequest) -> bool:
    """Keep what the closing run leaves for readers (activities/event_archive.py); whether
    that worked (a failure costs readers a query on the run, never the task)."""
    try:
        config = options.run_seal()
        await workflow.execute_local_activity(contracts.seal_run, request, **config)
    except ActivityError as err:
        if cancelled(err):
            raise
        workflow.logger.warning("the closing run was not sealed: %s", detail(err))
        return False
    return True


async def archive_events(request: ArchiveRequest) -> bool:
    """Store the run's events for readers; whether that worked (a failure costs readers a
    replay, never the task)."""
    with cancel_wins():
        try:
            config = options.events_archive()
            await workflow.execute_activity(contracts.archive_events, request, **config)
        except ActivityError as err:
            if cancelled(err):
                raise
            workflow.logger.warning("the run's events were not archived: %s", detail(err))
            return False
    return True
