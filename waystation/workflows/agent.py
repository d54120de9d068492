"""AgentWorkflow: the durable agent loop, a shell over pure decisions.

Each turn of the loop takes what handlers recorded, asks `plan.next_move` what to do with
the folded state, and does it: an activity, a wait for a person, or events. Update and
Signal handlers only record what they receive; the loop turns it into events at one fixed
point of each turn, so the orders in which a replay may deliver one activation's jobs all
give the same commands. Deterministic code only: time and ids through `workflow.*`, all
I/O in activities.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn, assert_never

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

    from waystation.workflows import (
        activity_calls,
        agents,
        approval,
        errors,
        messages,
        options,
        outputs,
        requests,
        search,
    )
    from waystation.workflows.approval import APPROVALS
    from waystation.workflows.calls import Delegation, Run, verdicts
    from waystation.workflows.conversation import (
        ConversationDigest,
        RunMessages,
        task_messages,
    )
    from waystation.workflows.events import (
        AgentEvent,
        AgentStarted,
        AgentState,
        Cancelled,
        ContextCompacted,
        Done,
        ErrorEvent,
        Failed,
        Interrupted,
        Observation,
        OutputRejected,
        Repaired,
        TaskStarted,
        action_of,
        apply,
        draft,
        messages_of,
        thought_of,
    )
    from waystation.workflows.messages import QueuedMessage
    from waystation.workflows.models import (
        FINAL_ANSWER_TOOL,
        AgentTask,
        Answer,
        AnswerOutcome,
        ChatMessage,
        ConversationSnapshot,
        Decision,
        DecisionOutcome,
        LlmRequest,
        LlmResult,
        Message,
        MessageReceipt,
        RepairNote,
        Resumption,
        SummaryRequest,
        ToolCall,
        ToolResult,
    )
    from waystation.workflows.notice import DeliveryFailure
    from waystation.workflows.notifications import Notifier
    from waystation.workflows.plan import (
        AddMessage,
        Announce,
        Answered,
        AskQuestions,
        AwaitDecisions,
        CallModel,
        Compact,
        Fail,
        HandOver,
        ListTools,
        RequestApprovals,
        RunCalls,
        RunProgress,
        context_budget,
        due_for_hand_over,
        next_move,
    )
    from waystation.workflows.questions import QUESTIONS
    from waystation.workflows.recovery import after_context_overflow, resumed
    from waystation.workflows.run import (
        ANSWER_SIGNAL,
        ANSWER_UPDATE,
        APPROVE_SIGNAL,
        CONTINUATION_QUERY,
        DECIDE_UPDATE,
        MESSAGE_ROOM_QUERY,
        MESSAGE_SIGNAL,
        NOTIFICATION_FAILED_SIGNAL,
        QUEUED_MESSAGES_QUERY,
        REJECT_SIGNAL,
        REPAIRED_SIGNAL,
        RESUME_SIGNAL,
        SEND_MESSAGE_UPDATE,
        WORKFLOW_TYPE,
        AgentOutcome,
        AgentRun,
        ArchiveRequest,
        EventPage,
        EventsRequest,
        LlmContext,
        RunCarry,
        RunRef,
        TurnClaim,
        event_page,
    )
    from waystation.workflows.stream import EVENTS_TOPIC, carried_from
    from waystation.workflows.tool_catalog import ToolCatalog, catalog_digest


# A failed task's run stays open this long for a resumption (see _fail, waystation/client/reset.py).
RESUME_GRACE = timedelta(seconds=3)
# A last run this large archives its events as it ends: a replay to read them takes seconds.
ARCHIVE_LAST_RUN_BYTES = 256 * 1024
ARCHIVE_PATCH = "archive-events"
# The task of a run started with nothing in it (a follow-up from the Temporal CLI): the run
# only finds the answer it follows and continues as new from it, never reading this.
_FOLLOW_UP_PLACEHOLDER = AgentTask(task="(a follow-up: the task is the one it follows)")
# Before it, a server's notice that its tools changed was not acted on.
RELIST_PATCH = "mcp-relist-changed"
# Before it, a parent adopted any task it found under a child's id, even one it never started.
OWN_CHILD_PATCH = "adopt-own-child-only"
# Before it, signalled messages were kept beyond the queue's bounds, and a run took waiting
# messages before it handed over, however long its history had grown.
MESSAGE_BOUND_PATCH = "bounded-message-queue"


@dataclass(frozen=True)
class _Clock:
    """When the workflow last looked at the time and its history, at a point every replay
    sees alike: after an activity, a timer or a decision, never after a local activity
    (whose result a live run and a replay deliver in different workflow tasks)."""

    now: datetime
    history_length: int
    history_bytes: int
    suggested: bool


def _sample() -> _Clock:
    info = workflow.info()
    return _Clock(
        now=workflow.now(),
        history_length=info.get_current_history_length(),
        history_bytes=info.get_current_history_size(),
        suggested=info.is_continue_as_new_suggested(),
    )


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow:
    """One agent task. The workflow id is the task id."""

    @workflow.init
    def __init__(self, run: AgentRun) -> None:
        carry = run.carry or RunCarry(state=AgentState())
        self._task = run.task or _FOLLOW_UP_PLACEHOLDER
        self._state = carry.state
        self._log: list[AgentEvent] = []
        self._first_seq = self._state.last_seq + 1
        self._earlier = carry.earlier
        self._stream = WorkflowStream(prior_state=carry.stream)
        self._events_topic = self._stream.topic(EVENTS_TOPIC)
        self._inbox = requests.Inbox({APPROVALS: carry.decisions, QUESTIONS: carry.answers})
        self._resumptions: list[Resumption] = []
        self._repairs: list[RepairNote] = []
        self._incoming: list[QueuedMessage] = list(carry.messages)
        if carry.message is not None:  # a fork's or a resume's, told to the model first
            via = "fork" if carry.forked else "resume"
            self._incoming.insert(0, QueuedMessage(message=Message(content=carry.message), via=via))
        self._message_signals = 0
        self._refused_messages = messages.Refusals()
        # Messages whose model call was cancelled for them (their user_message says so).
        self._interrupters: set[str] = set()
        self._turn_messages: list[str] = []
        # A follow-up run waits for its claim on the turn before it answers a send_message.
        self._claiming = run.task is None or carry.follow_up
        self._refusal: ApplicationError | None = None
        self._messages = RunMessages(task_messages(self._task.system_prompt, self._task.task))
        self._digest = ConversationDigest()
        self._visibility = search.Visibility(self._task.parent)
        self._clock = _sample()
        self._first_step = self._state.step
        # The MCP tools this run saw (listed again by every run: a catalog is not carried).
        self._catalog: ToolCatalog | None = None
        self._unlisted: list[str] = list(self._task.mcp_servers or [])
        self._notifier = Notifier(workflow.info().workflow_id)

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        """Run the loop until an answer no message follows, a limit, a non-retryable error
        or a cancellation."""
        self._visibility.begin()
        try:
            if run.task is None or (run.carry is not None and run.carry.follow_up):
                await self._claim_turn(run)
            elif run.carry is None:
                task_id = workflow.info().workflow_id
                self._append(draft(TaskStarted, 0, task_id=task_id, task=self._task))
            elif run.carry.forked and self._earlier is not None:
                await self._save_conversation(source=self._earlier)
            await self._notifier.ask_targets()
            return await self._loop()
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not activity_calls.cancelled(err):
                raise
            self._append(draft(Cancelled, self._state.step))
            await self._close_stream()
            raise asyncio.CancelledError() from None

    async def _loop(self) -> AgentOutcome:
        while True:
            await self._notifier.send()
            self._absorb()
            move = next_move(
                self._state,
                self._task,
                limit=context_budget(self._state, self._task),
                progress=self._progress(),
                messages=self._incoming,
                unlisted=self._unlisted,
            )
            if isinstance(move, AddMessage) and self._hand_over_first():
                move = HandOver()  # waiting messages travel in the bounded carry
            match move:
                case Announce(step=step, calls=calls):
                    for call in calls:
                        self._append(action_of(step, call))
                case RequestApprovals(step=step, calls=calls):
                    self._ask(APPROVALS, step, calls)
                case AskQuestions(step=step, calls=calls):
                    self._ask(QUESTIONS, step, calls)
                case AwaitDecisions(request_ids=ids, questions=asked, deadline=deadline):
                    await self._await_decisions(ids, asked, deadline)
                case RunCalls(step=step, calls=calls):
                    await self._run_calls(step, calls)
                case AddMessage(queued=queued):
                    self._take(queued)
                case Answered():
                    if (outcome := await self._close_turn()) is not None:
                        return outcome
                case HandOver():
                    await self._hand_over()
                case Compact(step=step, start=start, end=end):
                    await self._compact(step, start, end)
                case ListTools(servers=servers):
                    await self._list_tools(servers)
                case CallModel(step=step):
                    await self._call_model(step)
                case Fail(kind=kind, reason=reason):
                    await self._fail(kind, reason)
                case _:
                    assert_never(move)

    def _absorb(self) -> None:
        """Turn what handlers recorded into events, in the order it arrived."""
        step = self._state.step
        for note in self._repairs:
            self._append(draft(Repaired, step, **note.model_dump()))
        self._repairs = []
        self._inbox.absorb(lambda: self._state, self._append)
        for failed in self._notifier.failure_events(step):
            self._append(failed)
        for refused in self._refused_messages.events(step):
            self._append(refused)

    def _ask(self, kind: requests.AnyKind, step: int, calls: list[ToolCall]) -> None:
        self._inbox.ask(kind, kind.request_events(step, calls, self._state), self._append)

    def _recorded(self) -> bool:
        return bool(
            self._inbox
            or self._repairs
            or self._notifier.failures_recorded
            or self._refused_messages
        )

    def _hand_over_first(self) -> bool:
        """A run whose history is due to be handed over does so before it takes waiting
        messages, so a flood of them never grows one run (and what it holds) without end."""
        due = due_for_hand_over(self._state, self._task, self._progress())
        return due and workflow.patched(MESSAGE_BOUND_PATCH)

    async def _await_decisions(
        self, request_ids: list[str], asked: list[str], deadline: datetime
    ) -> None:
        remaining = deadline - self._clock.now
        try:
            if remaining <= timedelta(0):
                raise TimeoutError
            await workflow.wait_condition(
                lambda: (
                    self._recorded()
                    or due_for_hand_over(self._state, self._task, self._progress(_sample()))
                ),
                timeout=remaining,
            )
        except TimeoutError:
            self._clock = _sample()
            waiting: dict[requests.AnyKind, list[str]] = {APPROVALS: request_ids, QUESTIONS: asked}
            now = self._clock.now
            self._inbox.time_out(waiting, lambda: self._state, now, self._task, self._append)
            return
        self._clock = _sample()
        if not self._recorded():
            await self._hand_over()  # due while a person decides: the next run waits on

    async def _run_calls(self, step: int, calls: list[ToolCall]) -> None:
        """Run the step's calls (pure local ones first, then the rest and the sub-agents, at
        once), then log every observation."""
        task_id = workflow.info().workflow_id
        questions_settings = self._task.questions
        results, runs, delegations = verdicts(task_id, step, calls, self._state, questions_settings)
        for index, key in enumerate(list(delegations)):
            if (refused := agents.refusal(self._task, delegations[key].call, index)) is not None:
                results[key] = refused
                del delegations[key]
        share = agents.budget_shares(self._task, self._state.usage.total, len(delegations))
        local = [(k, r) for k, r in runs.items() if r.local]
        ran = await asyncio.gather(
            *(activity_calls.run_tool(self._task, run, self._catalog) for _, run in local)
        )
        results.update({k: out for (k, _), out in zip(local, ran, strict=True)})
        remote = [(k, r) for k, r in runs.items() if not r.local]
        if remote or delegations:
            ran = await self._run_remote(step, remote, list(delegations.values()), share)
            keys = [k for k, _ in remote] + list(delegations)
            results.update(dict(zip(keys, ran, strict=True)))
            self._clock = _sample()
        for call in calls:
            result = results[call.call_id]
            observed = {
                "output": result.output,
                "is_error": result.is_error,
                "usage": result.usage,
                "agent_status": result.agent_status,
            }
            self._append(draft(Observation, step, call_id=call.call_id, tool=call.tool, **observed))
        self._relist([server for r in results.values() for server in r.stale_servers])
        schema = self._task.output_schema
        final = [c for c in calls if c.tool == FINAL_ANSWER_TOOL and c.runnable]
        if schema is not None and final and not results[final[0].call_id].is_error:
            value = outputs.unwrap(schema, final[0].arguments or {})
            self._answer(step, outputs.as_text(value), value)

    async def _run_remote(
        self,
        step: int,
        remote: list[tuple[str, Run]],
        delegations: list[Delegation],
        share: int | None,
    ) -> list[ToolResult]:
        """The step's tool activities and its sub-agents, all at once: the children are
        started together, logged in call order once Temporal has started them, then
        awaited with the tools. Cancelling the task cancels them all, and waits."""
        running = [
            asyncio.ensure_future(activity_calls.run_tool(self._task, run, self._catalog))
            for _, run in remote
        ]
        try:
            starts = await asyncio.gather(*(self._start_child(step, d, share) for d in delegations))
            for delegation, start in zip(delegations, starts, strict=True):
                call_id, name = delegation.call.call_id, delegation.spec.name
                if not start.foreign:
                    self._started(step, call_id, name, start.child_id)
            pairs = zip(delegations, starts, strict=True)
            answers = [self._child_answer(d, start) for d, start in pairs]
            return list(await asyncio.gather(*running, *answers))
        except asyncio.CancelledError:
            for call in running:
                call.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    async def _start_child(
        self, step: int, delegation: Delegation, share: int | None
    ) -> agents.ChildStart:
        """Start a sub-agent as a child task (or find the one a repaired or reset step
        started before: same id)."""
        task_id = workflow.info().workflow_id
        call_id = delegation.call.call_id
        at = agents.link(self._task, task_id, delegation.spec, call_id)
        task = agents.child_task(self._task, delegation.spec, delegation.instruction, share, at)
        child_id = agents.child_id(task_id, step, call_id)
        try:
            handle = await workflow.start_child_workflow(
                AgentWorkflow.run,
                AgentRun(task=task),
                id=child_id,
                task_queue=workflow.info().task_queue,
                cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                parent_close_policy=ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                task_timeout=options.WORKFLOW_TASK_TIMEOUT,
                static_summary=f"{delegation.spec.name}: {delegation.instruction[:180]}",
            )
        except WorkflowAlreadyStartedError:
            # Adopt it only if Temporal recorded this task as its parent: the id is
            # predictable, so anyone could have created a task under it first.
            if workflow.patched(OWN_CHILD_PATCH):
                seen = await activity_calls.child_outcome(self._task, child_id)
                self._clock = _sample()
                if seen.foreign:
                    return agents.ChildStart(child_id, None, foreign=True)
            return agents.ChildStart(child_id, None)
        return agents.ChildStart(child_id, handle)

    async def _child_answer(self, delegation: Delegation, start: agents.ChildStart) -> ToolResult:
        """The sub-agent's answer (or its end) as the call's observation."""
        name = delegation.spec.name
        if start.foreign:
            return agents.not_adopted(delegation.call, start.child_id)
        if start.handle is None:
            return await self._rejoin(start.child_id, name)
        try:
            outcome = await start.handle
        except ChildWorkflowError as err:
            if activity_calls.task_cancelling():
                raise asyncio.CancelledError() from None
            return agents.child_ended(name, err.cause)
        return agents.answered(outcome.output, outcome.result, outcome.usage)

    def _started(self, step: int, call_id: str, name: str, child_id: str) -> None:
        """The log says a sub-agent's task exists once Temporal has started it."""
        self._clock = _sample()
        self._append(draft(AgentStarted, step, call_id=call_id, agent=name, child_id=child_id))

    async def _rejoin(self, child_id: str, name: str) -> ToolResult:
        """A child that exists already (a repair or reset re-ran the step that started it):
        Temporal keeps it but no longer reports its end here, so ask now and then."""
        pause = agents.REJOIN_FIRST_PAUSE
        try:
            while True:
                seen = await activity_calls.child_outcome(self._task, child_id)
                if seen.closed:
                    return agents.rejoined(name, seen)
                await workflow.sleep(pause)
                pause = min(pause * 2, agents.REJOIN_LONGEST_PAUSE)
        except asyncio.CancelledError:
            await workflow.get_external_workflow_handle(child_id).cancel()
            raise

    async def _list_tools(self, servers: list[str]) -> None:
        listed = await activity_calls.list_tools(self._task, servers)
        self._clock = _sample()
        self._catalog = self._catalog.merged(listed) if self._catalog else listed
        self._unlisted = []
        for problem in listed.problems():
            self._append(draft(ErrorEvent, self._state.step, kind="mcp_server", message=problem))

    def _relist(self, stale: list[str]) -> None:
        """The task's servers whose tools changed are listed again before the next step."""
        servers = self._task.mcp_servers or []
        changed = [s for s in dict.fromkeys(stale) if s in servers and s not in self._unlisted]
        if changed and workflow.patched(RELIST_PATCH):
            self._unlisted = [*self._unlisted, *changed]

    async def _call_model(self, step: int) -> None:
        """One model call; an answer ends the turn, tool calls open a step. A message that
        asks to interrupt cancels the call, and the step starts again with it."""
        request = LlmRequest(
            step=step,
            message_count=len(self._state.conversation),
            model=self._task.model,
            conversation_digest=self._conversation_digest(),
            catalog_digest=catalog_digest(self._catalog) if self._catalog else None,
            first_attempt=1 + self._state.interrupts * self._task.model.max_attempts,
        )
        call = activity_calls.start_model_call(self._task, request)
        try:
            await workflow.wait_condition(
                lambda: call.done() or messages.interrupting(self._incoming)
            )
        except asyncio.CancelledError:
            await activity_calls.cancelled_call(call)
            raise
        interrupting = not call.done()
        if interrupting:
            call.cancel()
        try:
            result: LlmResult = await call
        except ActivityError as err:
            self._clock = _sample()
            if interrupting and activity_calls.cancelled_by_request(err):
                self._interrupted(step, request)
                return
            if activity_calls.cancelled(err):
                raise asyncio.CancelledError() from None
            await self._model_failed(step, err)
            return
        self._clock = _sample()
        self._append(thought_of(step, result))
        self._relist(result.stale_servers)
        if result.tool_calls:
            return
        if self._task.output_schema is None:
            self._answer(step, result.content)
        elif result.output_problem is None:
            self._answer(step, outputs.as_text(result.output), result.output)
        else:
            told = outputs.rejection(result.output_problem, outputs.mode(self._task.model))
            self._append(draft(OutputRejected, step, problem=result.output_problem, message=told))

    def _answer(self, step: int, text: str, output: Any | None = None) -> None:
        """The turn's answer (with an output schema, its data, validated)."""
        state = self._state
        done = {"result": text, "turn": state.turn, "usage": state.usage, "output": output}
        self._append(draft(Done, step, **done))

    def _interrupted(self, step: int, request: LlmRequest) -> None:
        """The model call was cancelled for a message: its streamed text is void."""
        waiting = [q.message.message_id for q in self._incoming if q.message.interrupt]
        self._interrupters.update(i for i in waiting if i is not None)
        last_attempt = request.first_attempt + request.model.max_attempts - 1
        self._append(
            draft(
                Interrupted,
                self._state.step,
                interrupted_step=step,
                attempt=last_attempt,
                message_id=waiting[0] if waiting else None,
            )
        )

    def _take(self, queued: QueuedMessage) -> None:
        """Take the first waiting message into the conversation (a new turn after an answer)."""
        self._incoming.remove(queued)
        message = queued.message
        if message.max_steps is not None:
            self._task = self._task.model_copy(update={"max_steps": message.max_steps})
        interrupted = message.message_id in self._interrupters
        self._interrupters.discard(message.message_id or "")
        event = messages.taken(self._state, queued, interrupted=interrupted)
        if event.turn != self._state.turn:
            self._turn_messages = []
        if message.message_id is not None:
            self._turn_messages.append(message.message_id)
        self._append(event)

    async def _close_turn(self) -> AgentOutcome | None:
        """End the run with the turn's answer, unless a message came meanwhile: then the
        conversation goes on in this run."""
        if self._incoming:
            return None
        await self._notifier.send()
        if self._clock.history_bytes >= ARCHIVE_LAST_RUN_BYTES:
            await self._archive_events()
        await self._close_stream()
        if self._incoming:  # landed while the run was closing
            return None
        state = self._state
        return AgentOutcome(
            result=state.result or "",
            steps=state.step,
            usage=state.usage,
            last_seq=state.last_seq,
            turn=state.turn,
            output=state.output,
            message_ids=self._turn_messages,
            next_offset=self._stream_end(),
        )

    def _stream_end(self) -> int:
        stream = self._stream.get_state(publisher_ttl=timedelta(0))
        return stream.base_offset + len(stream.log)

    def _continuation(self) -> RunCarry:
        """What a follow-up continues from: this run's state (its answer is in the log
        already), the latest stream items (so offsets go on), and this run as the one before
        it. The task is this run's input's. A run has no activity in flight when it ends, so
        no publisher's dedup entry need go on with it."""
        stream = self._stream.get_state(publisher_ttl=timedelta(0))
        kept = carried_from(stream) - stream.base_offset
        tail = dataclasses.replace(
            stream, log=stream.log[kept:], base_offset=stream.base_offset + kept
        )
        info = workflow.info()
        earlier = RunRef(
            workflow_id=info.workflow_id, run_id=info.run_id, last_seq=self._state.last_seq
        )
        state = self._state.model_copy(update={"result": None})
        return RunCarry(state=state, stream=tail, earlier=earlier, follow_up=True)

    async def _claim_turn(self, run: AgentRun) -> None:
        """A follow-up run first claims the turn after the answer it follows, then goes on
        from it: a run started with only the run it follows (`follows`, our clients) or
        nothing at all (the Temporal CLI) continues as new from that answer's state, read
        from the closed run, keeping the messages it received; so does one that another
        run got ahead of."""
        info = workflow.info()
        carry = run.carry
        after = carry.earlier.run_id if carry is not None and carry.earlier else run.follows
        claim = TurnClaim(
            task_id=info.workflow_id,
            after_run_id=after,
            chain_id=info.first_execution_run_id,
            has_carry=carry is not None,
        )
        try:
            claimed = await activity_calls.claim_turn(self._task, claim)
        except ActivityError as err:
            await self._refuse(activity_calls.detail(err), err)
        self._clock = _sample()
        if claimed.continuation is not None:
            await self._start_from(claimed.continuation)
        self._claiming = False
        await self._save_conversation(source=claimed.follows)

    async def _refuse(self, reason: str, err: ActivityError) -> NoReturn:
        """The run has nothing to follow: the messages sent to it are refused, and it ends."""
        cause = err.cause
        kind = (
            cause.type
            if isinstance(cause, ApplicationError) and cause.type
            else errors.NOTHING_TO_FOLLOW
        )
        self._refusal = ApplicationError(reason, type=kind, non_retryable=True)
        self._claiming = False
        await workflow.wait_condition(workflow.all_handlers_finished)
        raise self._refusal

    async def _start_from(self, continuation: AgentRun) -> NoReturn:
        """Continue as new from another run's answer, with the messages this run received."""
        carry = continuation.carry or RunCarry(state=AgentState())
        mine = [
            q
            for q in self._incoming
            if not messages.known(carry.state, carry.messages, q.message.message_id or "")
        ]
        carry = carry.model_copy(update={"messages": [*carry.messages, *mine], "follow_up": True})
        self._claiming = False
        await self._stream.continue_as_new(
            lambda _: [AgentRun(task=continuation.task, carry=carry)]
        )

    async def _model_failed(self, step: int, err: ActivityError) -> None:
        cause = err.cause
        if not (isinstance(cause, ApplicationError) and cause.type == errors.LLM_CONTEXT_TOO_LONG):
            detail = activity_calls.detail(err)
            await self._fail("llm_error", f"the LLM call of step {step} failed: {detail}")
            return
        match after_context_overflow(self._state, step, cause.message):
            case Fail(kind=kind, reason=reason):
                await self._fail(kind, reason)
            case ErrorEvent() as event:
                self._append(event)

    async def _compact(self, step: int, start: int, end: int) -> None:
        request = SummaryRequest(
            step=step,
            message_count=len(self._state.conversation),
            start=start,
            end=end,
            model=self._task.model,
            conversation_digest=self._conversation_digest(),
        )
        try:
            result = await activity_calls.summarize(self._task, request)
        except ActivityError as err:
            detail = activity_calls.detail(err)
            await self._fail("llm_error", f"summarizing the conversation failed: {detail}")
            return
        self._clock = _sample()
        compacted = {"summary": result.summary, "usage": result.usage, "start": start, "end": end}
        self._append(draft(ContextCompacted, self._state.step, **compacted))

    async def _fail(self, kind: str, reason: str) -> None:
        """End the task as failed, unless a resumption comes within RESUME_GRACE: a resume
        sends one to a run still waiting, or resets a closed run to this very wait."""
        self._append(draft(Failed, self._state.step, kind=kind, reason=reason))
        await self._notifier.send()
        try:
            await workflow.wait_condition(lambda: bool(self._resumptions), timeout=RESUME_GRACE)
        except TimeoutError:
            await self._close_stream()
            # The usage comes along: a sub-agent's caller counts what its failure cost.
            raise ApplicationError(
                reason, kind, self._state.usage, type=errors.AGENT_FAILED, non_retryable=True
            ) from None
        self._clock = _sample()
        resumption = self._resumptions.pop(0)
        self._task, event = resumed(self._task, resumption, self._state.step)
        if resumption.message is not None:
            told = QueuedMessage(message=Message(content=resumption.message), via="resume")
            self._incoming.insert(0, told)
        self._append(event)

    async def _save_conversation(self, source: RunRef | None = None) -> None:
        """Put the conversation's messages this run (or a fork's origin) holds in the store."""
        snapshot = ConversationSnapshot(
            step=self._state.step,
            message_count=len(self._state.conversation),
            conversation_digest=self._conversation_digest(),
            source_workflow_id=source.workflow_id if source else None,
            source_run_id=source.run_id if source else None,
        )
        await activity_calls.save_conversation(self._task, snapshot)
        self._clock = _sample()

    async def _hand_over(self) -> None:
        """Continue as new with a bounded carry: the conversation by reference, the stream's
        latest items, and decisions not yet in the log."""
        await self._notifier.send()
        if self._messages.added_to(self._state.conversation):
            await self._save_conversation()
        await self._archive_events()
        self._stream.truncate(carried_from(self._stream.get_state()))
        info = workflow.info()
        earlier = RunRef(
            workflow_id=info.workflow_id, run_id=info.run_id, last_seq=self._state.last_seq
        )

        def next_run(stream: WorkflowStreamState) -> list[Any]:
            carry = RunCarry(
                state=self._state,
                stream=stream,
                decisions=self._inbox.carried(APPROVALS),
                answers=self._inbox.carried(QUESTIONS),
                messages=self._incoming,
                earlier=earlier,
            )
            return [AgentRun(task=self._task, carry=carry)]

        await self._stream.continue_as_new(next_run)

    async def _archive_events(self) -> None:
        """Keep this run's events where readers find them once it is closed (no replay).
        Behind a patch: runs recorded before it hand over and end without the activity."""
        if self._log and workflow.patched(ARCHIVE_PATCH):
            request = ArchiveRequest(first_seq=self._first_seq, last_seq=self._state.last_seq)
            await activity_calls.archive_events(request)
            self._clock = _sample()

    def _progress(self, clock: _Clock | None = None) -> RunProgress:
        clock = clock or self._clock
        return RunProgress(self._first_step, clock.history_bytes, clock.suggested)

    def _conversation_digest(self) -> str:
        return self._digest.of([r.digest for r in self._state.conversation])

    # --- handlers: they only record -------------------------------------------------------

    @workflow.update(name=DECIDE_UPDATE)
    def decide(self, decision: Decision) -> DecisionOutcome:
        """Approve or reject one request. Repeating a decision returns the first outcome."""
        return requests.accept(APPROVALS, self._state, decision, self._inbox.recorded(APPROVALS))

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self._validate(APPROVALS, decision)

    @workflow.signal(name=APPROVE_SIGNAL)
    def approve(self, decision: Decision) -> None:
        """Approve a request (for `temporal workflow signal --name approve`)."""
        self._inbox.recorded(APPROVALS).append(approval.signalled(decision, "approve"))

    @workflow.signal(name=REJECT_SIGNAL)
    def reject(self, decision: Decision) -> None:
        """Reject a request (for `temporal workflow signal --name reject`)."""
        self._inbox.recorded(APPROVALS).append(approval.signalled(decision, "reject"))

    @workflow.update(name=ANSWER_UPDATE)
    def answer(self, answer: Answer) -> AnswerOutcome:
        """Answer a question the model asked. The first answer wins: a repeat (or a later
        answer by someone else) gets the first one back."""
        return requests.accept(QUESTIONS, self._state, answer, self._inbox.recorded(QUESTIONS))

    @answer.validator
    def _validate_answer(self, answer: Answer) -> None:
        self._validate(QUESTIONS, answer)

    @workflow.signal(name=ANSWER_SIGNAL)
    def answer_signal(self, answer: Answer) -> None:
        """Answer a question (for `temporal workflow signal --name answer`)."""
        self._inbox.recorded(QUESTIONS).append(QUESTIONS.recorded(answer, "signal"))

    def _validate(self, kind: requests.AnyKind, response: Any) -> None:
        """The Update validators' one structure; the kind supplies its own check."""
        problem = requests.problem(kind, self._state, response, self._inbox.recorded(kind))
        if problem is not None:
            raise ApplicationError(problem.message, type=problem.kind, non_retryable=True)

    @workflow.update(name=SEND_MESSAGE_UPDATE)
    async def send_message(self, message: Message) -> MessageReceipt:
        """Send the task a message: a follow-up once it has answered, a steer while it works.
        A repeat (same message_id) gets the first receipt. Answers once the message is kept."""
        update = workflow.current_update_info()
        fallback = f"update-{update.id}" if update is not None else self._signal_message_id()
        receipt = messages.record(self._incoming, self._state, message, "update", fallback)
        await workflow.wait_condition(lambda: not self._claiming)
        if self._refusal is not None:
            raise self._refusal
        return receipt

    @send_message.validator
    def _validate_message(self, message: Message) -> None:
        view = messages.view_of(self._state, self._incoming)
        if (refused := messages.message_refusal(view, message)) is not None:
            raise ApplicationError(refused.sentence, type=refused.kind, non_retryable=True)

    @workflow.signal(name=MESSAGE_SIGNAL)
    def message(self, message: Message) -> None:
        """Send the task a message (for tools that can only signal; a repeat counts once).
        One the Update would refuse is not kept: the log says so (`message_refused`)."""
        fallback = self._signal_message_id()
        named = message.model_copy(update={"message_id": message.message_id or fallback})
        view = messages.view_of(self._state, self._incoming)
        refused = messages.message_refusal(view, named)
        # Only a refusal asks for the patch: runs recorded before it kept every message.
        if refused is not None and workflow.patched(MESSAGE_BOUND_PATCH):
            self._refused_messages.note(named.message_id or fallback, refused.sentence)
            return
        messages.record(self._incoming, self._state, named, "signal", fallback)

    @workflow.query(name=MESSAGE_ROOM_QUERY)
    def message_room(self) -> messages.QueueVolume:
        """How many messages, and bytes of them, wait to be taken (clients check the room
        before they signal)."""
        return messages.volume(self._incoming)

    def _signal_message_id(self) -> str:
        # Deterministic: the same history gives the same ids in the same order.
        self._message_signals += 1
        info = workflow.info()
        length = info.get_current_history_length()
        return f"signal-{info.run_id[:12]}-{length}-{self._message_signals}"

    @workflow.signal(name=RESUME_SIGNAL)
    def resume_after_failure(self, resumption: Resumption) -> None:
        """Sent right after a reset of a failed task: raise its limits, note what failed."""
        self._resumptions.append(resumption)

    @workflow.signal(name=REPAIRED_SIGNAL)
    def repaired(self, note: RepairNote) -> None:
        """Sent right after a repair reset: the log records it at the loop's next turn."""
        self._repairs.append(note)

    @workflow.signal(name=NOTIFICATION_FAILED_SIGNAL)
    def notification_failed(self, failure: DeliveryFailure) -> None:
        """Sent by a notification that could not be delivered: logged as an `error` event."""
        self._notifier.failed(failure)

    # --- queries ----------------------------------------------------------------------------

    @workflow.query(name="state")
    def state(self) -> AgentState:
        """The fold of every event published so far."""
        return self._state

    @workflow.query(name="events")
    def events(self, request: EventsRequest) -> EventPage:
        """Events with seq >= since that this run holds, at most `limit` (and ~1 MB)."""
        return event_page(self._log, self._first_seq, self._earlier, request)

    @workflow.query(name="llm_context")
    def llm_context(self, message_count: int) -> LlmContext:
        """The conversation of an LLM step: the content this run holds (as much as fits one
        answer; `conversation_content` gives the rest), the rest by digest."""
        refs = self._state.conversation[:message_count]
        # The content that fits one answer; the asker reads the rest a page at a time.
        held = self._messages.page([r.digest for r in refs])
        return LlmContext(
            messages=[held.get(r.digest) for r in refs],
            digests=[r.digest for r in refs],
            tools=self._task.tools,
            approval_policy=self._task.approval.policy,
            catalog=self._catalog,
            output_schema=self._task.output_schema,
        )

    @workflow.query(name=QUEUED_MESSAGES_QUERY)
    def queued_messages(self) -> list[Message]:
        """Messages received and not yet taken into the conversation, in arrival order."""
        return [q.message for q in self._incoming]

    @workflow.query(name=CONTINUATION_QUERY)
    def continuation(self) -> RunCarry:
        """What a follow-up of this run's answer continues from (asked of a closed run)."""
        return self._continuation()

    @workflow.query(name="conversation_content")
    def conversation_content(self, digests: list[str]) -> dict[str, ChatMessage]:
        """The messages with these digests that this run holds, as many as fit one answer
        (at least one): ask again for the rest."""
        return self._messages.page(digests)

    # --- the log ----------------------------------------------------------------------------

    def _append(self, event: AgentEvent) -> None:
        """Stamp the event with its place and time, fold it, publish it, keep its content."""
        clock = self._clock
        stamp = {
            "seq": self._state.last_seq + 1,
            "at": clock.now,
            "history_length": clock.history_length,
        }
        event = event.model_copy(update=stamp)
        self._state = apply(self._state, event)
        self._log.append(event)
        self._messages.add(messages_of(event))
        self._events_topic.publish(event)
        self._visibility.publish(self._state, self._task.model.name, event.at)
        self._notifier.note(event, self._task.task)

    async def _close_stream(self) -> None:
        # Release long-poll subscribers and let every handler finish before the run ends.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
