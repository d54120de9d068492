"""Signals that Temporal refuses for a moment: "Workflow is busy" (RESOURCE_EXHAUSTED).

The server refuses a signal while a workflow has too many in flight, e.g. several people
approving at once; it is fine a moment later. Every signal our clients send (decisions, a
resumption, a repair note) goes through `sending`, which tries again with a growing pause.
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


async def sending(
    send: Callable[[], Awaitable[T]],
    policy: BusyRetry = DEFAULT,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`send()`, tried again while Temporal answers RESOURCE_EXHAUSTED (the last refusal is
    raised as it came); any other error is raised at once."""
    for attempt in range(1, policy.tries + 1):
        try:
            return await send()
        except RPCError as err:
            if not is_busy(err) or attempt == policy.tries:
                raise
        spread = random.uniform(1 - policy.jitter, 1 + policy.jitter)
        await sleep(policy.pause(attempt) * spread)
    raise AssertionError("unreachable: the last attempt returns or raises")
