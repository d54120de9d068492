"""Keep an activity's heartbeat alive while it waits on something slow.

A short heartbeat timeout lets Temporal notice a dead worker in seconds; beating on a
timer keeps a slow but live call (a model thinking, a tool running) from looking dead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio import activity

DEFAULT_INTERVAL = timedelta(seconds=1)


@contextlib.asynccontextmanager
async def keep_heartbeating() -> AsyncIterator[None]:
    """Heartbeat every third of the heartbeat timeout until the block exits."""
    if not activity.in_activity() or activity.info().is_local:
        yield  # local activities have no heartbeat: their workflow task watches them
        return
    timeout = activity.info().heartbeat_timeout
    interval = (timeout / 3) if timeout else DEFAULT_INTERVAL

    async def beat() -> None:
        # The first beat is due a third of the timeout after the start, not at once: a call
        # that finishes sooner (most tool calls) never pays for a heartbeat.
        while True:
            await asyncio.sleep(interval.total_seconds())
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
