"""The chat backend of any OpenAI-compatible endpoint, and what its errors mean.

Provider errors become ApplicationErrors here, retryable or not, with the provider's own
message: the LLM activity never sees an `openai` exception.
"""

from __future__ import annotations

import contextlib
import email.utils
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import timedelta
from typing import Any

import httpx2
import openai
from temporalio.exceptions import ApplicationError

from waystation.activities.chat import ChatDelta, to_openai_messages, tool_choice_option
from waystation.activities.quotas import rate_limit_reset, report_rate_limits
from waystation.activities.redaction import url_without_credentials
from waystation.activities.stream_clocks import clocked_events
from waystation.workflows import errors
from waystation.workflows.models import ChatMessage, ModelSettings, Usage

_RETRYABLE_STATUS = {408, 409, 429}
_REJECTED_STATUS = {400, 401, 403, 404, 422}
# How endpoints say the prompt is longer than the model's context (OpenAI's code, llama.cpp's
# and vLLM's messages).
_CONTEXT_TOO_LONG = (
    "context_length_exceeded",
    "maximum context length",
    "exceeds the available context size",
    "context window",
    "prompt is too long",
    "too many tokens",
)


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


def with_rate_limits_reported(stream: Any) -> Any:
    """The opened stream, its response's rate-limit headers told to the quota gate."""
    response = getattr(stream, "response", None)
    if response is not None:
        report_rate_limits(response.headers)
    return stream


def _provider_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return err.message


def _context_too_long(err: openai.APIStatusError, message: str) -> bool:
    code = getattr(err, "code", None)
    text = f"{code or ''} {message}".lower()
    return any(marker in text for marker in _CONTEXT_TOO_LONG)


def classify_provider_error(err: Exception) -> ApplicationError:
    """Map a provider error onto retryable or not, keeping the provider's own message."""
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        message = _provider_message(err)
        detail = f"model endpoint answered {status}: {message}"
        if status in (400, 413) and _context_too_long(err, message):
            return ApplicationError(detail, type=errors.LLM_CONTEXT_TOO_LONG, non_retryable=True)
        if status in _REJECTED_STATUS or (400 <= status < 500 and status not in _RETRYABLE_STATUS):
            return ApplicationError(detail, type=errors.LLM_REQUEST_REJECTED, non_retryable=True)
        return ApplicationError(
            detail,
            type=errors.LLM_UNAVAILABLE,
            next_retry_delay=retry_after(err.response.headers)
            or rate_limit_reset(err.response.headers),
        )
    if isinstance(err, openai.APITimeoutError):
        detail = str(err) if str(err) != "Request timed out." else "model endpoint timed out"
        return ApplicationError(detail, type=errors.LLM_UNAVAILABLE)
    if isinstance(err, openai.APIConnectionError):
        return ApplicationError(unreachable_sentence(err), type=errors.LLM_UNAVAILABLE)
    if isinstance(err, openai.APIResponseValidationError | openai.APIError):
        return ApplicationError(
            f"malformed answer from the model endpoint: {err}", type=errors.LLM_MALFORMED_RESPONSE
        )
    raise err


# What an unreachable endpoint's connection error means, by a piece of httpx's text.
_UNREACHABLE_REASONS = (
    ("name or service not known", "no host has that name"),
    ("nodename nor servname", "no host has that name"),
    ("temporary failure in name resolution", "no host has that name"),
    ("connection refused", "nothing answers there"),
    ("all connection attempts failed", "nothing answers there"),
    ("certificate", "its TLS certificate is not trusted"),
)


def unreachable_sentence(err: openai.APIConnectionError) -> str:
    """The endpoint that cannot be reached, by its URL (credentials in it redacted), and
    why in a few words: the person fixes OPENAI_BASE_URL, or starts the server it names."""
    url = str(err.request.url).removesuffix("/chat/completions")
    cause = str(err.__cause__ or err).lower()
    reason = next((said for piece, said in _UNREACHABLE_REASONS if piece in cause), "no connection")
    return (
        f"cannot reach the model endpoint at {url_without_credentials(url)} "
        f"(OPENAI_BASE_URL): {reason}"
    )


class StreamTimeoutError(openai.APITimeoutError):
    """No first chunk in time, or a stream that stalled: retryable like any timeout."""

    def __init__(self, message: str, request: httpx2.Request) -> None:
        openai.APIConnectionError.__init__(self, message=message, request=request)


