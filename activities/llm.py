"""The `call_llm` activity: read the conversation, stream one assistant message, publish tokens.

The conversation is read from the workflow (`llm_context` query) rather than passed in,
so history stays flat: each message enters history once, as the result that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import openai
from temporalio import activity
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError

from activities.chat import ChatBackend, ChatDelta, OpenAIChat
from activities.conversation_cache import ConversationCache
from activities.heartbeat import keep_heartbeating
from activities.offline_model import OfflineModel
from activities.spans import span
from activities.tools import ToolRegistry
from workflows import errors
from workflows.models import (
    OFFLINE_MODEL,
    ChatMessage,
    LlmContext,
    LlmRequest,
    LlmResult,
    SummaryRequest,
    SummaryResult,
    ToolCallRequest,
    Usage,
)
from workflows.stream import TOKENS_TOPIC, LlmAttemptStarted, TokenDelta

TOKEN_BATCH_INTERVAL = timedelta(milliseconds=100)
SUMMARY_INSTRUCTIONS = (
    "Summarize this part of an agent's conversation for the agent's own later use: the "
    "facts learned, the results of tool calls, decisions made, and what is still open. "
    "Be concise and keep exact values."
)
LLM_CONTEXT_QUERY = "llm_context"

_RETRYABLE_STATUS = {408, 409, 429}
_REJECTED_STATUS = {400, 401, 403, 404, 422}


def retry_after(headers: object) -> timedelta | None:
    """The server's requested wait from `retry-after-ms` or `retry-after` (seconds or a date)."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    if (ms := get("retry-after-ms")) is not None:
        with contextlib.suppress(ValueError):
            return timedelta(milliseconds=float(ms))
    value = get("retry-after")
    if value is None:
        return None
    try:
        return timedelta(seconds=max(0.0, float(value)))
    except ValueError:
        pass
    parsed = email.utils.parsedate_to_datetime(value) if value else None
    if parsed is None:
        return None
    return timedelta(seconds=max(0.0, parsed.timestamp() - time.time()))


def _provider_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return err.message


def classify_provider_error(err: Exception) -> ApplicationError:
    """Map a provider error onto retryable or not, keeping the provider's own message."""
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        detail = f"model endpoint answered {status}: {_provider_message(err)}"
        if status in _REJECTED_STATUS or (400 <= status < 500 and status not in _RETRYABLE_STATUS):
            return ApplicationError(detail, type=errors.LLM_REQUEST_REJECTED, non_retryable=True)
        return ApplicationError(
            detail,
            type=errors.LLM_UNAVAILABLE,
            next_retry_delay=retry_after(err.response.headers),
        )
    if isinstance(err, openai.APITimeoutError):
        return ApplicationError("model endpoint timed out", type=errors.LLM_UNAVAILABLE)
    if isinstance(err, openai.APIConnectionError):
        return ApplicationError(
            f"cannot reach the model endpoint: {err.__cause__ or err}", type=errors.LLM_UNAVAILABLE
        )
    if isinstance(err, openai.APIResponseValidationError | openai.APIError):
        return ApplicationError(
            f"malformed answer from the model endpoint: {err}", type=errors.LLM_MALFORMED_RESPONSE
        )
    raise err


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


class TokenPublisher:
    """Publishes token deltas of one attempt on the task's stream, in batches.

    Tokens are held for the first batch interval. A message that completes within it
    publishes none: the step's thought event, appended as the call returns, carries the
    same text at the same moment, and the task is spared a signal and a workflow task.
    Anything slower streams live from then on.
    """

    def __init__(self, step: int, attempt: int) -> None:
        self._step = step
        self._attempt = attempt
        self._index = 0
        self._client = WorkflowStreamClient.from_within_activity(
            batch_interval=TOKEN_BATCH_INTERVAL, max_retry_duration=timedelta(seconds=30)
        )
        self._topic = self._client.topic(TOKENS_TOPIC)
        self._held: list[TokenDelta] = []
        self._live = False
        self._go_live_timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> TokenPublisher:
        await self._client.__aenter__()
        if self._attempt > 1:
            # A retry is announced at once, so viewers can drop the void partial text.
            self._topic.publish(LlmAttemptStarted(step=self._step, attempt=self._attempt))
            self._live = True
        else:
            self._go_live_timer = asyncio.get_running_loop().call_later(
                TOKEN_BATCH_INTERVAL.total_seconds(), self._go_live
            )
        return self

    def _go_live(self) -> None:
        self._live = True
        last = len(self._held) - 1
        for position, delta in enumerate(self._held):
            self._topic.publish(delta, force_flush=position == last)  # now, not a tick later
        self._held.clear()

    def publish(self, text: str) -> None:
        delta = TokenDelta(step=self._step, attempt=self._attempt, index=self._index, text=text)
        self._index += 1
        if self._live:
            self._topic.publish(delta)
        else:
            self._held.append(delta)

    async def __aexit__(self, *exc: object) -> None:
        if self._go_live_timer is not None:
            self._go_live_timer.cancel()
        self._held.clear()  # completed (or failed) before going live: the thought has it all
        # Tokens are a live view, not the record: losing them must not fail the step.
        try:
            await self._client.__aexit__(*exc)
        except Exception:
            activity.logger.warning("could not publish token deltas", exc_info=True)


