"""The model's side of a step: one model call (cancelled for a message that interrupts),
a summary that compacts the conversation, and the MCP servers' tool listings the model
is offered.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
)

from waystation.vocabulary import FailureKind
from waystation.workflows import (
    activity_calls,
    errors,
    messages,
    options,
    outputs,
)
from waystation.workflows.events import (
    ContextCompacted,
    ErrorEvent,
    Interrupted,
    ModelSwitched,
    OutputRejected,
    QuotaGranted,
    Thought,
    WaitingQuota,
    WaitingWorker,
    WorkerFound,
    draft,
    price_in,
    thought_of,
)
from waystation.workflows.models import (
    LlmRequest,
    LlmResult,
    ModelSettings,
    QuotaNotice,
    SummaryRequest,
)
from waystation.workflows.plan import Fail
from waystation.workflows.recovery import after_context_overflow
from waystation.workflows.run_core import RunCore, sample_clock
from waystation.workflows.tool_catalog import catalog_digest

# Before it, a server's notice that its tools changed was not acted on.
RELIST_PATCH = "mcp-relist-changed"
# Before it, a task's fallback_models were not acted on.
FALLBACK_PATCH = "model-fallback"


def model_chain(model: ModelSettings) -> list[str]:
    """The models a turn's steps may call, in order (each once)."""
    return list(dict.fromkeys([model.name, *model.fallback_models]))


