"""AgentRuntime: the client API. `run(task)`, `resume(task_id, approval)`, `stream(task_id, since)`.

run and resume return the same TaskHandle; stream observes and never executes: execution
happens only in workers. Names say what they cost: `get` makes no call, `find` asks
Temporal whether the task exists, `resume` may reset a failed task, `repair` resets a
stuck one.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Literal, cast, overload

from pydantic import TypeAdapter
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from typing_extensions import TypeVar

from waystation.activities.event_archive import read_archived
from waystation.activities.tool_modules import load_tools
from waystation.activities.tools import ToolRegistry
from waystation.client import task_rights
from waystation.client.busy import reading, sending
from waystation.client.health import (
    Stuck,
    TaskOverview,
    cannot_run,
    overview,
    stuck,
    unanswered,
    with_failures_readable,
    worker_hint,
)
from waystation.client.messaging import Delivery, deliver
from waystation.client.reset import reset_failed_task, reset_stuck_task
from waystation.client.streaming import StreamHub, StreamItem
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
    undecryptable,
    unreadable,
)
from waystation.client.task_list import InvalidPageTokenError, TaskSummary, first_start, list_page
from waystation.client.task_log import TaskLog
from waystation.client.task_tree import TaskTree, read_tree
from waystation.client.tree_stream import (
    InvalidCursorError,
    TreeCursor,
    TreeItem,
    TreeStream,
    parse_cursor,
)
from waystation.settings import Role, Settings
from waystation.vocabulary import STUCK, TERMINAL_STATUSES, StatusFilter
from waystation.workflows import errors, options, search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.approval import decision_problem
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    Done,
    Resumed,
    TaskStarted,
    UserMessage,
    conversation_of,
    fold,
)
from waystation.workflows.forks import fork_start
from waystation.workflows.models import (
    AgentTask,
    Answer,
    AnswerOutcome,
    ChatMessage,
    Decision,
    DecisionOutcome,
    FailureDetail,
    Message,
    ModelSettings,
    RepairNote,
    Resumption,
    schema_problem,
)
from waystation.workflows.questions import answer_problem
from waystation.workflows.run import WORKFLOW_TYPE, AgentOutcome, AgentRun, RunCarry, RunRef
from waystation.workflows.tool_catalog import split_name

__all__ = [
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

WORKFLOW_TASK_TIMEOUT = options.WORKFLOW_TASK_TIMEOUT  # (workflows/options.py)
# A query or Update that no worker answers must not hang its caller.
QUERY_TIMEOUT = timedelta(seconds=10)
UPDATE_TIMEOUT = timedelta(seconds=30)
RPC_GRACE = timedelta(seconds=5)

T = TypeVar("T")
OutputT = TypeVar("OutputT", default=Any)


@dataclass(frozen=True)
class _Deadline:
    """One call's bound, shared by the queries it sends one after another."""

    within: timedelta
    at: float  # on the event loop's clock

    @classmethod
    def after(cls, within: timedelta) -> _Deadline:
        return cls(within, asyncio.get_running_loop().time() + within.total_seconds())

    def left(self) -> timedelta:
        return timedelta(seconds=max(0.0, self.at - asyncio.get_running_loop().time()))


@dataclass(frozen=True)
class _Awaited:
    """The answer a handle waits for: to a message it sent, or of a turn (0 for `run`)."""

    message_id: str | None = None
    turn: int | None = None


