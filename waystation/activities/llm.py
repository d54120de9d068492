"""The model activities: `call_llm` (stream one assistant message, publish its tokens),
`summarize_context` and `save_conversation`.

None of them gets the conversation in its input, so history stays flat: each message
enters history once, as the result that produced it. The conversation is rebuilt from what
this worker saw when that provably matches, and otherwise read through the workflow's
`llm_context` query (what the current run holds) and the conversation store (what earlier
runs saved when they handed over).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.workflow_streams import TopicHandle, WorkflowStreamClient
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from waystation.activities.agent_tools import TaskTools
from waystation.activities.attempt_step import failures_name_step
from waystation.activities.call_ids import unique_call_ids
from waystation.activities.chat import ChatBackend, ChatDelta
from waystation.activities.conversation_cache import Conversation, ConversationCache
from waystation.activities.conversation_store import ConversationStore
from waystation.activities.heartbeat import Watchdog, watched
from waystation.activities.mcp.activities import McpActivities, check_call, with_unavailable_servers
from waystation.activities.model_backends import ModelBackends
from waystation.activities.offline_model import OfflineModel
from waystation.activities.quota_notices import QuotaNoticeSender
from waystation.activities.quotas import (
    DEFAULT_LEASE_SECONDS,
    NOTICE_AFTER_SECONDS,
    InputCalibration,
    QuotaGate,
    Quotas,
    QuotaTurn,
    listening_for_rate_limits,
)
from waystation.activities.redaction import Redactor
from waystation.activities.spans import span
from waystation.activities.storage.errors import StorageError
from waystation.activities.storage.quota_state import QuotaDecision
from waystation.activities.structured_output import final_answer_call, native_answer
from waystation.activities.text_tool_calls import recover_tool_calls
from waystation.activities.tools import ToolRegistry
from waystation.settings.model_endpoints import ModelEndpoint, all_endpoints
from waystation.workflows import errors, outputs
from waystation.workflows.conversation import (
    assistant_message,
    conversation_digest,
    estimate_tokens,
    message_digest,
)
from waystation.workflows.models import (
    FINAL_ANSWER_TOOL,
    ChatMessage,
    ConversationSnapshot,
    LlmRequest,
    LlmResult,
    ModelSettings,
    ReasoningItem,
    SummaryRequest,
    SummaryResult,
    ToolCall,
    Usage,
)
from waystation.workflows.run import AgentOutcome, LlmContext
from waystation.workflows.stream import TOKENS_TOPIC, LlmAttemptStarted, TokenDelta
from waystation.workflows.tool_catalog import is_mcp_tool_name

TOKEN_BATCH_INTERVAL = timedelta(milliseconds=100)
# Publishing the last tokens may not hold up the answer for longer than this.
PUBLISHER_EXIT_SECONDS = 5.0
# How long the work around the model call may go without progress.
CONVERSATION_READ_SECONDS = 120.0
# Calls of one message that may run; the rest are answered with TOO_MANY_CALLS. Temporal
# fails every workflow task of a run with more than 2,000 pending activities (or children),
# so a message with more calls than that would leave its task stuck.
MAX_CALLS_PER_MESSAGE = 64
TOO_MANY_CALLS = (
    f"not run: a message may make at most {MAX_CALLS_PER_MESSAGE} tool calls; make this one "
    "again in a later step if you still need it"
)
SUMMARY_INSTRUCTIONS = (
    "Summarize this part of an agent's conversation for the agent's own later use: the "
    "facts learned, the results of tool calls, decisions made, and what is still open. "
    "Be concise and keep exact values."
)


@dataclass
class _PendingCall:
    call_id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class AssembledMessage:
    """Text and tool calls put back together from a stream of deltas."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    reasoning: list[ReasoningItem] = field(default_factory=list)

    def add(self, delta: ChatDelta) -> None:
        if delta.text:
            self.text.append(delta.text)
        if delta.tool_call_index is not None:
            call = self.calls.setdefault(delta.tool_call_index, _PendingCall())
            if delta.tool_call_id:
                call.call_id = delta.tool_call_id
            if delta.tool_name:
                call.name += delta.tool_name
            call.arguments += delta.tool_arguments
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        if delta.usage is not None:
            self.usage = delta.usage
        if delta.model:
            self.model = delta.model
        if delta.reasoning is not None:
            self.reasoning.append(delta.reasoning)


