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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

    from workflows import activity_calls, approval, errors, search
    from workflows.calls import verdicts
    from workflows.conversation import (
        ConversationDigest,
        RunMessages,
        task_messages,
    )
    from workflows.events import (
        AgentEvent,
        AgentState,
        Cancelled,
        ContextCompacted,
        Done,
        ErrorEvent,
        Failed,
        Observation,
        Repaired,
        TaskStarted,
        UserMessage,
        action_of,
        apply,
        draft,
        messages_of,
        thought_of,
    )
    from workflows.models import (
        AgentOutcome,
        ChatMessage,
        ConversationSnapshot,
        Decision,
        DecisionOutcome,
        LlmRequest,
        RepairNote,
        Resumption,
        SummaryRequest,
        ToolCall,
    )
    from workflows.plan import (
        AddMessage,
        Announce,
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
    from workflows.recovery import after_context_overflow, resumed
    from workflows.run import (
        APPROVE_SIGNAL,
        DECIDE_UPDATE,
        REJECT_SIGNAL,
        REPAIRED_SIGNAL,
        RESUME_SIGNAL,
        WORKFLOW_TYPE,
        AgentRun,
        ArchiveRequest,
        EventPage,
        EventsRequest,
        LlmContext,
        RunCarry,
        RunRef,
        event_page,
    )
    from workflows.stream import EVENTS_TOPIC, carried_from
    from workflows.tool_catalog import ToolCatalog, catalog_digest


# A failed task's run stays open this long for a resumption (see _fail and runtime/reset.py).
RESUME_GRACE = timedelta(seconds=3)
# A last run this large archives its events as it ends: a replay to read them takes seconds.
ARCHIVE_LAST_RUN_BYTES = 256 * 1024
ARCHIVE_PATCH = "archive-events"


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
        self._task = run.task
        self._state = carry.state
        self._log: list[AgentEvent] = []
        self._first_seq = self._state.last_seq + 1
        self._earlier = carry.earlier
        self._stream = WorkflowStream(prior_state=carry.stream)
        self._events_topic = self._stream.topic(EVENTS_TOPIC)
        self._inbox: list[approval.RecordedDecision] = list(carry.decisions)
        self._early: list[approval.RecordedDecision] = []
        self._resumptions: list[Resumption] = []
        self._repairs: list[RepairNote] = []
        self._message = carry.message
        self._messages = RunMessages(task_messages(self._task.system_prompt, self._task.task))
        self._digest = ConversationDigest()
        self._visibility = search.Visibility()
        self._clock = _sample()
        self._first_step = self._state.step
        # The MCP tools this run saw (listed again by every run: a catalog is not carried).
        self._catalog: ToolCatalog | None = None
        self._unlisted: list[str] = list(self._task.mcp_servers or [])

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        """Run the loop until an answer, a limit, a non-retryable error or a cancellation."""
        try:
            if run.carry is None:
                started = draft(TaskStarted, 0, task_id=workflow.info().workflow_id, task=run.task)
                self._append(started)
            elif run.carry.forked and self._earlier is not None:
                await self._save_conversation(source=self._earlier)
            return await self._loop()
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not activity_calls.cancelled(err):
                raise
            self._append(draft(Cancelled, self._state.step))
            await self._close_stream()
            raise asyncio.CancelledError() from None

    async def _loop(self) -> AgentOutcome:
        while True:
            self._absorb()
            move = next_move(
                self._state,
                self._task,
                limit=context_budget(self._state, self._task),
                progress=self._progress(),
                message=self._message,
                unlisted=self._unlisted,
            )
            match move:
                case Announce(step=step, calls=calls):
                    for call in calls:
                        self._append(action_of(step, call))
                case RequestApprovals(step=step, calls=calls):
                    for event in approval.request_events(step, calls, self._state):
                        self._append(event)
                    self._inbox = self._early + self._inbox  # decisions that came first
                    self._early = []
                case AwaitDecisions(request_ids=ids, deadline=deadline):
                    await self._await_decisions(ids, deadline)
                case RunCalls(step=step, calls=calls):
                    await self._run_calls(step, calls)
                case AddMessage(content=content):
                    self._message = None
                    self._append(draft(UserMessage, self._state.step, content=content))
                case HandOver():
                    await self._hand_over()
                case Compact(step=step, start=start, end=end):
                    await self._compact(step, start, end)
                case ListTools(servers=servers):
                    await self._list_tools(servers)
                case CallModel(step=step):
                    if (outcome := await self._call_model(step)) is not None:
                        return outcome
                case Fail(kind=kind, reason=reason):
                    await self._fail(kind, reason)

    def _absorb(self) -> None:
        """Turn what handlers recorded into events, in the order it arrived."""
        step = self._state.step
        for note in self._repairs:
            self._append(draft(Repaired, step, **note.model_dump()))
        recorded, self._inbox, self._repairs = self._inbox, [], []
        for entry in recorded:
            event = approval.absorb(self._state, entry, len(self._early))
            if event == approval.KEEP:
                self._early.append(entry)  # a decision faster than the step that asks
            elif not isinstance(event, str):
                self._append(event)

    def _recorded(self) -> bool:
        return bool(self._inbox or self._repairs)

    async def _await_decisions(self, request_ids: list[str], deadline: datetime) -> None:
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
            for event in approval.timeout_events(self._state, request_ids, self._task.approval):
                self._append(event)
            return
        self._clock = _sample()
        if not self._recorded():
            await self._hand_over()  # due while a person decides: the next run waits on

    async def _run_calls(self, step: int, calls: list[ToolCall]) -> None:
        """Run the step's calls (pure local ones first), then log every observation."""
        task_id = workflow.info().workflow_id
        results, runs = verdicts(task_id, step, calls, self._state)
        for local in (True, False):
            batch = [(k, r) for k, r in runs.items() if r.local == local]
            outputs = await asyncio.gather(
                *(activity_calls.run_tool(self._task, run, self._catalog) for _, run in batch)
            )
            results.update({k: out for (k, _), out in zip(batch, outputs, strict=True)})
        if any(not r.local for r in runs.values()):
            self._clock = _sample()
        for call in calls:
            result = results[call.call_id]
            observed = {"output": result.output, "is_error": result.is_error}
            self._append(draft(Observation, step, call_id=call.call_id, tool=call.tool, **observed))

    async def _list_tools(self, servers: list[str]) -> None:
        listed = await activity_calls.list_tools(self._task, servers)
        self._clock = _sample()
        self._catalog = self._catalog.merged(listed) if self._catalog else listed
        self._unlisted = []
        for problem in listed.problems():
            self._append(draft(ErrorEvent, self._state.step, kind="mcp_server", message=problem))

    async def _call_model(self, step: int) -> AgentOutcome | None:
        """One model call; an answer ends the task, tool calls open a step."""
        request = LlmRequest(
            step=step,
            message_count=len(self._state.conversation),
            model=self._task.model,
            conversation_digest=self._conversation_digest(),
            catalog_digest=catalog_digest(self._catalog) if self._catalog else None,
        )
        try:
            result = await activity_calls.call_model(self._task, request)
        except ActivityError as err:
            self._clock = _sample()
            await self._model_failed(step, err)
            return None
        self._clock = _sample()
        self._append(thought_of(step, result))
        if result.tool_calls:
            return None
        self._append(draft(Done, step, result=result.content))
        if self._clock.history_bytes >= ARCHIVE_LAST_RUN_BYTES:
            await self._archive_events()
        await self._close_stream()
        usage, last_seq = self._state.usage, self._state.last_seq
        return AgentOutcome(result=result.content, steps=step, usage=usage, last_seq=last_seq)

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
        try:
            await workflow.wait_condition(lambda: bool(self._resumptions), timeout=RESUME_GRACE)
        except TimeoutError:
            await self._close_stream()
            raise ApplicationError(
                reason, kind, type=errors.AGENT_FAILED, non_retryable=True
            ) from None
        self._clock = _sample()
        resumption = self._resumptions.pop(0)
        step = self._state.step
        self._task, self._message, event = resumed(self._task, self._message, resumption, step)
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
        if self._messages.added_to(self._state.conversation):
            await self._save_conversation()
        await self._archive_events()
        self._stream.truncate(carried_from(self._stream.get_state()))
        info = workflow.info()
        earlier = RunRef(
            workflow_id=info.workflow_id, run_id=info.run_id, last_seq=self._state.last_seq
        )

        def next_run(stream: WorkflowStreamState) -> list[Any]:
            decisions = self._early + self._inbox
            carry = RunCarry(
                state=self._state,
                stream=stream,
                decisions=decisions,
                message=self._message,
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
        existing = approval.outcome_of(self._state, decision.request_id, self._inbox)
        if existing is not None:
            return existing.model_copy(update={"duplicate": True})
        self._inbox.append(approval.RecordedDecision(decision=decision, via="update"))
        return approval.accepted(decision)

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        problem = approval.decision_problem(self._state, decision, self._inbox)
        if problem is not None:
            raise ApplicationError(problem.message, type=problem.kind, non_retryable=True)

    @workflow.signal(name=APPROVE_SIGNAL)
    def approve(self, decision: Decision) -> None:
        """Approve a request (for `temporal workflow signal --name approve`)."""
        self._inbox.append(approval.signalled(decision, "approve"))

    @workflow.signal(name=REJECT_SIGNAL)
    def reject(self, decision: Decision) -> None:
        """Reject a request (for `temporal workflow signal --name reject`)."""
        self._inbox.append(approval.signalled(decision, "reject"))

    @workflow.signal(name=RESUME_SIGNAL)
    def resume_after_failure(self, resumption: Resumption) -> None:
        """Sent right after a reset of a failed task: raise its limits, note what failed."""
        self._resumptions.append(resumption)

    @workflow.signal(name=REPAIRED_SIGNAL)
    def repaired(self, note: RepairNote) -> None:
        """Sent right after a repair reset: the log records it at the loop's next turn."""
        self._repairs.append(note)

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
        """The conversation of an LLM step: the content this run holds, the rest by digest."""
        refs = self._state.conversation[:message_count]
        return LlmContext(
            messages=[self._messages.get(r.digest) for r in refs],
            digests=[r.digest for r in refs],
            tools=self._task.tools,
            approval_policy=self._task.approval.policy,
            catalog=self._catalog,
        )

    @workflow.query(name="conversation_content")
    def conversation_content(self, digests: list[str]) -> dict[str, ChatMessage]:
        """The messages with these digests that this run holds."""
        return self._messages.of(digests)

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

    async def _close_stream(self) -> None:
        # Release long-poll subscribers and let every handler finish before the run ends.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
