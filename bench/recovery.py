"""Time from a worker's SIGKILL to the task progressing on another worker.

    python -m bench.recovery [--repeats 5]

Worker A (a real subprocess) takes the call; worker B is started and ready; A is killed
with SIGKILL. Measured until the call's next attempt starts on B:
- inside an LLM stream: until the subscriber receives the retry marker of attempt 2;
- inside a tool: until the retried tool activity starts (its ActivityTaskStarted time).
The floor is the activity heartbeat timeout (a dead worker is noticed after it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from runtime.agent_runtime import AgentRuntime
from runtime.settings import Settings
from tests.conftest import WorkerProcess
from tests.fake_openai import FakeOpenAI, Reply, text, tools
from tests.servers import start_dev_env
from workflows.agent import LLM_HEARTBEAT_TIMEOUT, TOOL_HEARTBEAT_TIMEOUT
from workflows.models import AgentTask, ApprovalSettings, ModelSettings
from workflows.stream import LlmAttemptStarted, TokenDelta


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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


async def main(repeats: int) -> None:
    fake = FakeOpenAI()
    print("starting the Temporal dev server ...", flush=True)
    env = await start_dev_env()
    figures: dict[str, list[float]] = {"inside an LLM stream": [], "inside a tool": []}
    async with env:
        with TemporaryDirectory() as data:
            for n in range(repeats):
                for name, scenario in (
                    ("inside an LLM stream", kill_inside_llm),
                    ("inside a tool", kill_inside_tool),
                ):
                    settings = Settings(
                        task_queue=f"recovery-{uuid.uuid4().hex[:6]}",
                        data_dir=Path(data) / f"{n}",
                        workspace=Path(data) / f"{n}" / "ws",
                        openai_api_key="sk-bench",  # type: ignore[arg-type]
                        openai_base_url=fake.url,
                        embedded_server=False,
                    )
                    seconds = await scenario(env, fake, settings)
                    figures[name].append(seconds)
                    print(f"repeat {n + 1}/{repeats}, kill {name}: {seconds:.2f} s", flush=True)
    fake.close()
    floor = max(LLM_HEARTBEAT_TIMEOUT, TOOL_HEARTBEAT_TIMEOUT).total_seconds()
    print(
        "\n| SIGKILL → next attempt on another worker | median | p95 | median / heartbeat timeout |"
    )
    print("|---|---|---|---|")
    for name, values in figures.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.2f} s | {percentile(values, 0.95):.2f} s "
            f"| {median / floor:.2f}x of {floor:g} s |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    asyncio.run(main(parser.parse_args().repeats))
