"""AgentRuntime: the client API. `run(task)`, `resume(task_id, approval)`, `stream(task_id, since)`.

run and resume return the same TaskHandle (waystation/client/handle.py); stream observes and
never executes: execution happens only in workers. Names say what they cost: `get` makes no
call, `find` asks Temporal whether the task exists, `resume` may reset a failed task,
`repair` resets a stuck one. Starting a task: waystation/client/starting.py.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncGenerator, Awaitable
from datetime import timedelta
from typing import Any, Literal, overload

from pydantic import TypeAdapter
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from typing_extensions import TypeVar

from waystation.activities.event_archive import read_archived, read_sealed
from waystation.activities.run_history import sealed_run
from waystation.activities.tool_modules import load_tools
from waystation.activities.tools import ToolRegistry
from waystation.client import starting, task_rights
from waystation.client.busy import sending
from waystation.client.forking import fork_input
from waystation.client.handle import QUERY_TIMEOUT, UPDATE_TIMEOUT, TaskHandle
from waystation.client.health import cannot_run, unanswered, worker_hint
from waystation.client.memory_access import MemoryAccess
from waystation.client.messaging import Delivery, deliver
from waystation.client.reset import repaired_points, reset_failed_task, reset_stuck_task
from waystation.client.schedules import ScheduleInfo, Schedules, ScheduleSpec
from waystation.client.serving_workers import check_servable, offers_of, seen_lately
from waystation.client.starting import WORKFLOW_TASK_TIMEOUT, start_agent
from waystation.client.streaming import UNANSWERED, StreamHub, StreamItem, worker_too_busy
from waystation.client.task_errors import (
    DecisionError,
    MessageRefusedError,
    NoWorkerError,
    TaskCancelledError,
    TaskEndedError,
    TaskError,
    TaskFailedError,
    TaskNotFoundError,
    UnknownToolsError,
    UnreadableTaskError,
    task_errors,
)
from waystation.client.task_list import InvalidPageTokenError, TaskSummary, list_page
from waystation.client.task_log import TaskLog
from waystation.client.task_rights import TaskRefusedError
from waystation.client.tree_stream import (
    InvalidCursorError,
    TreeCursor,
    TreeItem,
    TreeStream,
    parse_cursor,
)
from waystation.settings import Role, Settings
from waystation.vocabulary import STUCK, StatusFilter
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentState
from waystation.workflows.memory import with_namespace
from waystation.workflows.models import (
    AgentTask,
    Decision,
    Message,
    RepairNote,
    Resumption,
    schema_problem,
)
from waystation.workflows.run import WORKFLOW_TYPE, AgentRun, SealedRun

__all__ = [
    "QUERY_TIMEOUT",
    "UPDATE_TIMEOUT",
    "WORKFLOW_TASK_TIMEOUT",
    "AgentRuntime",
    "DecisionError",
    "InvalidCursorError",
    "InvalidPageTokenError",
    "MessageRefusedError",
    "NoWorkerError",
    "TaskCancelledError",
    "TaskEndedError",
    "TaskError",
    "TaskFailedError",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskSummary",
    "TreeItem",
    "UnknownToolsError",
    "UnreadableTaskError",
]

T = TypeVar("T")


WORKER_LISTING_GRACE = timedelta(seconds=5)
# An empty listing this soon after one named a worker is taken as Temporal missing it (it
# forgets a live poller until its next poll when it reloads a queue, a few seconds).
MISSED_WORKER_SECONDS = 10.0


class AgentRuntime:
    """The client side of waystation over one Temporal client and task queue."""

    def __init__(
        self, client: Client, settings: Settings | None = None, tools: ToolRegistry | None = None
    ) -> None:
        """`tools`: the tools the workers offer, which a task's `tools` may name besides its
        MCP servers' `server__tool`s; default: the settings' `tools` modules, which workers
        load alike (ToolDefinitionError if one cannot be loaded)."""
        self.client = client
        self.settings = settings or Settings()
        self.tools = (
            tools if tools is not None else load_tools(self.settings.tools, self.settings.agents)
        )
        self.tool_names = frozenset(self.tools.names())
        self.log = TaskLog(client, archive=functools.partial(read_archived, self.settings))
        self._streams = StreamHub(client, self.settings.task_queue, sealed=self.sealed)
        # The deployment's memory outside a task (its storage opens on first use).
        self.memory = MemoryAccess(self.settings)

    async def bounded(self, task_id: str, work: Awaitable[T], limit: timedelta, what: str) -> T:
        """`work`, or NoWorkerError saying whether no worker polls or all are busy (and the
        task errors Temporal's answers mean: waystation/client/task_errors.py)."""
        with task_errors(task_id):
            try:
                return await asyncio.wait_for(work, limit.total_seconds())
            except TimeoutError:
                raise await self.no_worker(task_id, what, limit) from None
            except WorkflowQueryFailedError as err:
                if not worker_too_busy(err):
                    raise
                # The worker took too long to replay the task for it (an overloaded machine):
                # as unanswered as a query no worker took, and as worth asking again.
                raise await self.no_worker(task_id, what, limit) from None
            except RPCError as err:
                if err.status in UNANSWERED:
                    # The server gave up on it: say, the worker holding the query died.
                    raise await self.no_worker(task_id, what, limit) from None
                # Refused while the workflow task keeps failing: on a payload the worker
                # cannot decrypt, the worker's sentence says so.
                if (problem := await cannot_run(self.client, task_id, err)) is not None:
                    raise problem from err
                raise

    async def no_worker(self, task_id: str, what: str, limit: timedelta) -> NoWorkerError:
        """The error for `what` unanswered within `limit`: whether no worker polls the task
        queue, or workers poll but did not answer."""
        queue = self.settings.task_queue
        return unanswered(task_id, what, limit, queue, await worker_hint(self.client, queue))

    def new_task(self, text: str, **fields: Any) -> AgentTask:
        """An AgentTask with this runtime's default model filled in."""
        return starting.new_task(self.settings, text, **fields)

    def with_defaults(self, task: AgentTask) -> AgentTask:
        """The task as it will run: what it leaves unset, the settings fill in (with no MCP
        servers named, every one they declare; the heartbeat timeout; the prices of the
        models it and its sub-agents call, which it keeps for good)."""
        agents = task_rights.callable_agents(task, self.tools)
        return starting.with_defaults(self.settings, task, self.tool_names, agents)

    def check_tools(self, task: AgentTask) -> None:
        """Refuse a task whose `tools` name a tool nobody offers (rather than drop it)."""
        starting.check_tools(task, self.tool_names)

    def admit(self, task: AgentTask, role: Role = "approver", task_id: str | None = None) -> None:
        """Refuse a task `role` may not start as given (waystation/client/task_rights.py): unknown
        tools (UnknownToolsError), settings wider than the role may set, limits above the
        deployment's caps, a client-chosen id of a sub-agent's form, a `parent` link
        (TaskRefusedError). `task` is as it will run (`with_defaults`)."""
        if task_id is not None:
            task_rights.check_task_id(task_id)
        self.check_tools(task)
        starting.check_cost_budget(task)
        servers = self.settings.mcp_server_configs()
        task_rights.admit(task, role, self.settings, self.tools, servers)

    async def check_workers(self, task: AgentTask) -> None:
        """Refuse a task no live worker of the queue can serve (TaskRefusedError, kind
        no_capable_worker), when every one says what it offers (client/serving_workers.py)."""
        # Temporal lists a worker only once it polls, and one that stopped for a while
        # after: a worker started a moment ago (say, to replace that one) gets a moment.
        deadline = asyncio.get_running_loop().time() + WORKER_LISTING_GRACE.total_seconds()
        agents = task_rights.callable_agents(task, self.tools)
        endpoints = self.settings.endpoints()
        queue = self.settings.task_queue
        refusal: TaskRefusedError | None = None
        while True:
            offers = await offers_of(self.client, self.settings)
            # No worker listed just after one was (or one refused the task): Temporal
            # missed it a moment, as it does when it reloads a queue; ask again.
            missed = not offers and (
                refusal is not None or seen_lately(self.client, queue, MISSED_WORKER_SECONDS)
            )
            if not missed:
                try:
                    check_servable(task, queue, offers, endpoints, agents)
                    return
                except TaskRefusedError as refused:
                    refusal = refused
            if asyncio.get_running_loop().time() >= deadline:
                if refusal is None:
                    return  # no worker after all: the task starts, to wait for one
                raise refusal
            await asyncio.sleep(0.5)

    @overload
    async def run(
        self,
        task: AgentTask | str,
        *,
        task_id: str | None = None,
        role: Role = "approver",
        tenant: str | None = None,
    ) -> TaskHandle[Any]: ...

    @overload
    async def run(
        self,
        task: AgentTask | str,
        *,
        task_id: str | None = None,
        output_type: type[T],
        role: Role = "approver",
        tenant: str | None = None,
    ) -> TaskHandle[T]: ...

    async def run(
        self,
        task: AgentTask | str,
        *,
        task_id: str | None = None,
        output_type: type[Any] | None = None,
        role: Role = "approver",
        tenant: str | None = None,
    ) -> TaskHandle[Any]:
        """Start a task (or, with a task_id already used, return that task: idempotent).
        With `output_type` (a pydantic model, or any type pydantic can schema) the task
        answers with data of that type: its JSON Schema is the task's output_schema, and
        the handle's `result().output` (and `output()`) is an instance of it. `role`: who
        asks (`admit` says what a reader may not set); code holding Temporal's credentials
        is an approver. `tenant`: who the task is for (its `tenant`; its sub-agents, its
        follow-ups and its forks keep it)."""
        task = self.with_defaults(self.new_task(task) if isinstance(task, str) else task)
        if tenant is not None:
            task = task.model_copy(update={"tenant": starting.checked_tenant(tenant)})
        task = with_namespace(task)  # stored with the task: its replay reads no setting
        if output_type is not None and task.output_schema is None:
            schema = TypeAdapter(output_type).json_schema()
            task = task.model_copy(update={"output_schema": schema_problem(schema)})
        self.admit(task, role, task_id)
        await starting.check_model(self.settings, task)  # a typo refused, not failed later
        await self.check_workers(task)
        task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        try:
            started = await start_agent(
                self.client,
                task_id,
                AgentRun(task=task),
                task_queue=self.settings.task_queue,
                text=task.task,
            )
        except WorkflowAlreadyStartedError:  # a closed task with this id
            return TaskHandle(self, task_id, awaits_turn=0, output_type=output_type)
        # Keep the started handle: it follows the run chain from this start.
        return TaskHandle(self, task_id, started, awaits_turn=0, output_type=output_type)

    @functools.cached_property
    def schedules(self) -> Schedules:
        """This queue's schedules: list, describe, pause, resume, trigger, change, delete
        (waystation/client/schedules.py)."""
        return Schedules(self.client, self.settings.task_queue)

    async def create_schedule(
        self, spec: ScheduleSpec, *, role: Role = "approver", tenant: str | None = None
    ) -> ScheduleInfo:
        """Create a schedule whose firings run `spec.task` as `run` would start it: the
        settings' defaults filled in now, admitted for `role` (a reader may not widen it),
        its model checked; `tenant` as `run`'s. A firing is a task (docs/schedules.md)."""
        task = self.with_defaults(spec.task)
        if tenant is not None:
            task = task.model_copy(update={"tenant": starting.checked_tenant(tenant)})
        task = with_namespace(task)  # the firings' memory, as `run` resolves a task's
        self.admit(task, role, spec.name)
        await starting.check_model(self.settings, task)
        return await self.schedules.create(spec.model_copy(update={"task": task}))

    async def send(self, task_id: str, content: str, **options: Any) -> TaskHandle:
        """`get(task_id).send(content, ...)`: see TaskHandle.send."""
        return await self.get(task_id).send(content, **options)

    async def sealed(self, task_id: str, run_id: str) -> SealedRun | None:
        """What closed run `run_id` sealed as it closed, if it is its very end and this
        client has the workers' storage (activities/run_history.py)."""
        reader = functools.partial(read_sealed, self.settings)
        return await sealed_run(self.client, task_id, run_id, reader)

    async def deliver(self, task_id: str, message: Message) -> Delivery:
        """Deliver a message to the task: see waystation/client/messaging.py."""
        sealed = functools.partial(read_sealed, self.settings)
        return await deliver(
            self.client, task_id, message, task_queue=self.settings.task_queue, sealed=sealed
        )

    async def resume(
        self,
        task_id: str,
        approval: Decision | None = None,
        *,
        max_steps: int | None = None,
        token_budget: int | None = None,
        cost_budget: float | None = None,
        message: str | None = None,
    ) -> TaskHandle:
        """The handle of an existing task, going on from where it stopped.

        A running task gets `approval` applied if one is given. A failed task goes on from
        its last good point (before the activity that failed it, or just before the limit
        it hit), with `max_steps` / `token_budget` / `cost_budget` raised and `message` added
        if given; its event log then shows a `resumed` event naming the failure. A task whose
        state says `failed` resumes at once, even while its run is still closing.
        """
        task_rights.check_max_steps(max_steps, self.settings)
        handle = self.get(task_id)
        resumption = Resumption(
            max_steps=max_steps, token_budget=token_budget, cost_budget=cost_budget, message=message
        )
        seen = await handle.overview()
        if seen.status == WorkflowExecutionStatus.RUNNING:
            state = await handle.state()
            if state.status != "failed":
                raised = (max_steps, token_budget, cost_budget, message)
                if any(given is not None for given in raised):
                    raise TaskError(task_id, f"task {task_id} is {state.status}, not failed")
                if approval is not None:
                    await handle.decide(approval)
                return handle
            # It has just failed and its run waits a moment for this very signal.
            if await self._resume_in_grace(handle, state, resumption):
                return handle
            seen = await handle.overview()
        if seen.status in (
            WorkflowExecutionStatus.FAILED,
            WorkflowExecutionStatus.TERMINATED,
            WorkflowExecutionStatus.TIMED_OUT,
        ):
            await reset_failed_task(self.client, task_id, seen.run_id, resumption)
            return self.get(task_id)
        status = seen.status.name.lower() if seen.status else "unknown"
        raise TaskError(task_id, f"task {task_id} is {status}: there is nothing to resume")

    async def _resume_in_grace(
        self, handle: TaskHandle, state: AgentState, resumption: Resumption
    ) -> bool:
        """A task that has just failed waits a moment for a resumption: send it there."""
        note = resumption.model_copy(
            update={"failure": state.failure, "failure_kind": state.failure_kind}
        )
        try:
            await sending(lambda: handle._handle.signal(AgentWorkflow.resume_after_failure, note))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False  # it closed meanwhile: reset it instead
            raise
        return True

    async def repair(self, task_id: str, *, by: str) -> TaskHandle:
        """Reset a stuck task to its last good workflow task, with the signals and Updates
        sent since re-applied; its log shows a `repaired` event. Never twice at one point."""
        handle = await self.find(task_id)
        found = await handle.stuck()
        if found is None:
            raise TaskError(task_id, f"task {task_id} is not stuck: its workflow tasks complete")
        if found.reset_to_event is None:
            raise TaskError(
                task_id,
                f"task {task_id} cannot be repaired: its first workflow task fails, so there "
                f"is no earlier point to reset it to: {found.problem}",
            )
        description = await handle.describe()
        history = await handle._handle.fetch_history()
        already = await repaired_points(self.client, history.events)
        if found.reset_to_event in already:
            raise TaskError(
                task_id,
                f"task {task_id} was repaired once at event {found.reset_to_event} and is stuck "
                f"there again, so the fault is in the code, not its history: {found.problem}",
            )
        note = RepairNote(problem=found.problem, reset_to_event=found.reset_to_event, by=by)
        await reset_stuck_task(self.client, task_id, description.run_id or "", note)
        return self.get(task_id)

    async def fork(
        self,
        task_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        new_task_id: str | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
        cost_budget: float | None = None,
        role: Role = "approver",
    ) -> TaskHandle:
        """A new task that starts from the state just after event `at_seq` of `task_id`.

        The original is untouched. A fork at a thought runs that thought's calls first (a
        call that needs approval and has not run asks for a decision in the fork, even one
        approved in the original);
        `message` is added as the next user message. The fork has the limits in force at
        `at_seq` (a resume may have raised the original's), or `max_steps` / `token_budget` /
        `cost_budget` if given. The fork has its own id and its own stream (offsets from
        0). The fork is a task `role` starts: its settings are admitted as `run` admits a
        new task's (a fork of a sub-agent's task stands alone: no `parent`).
        """
        if new_task_id is not None:
            task_rights.check_task_id(new_task_id)
        task_rights.check_max_steps(max_steps, self.settings)
        kept = await self.get(task_id).events(0, limit=at_seq + 1)
        limits = {"max_steps": max_steps, "token_budget": token_budget, "cost_budget": cost_budget}
        run = await fork_input(self.log, task_id, kept, at_seq, message=message, limits=limits)
        assert run.task is not None
        self.admit(run.task, role)
        fork_id = new_task_id or f"{task_id}-fork-{uuid.uuid4().hex[:6]}"
        started = await start_agent(
            self.client,
            fork_id,
            run,
            task_queue=self.settings.task_queue,
            text=run.task.task,
            on_conflict=WorkflowIDConflictPolicy.FAIL,
        )
        return TaskHandle(self, fork_id, started)

    async def list_tasks(
        self,
        status: StatusFilter | None = None,
        page_size: int = 50,
        page_token: bytes | None = None,
        *,
        tenant: str | None = None,
    ) -> tuple[list[TaskSummary], bytes | None]:
        """A page of tasks, newest started first (waystation/client/task_list.py says how, since
        Temporal's visibility takes no ORDER BY), optionally only those with a status: an
        AgentStatus, or `stuck` (Temporal reports its workflow task failing again and
        again). Each task is listed once, as its latest run; a task keeps its place in the
        pages while it closes. InvalidPageTokenError for a token no listing gave out.
        `tenant`: only that tenant's tasks (its AgentTenant)."""
        query = f'WorkflowType="{WORKFLOW_TYPE}"'
        if tenant is not None:
            query += f' AND {search.AGENT_TENANT.name}="{starting.checked_tenant(tenant)}"'
        if status == STUCK:
            query += f" AND {search.STUCK_QUERY}"
        elif status is not None:
            query += f' AND {search.AGENT_STATUS.name}="{status}"'
        return await list_page(
            self.client, query, page_size, page_token, running_only=status == STUCK
        )

    async def find(self, task_id: str) -> TaskHandle:
        """The handle of an existing task, as it is: raises TaskNotFoundError, changes nothing."""
        handle = self.get(task_id)
        await handle.describe()
        return handle

    def get(self, task_id: str) -> TaskHandle:
        """A handle for `task_id`, without asking anyone whether it exists."""
        return TaskHandle(self, task_id)

    @overload
    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
        tree: Literal[False] = False,
        after: str | None = None,
    ) -> AsyncGenerator[StreamItem, None]: ...

    @overload
    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
        tree: Literal[True],
        after: str | None = None,
    ) -> AsyncGenerator[TreeItem, None]: ...

    @overload
    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
        tree: bool,
        after: str | None = None,
    ) -> AsyncGenerator[StreamItem, None]: ...

    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
        tree: bool = False,
        after: str | None = None,
    ) -> AsyncGenerator[StreamItem, None] | AsyncGenerator[TreeItem, None]:
        """Items of the task's stream from offset `since`, ending after the terminal event;
        with `follow`, across the conversation's turns, ending only when it fails or is
        cancelled (after each answer it waits for the next message, asking Temporal, not a
        worker).

        With `tree`, its sub-agents' items too (and theirs), each a TreeItem naming the
        task it comes from and its path (waystation/client/tree_stream.py); the stream still ends
        with the task's own end. `after` is an item's `cursor`: the stream goes on right
        after that item, in every stream of the tree. A plain `since` counts the task's own
        offsets: the sub-agents it starts from there on are followed from their first
        item, and those it started before (still at work at `since`) are left out.
        InvalidCursorError for an `after` no stream gave out.

        Observes only. An unknown task raises TaskNotFoundError at once, or once
        `wait_for_start` has passed without the task appearing.
        """
        cursor = parse_cursor(after) if after is not None else TreeCursor(since)
        if tree:
            merged = TreeStream(
                self._streams,
                task_id,
                cursor,
                topics,
                wait_for_start=wait_for_start,
                follow=follow,
            )
            return merged.items()
        return self._streams.subscribe(
            task_id,
            since=cursor.root_next,
            topics=topics,
            wait_for_start=wait_for_start,
            follow=follow,
        )

    async def stream_head(self, task_id: str, within: timedelta = QUERY_TIMEOUT) -> int:
        """The offset the next stream item will get (a query: NoWorkerError if no worker
        answers it `within`)."""
        head = self._streams.head(task_id)
        return await self.bounded(task_id, head, within, "the stream's head query")
