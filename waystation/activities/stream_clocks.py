"""The two clocks that guard every model stream, whichever protocol it speaks.

`first_chunk_timeout_seconds` runs from sending the request to the first event (a CPU-served
model reads the whole prompt before it answers), then `request_timeout_seconds` between
events. Either one running out raises the backend's own retryable error, made by
`timed_out` from a sentence. The response is closed however the stream ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol


class ClosableStream(Protocol):
    def __aiter__(self) -> Any: ...

    async def close(self) -> None: ...


async def clocked_events(
    open_stream: Callable[[], Awaitable[ClosableStream]],
    first_wait: float,
    idle_wait: float,
    timed_out: Callable[[str], Exception],
) -> AsyncIterator[Any]:
    """The events of the stream `open_stream` opens, each within its clock."""
    response: ClosableStream | None = None
    try:
        try:
            async with asyncio.timeout(first_wait):
                response = await open_stream()
                events = aiter(response)
                event = await anext(events, None)
        except TimeoutError as err:
            raise timed_out(f"no first chunk from the model within {first_wait:g} s") from err
        while event is not None:
            yield event
            try:
                async with asyncio.timeout(idle_wait):
                    event = await anext(events, None)
            except TimeoutError as err:
                raise timed_out(f"the model's stream stalled for {idle_wait:g} s") from err
    finally:
        if response is not None:
            await response.close()
