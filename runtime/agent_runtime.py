"""AgentRuntime: the client API. `run(task)`, `resume(task_id, approval)`, `stream(task_id, since)`.

run and resume return the same TaskHandle; stream observes and never executes: execution
happens only in workers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from runtime.reset import reset_failed_task
from runtime.settings import Settings
from runtime.streaming import StreamHub, StreamItem
from workflows import errors, search
from workflows.agent import AgentWorkflow, EventPage, RunCarry
from workflows.events import AgentEvent, AgentState, TaskStarted, fold
from workflows.models import (
    AgentOutcome,
    AgentTask,
    Decision,
    DecisionOutcome,
    ModelSettings,
    Resumption,
)

# A workflow task taken by a worker that then dies is retried elsewhere after this (Temporal's
# default is 10 s). Until then the task cannot answer queries either, and a retried LLM call
# that reads its conversation by query waits on it: measured, SIGKILLs mid-stream took up to
# 18 s to recover at 10 s, 6 s at 5 s, 4 s at 3 s. A replay of a whole run's history takes
# well under a second here, so 3 s still leaves room for slow workflow tasks.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=3)


class TaskError(Exception):
    """Base of the errors a task operation raises."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class TaskNotFoundError(TaskError):
    pass


class TaskFailedError(TaskError):
    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class TaskCancelledError(TaskError):
    pass


class DecisionError(TaskError):
    """A decision was refused: unknown request, conflict, or the task is not waiting."""

    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class TaskSummary(BaseModel):
    """One task as Temporal's visibility lists it (no worker needed)."""

    id: str
    status: str
    step: int | None = None
    started_at: datetime
    closed_at: datetime | None = None


class TaskHandle:
    """One task, however it was reached: result, state, events, approve, cancel, stream."""

    def __init__(
        self,
        runtime: AgentRuntime,
        task_id: str,
        workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] | None = None,
    ) -> None:
        self._runtime = runtime
        self.id = task_id
        self._handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            workflow or runtime.client.get_workflow_handle_for(AgentWorkflow.run, task_id)
        )

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"

    async def result(self) -> AgentOutcome:
        """Wait for the answer. Raises TaskFailedError or TaskCancelledError otherwise."""
        try:
            return await self._handle.result()
        except WorkflowFailureError as err:
            cause = err.cause
            if isinstance(cause, CancelledError):
                raise TaskCancelledError(self.id, f"task {self.id} was cancelled") from err
            if isinstance(cause, ApplicationError):
                kind = cause.details[0] if cause.details else None
                raise TaskFailedError(self.id, cause.message, str(kind) if kind else None) from err
            raise TaskFailedError(self.id, str(cause or err), None) from err
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def state(self) -> AgentState:
        """The folded state (needs a worker to answer the query)."""
        try:
            return await self._handle.query(AgentWorkflow.state)
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def events(self, since: int = 0) -> list[AgentEvent]:
        """Events with seq >= since, across the task's chain of continue-as-new runs."""
        try:
            page: EventPage = await self._handle.query(AgentWorkflow.events, since)
            events = page.events
            while since < page.first_seq and page.previous_run_id:
                earlier = self._runtime.client.get_workflow_handle_for(
                    AgentWorkflow.run, self.id, run_id=page.previous_run_id
                )
                first_later = page.first_seq
                page = await earlier.query(AgentWorkflow.events, since)
                events = [e for e in page.events if e.seq < first_later] + events
        except RPCError as err:
            raise _not_found(self.id, err) from err
        return events

    async def approve(
        self,
        request_id: str | None = None,
        *,
        reject: bool = False,
        message: str | None = None,
        arguments: dict[str, Any] | None = None,
        approver: str | None = None,
    ) -> DecisionOutcome:
        """Decide one approval request; with no id, the only pending one."""
        if request_id is None:
            pending = (await self.state()).pending_approvals
            if len(pending) != 1:
                raise DecisionError(
                    self.id,
                    f"task {self.id} has {len(pending)} pending approval requests; name one"
                    + (f": {', '.join(pending)}" if pending else ""),
                    errors.UNKNOWN_REQUEST if pending else errors.TASK_NOT_WAITING,
                )
            request_id = next(iter(pending))
        decision = Decision(
            request_id=request_id,
            decision="reject" if reject else "approve",
            message=message,
            arguments=arguments,
            approver=approver,
        )
        return await self.decide(decision)

    async def decide(self, decision: Decision) -> DecisionOutcome:
        """Apply a decision through the `decide` Update; repeats return the first outcome."""
        try:
            outcome: DecisionOutcome = await self._handle.execute_update(
                "decide", decision, result_type=DecisionOutcome
            )
            return outcome
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError):
                raise DecisionError(self.id, cause.message, cause.type) from err
            raise
        except RPCError as err:
            closed = ("already completed", "aborted by closing workflow")
            if err.status == RPCStatusCode.NOT_FOUND and any(c in err.message for c in closed):
                return await self._decision_after_close(decision)
            raise _not_found(self.id, err) from err

    async def _decision_after_close(self, decision: Decision) -> DecisionOutcome:
        # A closed workflow takes no Update, but a repeat of a decision it applied
        # must still get the first outcome, and anything else a clear refusal.
        state = await self.state()
        existing = state.decisions.get(decision.request_id)
        if existing is None:
            raise DecisionError(
                self.id,
                f"task is {state.status}, not waiting for approval (request {decision.request_id})",
                errors.TASK_NOT_WAITING,
            )
        if not decision.repeats(existing):
            raise DecisionError(
                self.id,
                f"request {decision.request_id} was already decided: {existing.decision}",
                errors.DECISION_CONFLICT,
            )
        return existing.model_copy(update={"duplicate": True})

    async def describe(self) -> WorkflowExecutionDescription:
        """Temporal's view of the task's latest run (no worker needed)."""
        try:
            return await self._handle.describe()
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def cancel(self) -> None:
        try:
            await self._handle.cancel()
        except RPCError as err:
            raise _not_found(self.id, err) from err

    def stream(
        self, since: int = 0, topics: list[str] | None = None
    ) -> AsyncGenerator[StreamItem, None]:
        return self._runtime.stream(self.id, since=since, topics=topics)


