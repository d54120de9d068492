"""Time from a worker's SIGKILL to the task progressing on another worker.

    python -m bench.recovery

Worker A (a real subprocess) takes the call; worker B is started and ready; A is killed
with SIGKILL. Measured until the call's next attempt starts on B:
- inside an LLM stream: until the subscriber receives the retry marker of attempt 2;
- inside a tool: until the retried tool activity starts (its ActivityTaskStarted time).
The floor is the activity heartbeat timeout (a dead worker is noticed after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from bench.common import Bench, Row, median, percentile, run_alone, say
from waystation.client.agent_runtime import AgentRuntime, TaskEndedError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings
from waystation.workflows.options import DEFAULT_HEARTBEAT_TIMEOUT
from waystation.workflows.stream import LlmAttemptStarted, TokenDelta

REPEATS = 3


async def kill_inside_llm(env: WorkflowEnvironment, fake: FakeOpenAI, settings: Settings) -> float:
    address = env.client.service_client.config.target_host
    runtime = AgentRuntime(env.client, settings)
    model = fake.script(lambda body: Reply(content=" ".join(["tok"] * 300), chunk_delay=0.02))
    first = await WorkerProcess(address, settings).ready()
    handle = await runtime.run(AgentTask(task="talk", model=ModelSettings(name=model)))
    killed_at = 0.0
    second: WorkerProcess | None = None
    try:
        async for item in runtime.stream(handle.id):
            if isinstance(item.data, TokenDelta) and not killed_at:
                second = await WorkerProcess(address, settings).ready()
                first.kill()
                killed_at = time.monotonic()
            elif isinstance(item.data, LlmAttemptStarted):
                return time.monotonic() - killed_at
        raise RuntimeError("the task ended without a retried attempt")
    finally:
        first.kill()
        if second is not None:
            with contextlib.suppress(TaskEndedError):
                await handle.cancel()
            second.kill()


async def kill_inside_tool(env: WorkflowEnvironment, fake: FakeOpenAI, settings: Settings) -> float:
    address = env.client.service_client.config.target_host
    runtime = AgentRuntime(env.client, settings)
    model = fake.script(
        lambda body: (
            text("ok")
            if body["messages"][-1]["role"] == "tool"
            else tools(("run_shell", {"command": "sleep 3"}))
        )
    )
    first = await WorkerProcess(address, settings).ready()
    task = AgentTask(
        task="wait",
        model=ModelSettings(name=model),
        approval=ApprovalSettings(policy={"run_shell": "never"}),
    )
    handle = await runtime.run(task)
    second: WorkerProcess | None = None
    try:
        async for item in runtime.stream(handle.id, topics=["events"]):
            if item.data.type == "action":
                await asyncio.sleep(0.3)  # the tool is running on the first worker
                second = await WorkerProcess(address, settings).ready()
                first.kill()
                killed_at = time.time()
                break
        await handle.result()
        history = await env.client.get_workflow_handle(handle.id).fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                if attrs.attempt > 1:
                    return event.event_time.ToDatetime().timestamp() - killed_at
        raise RuntimeError("no retried tool attempt in history")
    finally:
        first.kill()
        if second is not None:
            second.kill()


async def measure(bench: Bench, repeats: int = REPEATS) -> list[Row]:
    figures: dict[str, list[float]] = {"inside an LLM stream": [], "inside a tool": []}
    for n in range(repeats):
        for name, scenario in (
            ("inside an LLM stream", kill_inside_llm),
            ("inside a tool", kill_inside_tool),
        ):
            seconds = await scenario(bench.env, bench.fake, bench.settings("recovery"))
            figures[name].append(seconds)
            say(f"recovery: repeat {n + 1}/{repeats}, SIGKILL {name}: {seconds:.2f} s")
    floor = DEFAULT_HEARTBEAT_TIMEOUT.total_seconds()
    return [
        Row(
            f"SIGKILL {name} → next attempt on another worker, median / p95",
            f"{median(values):.2f} / {percentile(values, 0.95):.2f} s",
            f"{median(values) / floor:.2f}x the {floor:g} s heartbeat timeout",
        )
        for name, values in figures.items()
    ]


if __name__ == "__main__":
    run_alone(measure)
