"""Durable bytes per step at 10, 100 and 1,000 steps: `python -m bench.durable_bytes`.

Ours: Temporal's own history size (`history_size_bytes`) summed over the task's chain of
runs; the conversation lives in history only (no separate message store). LangGraph: the
size of its SQLite checkpointer's files after the same task. 2 KB model messages, one
calculator call a step; our task keeps a 20,000-token context window (older turns are
summarized), LangGraph keeps its whole MessagesState, as it does by default.
"""

from __future__ import annotations

import asyncio

from bench import peers
from bench.common import Bench, Row, instant_task, run_alone, say
from waystation.client.agent_runtime import AgentRuntime

MESSAGE_BYTES = 2048
STEP_COUNTS = (10, 100, 1000)


async def chain_history_bytes(bench: Bench, task_id: str) -> tuple[int, int]:
    """Total history bytes of every run of the task, and the number of runs."""
    total, runs = 0, 0
    run_id: str | None = None
    while True:
        handle = bench.client.get_workflow_handle(task_id, run_id=run_id)
        total += (await handle.describe()).raw_info.history_size_bytes
        runs += 1
        history = await handle.fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return total, runs
        run_id = started.continued_execution_run_id


async def measure(bench: Bench) -> list[Row]:
    settings = bench.settings("bytes")
    ours: dict[int, tuple[int, int]] = {}
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)
        for steps in STEP_COUNTS:
            say(f"durable bytes: our agent, {steps} steps of {MESSAGE_BYTES}-byte messages")
            handle = await runtime.run(
                instant_task(steps, MESSAGE_BYTES, context_limit_tokens=20_000)
            )
            outcome = await handle.result()
            if outcome.steps != steps:
                raise RuntimeError(f"expected {steps} steps, the task took {outcome.steps}")
            ours[steps] = await chain_history_bytes(bench, handle.id)
    theirs: dict[int, int] = {}
    if peers.available():
        for steps in STEP_COUNTS:
            say(f"durable bytes: LangGraph SqliteSaver, {steps} steps")
            database = bench.scratch / f"langgraph-bytes-{steps}.sqlite"
            theirs[steps] = await asyncio.to_thread(
                peers.sqlite_bytes, steps, database, MESSAGE_BYTES
            )
            for path in database.parent.glob(database.name + "*"):
                path.unlink()  # 1,000 steps leave gigabytes behind

    rows = []
    for steps in STEP_COUNTS:
        total, runs = ours[steps]
        versus = "LangGraph not installed"
        if steps in theirs:
            per_step = theirs[steps] / steps / 1000
            versus = (
                f"LangGraph SqliteSaver {theirs[steps] / 1e6:.1f} MB ({per_step:.0f} KB/step); "
                f"ours is 1/{theirs[steps] / total:.0f} of it"
            )
        rows.append(
            Row(
                f"durable bytes after {steps} steps ({MESSAGE_BYTES} B messages)",
                f"{total / 1e6:.2f} MB in {runs} run(s), {total / steps / 1000:.1f} KB/step",
                versus,
            )
        )
    first, last = STEP_COUNTS[0], STEP_COUNTS[-1]
    growth = (ours[last][0] / last) / (ours[first][0] / first)
    rows.append(
        Row(
            f"bytes per step at {last} steps vs at {first}",
            f"{growth:.2f}x",
            "flat means ~1x"
            + (
                f"; LangGraph {(theirs[last] / last) / (theirs[first] / first):.0f}x"
                if theirs
                else ""
            ),
        )
    )
    return rows


if __name__ == "__main__":
    run_alone(measure)
