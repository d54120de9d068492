"""Spans for LLM and tool calls; no-ops unless an OpenTelemetry TracerProvider is installed."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from opentelemetry import trace
from opentelemetry.trace import Span

_tracer = trace.get_tracer("waystation")


def span(name: str, **attributes: str | int | float | bool) -> AbstractContextManager[Span]:
    """A span for the block; with no TracerProvider installed, none at all (not even the
    cost of a non-recording one, which every LLM and tool call would pay)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext(trace.INVALID_SPAN)
    return _tracer.start_as_current_span(name, attributes=attributes)
