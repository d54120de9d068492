"""Calls that Temporal refuses for a moment, tried again with a growing pause.

The server refuses a signal while a workflow has too many in flight ("Workflow is busy",
RESOURCE_EXHAUSTED), e.g. several people approving at once; it is fine a moment later.
Every signal our clients send (decisions, a resumption, a repair note) goes through
`sending`. A read that changes nothing may be retried on more: the dev server answers a
describe with CANCELLED while it resets the same workflow, and UNAVAILABLE while it is
overloaded; `reading` retries those too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")


@dataclass(frozen=True)
class BusyRetry:
    """How often, and with what pauses, a refused signal is sent again."""

    tries: int = 8
    first_pause: float = 0.1
    factor: float = 2.0
    max_pause: float = 3.0
    jitter: float = 0.2
    """Each pause is off by up to this fraction, so callers refused together spread out."""

    def pause(self, attempt: int) -> float:
        """The nominal pause after failed attempt `attempt` (1-based), without jitter."""
        return min(self.first_pause * self.factor ** (attempt - 1), self.max_pause)


DEFAULT = BusyRetry()


def is_busy(err: RPCError) -> bool:
    return err.status == RPCStatusCode.RESOURCE_EXHAUSTED


# Refusals that say nothing about the request itself; a read can be sent again.
_PASSING = frozenset(
    {
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
    }
)


def is_passing(err: RPCError) -> bool:
    """Whether a read refused with `err` may succeed if sent again as it was."""
    return err.status in _PASSING


async def sending(
    send: Callable[[], Awaitable[T]],
    policy: BusyRetry = DEFAULT,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`send()`, tried again while Temporal answers RESOURCE_EXHAUSTED (the last refusal is
    raised as it came); any other error is raised at once."""
    return await _retrying(send, is_busy, policy, sleep)


async def reading(
    read: Callable[[], Awaitable[T]],
    policy: BusyRetry = DEFAULT,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`read()`, tried again while Temporal answers with a passing refusal (`is_passing`);
    only for calls that change nothing, as a refused one may have been carried out."""
    return await _retrying(read, is_passing, policy, sleep)


async def _retrying(
    call: Callable[[], Awaitable[T]],
    retry_on: Callable[[RPCError], bool],
    policy: BusyRetry,
    sleep: Callable[[float], Awaitable[None]],
) -> T:
    for attempt in range(1, policy.tries + 1):
        try:
            return await call()
        except RPCError as err:
            if not retry_on(err) or attempt == policy.tries:
                raise
        spread = random.uniform(1 - policy.jitter, 1 + policy.jitter)
        await sleep(policy.pause(attempt) * spread)
    raise AssertionError("unreachable: the last attempt returns or raises")