class TokenPublisher:
    """Publishes token deltas of one attempt on the task's stream, in batches.

    Tokens are held for the first batch interval. A message that completes within it
    publishes none: the step's thought event, appended as the call returns, carries the
    same text at the same moment, and the task is spared a signal and a workflow task.
    Anything slower streams live from then on, a batch every TOKEN_BATCH_INTERVAL. Until it
    goes live a publisher holds no stream client and no task, only a timer: most calls of a
    fast model never need them.

    The batching timer is our own: the stream client's background flusher waits with
    `asyncio.wait_for`, which on Python 3.11 can swallow the cancellation that stops it,
    and then never lets its `async with` block exit.
    """

    def __init__(self, step: int, attempt: int) -> None:
        self._step = step
        self._attempt = attempt
        self._index = 0
        self._client: WorkflowStreamClient | None = None
        self._topic: TopicHandle[Any] | None = None
        self._held: list[TokenDelta] = []
        self._wake = asyncio.Event()
        self._going_live: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TokenPublisher:
        if self._attempt > 1:
            # A retry is announced at once, so viewers can drop the void partial text.
            self._go_live(LlmAttemptStarted(step=self._step, attempt=self._attempt))
        else:
            loop = asyncio.get_running_loop()
            self._going_live = loop.call_later(TOKEN_BATCH_INTERVAL.total_seconds(), self._go_live)
        return self

    def _go_live(self, first: LlmAttemptStarted | None = None) -> None:
        """Publish what is held and stream from now on, a batch every interval."""
        client = WorkflowStreamClient.from_within_activity(max_retry_duration=timedelta(seconds=30))
        self._client, self._topic = client, client.topic(TOKENS_TOPIC)
        for item in [first] if first is not None else self._held:
            self._topic.publish(item)
        self._held.clear()
        self._flusher = asyncio.create_task(self._flush_in_batches(client))

    async def _flush_in_batches(self, client: WorkflowStreamClient) -> None:
        interval = TOKEN_BATCH_INTERVAL.total_seconds()
        while True:
            await client.flush()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({woken}, timeout=interval)
            finally:
                woken.cancel()
            self._wake.clear()

    def publish(self, text: str) -> None:
        delta = TokenDelta(step=self._step, attempt=self._attempt, index=self._index, text=text)
        self._index += 1
        if self._topic is not None:
            self._topic.publish(delta)
        else:
            self._held.append(delta)

    async def __aexit__(self, *exc: object) -> None:
        if self._going_live is not None:
            self._going_live.cancel()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher
        if self._client is None:
            return  # completed (or failed) before going live: the thought has it all
        # Tokens are a live view, not the record: losing them must not fail or stall the step.
        closing = asyncio.ensure_future(self._client.flush())
        done, _ = await asyncio.wait({closing}, timeout=PUBLISHER_EXIT_SECONDS)
        if not done:
            closing.cancel()
            activity.logger.warning("gave up publishing the last token deltas of this attempt")
        elif (err := closing.exception()) is not None:
            activity.logger.warning("could not publish token deltas", exc_info=err)


