"""Wait out a database that is restarting: retry an idempotent operation with backoff."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from waystation.activities.storage.errors import StorageUnavailableError

T = TypeVar("T")
logger = logging.getLogger("waystation.storage")

# A database restart takes seconds; a tool call waits this long before its activity fails
# (and Temporal retries it). Its heartbeat keeps beating meanwhile.
RETRY_WINDOW_SECONDS = 60.0
_FIRST_DELAY, _MAX_DELAY = 0.1, 2.0


async def retrying(
    operation: Callable[[], Awaitable[T]],
    *,
    transient: tuple[type[BaseException], ...],
    where: str,
    window: float = RETRY_WINDOW_SECONDS,
) -> T:
    """`operation()`, tried again on a transient error until it succeeds or `window` passes.

    Every operation given here must be idempotent: the first try may have been applied
    before its connection broke.
    """
    deadline = time.monotonic() + window
    delay = _FIRST_DELAY
    warned = False
    while True:
        try:
            return await operation()
        except transient as err:
            if time.monotonic() + delay > deadline:
                raise StorageUnavailableError(
                    f"the storage ({where}) stayed unreachable for {window:g} s: {err}"
                ) from err
            if not warned:
                logger.warning("waiting for storage (%s): %s", where, str(err).strip())
                warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)
