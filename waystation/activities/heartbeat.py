"""Keep an activity's heartbeat alive while it does useful work, and only then.

A short heartbeat timeout lets Temporal notice a dead worker in seconds; beating on a
timer keeps a slow but live call (a model thinking, a tool running) from looking dead. A
timer alone would also vouch for a call that is stuck (a stream that never ends, an exit
that never returns), so a `Watchdog` can say how long the work may go without progress:
past that the heartbeat stops, the call is cancelled, and Temporal retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from waystation.workflows import errors

DEFAULT_INTERVAL = timedelta(seconds=1)


class Watchdog:
    """Progress of an activity's work: each `advance` proves it alive for `limit` seconds."""

    def __init__(self, limit: float, what: str) -> None:
        self.limit = limit
        self.what = what
        self.progress = 0
        self.stalled = False
        self._last = time.monotonic()

    def advance(self) -> None:
        self.progress += 1
        self._last = time.monotonic()

    def expect(self, limit: float, what: str) -> None:
        """A new phase of the work, with its own allowance."""
        self.limit, self.what = limit, what
        self._last = time.monotonic()

    def overdue(self) -> bool:
        return time.monotonic() - self._last > self.limit

    def details(self) -> dict[str, Any]:
        return {"progress": self.progress, "phase": self.what}

    def reason(self) -> str:
        return f"no progress for {self.limit:g} s while {self.what}"


@contextlib.asynccontextmanager
async def keep_heartbeating(watchdog: Watchdog | None = None) -> AsyncIterator[None]:
    """Heartbeat every third of the heartbeat timeout until the block exits, or until the
    watchdog sees no progress for its limit (then the block is cancelled)."""
    if not activity.in_activity() or activity.info().is_local:
        yield  # local activities have no heartbeat: their workflow task watches them
        return
    timeout = activity.info().heartbeat_timeout
    interval = (timeout / 3) if timeout else DEFAULT_INTERVAL
    owner = asyncio.current_task()

    async def beat() -> None:
        # The first beat is due a third of the timeout after the start, not at once: a call
        # that finishes sooner (most tool calls) never pays for a heartbeat.
        beats = 0
        while True:
            await asyncio.sleep(interval.total_seconds())
            if watchdog is not None and watchdog.overdue():
                watchdog.stalled = True
                if owner is not None:
                    owner.cancel(watchdog.reason())
                return  # no more beats: even a call that ignores the cancel is retried
            beats += 1
            # Numbered, so `temporal workflow describe` shows which beat the server last heard.
            details = watchdog.details() if watchdog is not None else {}
            activity.heartbeat({"beat": beats, **details})

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def watched(watchdog: Watchdog) -> AsyncIterator[None]:
    """Heartbeat under `watchdog`; a call it stops for want of progress fails retryably."""
    try:
        async with keep_heartbeating(watchdog):
            yield
    except asyncio.CancelledError:
        if watchdog.stalled:  # not cancelled by Temporal: the work stopped progressing
            raise ApplicationError(watchdog.reason(), type=errors.LLM_UNAVAILABLE) from None
        raise
