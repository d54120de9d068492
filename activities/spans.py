"""Spans for LLM and tool calls; no-ops unless an OpenTelemetry TracerProvider is installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span

_tracer = trace.get_tracer("waystation")


@contextmanager
def span(name: str, **attributes: str | int | float | bool) -> Iterator[Span]:
    with _tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current
