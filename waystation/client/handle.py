"""TaskHandle: one task, however it was reached (waystation/client/agent_runtime.py makes
them): its answer, state, events, the responses a person gives it, messages, cancellation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Protocol, cast, overload

from pydantic import TypeAdapter
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError
from typing_extensions import TypeVar

from waystation.client import task_rights
from waystation.client.busy import reading, sending
from waystation.client.health import (
    Stuck,
    TaskOverview,
    overview,
    stuck,
    unanswered,
    with_failures_readable,
    worker_hint,
)
from waystation.client.messaging import Delivery
from waystation.client.person_requests import (
    APPROVALS,
    QUESTIONS,
    Outcome,
    RequestKind,
    Response,
    closed_under,
)
from waystation.client.streaming import StreamItem
from waystation.client.task_errors import (
    NoWorkerError,
    TaskEndedError,
    TaskError,
    UnreadableTaskError,
    task_errors,
    undecryptable,
)
from waystation.client.task_log import TaskLog
from waystation.client.task_tree import TaskTree, read_tree
from waystation.settings import Settings
from waystation.vocabulary import TERMINAL_STATUSES
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    Done,
    UserMessage,
    conversation_of,
)
from waystation.workflows.models import (
    Answer,
    AnswerOutcome,
    ChatMessage,
    Decision,
    DecisionOutcome,
    Message,
)
from waystation.workflows.run import AgentOutcome, SealedRun

# A query or Update that no worker answers must not hang its caller.
QUERY_TIMEOUT = timedelta(seconds=10)
UPDATE_TIMEOUT = timedelta(seconds=30)
RPC_GRACE = timedelta(seconds=5)

T = TypeVar("T")
OutputT = TypeVar("OutputT", default=Any)


class HandleRuntime(Protocol):
    """What a handle asks of the runtime that made it (AgentRuntime)."""

    client: Client
    settings: Settings
    log: TaskLog

    async def bounded(self, task_id: str, work: Awaitable[T], limit: timedelta, what: str) -> T: ...

    async def no_worker(self, task_id: str, what: str, limit: timedelta) -> NoWorkerError: ...

    async def sealed(self, task_id: str, run_id: str) -> SealedRun | None: ...

    async def deliver(self, task_id: str, message: Message) -> Delivery: ...

    def stream(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        follow: bool = False,
        tree: bool,
        after: str | None = None,
    ) -> AsyncGenerator[StreamItem, None]: ...


@dataclass(frozen=True)
class Deadline:
    """One call's bound, shared by the queries it sends one after another."""

    within: timedelta
    at: float  # on the event loop's clock

    @classmethod
    def after(cls, within: timedelta) -> Deadline:
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
        runtime: HandleRuntime,
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
        with task_errors(self.id):
            return await self._handle.result()

    async def state(self, within: timedelta = QUERY_TIMEOUT) -> AgentState:
        """The folded state: a closed task's as its run sealed it when it closed (no worker
        needed: with Worker Versioning only one of the run's own version could answer),
        else a worker answers the query (NoWorkerError if none does `within`)."""
        if (closed := await self._sealed_state()) is not None:
            return closed
        return await self._runtime.bounded(
            self.id, self._query_state(within), within, "the state query"
        )

    async def _sealed_state(self) -> AgentState | None:
        """The state the task's latest run sealed as it closed; None while it runs, or when
        it left no seal this client can read (then a worker replays it to answer)."""
        seen = await self.overview()
        if seen.status in (None, WorkflowExecutionStatus.RUNNING):
            return None
        sealed = await self._runtime.sealed(self.id, seen.run_id)
        return sealed.state() if sealed is not None else None

    async def _query_state(self, within: timedelta) -> AgentState:
        # The RPC's own deadline comes later, so the caller's bound is what ends the wait.
        with task_errors(self.id):
            return await self._handle.query(AgentWorkflow.state, rpc_timeout=within + RPC_GRACE)

    async def _state_by(
        self, deadline: Deadline, what: str, *, wait_for_a_worker: bool
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
        return await self._runtime.bounded(self.id, page, within, "the events query")

    async def queued_messages(self, within: timedelta = QUERY_TIMEOUT) -> list[Message]:
        """Messages the task has received and not yet taken (its next model call will)."""
        query = self._handle.query(AgentWorkflow.queued_messages, rpc_timeout=within + RPC_GRACE)
        return await self._runtime.bounded(self.id, query, within, "the messages query")

    async def overview(self) -> TaskOverview:
        """Temporal's view of the latest run: status, run id and memo (no worker needed)."""
        with task_errors(self.id):  # its memo may be encrypted with a key this side lacks
            return await overview(self._runtime.client, self.id)

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
        See `respond`."""

        def decision(request: str) -> Decision:
            verdict = "reject" if reject else "approve"
            return Decision(
                request_id=request,
                decision=verdict,
                message=message,
                arguments=arguments,
                approver=approver,
                shown=shown,
            )

        return await self._respond(APPROVALS, request_id, decision, Deadline.after(within))

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
        back (`duplicate`). An answer that is not one of the question's choices is refused
        (DecisionError, kind `invalid_choice`). See `respond`."""

        def given(request: str) -> Answer:
            return Answer(request_id=request, answer=text, answerer=answerer)

        return await self._respond(QUESTIONS, request_id, given, Deadline.after(within))

    async def decide(
        self, decision: Decision, *, within: timedelta = UPDATE_TIMEOUT
    ) -> DecisionOutcome:
        """`respond` with a Decision."""
        return await self.respond(decision, within=within)

    @overload
    async def respond(
        self, response: Decision, *, within: timedelta = UPDATE_TIMEOUT
    ) -> DecisionOutcome: ...

    @overload
    async def respond(
        self, response: Answer, *, within: timedelta = UPDATE_TIMEOUT
    ) -> AnswerOutcome: ...

    async def respond(
        self, response: Decision | Answer, *, within: timedelta = UPDATE_TIMEOUT
    ) -> DecisionOutcome | AnswerOutcome:
        """Respond to a request the task put to a person (a Decision on an approval request,
        an Answer to a question) and return the outcome that took effect (a repeat gets the
        first, marked `duplicate`). A refused response raises DecisionError, whose `kind`
        says why (waystation/workflows/errors.py), and never reaches the task.

        The response is checked against the task's state first; then it travels as a Signal
        and its outcome is read back. Signals are safe whatever moment they land in (their
        handler only records), unlike an Update right after a query a cold worker answered
        (docs/never-stuck.md).

        Its queries take `within` in all (the signal between them is sent as soon as
        Temporal takes it). Each query is sent again after a status query's bound: a loaded
        worker may answer late, or lose the query, and giving up early would report a
        response the task did take as if no worker had been there. When no worker polls at
        all, the check says so after one such bound, before anything is sent. After the
        response is sent, NoWorkerError is safe to retry: a repeat gets the first outcome.
        """
        deadline = Deadline.after(within)
        if isinstance(response, Decision):
            return await self._respond(APPROVALS, response.request_id, lambda _: response, deadline)
        return await self._respond(QUESTIONS, response.request_id, lambda _: response, deadline)

    async def _respond(
        self,
        kind: RequestKind[Response, Outcome],
        request_id: str | None,
        response_to: Callable[[str], Response],
        deadline: Deadline,
    ) -> Outcome:
        """The one way a response reaches a task (see `respond`); `response_to` makes it for
        the request (with no `request_id`, the only pending one)."""
        state = await self._state_by(deadline, "the state query", wait_for_a_worker=False)
        request = request_id if request_id is not None else kind.only_pending(self.id, state)
        # A fresh id tells this response's outcome from an earlier one's.
        response = response_to(request).model_copy(update={kind.id_field: uuid.uuid4().hex})
        if (earlier := kind.settled(self.id, state, response)) is not None:
            return earlier
        try:
            await sending(lambda: self._handle.signal(kind.signal(response), response))
        except RPCError as err:
            if closed_under(err):
                return await self._settled_after_close(kind, response, deadline)
            with task_errors(self.id):
                raise
        # It is sent: a worker that is gone for now may be back within the wait.
        pause = 0.02
        while True:
            what = f"the {kind.outcome_named}"
            state = await self._state_by(deadline, what, wait_for_a_worker=True)
            if response.request_id in kind.outcomes(state):
                outcome = kind.settled(self.id, state, response)
                assert outcome is not None
                return outcome
            await asyncio.sleep(min(pause, deadline.left().total_seconds()))
            pause = min(pause * 1.5, 0.25)

    async def _settled_after_close(
        self, kind: RequestKind[Response, Outcome], response: Response, deadline: Deadline
    ) -> Outcome:
        # A closed task takes no response, but a repeat of one it took still gets the first
        # outcome, and anything else the same refusal as before. One query, with the time
        # left (a status query's at least): a closed run is replayed to answer it, which a
        # long one takes a while, and each query sent again would replay it again.
        state = await self.state(max(deadline.left(), QUERY_TIMEOUT))
        if (outcome := kind.settled(self.id, state, response)) is None:
            raise kind.not_waiting(self.id, state, response.request_id)
        return outcome

    async def describe(self) -> WorkflowExecutionDescription:
        """Temporal's view of the task's latest run (no worker needed)."""
        with task_errors(self.id):
            return await reading(self._handle.describe)

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
        with task_errors(self.id):
            await self._handle.cancel()

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


def _ended_as(seen: TaskOverview) -> str | None:
    """The status a task ended with, from Temporal's view (a failed task's run may wait a
    moment more for a resumption), or None while it goes on."""
    said = seen.memo.get(search.MEMO_STATUS)
    if said in TERMINAL_STATUSES:
        return str(said)
    if seen.status not in (None, WorkflowExecutionStatus.RUNNING):
        return str(said or seen.status.name.lower())
    return None