class TaskHandle(Generic[OutputT]):
    """One task, however it was reached: result, state, events, approve, send, cancel,
    stream. `run` gives a handle whose result is the task's own answer; `send` makes the
    handle wait for the answer to that message; other handles give the latest answer.
    With an `output_type` (a pydantic model), `output()` and `result().output` are one."""

    def __init__(
        self,
        runtime: AgentRuntime,
        task_id: str,
        workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] | None = None,
        *,
        awaits_turn: int | None = None,
        output_type: type[OutputT] | None = None,
    ) -> None:
        self._runtime = runtime
        self.id = task_id
        self._output_type = output_type
        self._handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            workflow or runtime.client.get_workflow_handle_for(AgentWorkflow.run, task_id)
        )
        self._awaited = _Awaited(turn=awaits_turn)
        self.began_turn = False
        """The last message sent began a new turn (the task had answered and its run closed)."""
        self.stream_from: int | None = None
        """Where that new turn's stream items start (a follow-up's live view starts there)."""

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"

    async def send(
        self,
        content: str,
        *,
        interrupt: bool = False,
        max_steps: int | None = None,
        sender: str | None = None,
        message_id: str | None = None,
    ) -> TaskHandle[OutputT]:
        """Send the task a message: a steer while it works (taken at its next model call;
        with `interrupt`, the model call in flight is cancelled for it), or a follow-up once
        it has answered (the same task goes on). Returns this handle, whose `result()` is
        then the answer to this message. A repeat with the same `message_id` counts once.

        Raises MessageRefusedError for a failed or cancelled task (resume or fork it), and
        ValidationError for an empty message or one longer than a task's text may be."""
        message = Message(
            content=content,
            message_id=message_id or f"msg-{uuid.uuid4().hex}",
            interrupt=interrupt,
            max_steps=max_steps,
            sender=sender,
        )
        task_rights.check_max_steps(max_steps, self._runtime.settings)
        delivery = await self._runtime.deliver(self.id, message)
        self._handle = delivery.workflow
        self._awaited = _Awaited(message_id=message.message_id)
        self.began_turn = delivery.started
        self.stream_from = delivery.stream_from
        return self

    @property
    def awaited_message(self) -> str | None:
        """The id of the message whose answer `result()` waits for (the last one sent)."""
        return self._awaited.message_id

    async def result(self) -> AgentOutcome:
        """Wait for the answer (see the class docstring for which). Raises TaskFailedError
        or TaskCancelledError if the task ends otherwise first."""
        outcome = await self._closing_outcome()
        awaited = self._awaited
        if awaited.message_id is not None and awaited.message_id not in outcome.message_ids:
            outcome = await self._answer_in_log(outcome, lambda e: _takes(e, awaited.message_id))
        elif awaited.turn is not None and outcome.turn != awaited.turn:
            outcome = await self._answer_in_log(outcome, lambda e: _begins_turn(e, awaited.turn))
        if self._output_type is not None and outcome.output is not None:
            typed = TypeAdapter(self._output_type).validate_python(outcome.output)
            outcome = outcome.model_copy(update={"output": typed})
        return outcome

    async def output(self) -> OutputT:
        """The answer's data, as `output_type` (the task must have an output schema)."""
        outcome = await self.result()
        if outcome.output is None and self._output_type is not None:
            raise TaskError(self.id, f"task {self.id} answered without data: {outcome.result}")
        return cast(OutputT, outcome.output)

    async def _answer_in_log(
        self, closing: AgentOutcome, begins: Callable[[AgentEvent], bool]
    ) -> AgentOutcome:
        """The answer the log holds after the event `begins` matches: the run went on to a
        later turn (a message came as it answered) before it closed."""
        began = False
        for event in await self.events():
            began = began or begins(event)
            if began and isinstance(event, Done):
                return AgentOutcome(
                    result=event.result,
                    steps=event.step,
                    usage=event.usage or closing.usage,
                    last_seq=event.seq,
                    turn=event.turn,
                    output=event.output,
                )
        return closing

    async def _closing_outcome(self) -> AgentOutcome:
        try:
            return await self._handle.result()
        except WorkflowFailureError as err:
            cause = err.cause
            if isinstance(cause, CancelledError):
                raise TaskCancelledError(self.id, f"task {self.id} was cancelled") from err
            if isinstance(cause, ApplicationError):
                detail = FailureDetail.of(cause.details)
                kind = detail.kind if detail else None
                raise TaskFailedError(self.id, cause.message, kind) from err
            raise TaskFailedError(self.id, str(cause or err), None) from err
        except RPCError as err:
            raise _not_found(self.id, err) from err
        except ValueError as err:  # the answer, encrypted with a key this side lacks
            if (problem := unreadable(self.id, err)) is not None:
                raise problem from err
            raise

    async def state(self, within: timedelta = QUERY_TIMEOUT) -> AgentState:
        """The folded state (a worker answers the query; NoWorkerError if none does `within`)."""
        return await self._runtime.bounded(
            self.id, self._query_state(within), within, "the state query"
        )

    async def _query_state(self, within: timedelta) -> AgentState:
        # The RPC's own deadline comes later, so the caller's bound is what ends the wait.
        try:
            return await self._handle.query(AgentWorkflow.state, rpc_timeout=within + RPC_GRACE)
        except RPCError as err:
            raise _not_found(self.id, err) from err
        except (ValueError, WorkflowQueryFailedError) as err:
            if (problem := unreadable(self.id, err)) is not None:
                raise problem from err
            raise

    async def _state_by(
        self, deadline: _Deadline, what: str, *, wait_for_a_worker: bool
    ) -> AgentState:
        """The state, asked again after each query a status query's bound leaves unanswered,
        until `deadline`. A query can be lost: the SDK drops the queries buffered for a run
        it evicts (say, after a workflow task that came back late), and the server holds a
        lost query until its deadline, so no one query may take the whole wait. When no
        worker polls at all, NoWorkerError comes at once, unless `wait_for_a_worker`."""
        while (left := deadline.left()) > timedelta(0):
            bound = min(left, QUERY_TIMEOUT)
            try:
                return await asyncio.wait_for(self._query_state(bound), bound.total_seconds())
            except TimeoutError:
                if wait_for_a_worker:
                    continue
                queue = self._runtime.settings.task_queue
                if (hint := await worker_hint(self._runtime.client, queue)) is not None:
                    raise unanswered(self.id, what, bound, queue, hint) from None
        raise await self._runtime.no_worker(self.id, what, deadline.within)

    async def events(
        self, since: int = 0, limit: int = 100_000, within: timedelta = QUERY_TIMEOUT
    ) -> list[AgentEvent]:
        """Events with seq >= since (at most `limit`), across the task's chain of runs."""
        page = self._runtime.log.page(self.id, since, limit)
        try:
            return await self._runtime.bounded(self.id, page, within, "the events query")
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def queued_messages(self, within: timedelta = QUERY_TIMEOUT) -> list[Message]:
        """Messages the task has received and not yet taken (its next model call will)."""
        query = self._handle.query(AgentWorkflow.queued_messages, rpc_timeout=within + RPC_GRACE)
        try:
            return await self._runtime.bounded(self.id, query, within, "the messages query")
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def overview(self) -> TaskOverview:
        """Temporal's view of the latest run: status, run id and memo (no worker needed)."""
        try:
            return await overview(self._runtime.client, self.id)
        except RPCError as err:
            raise _not_found(self.id, err) from err
        except ValueError as err:  # its memo, encrypted with a key this side lacks
            if (problem := unreadable(self.id, err)) is not None:
                raise problem from err
            raise

    async def conversation(self, within: timedelta = QUERY_TIMEOUT) -> list[ChatMessage]:
        """The messages the model is sent next, read from the task's events (NoWorkerError
        if no worker answers a query `within`)."""
        events = await self.events(within=within)
        return conversation_of(events, await self.state(within))

    async def tree(self, state: AgentState | None = None) -> TaskTree:
        """The sub-agents below this task, nested, each with its own status, and the task
        that called it, from Temporal (waystation/client/task_tree.py); `state` saves its query."""
        state = state if state is not None else await self.state()
        seen = await self.overview()
        return await read_tree(self._runtime.client, self.id, seen.memo, state.children)

    async def pending_requests(self) -> dict[str, dict[str, Any]]:
        """Requests waiting for a person, as committed to history (no worker needed)."""
        memo = (await self.overview()).memo
        return {p["request_id"]: p for p in memo.get(search.MEMO_PENDING) or []}

    async def approve(
        self,
        request_id: str | None = None,
        *,
        reject: bool = False,
        message: str | None = None,
        arguments: dict[str, Any] | None = None,
        approver: str | None = None,
        shown: str | None = None,
        within: timedelta = UPDATE_TIMEOUT,
    ) -> DecisionOutcome:
        """Decide one approval request; with no id, the only pending one (or, when none is
        pending, a repeat of the latest decision gets its outcome back). With `shown` (the
        request's `digest` as the person saw it) a request for any other call is refused.
        Its queries take `within` in all, as `decide`'s."""
        deadline = _Deadline.after(within)
        if request_id is None:
            state = await self._state_by(deadline, "the state query", wait_for_a_worker=False)
            pending = list(state.pending_approvals)
            if len(pending) > 1:
                raise DecisionError(
                    self.id,
                    f"task {self.id} has {len(pending)} pending approval requests; name one: "
                    + ", ".join(pending),
                    errors.UNKNOWN_REQUEST,
                )
            if not pending and not state.decisions:
                raise DecisionError(
                    self.id,
                    f"task {self.id} is {state.status}, not waiting for approval",
                    errors.TASK_NOT_WAITING,
                )
            request_id = pending[0] if pending else list(state.decisions)[-1]
        decision = Decision(
            request_id=request_id,
            decision="reject" if reject else "approve",
            message=message,
            arguments=arguments,
            approver=approver,
            shown=shown,
        )
        return await self._decide(decision, deadline)

    async def decide(
        self, decision: Decision, *, within: timedelta = UPDATE_TIMEOUT
    ) -> DecisionOutcome:
        """Apply a decision and return the outcome that took effect (a repeat gets the first).

        The decision is checked against the task's state first, so a refused one never
        reaches the task; then it travels as a Signal and its outcome is read back. Signals
        are safe whatever moment they land in (their handler only records), unlike an
        Update right after a query a cold worker answered (docs/never-stuck.md).

        Its queries take `within` in all (the signal between them is sent as soon as
        Temporal takes it). Each query is sent again after a status query's bound: a loaded
        worker may answer late, or lose the query, and giving up early would report a
        decision the task did take as if no worker had been there. When no worker polls at
        all, the check says so after one such bound, before anything is sent. After the
        decision is sent, NoWorkerError is safe to retry: a repeat gets the first outcome.
        """
        return await self._decide(decision, _Deadline.after(within))

    async def _decide(self, decision: Decision, deadline: _Deadline) -> DecisionOutcome:
        decision = decision.model_copy(update={"decision_id": uuid.uuid4().hex})
        state = await self._state_by(deadline, "the state query", wait_for_a_worker=False)
        if (problem := decision_problem(state, decision)) is not None:
            raise DecisionError(self.id, problem.message, problem.kind)
        if (existing := state.decisions.get(decision.request_id)) is not None:
            return existing.model_copy(update={"duplicate": True})
        signal = AgentWorkflow.reject if decision.decision == "reject" else AgentWorkflow.approve
        try:
            await sending(lambda: self._handle.signal(signal, decision))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and "completed" in err.message:
                return await self._decision_after_close(decision, deadline)
            raise _not_found(self.id, err) from err
        outcome = await self._outcome_of(decision.request_id, deadline)
        if outcome.decision_id == decision.decision_id:
            return outcome
        if decision.repeats(outcome):
            return outcome.model_copy(update={"duplicate": True})
        raise DecisionError(
            self.id,
            f"request {decision.request_id} was already decided: {outcome.decision}"
            + (f" by {outcome.approver}" if outcome.approver else ""),
            errors.DECISION_CONFLICT,
        )

    async def _outcome_of(self, request_id: str, deadline: _Deadline) -> DecisionOutcome:
        return await self._read_back(lambda s: s.decisions.get(request_id), deadline, "decision")

    async def _read_back(
        self, lookup: Callable[[AgentState], T | None], deadline: _Deadline, what: str
    ) -> T:
        # It is sent: a worker that is gone for now may be back within the wait.
        pause = 0.02
        while True:
            state = await self._state_by(deadline, f"the {what}", wait_for_a_worker=True)
            if (outcome := lookup(state)) is not None:
                return outcome
            await asyncio.sleep(min(pause, deadline.left().total_seconds()))
            pause = min(pause * 1.5, 0.25)

    async def answer(
        self,
        text: str,
        request_id: str | None = None,
        *,
        answerer: str | None = None,
        within: timedelta = UPDATE_TIMEOUT,
    ) -> AnswerOutcome:
        """Answer a question the model asked; with no id, the only pending one. The first
        answer wins: a repeat, or someone else's answer that came later, gets the first one
        back (`duplicate`). An answer that is not one of the question's choices, an unknown
        question and a task not waiting are refused with a sentence, nothing sent. Its
        queries take `within` in all, as a decision's."""
        deadline = _Deadline.after(within)
        state = await self._state_by(deadline, "the state query", wait_for_a_worker=False)
        if request_id is None:
            pending = list(state.pending_questions)
            if len(pending) > 1:
                raise DecisionError(
                    self.id,
                    f"task {self.id} has {len(pending)} pending questions; name one: "
                    + ", ".join(pending),
                    errors.UNKNOWN_REQUEST,
                )
            if not pending and not state.answers:
                raise DecisionError(
                    self.id,
                    f"task {self.id} is {state.status}, not waiting for an answer",
                    errors.TASK_NOT_WAITING,
                )
            request_id = pending[0] if pending else list(state.answers)[-1]
        given = Answer(
            request_id=request_id, answer=text, answerer=answerer, answer_id=uuid.uuid4().hex
        )
        if (problem := answer_problem(state, given)) is not None:
            raise DecisionError(self.id, problem.message, problem.kind)
        if (existing := state.answers.get(request_id)) is not None:
            return existing.model_copy(update={"duplicate": True})
        try:
            await sending(lambda: self._handle.signal(AgentWorkflow.answer_signal, given))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and "completed" in err.message:
                raise DecisionError(
                    self.id,
                    f"task {self.id} has ended: not waiting for an answer",
                    errors.TASK_NOT_WAITING,
                ) from err
            raise _not_found(self.id, err) from err
        outcome = await self._read_back(lambda s: s.answers.get(request_id), deadline, "answer")
        if outcome.answer_id == given.answer_id:
            return outcome
        return outcome.model_copy(update={"duplicate": True})

    async def _decision_after_close(
        self, decision: Decision, deadline: _Deadline
    ) -> DecisionOutcome:
        # A closed task takes no decision, but a repeat of one it applied still gets the
        # first outcome, and anything else the same refusal as before. One query, with the
        # time left (a status query's at least): a closed run is replayed to answer it, which
        # a long one takes a while, and each query sent again would replay it again.
        state = await self.state(max(deadline.left(), QUERY_TIMEOUT))
        problem = decision_problem(state, decision)
        if problem is not None:
            raise DecisionError(self.id, problem.message, problem.kind)
        existing = state.decisions.get(decision.request_id)
        if existing is None:
            raise DecisionError(
                self.id,
                f"task is {state.status}, not waiting for approval (request {decision.request_id})",
                errors.TASK_NOT_WAITING,
            )
        return existing.model_copy(update={"duplicate": True})

    async def describe(self) -> WorkflowExecutionDescription:
        """Temporal's view of the task's latest run (no worker needed)."""
        try:
            return await reading(self._handle.describe)
        except RPCError as err:
            raise _not_found(self.id, err) from err

    async def stuck(self) -> Stuck | None:
        """Whether the task's workflow task keeps failing, and with what (no worker needed).
        UnreadableTaskError when it fails on a payload the worker cannot decrypt: no repair
        helps, the keys must change (then the task moves on by itself)."""
        description = await self.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
        history = await self._handle.fetch_history()
        converter = self._runtime.client.data_converter
        events = await with_failures_readable(converter, list(history.events))
        found = stuck(description, events)
        if found is not None:
            failing = f"task {self.id} is stuck (its workflow task failed {found.attempts} times)"
            if (problem := undecryptable(self.id, found.problem, failing)) is not None:
                raise problem
        return found

    async def cancel(self) -> None:
        """Request cancellation: the running call is cancelled, a `cancelled` event follows.
        A task that has already ended raises TaskEndedError (Temporal would take the request
        and do nothing)."""
        try:
            seen: TaskOverview | None = await self.overview()
        except UnreadableTaskError:
            seen = None  # its memo is sealed with a key this side lacks: cancel it regardless
        if seen is not None and (ended := _ended_as(seen)) is not None:
            raise TaskEndedError(
                self.id, f"task {self.id} has already ended ({ended}): there is nothing to cancel"
            )
        try:
            await self._handle.cancel()
        except RPCError as err:
            raise _not_found(self.id, err) from err

    def stream(
        self,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        follow: bool = False,
        tree: bool = False,
        after: str | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """`AgentRuntime.stream` of this task (with `tree`, its items are TreeItems)."""
        return self._runtime.stream(
            self.id, since=since, topics=topics, follow=follow, tree=tree, after=after
        )


def _takes(event: AgentEvent, message_id: str | None) -> bool:
    return isinstance(event, UserMessage) and event.message_id == message_id


def _begins_turn(event: AgentEvent, turn: int | None) -> bool:
    return (
        event.type == "task_started"
        if turn == 0
        else (isinstance(event, UserMessage) and event.turn == turn)
    )


def _summary(text: str, limit: int = 200) -> str:
    """What the Web UI shows for a task (encoded like every payload when a codec is on)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _ended_as(seen: TaskOverview) -> str | None:
    """The status a task ended with, from Temporal's view (a failed task's run may wait a
    moment more for a resumption), or None while it goes on."""
    said = seen.memo.get(search.MEMO_STATUS)
    if said in TERMINAL_STATUSES:
        return str(said)
    if seen.status not in (None, WorkflowExecutionStatus.RUNNING):
        return str(said or seen.status.name.lower())
    return None


def _limits_in_force(task: AgentTask, events: list[AgentEvent]) -> AgentTask:
    """`task` with the limits in force after `events`: those the last `resumed` event left
    (each records both; one recorded before events carried limits has neither), and a
    later message's max_steps for its turn."""
    update: dict[str, Any] = {}
    for event in reversed(events):
        if isinstance(event, UserMessage) and event.max_steps is not None:
            update.setdefault("max_steps", event.max_steps)
        if isinstance(event, Resumed) and event.max_steps is not None:
            update.setdefault("max_steps", event.max_steps)
            update["token_budget"] = event.token_budget
            break
    return task.model_copy(update=update) if update else task


