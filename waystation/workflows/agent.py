"""AgentWorkflow: the durable agent loop, a shell over pure decisions.

Each turn of the loop takes what handlers recorded, asks `plan.next_move` what to do with
the folded state, and does it: an activity, a wait for a person, or events. Update and
Signal handlers only record what they receive; the loop turns it into events at one fixed
point of each turn, so the orders in which a replay may deliver one activation's jobs all
give the same commands. Deterministic code only: time and ids through `workflow.*`, all
I/O in activities.

This module is the loop, the handlers and the queries; what a move does lives in the
parts the class is made of (workflows/run_core.py lists them), and what a person answers
in workflows/requests.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any, assert_never

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
)

with workflow.unsafe.imports_passed_through():
    from waystation.workflows import (
        activity_calls,
        approval,
        messages,
        request_kinds,
        requests,
    )
    from waystation.workflows.approval import APPROVALS
    from waystation.workflows.events import (
        AgentState,
        Cancelled,
        Repaired,
        TaskStarted,
        action_of,
        draft,
    )
    from waystation.workflows.hand_over import MESSAGE_BOUND_PATCH
    from waystation.workflows.models import (
        Answer,
        AnswerOutcome,
        ChatMessage,
        Decision,
        DecisionOutcome,
        Message,
        MessageReceipt,
        QuotaNotice,
        RepairNote,
        Resumption,
        ToolCall,
    )
    from waystation.workflows.notice import DeliveryFailure
    from waystation.workflows.plan import (
        AddMessage,
        Announce,
        Answered,
        AskPeople,
        AwaitPeople,
        CallModel,
        Compact,
        Fail,
        HandOver,
        ListTools,
        RunCalls,
        context_budget,
        due_for_hand_over,
        next_move,
    )
    from waystation.workflows.questions import QUESTIONS
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
        QUOTA_NOTICE_SIGNAL,
        REJECT_SIGNAL,
        REPAIRED_SIGNAL,
        RESUME_SIGNAL,
        SEND_MESSAGE_UPDATE,
        WORKFLOW_TYPE,
        AgentOutcome,
        AgentRun,
        EventPage,
        EventsRequest,
        LlmContext,
        RunCarry,
        event_page,
    )
    from waystation.workflows.run_core import sample_clock
    from waystation.workflows.step_calls import StepCalls
    from waystation.workflows.turns import Turns


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflow(StepCalls, Turns):
    """One agent task. The workflow id is the task id."""

    @workflow.init
    def __init__(self, run: AgentRun) -> None:
        super().__init__(run)

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        """Run the loop until an answer no message follows, a limit, a non-retryable error
        or a cancellation."""
        self._move_to_current_version(run)
        self._visibility.begin()
        try:
            if run.task is None or (run.carry is not None and run.carry.follow_up):
                await self._claim_turn(run)
            elif run.carry is None:
                task_id = workflow.info().workflow_id
                self._append(draft(TaskStarted, 0, task_id=task_id, task=self._task))
                if (recalled := await activity_calls.recall_memory(self._task)) is not None:
                    self._append(recalled)
            elif run.carry.forked and self._earlier is not None:
                await self._save_conversation(source=self._earlier)
            await self._notifier.ask_targets()
            return await self._loop()
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not activity_calls.cancelled(err):
                raise
            self._append(draft(Cancelled, self._state.step))
            with contextlib.suppress(ActivityError):  # the cancel wins over the seal
                await self._seal()
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
                case AskPeople(kind=kind, step=step, calls=calls):
                    self._ask(request_kinds.BY_NAME[kind], step, calls)
                case AwaitPeople(waiting=waiting, deadline=deadline):
                    await self._await_people(waiting, deadline)
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

    async def _await_people(self, waiting: dict[str, list[str]], deadline: datetime) -> None:
        remaining = deadline - self._clock.now
        try:
            if remaining <= timedelta(0):
                raise TimeoutError
            await workflow.wait_condition(
                lambda: (
                    self._recorded()
                    or due_for_hand_over(self._state, self._task, self._progress(sample_clock()))
                ),
                timeout=remaining,
            )
        except TimeoutError:
            self._clock = sample_clock()
            now = self._clock.now
            self._inbox.time_out(waiting, lambda: self._state, now, self._task, self._append)
            return
        self._clock = sample_clock()
        if not self._recorded():
            await self._hand_over()  # due while a person decides: the next run waits on

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

    @workflow.signal(name=QUOTA_NOTICE_SIGNAL)
    def quota_notice(self, notice: QuotaNotice) -> None:
        """Sent by a model call waiting for its turn under a quota, and once it has it: the
        loop records it as an event while it waits for the call."""
        self._quota_notices.append(notice)

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
            agents=self._task.agents,
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
