"""A Temporal client whose signals and queries a test can hook, through the SDK's public
client `Interceptor`: for faults a test must place exactly (a signal refused as busy, a
worker paused right after a signal, a query that is never answered) and for seeing what a
client was told."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    SignalWorkflowInput,
)

SignalHook = Callable[[SignalWorkflowInput], Awaitable[None]]
QueryHook = Callable[[QueryWorkflowInput], Awaitable[None]]
AnswerHook = Callable[[QueryWorkflowInput, Any], None]


@dataclass
class ClientHooks(Interceptor):
    """Each hook runs around the call it names; one that raises (or never returns) stands
    for Temporal doing so, as the client's caller sees it."""

    before_signal: SignalHook | None = None
    after_signal: SignalHook | None = None
    before_query: QueryHook | None = None
    after_query: AnswerHook | None = None

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Hooked(next, self)

    def client(self, base: Client) -> Client:
        """A client like `base` (same server, namespace, data converter) with these hooks."""
        config = base.config()
        config["interceptors"] = [self]
        return Client(**config)


class _Hooked(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, hooks: ClientHooks) -> None:
        super().__init__(next)
        self._hooks = hooks

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        if self._hooks.before_signal is not None:
            await self._hooks.before_signal(input)
        await super().signal_workflow(input)
        if self._hooks.after_signal is not None:
            await self._hooks.after_signal(input)

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        if self._hooks.before_query is not None:
            await self._hooks.before_query(input)
        answer = await super().query_workflow(input)
        if self._hooks.after_query is not None:
            self._hooks.after_query(input, answer)
        return answer
