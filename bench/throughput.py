"""Throughput of one worker: 50 concurrent 20-step tasks: `python -m bench.throughput`.

Beside the floor measured in the same run: 50 concurrent bare workflows running the same
number of activities (2 per step) on one worker.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from temporalio.worker import Worker

from bench.common import Bench, Row, instant_task, run_alone, say
from bench.floor import BareLoop, noop
from waystation.client.agent_runtime import AgentRuntime

TASKS = 50
STEPS = 20


async def measure(bench: Bench, tasks: int = TASKS, steps: int = STEPS) -> list[Row]:
    settings = bench.settings("throughput")
    say(f"throughput: {tasks} concurrent {steps}-step tasks on one worker")
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)
        start = time.perf_counter()
        handles = await asyncio.gather(*(runtime.run(instant_task(steps)) for _ in range(tasks)))
        outcomes = await asyncio.gather(*(h.result() for h in handles))
        ours = time.perf_counter() - start
    if any(o.steps != steps for o in outcomes):
        raise RuntimeError("a task did not take the expected number of steps")

    say(f"throughput: {tasks} concurrent bare workflows of {2 * steps} activities (the floor)")
    queue = settings.task_queue + "-floor"
    async with Worker(bench.client, task_queue=queue, workflows=[BareLoop], activities=[noop]):
        start = time.perf_counter()
        await asyncio.gather(
            *(
                bench.client.execute_workflow(
                    BareLoop.run, 2 * steps, id=f"floor-{uuid.uuid4().hex}", task_queue=queue
                )
                for _ in range(tasks)
            )
        )
        floor = time.perf_counter() - start
    return [
        Row(
            f"{tasks} x {steps}-step tasks, one worker: tasks/s",
            f"{tasks / ours:.1f}",
            f"floor {tasks / floor:.1f} bare workflows/s",
        ),
        Row(
            f"{tasks} x {steps}-step tasks, one worker: steps/s",
            f"{tasks * steps / ours:.0f}",
            f"{(tasks * steps / ours) / (tasks * steps / floor):.2f}x the floor's "
            f"{tasks * steps / floor:.0f} (2 activities a step)",
        ),
    ]


if __name__ == "__main__":
    run_alone(measure)