class LlmActivities:
    """The model activities over a tool registry, the model endpoints (activities/
    model_backends.py: each `ENDPOINT:MODEL`'s client, or the offline model) and the
    conversation store. Built once per worker (worker.py)."""

    def __init__(
        self,
        registry: ToolRegistry,
        store: ConversationStore,
        api_key: str | None = None,
        base_url: str | None = None,
        backends: Mapping[str, ChatBackend] | None = None,
        conversations: ConversationCache | None = None,
        mcp: McpActivities | None = None,
        redactor: Redactor | None = None,
        endpoints: Mapping[str, ModelEndpoint] | None = None,
        environ: Mapping[str, str] | None = None,
        quotas: QuotaGate | None = None,
    ) -> None:
        """`api_key` and `base_url` are the OpenAI endpoints' (as OPENAI_API_KEY and
        OPENAI_BASE_URL in `environ`, the variables every endpoint reads its key and place
        from); `endpoints` the declared ones; `backends` serve models by their whole name;
        `quotas` the gate that holds calls to their endpoints' limits (None: no limits)."""
        self._registry = registry
        self._task_tools = TaskTools(registry)
        self._store = store
        self._mcp = mcp
        self._redactor = redactor or Redactor()
        self._conversations = conversations or ConversationCache()
        self.context_reads: Counter[Literal["rebuilt", "queried"]] = Counter()
        """How each call got its conversation: rebuilt from what this worker saw, or by query."""
        environ = dict(environ or {})
        if api_key:
            environ["OPENAI_API_KEY"] = api_key
        if base_url:
            environ["OPENAI_BASE_URL"] = base_url
        self._backends = ModelBackends(endpoints, environ, backends)
        self._endpoints = all_endpoints(endpoints or {})
        self._quotas = quotas
        self._input_calibration = InputCalibration()

    @property
    def conversations(self) -> ConversationCache:
        """What this worker saw of each task's conversation."""
        return self._conversations

    async def close(self) -> None:
        """Close the endpoints' HTTP clients (the worker does this as it shuts down)."""
        if self._quotas is not None:
            await self._quotas.close()
        await self._backends.close()

    def _backend(self, model: ModelSettings) -> tuple[ChatBackend, ModelSettings]:
        """The backend that calls the model, and the model's settings as it is given them:
        the name its endpoint knows it by."""
        backend, model_id = self._backends.route(model.name)
        return backend, model if model_id == model.name else model.model_copy(
            update={"name": model_id}
        )

    def _quotas_of(self, model_name: str) -> Quotas:
        """The quotas a call of `model_name` counts against (none without a gate)."""
        if self._quotas is None:
            return []
        endpoint, model_id = self._backends.endpoint_of(model_name)
        if endpoint is None:
            return []
        return self._endpoints[endpoint].quotas_of(endpoint, model_id)

    # --- the conversation -------------------------------------------------------------------

    async def _conversation(
        self, message_count: int, digest: str, catalog: str | None = None
    ) -> Conversation:
        """The conversation of the step: rebuilt here when that provably matches, else read."""
        workflow_id = activity.info().workflow_id or ""
        rebuilt = self._conversations.rebuild(workflow_id, message_count, digest)
        if rebuilt is not None and rebuilt.catalog_digest == catalog:
            self.context_reads["rebuilt"] += 1
            return rebuilt
        self.context_reads["queried"] += 1
        context = await self._query_context(message_count)
        messages = await self._fill(context, workflow_id)
        if conversation_digest(context.digests) != digest:
            raise ApplicationError(
                "the conversation read back does not match the step's; reading it again",
                type=errors.LLM_UNAVAILABLE,
            )
        return Conversation(
            messages,
            context.digests,
            context.tools,
            context.approval_policy,
            context.catalog,
            context.output_schema,
            agents=context.agents,
        )

    async def _query_context(self, message_count: int) -> LlmContext:
        from waystation.workflows.agent import AgentWorkflow  # the workflow module imports this one

        info = activity.info()
        handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            activity.client().get_workflow_handle_for(
                AgentWorkflow.run, info.workflow_id or "", run_id=info.workflow_run_id
            )
        )
        context = await handle.query(AgentWorkflow.llm_context, message_count)
        if len(context.digests) != message_count:
            raise ApplicationError(
                f"conversation has {len(context.digests)} messages, expected {message_count}",
                type=errors.LLM_UNAVAILABLE,
            )
        return context

    async def _fill(self, context: LlmContext, workflow_id: str) -> list[ChatMessage]:
        """The messages of `context`: what the run held, what this worker saw, the store."""
        known = self._conversations.known(workflow_id)
        found = {
            d: m
            for d, m in zip(context.digests, context.messages, strict=True)
            if m is not None and message_digest(m) == d
        }
        found.update({d: known[d] for d in context.digests if d not in found and d in known})
        missing = [d for d in context.digests if d not in found]
        if missing:
            found.update(await self._store.get(missing))
        if missing := [d for d in context.digests if d not in found]:
            info = activity.info()
            found.update(
                await _held_by(info.workflow_id or "", info.workflow_run_id or "", missing)
            )
        if lost := [d for d in context.digests if d not in found]:
            raise ApplicationError(
                f"{len(lost)} message(s) of the conversation are neither in the task's current "
                "run nor in the conversation store: every worker of a task queue must share "
                "one store (WAYSTATION_DATABASE_URL when workers run on several machines)",
                type=errors.CONVERSATION_LOST,
                non_retryable=True,
            )
        return [found[d] for d in context.digests]

    @activity.defn(name="save_conversation")
    async def save_conversation(self, snapshot: ConversationSnapshot) -> None:
        """Put every message of the conversation in the store, before its run hands over (or
        as a fork starts from another task's run): the next run holds only references."""
        watchdog = Watchdog(CONVERSATION_READ_SECONDS, "saving the conversation")
        async with watched(watchdog):
            context = await self._query_context(snapshot.message_count)
            held = {d: m for d, m in zip(context.digests, context.messages, strict=True) if m}
            rest = [d for d in context.digests if d not in held]
            stored = await self._store.get(rest)
            missing = [d for d in rest if d not in stored]
            # What this worker saw of the task spares a replay of the source run.
            seen = self._conversations.known(activity.info().workflow_id or "")
            held.update({d: seen[d] for d in missing if d in seen})
            missing = [d for d in missing if d not in held]
            if missing:  # what did not fit the context query's answer
                info = activity.info()
                held.update(
                    await _held_by(info.workflow_id or "", info.workflow_run_id or "", missing)
                )
                missing = [d for d in missing if d not in held]
            if missing and snapshot.source_workflow_id and snapshot.source_run_id:
                held.update(
                    await _held_by(snapshot.source_workflow_id, snapshot.source_run_id, missing)
                )
            await self._store.put(held)
        if lost := [d for d in missing if d not in held]:
            raise ApplicationError(
                f"{len(lost)} message(s) of the conversation could not be found to save",
                type=errors.CONVERSATION_LOST,
                non_retryable=True,
            )

    # --- the model --------------------------------------------------------------------------

    @activity.defn(name="summarize_context")
    async def summarize_context(self, request: SummaryRequest) -> SummaryResult:
        """Summarize messages [start, end) so the conversation fits the task's window."""
        with failures_name_step(request.step):
            return await self._summarize(request)

    async def _summarize(self, request: SummaryRequest) -> SummaryResult:
        backend, model = self._backend(request.model)
        watchdog = Watchdog(CONVERSATION_READ_SECONDS, "reading the conversation")
        async with watched(watchdog):
            conversation = await self._conversation(
                request.message_count, request.conversation_digest
            )
            old = conversation.messages[request.start : request.end]
            if isinstance(backend, OfflineModel):
                return self._summarized(request, conversation, backend.summarize(old))
            transcript = "\n".join(
                f"{m.role}: {m.content or ''}"
                + "".join(f" [calls {c.name}({c.arguments})]" for c in m.tool_calls)
                for m in old
            )
            prompt = [
                ChatMessage(role="system", content=SUMMARY_INSTRUCTIONS),
                ChatMessage(role="user", content=transcript),
            ]
            message = await self._stream(
                backend,
                prompt,
                [],
                model,
                watchdog,
                None,
                quotas=self._quotas_of(request.model.name),
                tenant=request.tenant,
                # A summary's wait is not told: only the loop's model calls are (its attempts
                # are not theirs).
                notices=None,
            )
        return self._summarized(request, conversation, "".join(message.text), message.usage)

    def _summarized(
        self,
        request: SummaryRequest,
        conversation: Conversation,
        summary: str,
        usage: Usage | None = None,
    ) -> SummaryResult:
        """The summary, remembered in place of what it replaces: the next call of the task
        on this worker rebuilds the compacted conversation instead of asking for it."""
        workflow_id = activity.info().workflow_id or ""
        self._conversations.remember_compaction(
            workflow_id, request.step, conversation, request.start, request.end, summary
        )
        return SummaryResult(summary=summary, usage=usage or Usage())

    async def _stream(
        self,
        backend: ChatBackend,
        messages: list[ChatMessage],
        tools: list[dict[str, object]],
        model: ModelSettings,
        watchdog: Watchdog,
        tokens: TokenPublisher | None,
        *,
        response_format: dict[str, Any] | None = None,
        quotas: Quotas = (),
        tenant: str | None = None,
        notices: QuotaNoticeSender | None = None,
    ) -> AssembledMessage:
        """One streamed completion, sent once its quotas give it its turn; the watchdog
        allows the first chunk more time. Known secrets are redacted from its text, its
        tokens and the endpoint's error texts (an endpoint may echo the request's
        Authorization header)."""
        message = AssembledMessage()
        options = {"response_format": response_format} if response_format is not None else {}
        shown = self._redactor.stream()
        exhausted: list[float] = []  # a response that says a limit is used up, until when
        async with self._turn(quotas, tenant, messages, tools, watchdog, notices) as turn:
            watchdog.expect(model.first_chunk_timeout_seconds + 5, "waiting for the model")
            listening = (
                listening_for_rate_limits(exhausted.append) if quotas else contextlib.nullcontext()
            )
            try:
                with listening:
                    async for delta in backend.stream(messages, tools, model, **options):
                        message.add(delta)
                        if watchdog.progress == 0:
                            watchdog.expect(
                                model.request_timeout_seconds + 5, "streaming the answer"
                            )
                        watchdog.advance()
                        if delta.text and tokens is not None and (text := shown.feed(delta.text)):
                            tokens.publish(text)
            except ApplicationError as err:
                if err.next_retry_delay is not None:
                    # The provider asked every caller of this key to wait: the whole fleet does.
                    await self._pause(quotas, err.next_retry_delay.total_seconds())
                redacted = self._redactor.error(err)
                if redacted is err:
                    raise
                raise redacted from redacted.__cause__
            finally:
                turn.record(message.usage)
            if exhausted:
                await self._pause(quotas, max(exhausted))
        if tokens is not None and (rest := shown.end()):
            tokens.publish(rest)
        if self._redactor and message.text:
            message.text = [self._redactor.redact("".join(message.text))]
        return message

    async def _pause(self, quotas: Quotas, seconds: float) -> None:
        """Pause the quotas for the fleet; a database that cannot take it loses the pause,
        never the answer in hand (a paid call) nor the provider's own error."""
        if self._quotas is None:
            return
        try:
            await self._quotas.pause(quotas, seconds)
        except StorageError as err:
            activity.logger.warning("could not pause the quota for the fleet: %s", err)

    @contextlib.asynccontextmanager
    async def _turn(
        self,
        quotas: Quotas,
        tenant: str | None,
        messages: list[ChatMessage],
        tools: list[dict[str, object]],
        watchdog: Watchdog,
        notices: QuotaNoticeSender | None,
    ) -> AsyncIterator[QuotaTurn]:
        """The call's turn under its quotas; while it waits it heartbeats (a wait is
        progress), stays cancellable, and tells the task of a wait longer than a second."""
        if self._quotas is None or not quotas:
            yield QuotaTurn((), 0)
            return
        estimate = sum(estimate_tokens(m) for m in messages) + len(json.dumps(tools)) // 4
        # Calibrated by the call's first quota (the endpoint's, when it has limits of its
        # own): its provider's count is what the quota counts.
        calibrated_by = quotas[0][0]
        watchdog.expect(CONVERSATION_READ_SECONDS, "waiting for the model's quota")
        told = False

        async def on_wait(decision: QuotaDecision, waited: float) -> None:
            nonlocal told
            watchdog.advance()
            expected = decision.wait_seconds
            long = (expected or 0) > NOTICE_AFTER_SECONDS or waited > NOTICE_AFTER_SECONDS
            if notices is not None and decision.limit is not None and long and not told:
                told = True
                # 0: not known in advance (a running call's end, another waiter's turn).
                await notices.waiting(decision.quota, decision.limit, expected or 0.0)

        async def on_granted(quota: str, waited: float) -> None:
            if notices is not None:
                await notices.granted(quota, waited)

        heartbeat = activity.info().heartbeat_timeout if activity.in_activity() else None
        async with self._quotas.turn(
            quotas,
            tenant=tenant,
            input_tokens=self._input_calibration.scaled(calibrated_by, estimate),
            lease_seconds=heartbeat.total_seconds() if heartbeat else DEFAULT_LEASE_SECONDS,
            on_wait=on_wait,
            on_granted=on_granted,
        ) as turn:
            try:
                yield turn
            finally:
                reported = turn.usage.input_tokens
                self._input_calibration.learn(calibrated_by, estimate, reported)

    def _check(
        self, conversation: Conversation, call_id: str, name: str, arguments: str
    ) -> ToolCall:
        """A model's call checked against the tool it names: an MCP tool of the catalog the
        run listed, or a tool of the registry."""
        tools, policy = conversation.tools, conversation.approval_policy
        if conversation.catalog is not None and is_mcp_tool_name(name):
            return check_call(conversation.catalog, call_id, name, arguments, tools, policy)
        registry = self._task_tools.of(conversation.agents)
        return registry.check_call(call_id, name, arguments, tools, policy)

    @activity.defn(name="call_llm")
    async def call_llm(self, request: LlmRequest) -> LlmResult:
        """Stream one assistant message for the step; tool calls come back checked. A
        worker that lacks what the task needs says so (WORKER_LACKS) and does nothing."""
        self._check_capable(request)
        with failures_name_step(request.step):
            if not request.wait_for_capable_worker:
                # Numbered past the attempts of any call of this step a message interrupted.
                return await self._call(
                    request, request.first_attempt - 1 + activity.info().attempt
                )
            return await self._call_after_waiting(request)

    async def _call_after_waiting(self, request: LlmRequest) -> LlmResult:
        """The call of a task that waited for this worker: attempts on workers that lacked
        what it needs do not count, so its own are numbered and bounded here (max_attempts,
        kept in the heartbeat details across attempts), as the usual retry policy would."""
        tried = _capable_tries()
        try:
            result = await self._call(request, request.first_attempt + tried)
        except Exception as err:
            failure = err if isinstance(err, ApplicationError) else None
            kind = failure.type if failure is not None else errors.LLM_UNAVAILABLE
            last = (
                (failure is not None and failure.non_retryable)
                or kind in errors.NON_RETRYABLE_LLM_ERRORS
                or tried + 1 >= request.model.max_attempts
            )
            activity.heartbeat({CAPABLE_TRIES: tried + 1})
            raise ApplicationError(
                failure.message if failure is not None else str(err),
                *(failure.details if failure is not None else ()),
                type=kind,
                non_retryable=last,
                next_retry_delay=failure.next_retry_delay if failure is not None else None,
            ) from err
        return result.model_copy(update={"worker": activity.client().identity})

    def lacks(self, requires: list[str] | None, model: str) -> list[str]:
        """What a task that needs the tools `requires` and calls `model` lacks here."""
        missing = [name for name in requires or [] if self._registry.get(name) is None]
        if (need := self._backends.need(model)) is not None:
            missing.append(need)
        return missing

    def _check_capable(self, request: LlmRequest) -> None:
        if not (missing := self.lacks(request.requires, request.model.name)):
            return
        if request.wait_for_capable_worker and (tried := _capable_tries()):
            activity.heartbeat({CAPABLE_TRIES: tried})  # kept for the next attempt
        them = "it" if len(missing) == 1 else "them"
        raise ApplicationError(
            f"a worker of task queue {activity.info().task_queue!r} lacks "
            f"{', '.join(missing)}: the task waits for a worker that has {them}",
            missing,
            type=errors.WORKER_LACKS,
            # While the task waits for a worker, the next attempt may find one.
            non_retryable=not request.wait_for_capable_worker,
            category=ApplicationErrorCategory.BENIGN,  # no traceback in the worker's log
        )

    async def _call(self, request: LlmRequest, attempt: int) -> LlmResult:
        conversation, message, way = await self._streamed(request, attempt)
        if message.finish_reason is None:
            raise ApplicationError(
                "the model's stream ended before the message was complete",
                type=errors.LLM_MALFORMED_RESPONSE,
            )
        content = "".join(message.text)
        calls, from_text = self._calls_in(request, conversation, message, content, way)
        answer_schema = conversation.output_schema
        output, output_problem = None, None
        if answer_schema is not None and not calls:
            if way == "native":
                output, output_problem = native_answer(content, answer_schema)
            else:
                output_problem = f"you answered in text instead of calling {FINAL_ANSWER_TOOL}"
        catalog = conversation.catalog
        stale = self._mcp.stale_servers(catalog) if self._mcp and catalog else []
        result = LlmResult(
            content=content,
            tool_calls=calls,
            usage=message.usage,
            finish_reason=message.finish_reason,
            model=message.model or request.model.name,
            attempt=attempt,
            calls_from_text=bool(calls) and from_text,
            stale_servers=stale,
            output=output,
            output_problem=output_problem,
            # Named by the task's model, whatever the endpoint called it: only that model
            # is sent it back (_streamed).
            reasoning=[
                item.model_copy(update={"model": request.model.name}) for item in message.reasoning
            ],
        )
        reply = assistant_message(result.content, calls, result.reasoning)
        self._conversations.remember_call(
            activity.info().workflow_id or "", request.step, conversation, reply
        )
        return result

    async def _streamed(
        self, request: LlmRequest, attempt: int
    ) -> tuple[Conversation, AssembledMessage, str | None]:
        """The conversation the step sends, the model's message streamed back (its tokens
        published as they come), and how an answer with data is asked for (None: no schema)."""
        backend, model = self._backend(request.model)
        watchdog = Watchdog(CONVERSATION_READ_SECONDS, "reading the conversation")
        with span("llm call", model=request.model.name, step=request.step, attempt=attempt) as s:
            async with watched(watchdog):
                conversation = await self._conversation(
                    request.message_count, request.conversation_digest, request.catalog_digest
                )
                schemas = self._task_tools.of(conversation.agents).schemas(conversation.tools)
                sent = conversation.messages
                if conversation.catalog is not None:
                    schemas = schemas + conversation.catalog.openai_tools(conversation.tools)
                    sent = with_unavailable_servers(sent, conversation.catalog)
                answer_schema = conversation.output_schema
                way = outputs.mode(request.model) if answer_schema is not None else None
                if answer_schema is not None and way == "tool":
                    schemas = [*schemas, outputs.final_answer_tool(answer_schema)]
                native = (
                    outputs.response_format(answer_schema)
                    if answer_schema is not None and way == "native"
                    else None
                )
                sent = reasoning_of(sent, request.model.name)
                async with TokenPublisher(request.step, attempt) as tokens:
                    message = await self._stream(
                        backend,
                        sent,
                        schemas,
                        model,
                        watchdog,
                        tokens,
                        response_format=native,
                        quotas=self._quotas_of(request.model.name),
                        tenant=request.tenant,
                        notices=QuotaNoticeSender(
                            request.step, attempt, retried=activity.info().attempt > 1
                        ),
                    )
            s.set_attribute("llm.input_tokens", message.usage.input_tokens)
            s.set_attribute("llm.output_tokens", message.usage.output_tokens)
            s.set_attribute("llm.tool_calls", len(message.calls))
        return conversation, message, way

    def _calls_in(
        self,
        request: LlmRequest,
        conversation: Conversation,
        message: AssembledMessage,
        content: str,
        way: str | None,
    ) -> tuple[list[ToolCall], bool]:
        """The message's tool calls, checked (with whether they were recovered from its
        text: a model that writes its calls instead of making them)."""
        answer_schema = conversation.output_schema
        sent_calls = [call for _, call in sorted(message.calls.items())]
        ids = unique_call_ids([call.call_id for call in sent_calls], f"call_{request.step}")
        # Arguments are redacted as text is: what a person approves is then what runs.
        written = [
            (call_id, call.name, self._redactor.redact(call.arguments))
            for call_id, call in zip(ids, sent_calls, strict=True)
        ]
        from_text = not written and request.model.recover_text_tool_calls and way != "native"
        if from_text:
            registry = self._task_tools.of(conversation.agents)
            offered = [tool.name for tool in registry.allowed(conversation.tools)]
            if conversation.catalog is not None:
                offered += [t.name for t in conversation.catalog.tools()]
            if way == "tool":
                offered.append(FINAL_ANSWER_TOOL)
            recovered = recover_tool_calls(content, offered)
            ids = unique_call_ids([None] * len(recovered), f"text_{request.step}")
            written = [(i, r.name, r.arguments) for i, r in zip(ids, recovered, strict=True)]
        alone = len(written) == 1
        calls = [
            final_answer_call(call_id, arguments, answer_schema, alone)
            if answer_schema is not None and way == "tool" and name == FINAL_ANSWER_TOOL
            else self._check(conversation, call_id, name, arguments)
            for call_id, name, arguments in written[:MAX_CALLS_PER_MESSAGE]
        ]
        calls += [
            ToolCall(call_id=call_id, tool=name, raw_arguments=arguments, problem=TOO_MANY_CALLS)
            for call_id, name, arguments in written[MAX_CALLS_PER_MESSAGE:]
        ]
        return calls, from_text


