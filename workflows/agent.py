"""AgentWorkflow: the durable agent loop (LLM -> tool calls -> observations -> ... -> answer).

Every step appends events; the state queries return is the fold of the published log.
Deterministic code only: time and ids through `workflow.*`, all I/O in activities.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.workflow_streams import WorkflowStream, WorkflowStreamState

    from workflows import errors, search
    from workflows.context import ConversationDigest, compaction_range
    from workflows.events import (
        Action,
        AgentEvent,
        AgentState,
        ApprovalRequested,
        ApprovalResolved,
        Cancelled,
        ContextCompacted,
        Done,
        ErrorEvent,
        Failed,
        Observation,
        Resumed,
        TaskStarted,
        Thought,
        UserMessage,
        apply,
    )
    from workflows.models import (
        AgentOutcome,
        AgentTask,
        Contract,
        Decision,
        DecisionOutcome,
        LlmContext,
        LlmRequest,
        LlmResult,
        ModelSettings,
        Resumption,
        SummaryRequest,
        SummaryResult,
        ToolCall,
        ToolRequest,
        ToolResult,
    )
    from workflows.stream import EVENTS_TOPIC

# Activities beat every third of these on a timer, so a dead worker's call is retried
# elsewhere within seconds while a slow but live call is left alone.
LLM_HEARTBEAT_TIMEOUT = timedelta(seconds=2)
TOOL_HEARTBEAT_TIMEOUT = timedelta(seconds=2)
TOOL_START_TO_CLOSE = timedelta(minutes=15)
RETRY_SAFE_TOOL = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
)
# A tool that cannot tell whether a lost attempt took effect runs at most once.
ONCE_ONLY_TOOL = RetryPolicy(maximum_attempts=1)
# Fast, pure tools run as local activities (one workflow task instead of a server round
# trip); histories from before this ran them as ordinary activities.
LOCAL_TOOLS_PATCH = "local-activities-for-pure-tools"
LOCAL_TOOL_TIMEOUT = timedelta(seconds=10)
# The memo changes with the status only (the step is in the AgentStep search attribute);
# histories from before this wrote it every step.
MEMO_ON_STATUS_PATCH = "memo-on-status-change"
# A run due to continue as new may do so while it waits for a person; histories from
# before this waited on in the same run.
CONTINUE_AS_NEW_WHILE_WAITING_PATCH = "continue-as-new-while-waiting"
# After a limit ends a task, its run stays open this long for `resume_after_failure`: a
# reset re-runs that last step and the runtime's signal with the raised limits lands here.
RESUME_GRACE = timedelta(seconds=3)
RESUME_GRACE_PATCH = "resume-grace-after-limit"
# Stream items a run hands to the next at continue-as-new (token deltas dominate them):
# at most this many, and at most this many bytes of them.
STREAM_ITEMS_KEPT = 500
STREAM_BYTES_KEPT = 64_000
# Signalled decisions for requests not made yet are kept (and carried to the next run) up
# to this many; a flood of decisions for requests that never come cannot grow the task.
EARLY_DECISIONS_KEPT = 100
# A run continues as new once its history passes this (as the workflow sees it, which
# runs about 0.6x of what describe reports), well before Temporal's own suggestion, so no
# run's history reaches 2 MB.
HISTORY_BYTES_PER_RUN = 1_000_000

Via = Literal["update", "signal"]


class EventPage(Contract):
    """Answer of the `events` query: events with seq >= since, and where to ask next.

    A run holds the events from `first_seq` on; older ones are in `previous_run_id` (and
    the runs before it), which still answer this query.
    """

    events: list[AgentEvent]
    next_seq: int
    first_seq: int = 0
    previous_run_id: str | None = None


class RunCarry(Contract):
    """What one run hands the next at continue-as-new: the fold, the stream, the chain.

    `events` is empty at continue-as-new (the previous run keeps its events and answers
    for them; `previous_run_id` names it) and holds the prefix of the log for a fork.
    """

    events: list[AgentEvent]
    state: AgentState
    stream: WorkflowStreamState | None = None
    early_decisions: list[Decision] = []
    message: str | None = None
    """A user message to add first (a fork with an edited message)."""
    previous_run_id: str | None = None


def _model_call_options(model: ModelSettings) -> dict[str, Any]:
    """Timeouts and retries of an activity that calls the model (honours Retry-After)."""
    return {
        "start_to_close_timeout": timedelta(seconds=model.request_timeout_seconds * 10),
        "heartbeat_timeout": LLM_HEARTBEAT_TIMEOUT,
        "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=60),
            maximum_attempts=model.max_attempts,
            non_retryable_error_types=errors.NON_RETRYABLE_LLM_ERRORS,
        ),
    }


def _cancelled(err: BaseException) -> bool:
    return isinstance(err, ActivityError) and isinstance(err.cause, CancelledError)


def request_id_for(step: int, call_id: str) -> str:
    """Approval request ids are predictable, so a decision may arrive before the request."""
    return f"{step}-{call_id}"


@workflow.defn(name="AgentWorkflow")
class AgentWorkflow:
    """One agent task. The workflow id is the task id."""

    @workflow.init
    def __init__(self, task: AgentTask, carry: RunCarry | None = None) -> None:
        # The SDK applies type hints only when every parameter has a payload, so a start
        # with the task alone (the usual case) hands it over as a plain dict.
        task = AgentTask.model_validate(task)
        carry = RunCarry.model_validate(carry) if carry is not None else None
        self._task = task
        self._log: list[AgentEvent] = list(carry.events) if carry else []
        self._state = carry.state if carry else AgentState()
        # Seq of self._log[0]: the log of earlier runs stays with them.
        self._first_seq = self._state.last_seq + 1 - len(self._log)
        self._previous_run_id = carry.previous_run_id if carry else None
        self._stream = WorkflowStream(prior_state=carry.stream if carry else None)
        self._events_topic = self._stream.topic(EVENTS_TOPIC)
        self._early_decisions: dict[str, tuple[Decision, Via]] = {
            d.request_id: (d, "signal") for d in (carry.early_decisions if carry else [])
        }
        self._published_status: tuple[object, ...] | None = None
        self._digest = ConversationDigest()  # memory only: derived from the state's messages
        self._published_memo: dict[str, object] | None = None
        self._first_step_of_run = self._state.step
        self._resumed = False

    # --- the loop ---------------------------------------------------------------------------

    @workflow.run
    async def run(self, task: AgentTask, carry: RunCarry | None = None) -> AgentOutcome:
        """Run the loop until an answer, a limit, a non-retryable error or a cancellation."""
        if carry is None:
            self._append(
                TaskStarted(task_id=workflow.info().workflow_id, task=self._task, **self._meta(0))
            )
        elif carry.message:
            self._append(UserMessage(content=carry.message, **self._meta(self._state.step)))
        try:
            return await self._loop()
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not _cancelled(err):
                raise
            self._append(Cancelled(**self._meta(self._state.step)))
            await self._close_stream()
            raise asyncio.CancelledError() from None

    async def _loop(self) -> AgentOutcome:
        if (unfinished := self._unfinished_step()) is not None:
            await self._finish_step(*unfinished)
        while True:
            if self._should_continue_as_new():
                await self._continue_as_new()
            task = self._task
            used = self._state.usage.total
            if self._state.step >= task.max_steps:
                await self._limit_reached(
                    "max_steps",
                    f"reached max_steps={task.max_steps} without a final answer; every thought "
                    "and observation so far is kept, resume with a higher max_steps to go on",
                )
                continue
            if task.token_budget is not None and used >= task.token_budget:
                await self._limit_reached(
                    "token_budget",
                    f"used {used} tokens of the token_budget of {task.token_budget}; resume "
                    "with a higher budget to go on",
                )
                continue
            step = self._state.step + 1
            await self._fit_context(step)
            result = await self._call_llm(step)
            self._append(
                Thought(
                    content=result.content,
                    tool_calls=result.tool_calls,
                    usage=result.usage,
                    finish_reason=result.finish_reason,
                    model=result.model,
                    attempt=result.attempt,
                    **self._meta(step),
                )
            )
            if not result.tool_calls:
                self._append(Done(result=result.content, **self._meta(step)))
                await self._close_stream()
                return AgentOutcome(
                    result=result.content,
                    steps=step,
                    usage=self._state.usage,
                    last_seq=self._state.last_seq,
                )
            await self._finish_step(step, result.tool_calls, result.content or None)

    async def _limit_reached(self, kind: str, reason: str) -> None:
        """Fail the task, unless raised limits arrive within the grace (then go on)."""
        if not workflow.patched(RESUME_GRACE_PATCH):
            raise await self._fail(kind, reason)
        self._resumed = False
        self._append(Failed(kind=kind, reason=reason, **self._meta(self._state.step)))
        try:
            await workflow.wait_condition(lambda: self._resumed, timeout=RESUME_GRACE)
        except TimeoutError:
            await self._close_stream()
            raise ApplicationError(
                reason, kind, type=errors.AGENT_FAILED, non_retryable=True
            ) from None

    def _unfinished_step(self) -> tuple[int, list[ToolCall], str | None] | None:
        """The step the log stops inside of (a fork point): its calls lack observations."""
        for event in reversed(self._log):
            if isinstance(event, Thought):
                observed = {
                    e.call_id
                    for e in self._log
                    if isinstance(e, Observation) and e.step == event.step
                }
                if all(c.call_id in observed for c in event.tool_calls):
                    return None
                return event.step, event.tool_calls, event.content or None
            if isinstance(event, UserMessage | Done):
                return None
        return None

    async def _finish_step(
        self, step: int, calls: list[ToolCall], model_reason: str | None
    ) -> None:
        """Actions, approvals, tool runs and observations of a step, skipping what is logged."""
        logged = {e.call_id for e in self._log if isinstance(e, Action) and e.step == step}
        for call in calls:
            if call.call_id in logged:
                continue
            self._append(
                Action(
                    call_id=call.call_id,
                    tool=call.tool,
                    arguments=call.arguments,
                    raw_arguments=call.raw_arguments,
                    needs_approval=call.needs_approval and call.problem is None,
                    **self._meta(step),
                )
            )
        await self._await_approvals(step, calls, model_reason)
        observed = {e.call_id for e in self._log if isinstance(e, Observation) and e.step == step}
        todo = [c for c in calls if c.call_id not in observed]
        outputs = await asyncio.gather(*(self._run_call(step, c) for c in todo))
        for call, output in zip(todo, outputs, strict=True):
            self._append(
                Observation(
                    call_id=call.call_id,
                    tool=call.tool,
                    output=output.output,
                    is_error=output.is_error,
                    **self._meta(step),
                )
            )

    def _should_continue_as_new(self) -> bool:
        if self._state.step == self._first_step_of_run:
            return False  # a run makes progress before it hands over, whatever its size
        info = workflow.info()
        if info.is_continue_as_new_suggested():
            return True
        if info.get_current_history_size() > HISTORY_BYTES_PER_RUN:
            return True
        every = self._task.continue_as_new_after_steps
        return every is not None and self._state.step - self._first_step_of_run >= every

    async def _continue_as_new(self, unfinished_step: int | None = None) -> None:
        task = self._task  # with any limits raised since the start
        # A step cut short (waiting for approval) goes on in the next run, from its events.
        carried: list[AgentEvent] = []
        if unfinished_step is not None:
            start = max(
                i
                for i, e in enumerate(self._log)
                if isinstance(e, Thought) and e.step == unfinished_step
            )
            carried = self._log[start:]
        # The next run's input must stay far below the payload limit: the stream keeps its
        # latest items (older offsets read as an explicit gap), the events stay in this run.
        retained = self._stream.get_state()
        end = retained.base_offset + len(retained.log)
        kept, size = 0, 0
        for item in reversed(retained.log):
            size += len(item.data) + len(item.topic)
            if kept >= STREAM_ITEMS_KEPT or size > STREAM_BYTES_KEPT:
                break
            kept += 1
        if kept < len(retained.log):
            self._stream.truncate(end - kept)

        def next_run(stream: WorkflowStreamState) -> list[object]:
            carry = RunCarry(
                events=carried,
                state=self._state,
                stream=stream,
                early_decisions=[d for d, _ in self._early_decisions.values()],
                previous_run_id=workflow.info().run_id,
            )
            return [task, carry]

        await self._stream.continue_as_new(next_run)

    async def _fit_context(self, step: int) -> None:
        """Replace older turns by a summary when the conversation outgrows the task's limit."""
        limit = self._task.context_limit_tokens
        if limit is None:
            return
        span = compaction_range(self._state.messages, limit)
        if span is None:
            return
        start, end = span
        model = self._task.model
        result: SummaryResult = await workflow.execute_activity(
            "summarize_context",
            SummaryRequest(
                step=step,
                message_count=len(self._state.messages),
                start=start,
                end=end,
                model=model,
            ),
            result_type=SummaryResult,
            **_model_call_options(model),
        )
        self._append(
            ContextCompacted(
                summary=result.summary,
                start=start,
                end=end,
                usage=result.usage,
                **self._meta(self._state.step),
            )
        )

    async def _call_llm(self, step: int) -> LlmResult:
        model = self._task.model
        try:
            result: LlmResult = await workflow.execute_activity(
                "call_llm",
                LlmRequest(
                    step=step,
                    message_count=len(self._state.messages),
                    model=model,
                    conversation_digest=self._digest.of(self._state.messages),
                ),
                result_type=LlmResult,
                **_model_call_options(model),
            )
            return result
        except ActivityError as err:
            if _cancelled(err):
                raise
            cause = err.cause
            detail = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            failure = await self._fail("llm_error", f"the LLM call of step {step} failed: {detail}")
            raise failure from None

    # --- approval ---------------------------------------------------------------------------

    async def _await_approvals(
        self, step: int, calls: list[ToolCall], model_reason: str | None
    ) -> None:
        waiting: list[str] = []
        for call in calls:
            if not call.needs_approval or call.problem is not None or call.arguments is None:
                continue
            request_id = request_id_for(step, call.call_id)
            if request_id in self._state.decisions:
                continue
            waiting.append(request_id)
            if request_id in self._state.pending_approvals:
                continue  # requested before a fork point: still waiting
            self._append(
                ApprovalRequested(
                    request_id=request_id,
                    call_id=call.call_id,
                    tool=call.tool,
                    arguments=call.arguments,
                    reason=call.approval_reason,
                    model_reason=model_reason,
                    **self._meta(step),
                )
            )
            if (early := self._early_decisions.pop(request_id, None)) is not None:
                self._record_decision(*early)
        if not waiting:
            return
        settings = self._task.approval
        # A request carried over from an earlier run of this task keeps its deadline; a
        # fork is a new task, whose pending requests wait afresh.
        first_request = workflow.now()
        if self._previous_run_id is not None:
            first_request = min(
                (
                    pending.requested_at
                    for r, pending in self._state.pending_approvals.items()
                    if r in waiting
                ),
                default=first_request,
            )
        remaining = first_request + timedelta(seconds=settings.timeout_seconds) - workflow.now()
        hand_over = workflow.patched(CONTINUE_AS_NEW_WHILE_WAITING_PATCH)

        def decided() -> bool:
            return all(r in self._state.decisions for r in waiting)

        try:
            if remaining <= timedelta(0):
                raise TimeoutError
            await workflow.wait_condition(
                lambda: decided() or (hand_over and self._should_continue_as_new()),
                timeout=remaining,
            )
            if not decided():
                # The run is due to hand over while a person decides: the next run
                # carries this step's events and waits on, from the same requests.
                await self._continue_as_new(unfinished_step=step)
        except TimeoutError:
            for request_id in waiting:
                if request_id not in self._state.decisions:
                    self._append(
                        ApprovalResolved(
                            request_id=request_id,
                            decision="timeout",
                            message=f"no decision within {settings.timeout_seconds:g} s",
                            via="timeout",
                            **self._meta(step),
                        )
                    )
            if settings.on_timeout == "fail":
                raise await self._fail(
                    "approval_timeout",
                    f"no approval decision within {settings.timeout_seconds:g} s",
                ) from None

    async def _run_call(self, step: int, call: ToolCall) -> ToolResult:
        if call.problem is not None or call.arguments is None:
            return ToolResult(output=call.problem or "the call has no arguments", is_error=True)
        arguments = call.arguments
        note = ""
        if call.needs_approval:
            outcome = self._state.decisions[request_id_for(step, call.call_id)]
            if outcome.decision == "timeout":
                return ToolResult(
                    output="Nobody decided on this call in time, so it was not run.", is_error=True
                )
            if outcome.decision == "reject":
                why = f" The reviewer said: {outcome.message}" if outcome.message else ""
                return ToolResult(
                    output=f"A person rejected this {call.tool} call; it was not run.{why}",
                    is_error=True,
                )
            arguments = outcome.arguments if outcome.arguments is not None else arguments
            note = f"\n[approved with a note: {outcome.message}]" if outcome.message else ""
        request = ToolRequest(
            call_id=call.call_id,
            tool=call.tool,
            arguments=arguments,
            idempotency_key=f"{workflow.info().workflow_id}/{step}/{call.call_id}",
        )
        try:
            result: ToolResult
            if call.local and call.retry_safe and workflow.patched(LOCAL_TOOLS_PATCH):
                result = await workflow.execute_local_activity(
                    "run_tool",
                    request,
                    result_type=ToolResult,
                    start_to_close_timeout=LOCAL_TOOL_TIMEOUT,
                    retry_policy=RETRY_SAFE_TOOL,
                )
            else:
                result = await workflow.execute_activity(
                    "run_tool",
                    request,
                    result_type=ToolResult,
                    start_to_close_timeout=TOOL_START_TO_CLOSE,
                    heartbeat_timeout=TOOL_HEARTBEAT_TIMEOUT,
                    retry_policy=RETRY_SAFE_TOOL if call.retry_safe else ONCE_ONLY_TOOL,
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
        except ActivityError as err:
            if _cancelled(err):
                raise
            lost = "it may or may not have taken effect; it was not run again"
            detail = (
                err.cause.message if isinstance(err.cause, ApplicationError) else str(err.cause)
            )
            return ToolResult(
                output=f"{call.tool} did not complete ({detail}): {lost}", is_error=True
            )
        return result.model_copy(update={"output": result.output + note}) if note else result

    def _record_decision(self, decision: Decision, via: Via) -> DecisionOutcome:
        existing = self._state.decisions.get(decision.request_id)
        if existing is not None:
            if not decision.repeats(existing):
                raise ApplicationError(
                    f"request {decision.request_id} was already decided: {existing.decision}",
                    type=errors.DECISION_CONFLICT,
                )
            return existing.model_copy(update={"duplicate": True})
        self._append(
            ApprovalResolved(
                request_id=decision.request_id,
                decision=decision.decision,
                approver=decision.approver,
                message=decision.message,
                arguments=decision.arguments,
                via=via,
                **self._meta(self._state.step),
            )
        )
        return self._state.decisions[decision.request_id]

    def _check_decision(self, decision: Decision) -> None:
        existing = self._state.decisions.get(decision.request_id)
        if existing is not None:
            if not decision.repeats(existing):
                raise ApplicationError(
                    f"request {decision.request_id} was already decided: {existing.decision}"
                    + (f" by {existing.approver}" if existing.approver else ""),
                    type=errors.DECISION_CONFLICT,
                )
            return
        if decision.request_id not in self._state.pending_approvals:
            if self._state.finished or not self._state.pending_approvals:
                raise ApplicationError(
                    f"task is {self._state.status}, not waiting for approval "
                    f"(request {decision.request_id})",
                    type=errors.TASK_NOT_WAITING,
                )
            raise ApplicationError(
                f"unknown approval request {decision.request_id}; pending: "
                + ", ".join(self._state.pending_approvals),
                type=errors.UNKNOWN_REQUEST,
            )

    @workflow.update(name="decide")
    async def decide(self, decision: Decision) -> DecisionOutcome:
        """Approve or reject one request. Repeating a decision returns the first outcome."""
        return self._record_decision(decision, "update")

    @decide.validator
    def _validate_decide(self, decision: Decision) -> None:
        self._check_decision(decision)

    @workflow.signal(name="approve")
    def approve(self, decision: Decision) -> None:
        """Approve a request (for `temporal workflow signal --name approve`)."""
        self._signal_decision(decision.model_copy(update={"decision": "approve"}))

    @workflow.signal(name="reject")
    def reject(self, decision: Decision) -> None:
        """Reject a request (for `temporal workflow signal --name reject`)."""
        self._signal_decision(decision.model_copy(update={"decision": "reject"}))

    def _signal_decision(self, decision: Decision) -> None:
        request_id = decision.request_id
        if request_id in self._state.decisions:
            existing = self._state.decisions[request_id]
            self._append(
                ErrorEvent(
                    kind="duplicate_decision",
                    message=f"ignored a second decision ({decision.decision}) for request "
                    f"{request_id}, already decided: {existing.decision}",
                    **self._meta(self._state.step),
                )
            )
        elif request_id in self._state.pending_approvals:
            self._record_decision(decision, "signal")
        elif self._state.finished:
            self._append(
                ErrorEvent(
                    kind="late_decision",
                    message=f"ignored a decision for request {request_id}: the task has ended",
                    **self._meta(self._state.step),
                )
            )
        elif len(self._early_decisions) >= EARLY_DECISIONS_KEPT:
            self._append(
                ErrorEvent(
                    kind="unknown_request",
                    message=f"ignored a decision for request {request_id}: no such request, "
                    f"and {EARLY_DECISIONS_KEPT} decisions already wait for theirs",
                    **self._meta(self._state.step),
                )
            )
        else:
            # A fast approver can decide before the step that asks reaches its wait.
            self._early_decisions[request_id] = (decision, "signal")

    @workflow.signal(name="resume_after_failure")
    def resume_after_failure(self, resumption: Resumption) -> None:
        """Sent right after a reset of a failed task: raise its limits, note what failed."""
        updates: dict[str, object] = {}
        if resumption.max_steps is not None:
            updates["max_steps"] = resumption.max_steps
        if resumption.token_budget is not None:
            updates["token_budget"] = resumption.token_budget
        self._task = self._task.model_copy(update=updates)
        self._resumed = True
        self._append(
            Resumed(
                failure=resumption.failure,
                failure_kind=resumption.failure_kind,
                max_steps=self._task.max_steps,
                token_budget=self._task.token_budget,
                **self._meta(self._state.step),
            )
        )

    # --- queries ----------------------------------------------------------------------------

    @workflow.query(name="state")
    def state(self) -> AgentState:
        """The fold of every event published so far."""
        return self._state

    @workflow.query(name="events")
    def events(self, since: int = 0) -> EventPage:
        """Events with seq >= since."""
        start = max(0, since - self._first_seq)
        return EventPage(
            events=self._log[start:],
            next_seq=self._first_seq + len(self._log),
            first_seq=self._first_seq,
            previous_run_id=self._previous_run_id,
        )

    @workflow.query(name="llm_context")
    def llm_context(self, message_count: int) -> LlmContext:
        """The conversation an LLM step reads (its first `message_count` messages)."""
        return LlmContext(
            messages=self._state.messages[:message_count],
            tools=self._task.tools,
            approval_policy=self._task.approval.policy,
        )

    # --- the log ----------------------------------------------------------------------------

    def _meta(self, step: int) -> dict[str, object]:
        return {
            "seq": self._first_seq + len(self._log),
            "step": step,
            "at": workflow.now(),
            "history_length": workflow.info().get_current_history_length(),
        }

    def _append(self, event: AgentEvent) -> None:
        self._state = apply(self._state, event)
        self._log.append(event)
        self._events_topic.publish(event)
        self._publish_status()

    def _publish_status(self) -> None:
        """Keep the search attributes (every step) and the memo (every status) current."""
        pending = self._state.pending_approvals.values()
        waiting_since = min((p.requested_at for p in pending), default=None)
        current = (self._state.status, self._state.step, waiting_since)
        if current == self._published_status:
            return
        self._published_status = current
        updates: list[SearchAttributeUpdate[Any]] = [
            search.AGENT_STATUS.value_set(self._state.status),
            search.AGENT_STEP.value_set(self._state.step),
            search.AGENT_MODEL.value_set(self._task.model.name),
            search.AGENT_WAITING_SINCE.value_set(waiting_since)
            if waiting_since is not None
            else search.AGENT_WAITING_SINCE.value_unset(),
        ]
        workflow.upsert_search_attributes(updates)
        memo: dict[str, object] = {"status": self._state.status}
        if pending:
            memo["waiting_for"] = ", ".join(f"{p.tool} [{p.request_id}]" for p in pending)
        if workflow.patched(MEMO_ON_STATUS_PATCH):
            if memo == self._published_memo:
                return  # the step is in AgentStep; a memo write per step costs history
            self._published_memo = memo
        else:
            memo["step"] = self._state.step
        workflow.upsert_memo(memo)

    async def _fail(self, kind: str, reason: str) -> ApplicationError:
        self._append(Failed(kind=kind, reason=reason, **self._meta(self._state.step)))
        await self._close_stream()
        return ApplicationError(reason, kind, type=errors.AGENT_FAILED, non_retryable=True)

    async def _close_stream(self) -> None:
        # Release long-poll subscribers and let every handler finish before the run ends.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