def _summary(text: str, limit: int = 200) -> str:
    """What the Web UI shows for a task (encoded like every payload when a codec is on)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _not_found(task_id: str, err: RPCError) -> Exception:
    if err.status == RPCStatusCode.NOT_FOUND:
        return TaskNotFoundError(task_id, f"no task with id {task_id!r}")
    return err


class AgentRuntime:
    """The client side of waystation over one Temporal client and task queue."""

    def __init__(self, client: Client, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or Settings()
        self._streams = StreamHub(client)

    def new_task(self, text: str, **fields: Any) -> AgentTask:
        """An AgentTask with this runtime's default model filled in."""
        fields.setdefault("model", ModelSettings(name=self.settings.default_model))
        return AgentTask(task=text, **fields)

    async def run(self, task: AgentTask | str, *, task_id: str | None = None) -> TaskHandle:
        """Start a task (or, with a task_id already used, return that task: idempotent)."""
        if isinstance(task, str):
            task = self.new_task(task)
        task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        try:
            started = await self.client.start_workflow(
                AgentWorkflow.run,
                task,
                id=task_id,
                task_queue=self.settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=_summary(task.task),
                task_timeout=WORKFLOW_TASK_TIMEOUT,
            )
        except WorkflowAlreadyStartedError:
            return TaskHandle(self, task_id)  # a closed task with this id: that task
        # Keep the started handle: it follows the run chain from this start.
        return TaskHandle(self, task_id, started)

    async def resume(
        self,
        task_id: str,
        approval: Decision | None = None,
        *,
        max_steps: int | None = None,
        token_budget: int | None = None,
    ) -> TaskHandle:
        """The handle of an existing task, going on from where it stopped.

        A running task gets `approval` applied if one is given. A failed task is reset to
        its last good point (before the activity that failed it, or just before the limit
        it hit) and goes on, with `max_steps` / `token_budget` raised if given; its event
        log then shows a `resumed` event naming the failure.
        """
        handle = self.get(task_id)
        description = await handle.describe()
        if description.status in (
            WorkflowExecutionStatus.FAILED,
            WorkflowExecutionStatus.TERMINATED,
            WorkflowExecutionStatus.TIMED_OUT,
        ):
            await reset_failed_task(
                self.client,
                task_id,
                description.run_id,
                Resumption(max_steps=max_steps, token_budget=token_budget),
            )
            return self.get(task_id)
        if max_steps is not None or token_budget is not None:
            raise TaskError(task_id, f"task {task_id} has not failed: its limits stay as they are")
        if approval is not None:
            await handle.decide(approval)
        return handle

    async def fork(
        self,
        task_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        new_task_id: str | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
    ) -> TaskHandle:
        """A new task that starts from the state just after event `at_seq` of `task_id`.

        The original is untouched. `message` adds a user message first (an edited turn);
        `max_steps` / `token_budget` replace the original's limits. The fork has its own
        id and its own stream (offsets start at 0).
        """
        events = await self.get(task_id).events()
        if not 0 <= at_seq < len(events):
            raise TaskError(
                task_id, f"task {task_id} has events 0..{len(events) - 1}, not {at_seq}"
            )
        kept = events[: at_seq + 1]
        first = kept[0]
        if not isinstance(first, TaskStarted):
            raise TaskError(task_id, f"task {task_id}'s log does not start with task_started")
        state = fold(kept)
        if state.finished and message is None and state.status != "failed":
            raise TaskError(
                task_id, f"event {at_seq} ends the task: add a message to go on from it"
            )
        fork_id = new_task_id or f"{task_id}-fork-{uuid.uuid4().hex[:6]}"
        carry = RunCarry(events=kept, state=state, message=message)
        limits = {
            k: v for k, v in {"max_steps": max_steps, "token_budget": token_budget}.items() if v
        }
        started = await self.client.start_workflow(
            AgentWorkflow.run,
            args=[first.task.model_copy(update=limits), carry],
            id=fork_id,
            task_queue=self.settings.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
        return TaskHandle(self, fork_id, started)

    async def list_tasks(
        self, status: str | None = None, page_size: int = 50, page_token: bytes | None = None
    ) -> tuple[list[TaskSummary], bytes | None]:
        """A page of tasks, newest first, optionally only those with an AgentStatus."""
        query = 'WorkflowType="AgentWorkflow"'
        if status is not None:
            query += f' AND AgentStatus="{status}"'
        executions = self.client.list_workflows(
            query, page_size=page_size, next_page_token=page_token
        )
        await executions.fetch_next_page()
        tasks = [
            TaskSummary(
                id=e.id,
                status=e.typed_search_attributes.get(search.AGENT_STATUS) or "pending",
                step=e.typed_search_attributes.get(search.AGENT_STEP),
                started_at=e.start_time,
                closed_at=e.close_time,
            )
            for e in executions.current_page or []
        ]
        return tasks, executions.next_page_token

    async def find(self, task_id: str) -> TaskHandle:
        """The handle of an existing task, as it is: raises TaskNotFoundError, changes nothing."""
        handle = self.get(task_id)
        await handle.describe()
        return handle

    def get(self, task_id: str) -> TaskHandle:
        return TaskHandle(self, task_id)

    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Items of the task's stream from offset `since`, ending after the terminal event.

        Observes only. An unknown task raises TaskNotFoundError at once, or once
        `wait_for_start` has passed without the task appearing.
        """
        return self._streams.subscribe(
            task_id, since=since, topics=topics, wait_for_start=wait_for_start
        )

    async def stream_head(self, task_id: str) -> int:
        """The offset the next stream item will get."""
        try:
            return await self._streams.head(task_id)
        except RPCError as err:
            raise _not_found(task_id, err) from err