def reasoning_of(messages: list[ChatMessage], model_name: str) -> list[ChatMessage]:
    """The messages with only the reasoning `model_name` wrote: another model's (before a
    fallback, or a task's earlier model) means nothing to it, or is refused."""
    return [
        m.model_copy(update={"reasoning": [r for r in m.reasoning if r.model == model_name]})
        if any(r.model != model_name for r in m.reasoning)
        else m
        for m in messages
    ]


# The heartbeat detail that counts a waited-for call's own attempts (see _call_after_waiting).
CAPABLE_TRIES = "capable_tries"


def _capable_tries() -> int:
    details = activity.info().heartbeat_details
    last = details[-1] if details else None
    return int(last.get(CAPABLE_TRIES, 0)) if isinstance(last, dict) else 0


async def _held_by(workflow_id: str, run_id: str, wanted: list[str]) -> dict[str, ChatMessage]:
    """The messages with these digests that a run holds, read a page at a time (each answer
    stays below Temporal's payload limit); those it does not hold are left out."""
    from waystation.workflows.agent import AgentWorkflow  # the workflow module imports this one

    client: Client = activity.client()
    run: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, workflow_id, run_id=run_id
    )
    found: dict[str, ChatMessage] = {}
    rest = wanted
    while rest:
        page = await run.query(AgentWorkflow.conversation_content, rest)
        fresh = {d: m for d, m in page.items() if d in rest and message_digest(m) == d}
        if not fresh:
            break
        found.update(fresh)
        rest = [d for d in rest if d not in found]
    return found
