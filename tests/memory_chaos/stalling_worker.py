"""`python -m tests.memory_chaos.stalling_worker`: the real worker build whose memory writes
stall after the write is committed (tests only): a remember call then provably sits between
its write and its activity's completion, for the test to SIGKILL the worker there."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from waystation import worker
from waystation.activities.storage.memory import MemoryStore
from waystation.client.temporal import connect
from waystation.settings import Settings
from waystation.workflows.memory import MemoryItem

_put = MemoryStore.put


async def _put_then_stall(self: MemoryStore, *args: Any, **kwargs: Any) -> MemoryItem:
    await _put(self, *args, **kwargs)
    print("memory written: stalling", file=sys.stderr, flush=True)
    await asyncio.Event().wait()  # the heartbeat goes on: the call stays this attempt's
    raise AssertionError("unreachable")


async def main() -> None:
    settings = Settings()
    client = await connect(settings)
    MemoryStore.put = _put_then_stall  # type: ignore[method-assign]
    stalling = worker.build_worker(client, settings)
    async with stalling:
        print("worker polling (stalls after a memory write)", file=sys.stderr, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
