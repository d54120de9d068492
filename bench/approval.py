"""Approval round trip: decision sent → the approved tool starts: `python -m bench.approval`.

Each task asks to run a shell command and parks. The decision goes out as the `decide`
Update (what `resume`, the CLI and the HTTP API use) or as the `approve` Signal (what
`temporal workflow signal` sends); measured until the tool activity's start, as Temporal
records it in history.
"""

from __future__ import annotations

import asyncio
import time

from temporalio.api.enums.v1 import EventType

from bench.common import Bench, Row, median, percentile, run_alone, say
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.testing.fake_openai import text, tools
from waystation.workflows.models import AgentTask, Decision, ModelSettings

REPEATS = 15


async def tool_started_at(bench: Bench, handle: TaskHandle) -> float:
    history = await bench.client.get_workflow_handle(handle.id).fetch_history()
    scheduled: set[int] = set()
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == "run_tool":
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if event.activity_task_started_event_attributes.scheduled_event_id in scheduled:
                return event.event_time.ToDatetime().timestamp()
    raise RuntimeError("the approved tool never started")


async def one_round_trip(bench: Bench, runtime: AgentRuntime, via: str) -> float:
    model = bench.fake.script(
        lambda body: (
            text("done")
            if body["messages"][-1]["role"] == "tool"
            else tools(("run_shell", {"command": "true"}))
        )
    )
    handle = await runtime.run(AgentTask(task="approve me", model=ModelSettings(name=model)))
    request_id = ""
    async for item in runtime.stream(handle.id, topics=["events"]):
        if item.data.type == "approval_requested":
            request_id = item.data.request_id  # type: ignore[union-attr]
            break
    await asyncio.sleep(0.1)  # the task is parked: nothing else in flight
    sent = time.time()
    if via == "update":
        await handle.approve(request_id, approver="bench")
    else:
        await bench.client.get_workflow_handle(handle.id).signal(
            "approve", Decision(request_id=request_id, decision="approve", approver="bench")
        )
    await handle.result()
    return (await tool_started_at(bench, handle)) - sent


async def measure(bench: Bench, repeats: int = REPEATS) -> list[Row]:
    settings = bench.settings("approval")
    figures: dict[str, list[float]] = {"update": [], "signal": []}
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)
        for n in range(repeats):
            say(f"approval round trip: repeat {n + 1}/{repeats}")
            for via in figures:
                figures[via].append(await one_round_trip(bench, runtime, via))
    update, signal = figures["update"], figures["signal"]
    return [
        Row(
            "approval round trip (decide Update → tool started), median / p95",
            f"{median(update) * 1000:.0f} / {percentile(update, 0.95) * 1000:.0f} ms",
            f"approve Signal {median(signal) * 1000:.0f} / "
            f"{percentile(signal, 0.95) * 1000:.0f} ms",
        )
    ]


if __name__ == "__main__":
    run_alone(measure)