def _not_found(task_id: str, err: RPCError) -> Exception:
    if err.status == RPCStatusCode.NOT_FOUND:
        return TaskNotFoundError(task_id, f"no task with id {task_id!r}")
    return err


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
        self._streams = StreamHub(client, self.settings.task_queue)

    async def bounded(self, task_id: str, work: Awaitable[T], limit: timedelta, what: str) -> T:
        """`work`, or NoWorkerError saying whether no worker polls or all are busy."""
        try:
            return await asyncio.wait_for(work, limit.total_seconds())
        except TimeoutError:
            raise await self.no_worker(task_id, what, limit) from None
        except (ValueError, WorkflowQueryFailedError) as err:
            # A payload this side cannot decrypt: here, or in the worker that answers.
            if (problem := unreadable(task_id, err)) is not None:
                raise problem from err
            raise
        except RPCError as err:
            # Refused while the workflow task keeps failing: on a payload the worker cannot
            # decrypt, the worker's sentence says so.
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
        fields.setdefault("model", ModelSettings(name=self.settings.default_model))
        return AgentTask(task=text, **fields)

    def with_defaults(self, task: AgentTask) -> AgentTask:
        """The task as it will run: what it leaves unset, the settings fill in (with no MCP
        servers named, every one they declare; the heartbeat timeout)."""
        defaults: dict[str, Any] = {}
        if task.mcp_servers is None:
            defaults["mcp_servers"] = list(self.settings.mcp_server_configs())
        heartbeat = self.settings.heartbeat_timeout_seconds
        if task.heartbeat_timeout_seconds is None and heartbeat is not None:
            defaults["heartbeat_timeout_seconds"] = heartbeat
        return task.model_copy(update=defaults) if defaults else task

    def check_tools(self, task: AgentTask) -> None:
        """Refuse a task whose `tools` name a tool nobody offers (rather than drop it)."""
        servers = set(task.mcp_servers or [])
        unknown = [
            name
            for name in task.tools or []
            if name not in self.tool_names
            and ((split := split_name(name)) is None or split[0] not in servers)
        ]
        if not unknown:
            return
        named = ", ".join(repr(n) for n in unknown)
        offered = ", ".join(sorted(self.tool_names))
        mcp = (
            f"; MCP tools are server__tool for the servers {', '.join(sorted(servers))}"
            if servers
            else ""
        )
        raise UnknownToolsError(
            unknown, f"unknown tool(s) in the task's tools: {named} (the tools are {offered}{mcp})"
        )

    def admit(self, task: AgentTask, role: Role = "approver", task_id: str | None = None) -> None:
        """Refuse a task `role` may not start as given (waystation/client/task_rights.py): unknown
        tools (UnknownToolsError), settings wider than the role may set, limits above the
        deployment's caps, a client-chosen id of a sub-agent's form, a `parent` link
        (TaskRefusedError). `task` is as it will run (`with_defaults`)."""
        if task_id is not None:
            task_rights.check_task_id(task_id)
        self.check_tools(task)
        servers = self.settings.mcp_server_configs()
        task_rights.admit(task, role, self.settings, self.tools, servers)

    @overload
    async def run(
        self, task: AgentTask | str, *, task_id: str | None = None, role: Role = "approver"
    ) -> TaskHandle[Any]: ...

    @overload
    async def run(
        self,
        task: AgentTask | str,
        *,
        task_id: str | None = None,
        output_type: type[T],
        role: Role = "approver",
    ) -> TaskHandle[T]: ...

    async def run(
        self,
        task: AgentTask | str,
        *,
        task_id: str | None = None,
        output_type: type[Any] | None = None,
        role: Role = "approver",
    ) -> TaskHandle[Any]:
        """Start a task (or, with a task_id already used, return that task: idempotent).
        With `output_type` (a pydantic model, or any type pydantic can schema) the task
        answers with data of that type: its JSON Schema is the task's output_schema, and
        the handle's `result().output` (and `output()`) is an instance of it. `role`: who
        asks (`admit` says what a reader may not set); code holding Temporal's credentials
        is an approver."""
        task = self.with_defaults(self.new_task(task) if isinstance(task, str) else task)
        if output_type is not None and task.output_schema is None:
            schema = TypeAdapter(output_type).json_schema()
            task = task.model_copy(update={"output_schema": schema_problem(schema)})
        self.admit(task, role, task_id)
        task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        try:
            started = await self.client.start_workflow(
                AgentWorkflow.run,
                AgentRun(task=task),
                id=task_id,
                task_queue=self.settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=_summary(task.task),
                search_attributes=first_start(datetime.now(UTC)),
                task_timeout=WORKFLOW_TASK_TIMEOUT,
            )
        except WorkflowAlreadyStartedError:  # a closed task with this id
            return TaskHandle(self, task_id, awaits_turn=0, output_type=output_type)
        # Keep the started handle: it follows the run chain from this start.
        return TaskHandle(self, task_id, started, awaits_turn=0, output_type=output_type)

    async def send(self, task_id: str, content: str, **options: Any) -> TaskHandle:
        """`get(task_id).send(content, ...)`: see TaskHandle.send."""
        return await self.get(task_id).send(content, **options)

    async def deliver(self, task_id: str, message: Message) -> Delivery:
        """Deliver a message to the task: see waystation/client/messaging.py."""
        return await deliver(
            self.client,
            task_id,
            message,
            task_queue=self.settings.task_queue,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
            summary=_summary(message.content),
        )

    async def resume(
        self,
        task_id: str,
        approval: Decision | None = None,
        *,
        max_steps: int | None = None,
        token_budget: int | None = None,
        message: str | None = None,
    ) -> TaskHandle:
        """The handle of an existing task, going on from where it stopped.

        A running task gets `approval` applied if one is given. A failed task goes on from
        its last good point (before the activity that failed it, or just before the limit
        it hit), with `max_steps` / `token_budget` raised and `message` added if given; its
        event log then shows a `resumed` event naming the failure. A task whose state says
        `failed` resumes at once, even while its run is still closing.
        """
        task_rights.check_max_steps(max_steps, self.settings)
        handle = self.get(task_id)
        resumption = Resumption(max_steps=max_steps, token_budget=token_budget, message=message)
        seen = await handle.overview()
        if seen.status == WorkflowExecutionStatus.RUNNING:
            state = await handle.state()
            if state.status != "failed":
                if max_steps is not None or token_budget is not None or message is not None:
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
        already = await self._repaired_points(history.events)
        if found.reset_to_event in already:
            raise TaskError(
                task_id,
                f"task {task_id} was repaired once at event {found.reset_to_event} and is stuck "
                f"there again, so the fault is in the code, not its history: {found.problem}",
            )
        note = RepairNote(problem=found.problem, reset_to_event=found.reset_to_event, by=by)
        await reset_stuck_task(self.client, task_id, description.run_id or "", note)
        return self.get(task_id)

    async def _repaired_points(self, events: Any) -> set[int]:
        points: set[int] = set()
        for event in events:
            attrs = event.workflow_execution_signaled_event_attributes
            if event.HasField("workflow_execution_signaled_event_attributes") and (
                attrs.signal_name == "repaired"
            ):
                [note] = await self.client.data_converter.decode(attrs.input.payloads, [RepairNote])
                points.add(note.reset_to_event)
        return points

    async def fork(
        self,
        task_id: str,
        at_seq: int,
        *,
        message: str | None = None,
        new_task_id: str | None = None,
        max_steps: int | None = None,
        token_budget: int | None = None,
        role: Role = "approver",
    ) -> TaskHandle:
        """A new task that starts from the state just after event `at_seq` of `task_id`.

        The original is untouched. A fork at a thought runs that thought's calls first (a
        call that needs approval and has not run asks for a decision in the fork, even one
        approved in the original);
        `message` is added as the next user message. The fork has the limits in force at
        `at_seq` (a resume may have raised the original's), or `max_steps` / `token_budget`
        if given. The fork has its own id and its own stream (offsets from 0). The fork is
        a task `role` starts: its settings are admitted as `run` admits a new task's (a
        fork of a sub-agent's task stands alone: no `parent`).
        """
        if new_task_id is not None:
            task_rights.check_task_id(new_task_id)
        task_rights.check_max_steps(max_steps, self.settings)
        kept = await self.get(task_id).events(0, limit=at_seq + 1)
        if not 0 <= at_seq < len(kept) or kept[-1].seq != at_seq:
            last = kept[-1].seq if kept else -1
            raise TaskError(task_id, f"task {task_id} has events 0..{last}, not {at_seq}")
        first = kept[0]
        if not isinstance(first, TaskStarted):
            raise TaskError(task_id, f"task {task_id}'s log does not start with task_started")
        state = fold(kept)
        if state.status == "done" and message is None:
            raise TaskError(
                task_id, f"event {at_seq} ends the task with an answer: add a message to go on"
            )
        origin = await self._run_holding(task_id, at_seq)
        fork_id = new_task_id or f"{task_id}-fork-{uuid.uuid4().hex[:6]}"
        # Decisions on calls not yet run stay with the original: the fork asks again.
        carry = RunCarry(state=fork_start(state), message=message, earlier=origin, forked=True)
        limits = {"max_steps": max_steps, "token_budget": token_budget}
        task = _limits_in_force(first.task, kept).model_copy(
            update={k: v for k, v in limits.items() if v is not None} | {"parent": None}
        )
        self.admit(task, role)
        started = await self.client.start_workflow(
            AgentWorkflow.run,
            AgentRun(task=task, carry=carry),
            id=fork_id,
            task_queue=self.settings.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=_summary(task.task),
            search_attributes=first_start(datetime.now(UTC)),
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
        return TaskHandle(self, fork_id, started)

    async def _run_holding(self, task_id: str, seq: int) -> RunRef:
        span = await self.log.latest(task_id)
        while span.first_seq > seq and span.earlier is not None:
            span = await self.log.span(span.earlier)
        return RunRef(workflow_id=span.workflow_id, run_id=span.run_id, last_seq=seq)

    async def list_tasks(
        self,
        status: StatusFilter | None = None,
        page_size: int = 50,
        page_token: bytes | None = None,
    ) -> tuple[list[TaskSummary], bytes | None]:
        """A page of tasks, newest started first (waystation/client/task_list.py says how, since
        Temporal's visibility takes no ORDER BY), optionally only those with a status: an
        AgentStatus, or `stuck` (Temporal reports its workflow task failing again and
        again). Each task is listed once, as its latest run; a task keeps its place in the
        pages while it closes. InvalidPageTokenError for a token no listing gave out."""
        query = f'WorkflowType="{WORKFLOW_TYPE}"'
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
        try:
            head = self._streams.head(task_id)
            return await self.bounded(task_id, head, within, "the stream's head query")
        except RPCError as err:
            raise _not_found(task_id, err) from err
