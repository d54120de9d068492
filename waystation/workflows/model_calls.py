"""The model's side of a step: one model call (cancelled for a message that interrupts),
a summary that compacts the conversation, and the MCP servers' tool listings the model
is offered.
"""

from __future__ import annotations

import asyncio

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
    outputs,
)
from waystation.workflows.events import (
    ContextCompacted,
    ErrorEvent,
    Interrupted,
    OutputRejected,
    WaitingWorker,
    WorkerFound,
    draft,
    thought_of,
)
from waystation.workflows.models import (
    LlmRequest,
    LlmResult,
    SummaryRequest,
)
from waystation.workflows.plan import Fail
from waystation.workflows.recovery import after_context_overflow
from waystation.workflows.run_core import RunCore, sample_clock
from waystation.workflows.tool_catalog import catalog_digest

# Before it, a server's notice that its tools changed was not acted on.
RELIST_PATCH = "mcp-relist-changed"


class ModelCalls(RunCore):
    """Calling the model, compacting, and listing the MCP tools it is offered."""

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
            requires=self._task.requires,
            wait_for_capable_worker=self._state.status == "waiting_worker",
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
            self._clock = sample_clock()
            if interrupting and activity_calls.cancelled_by_request(err):
                self._interrupted(step, request)
                return
            if activity_calls.cancelled(err):
                raise asyncio.CancelledError() from None
            await self._model_failed(step, request, err)
            return
        self._clock = sample_clock()
        if request.wait_for_capable_worker:
            self._append(draft(WorkerFound, self._state.step, worker=result.worker))
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
            model=self._task.model,
            conversation_digest=self._conversation_digest(),
        )
        try:
            result = await activity_calls.summarize(self._task, request)
        except ActivityError as err:
            detail = activity_calls.detail(err)
            reason = f"summarizing the conversation failed: {detail}"
            await self._fail(FailureKind.LLM_ERROR, reason)
            return
        self._clock = sample_clock()
        compacted = {"summary": result.summary, "usage": result.usage, "start": start, "end": end}
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
