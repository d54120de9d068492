"""Optional OpenTelemetry tracing through Temporal's interceptor, plus LLM and tool spans.

With `WAYSTATION_TRACING=true` the client (and so every worker built on it) carries
Temporal's TracingInterceptor: workflow, activity, signal and update spans join one trace.
The activities add a span per LLM call (model, tokens) and per tool call
(`activities/spans.py`). Exporting is the
application's choice: configure an OpenTelemetry TracerProvider before starting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from temporalio.client import Interceptor

    from waystation.settings import Settings


def tracing_interceptors(settings: Settings) -> list[Interceptor]:
    if not settings.tracing:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]
