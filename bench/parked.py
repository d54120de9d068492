"""Many tasks parked on approval: worker RSS, time to park, and resuming one the worker forgot.

    python -m bench.parked                                  # 500 tasks, caches 50, 200, 1000
    python -m bench.parked --parked 10000 --caches 200

For each workflow-cache size (WAYSTATION_WORKER_CACHED_TASKS): a real worker subprocess,
`parked` tasks that each ask to run a shell command and wait for approval. Measured: the
time from the first start to all of them waiting, the worker's RSS idle and then, and the
approval round trip (decide Update sent → the approved tool starts, as Temporal records
it) for the oldest tasks (out of the worker's cache when `parked` exceeds it: the worker
replays their history) and for the newest (still cached).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.approval import tool_started_at
from bench.common import Bench, Row, median, run_alone, say
from bench.worker_memory import rss_mb
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ModelSettings

PARKED = 500
CACHES = (50, 200, 1000)
RESUMED = 5  # oldest and newest tasks approved, each
BATCH = 50


@dataclass(frozen=True)
class Parked:
    """One cache size's figures."""

    cache: int
    idle_mb: float
    parked_mb: float
    park_seconds: float
    uncached: list[float]
    cached: list[float]
    failed: int


async def park(bench: Bench, settings: Settings, runtime: AgentRuntime, count: int) -> list[str]:
    """Start `count` tasks and wait until every one waits for approval; their ids, oldest first."""
    model = bench.fake.script(
        lambda body: (
            text("done")
            if body["messages"][-1]["role"] == "tool"
            else tools(("run_shell", {"command": "true"}))
        ),
        record=False,
    )
    ids: list[str] = []
    for first in range(0, count, BATCH):
        handles = await asyncio.gather(
            *(
                runtime.run(AgentTask(task=f"wait {i}", model=ModelSettings(name=model)))
                for i in range(first, min(first + BATCH, count))
            )
        )
        ids += [h.id for h in handles]
    # A task that failed on the way (an overloaded machine) ends the wait too; it is counted.
    settled = (
        f'TaskQueue="{settings.task_queue}" AND '
        '(AgentStatus="waiting_approval" OR ExecutionStatus!="Running")'
    )
    async with asyncio.timeout(3600):
        while (await bench.client.count_workflows(settled)).count < count:
            await asyncio.sleep(0.5)
    return ids


async def resume_times(bench: Bench, runtime: AgentRuntime, candidates: list[str]) -> list[float]:
    """Approval round trips of the first RESUMED candidates still waiting."""
    times: list[float] = []
    for task_id in candidates:
        handle = runtime.get(task_id)
        if len(times) < RESUMED and await handle.pending_requests():
            times.append(await approve_and_time(bench, handle))
    return times


async def failed_count(bench: Bench, settings: Settings) -> int:
    query = f'TaskQueue="{settings.task_queue}" AND ExecutionStatus="Failed"'
    return (await bench.client.count_workflows(query)).count


async def approve_and_time(bench: Bench, handle: TaskHandle) -> float:
    [request_id] = list(await handle.pending_requests())
    sent = time.time()
    await handle.approve(request_id, approver="bench")
    await handle.result()
    return (await tool_started_at(bench, handle)) - sent


async def one_cache_size(bench: Bench, parked: int, cache: int) -> Parked:
    settings = bench.settings(f"parked{cache}")
    extra = {"WAYSTATION_WORKER_CACHED_TASKS": str(cache)}
    worker = await WorkerProcess(bench.address, settings, extra_env=extra).ready()
    try:
        await asyncio.sleep(1.0)
        idle = rss_mb(worker.pid)
        runtime = AgentRuntime(bench.client, settings)
        started = time.perf_counter()
        ids = await park(bench, settings, runtime, parked)
        park_seconds = time.perf_counter() - started
        await asyncio.sleep(2.0)  # the last workflow tasks complete
        parked_mb = rss_mb(worker.pid)
        failed = await failed_count(bench, settings)
        uncached = await resume_times(bench, runtime, ids[: RESUMED * 2])
        cached = await resume_times(bench, runtime, ids[::-1][: RESUMED * 2])
        return Parked(cache, idle, parked_mb, park_seconds, uncached, cached, failed)
    finally:
        worker.kill()


async def measure(bench: Bench, parked: int = PARKED, caches: Sequence[int] = CACHES) -> list[Row]:
    rows = []
    for cache in caches:
        say(f"parked: {parked} tasks waiting for approval, worker cache {cache}")
        found = await one_cache_size(bench, parked, cache)
        say(
            f"parked: cache {cache}: {found.parked_mb:.0f} MB, parked in "
            f"{found.park_seconds:.0f} s, resume {median(found.uncached) * 1000:.0f} ms"
        )
        rows += [
            Row(
                f"worker RSS, {parked} tasks waiting for approval, cache {cache}",
                f"{found.parked_mb:.0f} MB",
                f"idle {found.idle_mb:.0f} MB; parked in {found.park_seconds:.0f} s "
                f"({parked / found.park_seconds:.0f} tasks/s); {found.failed} failed on the way",
            ),
            Row(
                f"approval → tool started, {parked} parked, cache {cache}: oldest task, median",
                f"{median(found.uncached) * 1000:.0f} ms",
                f"newest task {median(found.cached) * 1000:.0f} ms"
                + (" (both cached)" if parked + 1 <= cache else " (oldest replayed)"),
            ),
        ]
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parked", type=int, default=PARKED)
    parser.add_argument("--caches", type=int, nargs="+", default=list(CACHES))
    args = parser.parse_args()
    run_alone(lambda bench: measure(bench, args.parked, args.caches))