class OpenAIChat:
    """Chat completions with `stream=True` against any OpenAI-compatible endpoint.

    Two clocks guard a stream: `first_chunk_timeout_seconds` from sending the request to
    the first chunk (a CPU-served model reads the whole prompt before it answers), then
    `request_timeout_seconds` between chunks. Either one running out raises
    `StreamTimeoutError`, an `openai.APITimeoutError`: a retryable ApplicationError.
    """

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # Temporal owns retries: the client must not retry behind its back.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or "not-needed",
            base_url=base_url,
            max_retries=0,
            default_headers=dict(headers) if headers else None,
        )

    def _body(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        response_format: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Messages, tools and options: the body the SDK sends as it is, in wire form."""
        body: dict[str, Any] = {"messages": to_openai_messages(messages)}
        if response_format is not None:
            body["response_format"] = response_format
        if tools:
            body["tools"] = tools
            if model.tool_choice is not None:  # endpoints refuse tool_choice without tools
                body["tool_choice"] = tool_choice_option(model.tool_choice)
        if model.temperature is not None:
            body["temperature"] = model.temperature
        if model.max_tokens is not None:
            body["max_tokens"] = model.max_tokens
        return body

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        """The deltas of one streamed completion; a provider error comes out classified."""
        try:
            async for delta in self._deltas(messages, tools, model, response_format):
                yield delta
        except openai.OpenAIError as err:
            raise classify_provider_error(err) from err

    async def _deltas(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        response_format: dict[str, Any] | None,
    ) -> AsyncIterator[ChatDelta]:
        first_wait = model.first_chunk_timeout_seconds
        idle_wait = model.request_timeout_seconds
        # The client's own read timeout only backs up the two clocks enforced here.
        backstop = max(first_wait, idle_wait) + 5.0
        create: Any = self._client.chat.completions.create  # options vary by endpoint
        request = httpx2.Request("POST", self._client.base_url.join("chat/completions"))

        async def open_stream() -> Any:
            # The body goes as `extra_body`, which the SDK sends as it is: `create` would walk
            # every message against its typed schema first, for the same bytes, ~30 ms more
            # per call at 120 messages (bench.request_body).
            return with_rate_limits_reported(
                await create(
                    model=model.name,
                    messages=[],
                    stream=True,
                    stream_options={"include_usage": True},
                    timeout=openai.Timeout(backstop, connect=min(first_wait, 10.0)),
                    extra_body=self._body(messages, tools, model, response_format),
                )
            )

        def timed_out(sentence: str) -> StreamTimeoutError:
            return StreamTimeoutError(sentence, request)

        async for chunk in clocked_events(open_stream, first_wait, idle_wait, timed_out):
            for delta in _deltas(chunk):
                yield delta

    async def close(self) -> None:
        await self._client.close()


def _deltas(chunk: Any) -> Iterator[ChatDelta]:
    """Our deltas from one streamed chunk of the OpenAI protocol."""
    usage = None
    if chunk.usage is not None:
        # OpenAI counts cached prompt tokens and reasoning tokens in these details.
        prompt = chunk.usage.prompt_tokens_details
        completion = chunk.usage.completion_tokens_details
        usage = Usage(
            input_tokens=chunk.usage.prompt_tokens or 0,
            output_tokens=chunk.usage.completion_tokens or 0,
            cache_read_tokens=(prompt.cached_tokens or 0) if prompt else 0,
            reasoning_tokens=(completion.reasoning_tokens or 0) if completion else 0,
        )
    if not chunk.choices:
        if usage is not None:
            yield ChatDelta(usage=usage, model=chunk.model)
        return
    choice = chunk.choices[0]
    delta = choice.delta
    if delta is not None and delta.content:
        yield ChatDelta(text=delta.content, model=chunk.model)
    for call in (delta.tool_calls if delta is not None else None) or []:
        function = call.function
        yield ChatDelta(
            tool_call_index=call.index,
            tool_call_id=call.id,
            tool_name=function.name if function else None,
            tool_arguments=(function.arguments or "") if function else "",
            model=chunk.model,
        )
    if choice.finish_reason is not None or usage is not None:
        yield ChatDelta(finish_reason=choice.finish_reason, usage=usage, model=chunk.model)
