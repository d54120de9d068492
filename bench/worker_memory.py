"""Worker memory with 500 tasks waiting for approval: `python -m bench.worker_memory`.

A real worker subprocess runs each task to its approval request, where it parks; then its
resident set size is read from /proc. Beside it, in the same run: the same worker idle,
and the same load with a workflow cache of 200 (waystation's default before it became
Temporal's 1,000).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.common import Bench, Row, run_alone, say
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ModelSettings

WAITING = 500
SMALL_CACHE = 200


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc")


async def waiting_worker_rss(bench: Bench, cached_tasks: int | None) -> tuple[float, float]:
    """RSS of an idle worker, then with WAITING tasks parked on approval (MB)."""
    settings = bench.settings("memory")
    extra = {"WAYSTATION_WORKER_CACHED_TASKS": str(cached_tasks)} if cached_tasks else {}
    worker = await WorkerProcess(bench.address, settings, extra_env=extra).ready()
    try:
        await asyncio.sleep(1.0)
        idle = rss_mb(worker.process.pid)
        runtime = AgentRuntime(bench.client, settings)
        model = bench.fake.script(lambda body: tools(("run_shell", {"command": "true"})))
        for first in range(0, WAITING, 50):
            await asyncio.gather(
                *(
                    runtime.run(AgentTask(task=f"wait {i}", model=ModelSettings(name=model)))
                    for i in range(first, min(first + 50, WAITING))
                )
            )
        query = f'TaskQueue="{settings.task_queue}" AND AgentStatus="waiting_approval"'
        async with asyncio.timeout(300):
            while (await bench.client.count_workflows(query)).count < WAITING:
                await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # let the last workflow tasks finish
        return idle, rss_mb(worker.process.pid)
    finally:
        worker.kill()


async def measure(bench: Bench) -> list[Row]:
    say(f"worker memory: {WAITING} tasks waiting for approval, the default cache")
    idle, ours = await waiting_worker_rss(bench, None)
    say(f"worker memory: {WAITING} tasks waiting, a cache of {SMALL_CACHE}")
    _, small = await waiting_worker_rss(bench, SMALL_CACHE)
    return [
        Row(
            f"worker RSS with {WAITING} tasks waiting for approval",
            f"{ours:.0f} MB",
            f"idle {idle:.0f} MB; {small:.0f} MB with a {SMALL_CACHE}-task cache",
        )
    ]


if __name__ == "__main__":
    run_alone(measure)