class ModelCalls(RunCore):
    """Calling the model, compacting, and listing the MCP tools it is offered."""

    async def _call_model(self, step: int) -> None:
        """One model call; an answer ends the turn, tool calls open a step. A message that
        asks to interrupt cancels the call, and the step starts again with it. A model the
        task can fall back from is retried here until fallback_after_seconds; if it is down
        all that while, the step goes on with the next model."""
        chain = model_chain(self._task.model)
        index = self._model_index(chain)
        model = self._model_in_use()
        # Tasks that name no fallback never ask, and make the commands they always made.
        falls_back = index + 1 < len(chain) and workflow.patched(FALLBACK_PATCH)
        since = workflow.now()
        failures = 0
        while True:
            # Numbered past every attempt of this step's earlier models and interrupted calls.
            blocks = self._state.interrupts + index
            request = LlmRequest(
                step=step,
                message_count=len(self._state.conversation),
                model=model,
                conversation_digest=self._conversation_digest(),
                catalog_digest=catalog_digest(self._catalog) if self._catalog else None,
                first_attempt=1 + blocks * model.max_attempts + failures,
                requires=self._task.requires,
                wait_for_capable_worker=self._state.status == "waiting_worker",
                tenant=self._task.tenant,
            )
            retried_here = falls_back and not request.wait_for_capable_worker
            # Whatever came before the call is scheduled cannot be of it.
            self._quota_notices.clear()
            call = activity_calls.start_model_call(
                self._task, request, retried_by_workflow=retried_here
            )
            interrupting = await self._until_done_or_interrupted(call, request)
            try:
                result: LlmResult = await call
            except ActivityError as err:
                self._clock = sample_clock()
                if interrupting and activity_calls.cancelled_by_request(err):
                    self._interrupted(step, request)
                    return
                if activity_calls.cancelled(err):
                    raise asyncio.CancelledError() from None
                if retried_here and activity_calls.retryable(err):
                    failures += 1
                    delay = options.model_retry_delay(failures, activity_calls.retry_after(err))
                    within = workflow.now() + delay - since <= self._fallback_after()
                    outage = activity_calls.outage(err)
                    if failures < model.max_attempts and (within or not outage):
                        if await self._pause_before_retry(delay):
                            continue
                        self._interrupted(step, request)
                        return
                if falls_back and activity_calls.outage(err):
                    if request.wait_for_capable_worker:
                        self._append(draft(WorkerFound, self._state.step, worker=None))
                    self._switch_model(chain[index], chain[index + 1], err)
                    return
                await self._model_failed(step, request, err)
                return
            break
        self._clock = sample_clock()
        if request.wait_for_capable_worker:
            self._append(draft(WorkerFound, self._state.step, worker=result.worker))
        self._append(thought_of(step, result, price_in(self._task, model.name)))
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

    async def _until_done_or_interrupted(
        self, call: workflow.ActivityHandle[LlmResult], request: LlmRequest
    ) -> bool:
        """Wait for the call, or cancel it for a message that interrupts: whether one did.
        Meanwhile the call's notices of its wait under a quota are recorded as they come;
        the wait is closed (quota_granted) before whatever ends the call."""

        def woken() -> bool:
            return call.done() or messages.interrupting(self._incoming) or bool(self._quota_notices)

        try:
            await workflow.wait_condition(woken)
            while self._quota_notices:
                self._record_quota_notices(request)
                await workflow.wait_condition(woken)
        except asyncio.CancelledError:
            await activity_calls.cancelled_call(call)
            raise
        self._close_quota_wait()
        if call.done():
            return False
        call.cancel()
        return True

    def _record_quota_notices(self, request: LlmRequest) -> None:
        """The notices that came, in the order they came; those of an earlier attempt (or
        of a wait that is not recorded) change nothing."""
        notices, self._quota_notices = self._quota_notices, []
        for notice in notices:
            wait = self._state.quota_wait
            latest = wait.attempt if wait is not None else request.first_attempt
            if notice.step != request.step or notice.attempt < latest:
                continue
            if notice.state == "waiting":
                told = (notice.quota, notice.limit, notice.expected_seconds, notice.attempt)
                # A notice sent again (a retried signal) is recorded once.
                if wait is None or told != (wait.quota, wait.limit, wait.expected_seconds, latest):
                    self._clock = sample_clock()
                    self._append(self._waiting_quota(notice))
            elif wait is not None and notice.attempt >= wait.attempt:
                # A later attempt's turn ends the wait an earlier one told and died in.
                self._clock = sample_clock()
                waited = notice.waited_seconds or 0.0
                self._append(
                    draft(QuotaGranted, self._state.step, quota=notice.quota, waited_seconds=waited)
                )

    def _waiting_quota(self, notice: QuotaNotice) -> WaitingQuota:
        return draft(
            WaitingQuota,
            notice.step,
            quota=notice.quota,
            limit=notice.limit,
            expected_seconds=notice.expected_seconds,
            attempt=notice.attempt,
        )

    def _close_quota_wait(self) -> None:
        """The call ended (or is being cancelled) while the task still shows its wait."""
        wait = self._state.quota_wait
        if wait is None:
            return
        self._clock = sample_clock()
        waited = max(0.0, (self._clock.now - wait.since).total_seconds())
        self._append(
            draft(QuotaGranted, self._state.step, quota=wait.quota, waited_seconds=round(waited, 3))
        )

    def _fallback_after(self) -> timedelta:
        return timedelta(seconds=self._task.model.fallback_after_seconds)

    async def _pause_before_retry(self, delay: timedelta) -> bool:
        """Wait before the model is called again; False if a message interrupts meanwhile."""
        try:
            await workflow.wait_condition(
                lambda: messages.interrupting(self._incoming), timeout=delay
            )
        except TimeoutError:
            self._clock = sample_clock()
            return True
        self._clock = sample_clock()
        return False

    def _switch_model(self, from_model: str, to_model: str, err: ActivityError) -> None:
        """The step goes on with the next model; reasoning another model gave is not sent."""
        dropped = sum(
            1
            for event in self._log
            if isinstance(event, Thought)
            for item in event.reasoning
            if item.model != to_model
        )
        reason = f"{from_model} kept failing: {activity_calls.detail(err)}"
        self._append(
            draft(
                ModelSwitched,
                self._state.step,
                from_model=from_model,
                to_model=to_model,
                reason=reason,
                reasoning_dropped=dropped,
            )
        )

    def _model_index(self, chain: list[str]) -> int:
        name = self._state.model
        return chain.index(name) if name is not None and name in chain else 0

    def _model_in_use(self) -> ModelSettings:
        """The task's model settings, named for the model this turn's steps call now."""
        index = self._model_index(model_chain(self._task.model))
        if not index:
            return self._task.model
        return self._task.model.model_copy(update={"name": self._state.model})

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

    async def _model_failed(self, step: int, request: LlmRequest, err: ActivityError) -> None:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == errors.WORKER_LACKS:
            # The loop calls the model again, waiting for a worker that has what it needs.
            missing = [str(name) for name in cause.details[0]] if cause.details else []
            at = self._state.step
            self._append(draft(WaitingWorker, at, missing=missing, message=cause.message))
            return
        if request.wait_for_capable_worker:
            # A worker that has what the task needs made the call, which failed past its
            # attempts: the wait is over, and the failure is the call's, as any other.
            self._append(draft(WorkerFound, self._state.step, worker=None))
        if not (isinstance(cause, ApplicationError) and cause.type == errors.LLM_CONTEXT_TOO_LONG):
            detail = activity_calls.detail(err)
            await self._fail(FailureKind.LLM_ERROR, f"the LLM call of step {step} failed: {detail}")
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
            model=self._model_in_use(),
            conversation_digest=self._conversation_digest(),
            tenant=self._task.tenant,
        )
        try:
            result = await activity_calls.summarize(self._task, request)
        except ActivityError as err:
            detail = activity_calls.detail(err)
            reason = f"summarizing the conversation failed: {detail}"
            await self._fail(FailureKind.LLM_ERROR, reason)
            return
        self._clock = sample_clock()
        usage = result.usage.priced(price_in(self._task, request.model.name))
        compacted = {"summary": result.summary, "usage": usage, "start": start, "end": end}
        self._append(draft(ContextCompacted, self._state.step, **compacted))

    async def _list_tools(self, servers: list[str]) -> None:
        listed = await activity_calls.list_tools(self._task, servers)
        self._clock = sample_clock()
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