class LlmActivities:
    """`call_llm` over a tool registry and the configured endpoint (or the offline model)."""

    def __init__(
        self,
        registry: ToolRegistry,
        api_key: str | None = None,
        base_url: str | None = None,
        backends: Mapping[str, ChatBackend] | None = None,
        conversations: ConversationCache | None = None,
    ) -> None:
        self._registry = registry
        self._conversations = conversations or ConversationCache()
        self.context_reads: Counter[Literal["rebuilt", "queried"]] = Counter()
        """How each call got its conversation: rebuilt from what this worker saw, or by query."""
        self._offline = OfflineModel()
        # Models served by something other than the OpenAI-compatible endpoint, by name.
        self._named_backends = dict(backends or {})
        self._endpoint: OpenAIChat | None = (
            OpenAIChat(api_key, base_url) if (api_key or base_url) else None
        )

    async def close(self) -> None:
        """Close the endpoint's HTTP client (the worker does this as it shuts down)."""
        if self._endpoint is not None:
            await self._endpoint.close()

    def _backend(self, model_name: str) -> ChatBackend:
        if model_name == OFFLINE_MODEL:
            return self._offline
        if (named := self._named_backends.get(model_name)) is not None:
            return named
        if self._endpoint is None:
            raise ApplicationError(
                f"the task asks for model {model_name!r} but this worker has no model endpoint: "
                "set OPENAI_API_KEY (and OPENAI_BASE_URL for a non-OpenAI endpoint) on the "
                "worker, or use the 'offline' model",
                type=errors.LLM_NOT_CONFIGURED,
                non_retryable=True,
            )
        return self._endpoint

    async def _conversation(self, request: LlmRequest) -> LlmContext:
        """The conversation of the step: rebuilt here when that provably matches, else read."""
        workflow_id = activity.info().workflow_id or ""
        if request.conversation_digest is not None:
            rebuilt = self._conversations.rebuild(
                workflow_id, request.message_count, request.conversation_digest
            )
            if rebuilt is not None:
                self.context_reads["rebuilt"] += 1
                return rebuilt
        self.context_reads["queried"] += 1
        return await self._read_context(request)

    async def _read_context(self, request: LlmRequest) -> LlmContext:
        info = activity.info()
        handle = activity.client().get_workflow_handle(
            info.workflow_id or "", run_id=info.workflow_run_id
        )
        # A busy worker may take seconds to answer (it may have to replay the task first):
        # beat meanwhile, or the heartbeat timeout would abandon a call that is fine.
        async with keep_heartbeating():
            context: LlmContext = await handle.query(
                LLM_CONTEXT_QUERY, request.message_count, result_type=LlmContext
            )
        if len(context.messages) != request.message_count:
            raise ApplicationError(
                f"conversation has {len(context.messages)} messages, expected "
                f"{request.message_count}",
                type=errors.LLM_UNAVAILABLE,
            )
        return context

    @activity.defn(name="summarize_context")
    async def summarize_context(self, request: SummaryRequest) -> SummaryResult:
        """Summarize messages [start, end) so the conversation fits the task's window."""
        backend = self._backend(request.model.name)
        context = await self._read_context(
            LlmRequest(step=request.step, message_count=request.message_count, model=request.model)
        )
        old = context.messages[request.start : request.end]
        if isinstance(backend, OfflineModel):
            return SummaryResult(summary=backend.summarize(old))
        transcript = "\n".join(
            f"{m.role}: {m.content or ''}"
            + "".join(f" [calls {c.name}({c.arguments})]" for c in m.tool_calls)
            for m in old
        )
        prompt = [
            ChatMessage(role="system", content=SUMMARY_INSTRUCTIONS),
            ChatMessage(role="user", content=transcript),
        ]
        message = AssembledMessage()
        with span("llm summary", model=request.model.name, step=request.step):
            async with keep_heartbeating():
                try:
                    async for delta in backend.stream(prompt, [], request.model):
                        message.add(delta)
                except openai.OpenAIError as err:
                    raise classify_provider_error(err) from err
        return SummaryResult(summary="".join(message.text), usage=message.usage)

    @activity.defn(name="call_llm")
    async def call_llm(self, request: LlmRequest) -> LlmResult:
        """Stream one assistant message for the step; tool calls come back checked."""
        backend = self._backend(request.model.name)
        context = await self._conversation(request)
        attempt = activity.info().attempt
        message = AssembledMessage()
        with span("llm call", model=request.model.name, step=request.step, attempt=attempt) as s:
            async with keep_heartbeating(), TokenPublisher(request.step, attempt) as tokens:
                try:
                    stream = backend.stream(
                        context.messages, self._registry.schemas(context.tools), request.model
                    )
                    async for delta in stream:
                        message.add(delta)
                        if delta.text:
                            tokens.publish(delta.text)
                except openai.OpenAIError as err:
                    raise classify_provider_error(err) from err
            s.set_attribute("llm.input_tokens", message.usage.input_tokens)
            s.set_attribute("llm.output_tokens", message.usage.output_tokens)
            s.set_attribute("llm.tool_calls", len(message.calls))
        if message.finish_reason is None:
            raise ApplicationError(
                "the model's stream ended before the message was complete",
                type=errors.LLM_MALFORMED_RESPONSE,
            )
        calls = [
            self._registry.check_call(
                call.call_id or f"call_{request.step}_{index}",
                call.name,
                call.arguments,
                context.tools,
                context.approval_policy,
            )
            for index, call in sorted(message.calls.items())
        ]
        result = LlmResult(
            content="".join(message.text),
            tool_calls=calls,
            usage=message.usage,
            finish_reason=message.finish_reason,
            model=message.model or request.model.name,
            attempt=attempt,
        )
        # The workflow appends this reply to the conversation exactly so (see events.apply).
        reply = ChatMessage(
            role="assistant",
            content=result.content or None,
            tool_calls=[
                ToolCallRequest(id=c.call_id, name=c.tool, arguments=c.raw_arguments) for c in calls
            ],
        )
        self._conversations.remember_call(
            activity.info().workflow_id or "", request.step, context, reply
        )
        return result
