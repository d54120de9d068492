"""Per-step overhead of an agent step, side by side in one run: `python -m bench.step_overhead`.

- agent: an AgentWorkflow step (instant fake model over real HTTP, calculator tool);
- floor: a bare Temporal workflow running the same number of activities (2 per step);
- plain loop: the same model call and tool in a Python loop, with no durability at all.
Median of repeats; ratios against the floor measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import openai
from temporalio.worker import Worker

from activities.builtin_tools import CalculatorArgs, calculator
from activities.tools import ToolContext
from bench.floor import BareLoop, noop
from runtime.agent_runtime import AgentRuntime
from runtime.settings import Settings
from tests.fake_openai import FakeOpenAI, Reply, text, tools
from tests.servers import start_dev_env
from worker import build_worker
from workflows.models import AgentTask, ApprovalSettings, ModelSettings


def step_model(fake: FakeOpenAI, steps: int) -> str:
    def reply(body: dict[str, Any]) -> Reply:
        done = sum(m["role"] == "tool" for m in body["messages"])
        if done >= steps - 1:
            return text("done")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="ok")

    return fake.script(reply)


async def plain_loop(fake: FakeOpenAI, steps: int, workspace: Path) -> float:
    client = openai.AsyncOpenAI(api_key="sk-bench", base_url=fake.url, max_retries=0)
    model = step_model(fake, steps)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    context = ToolContext(workspace=workspace, idempotency_key="k", ledger=None)  # type: ignore[arg-type]
    create: Any = client.chat.completions.create
    start = time.perf_counter()
    for _ in range(steps):
        response = await create(model=model, messages=messages, stream=True)
        calls: dict[int, dict[str, str]] = {}
        async for chunk in response:
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = calls.setdefault(call.index, {"id": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                entry["arguments"] += (call.function.arguments or "") if call.function else ""
        if not calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": "calculator", "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            result = await calculator(CalculatorArgs.model_validate_json(c["arguments"]), context)
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    await client.close()
    return (time.perf_counter() - start) / steps


async def main(steps: int, repeats: int) -> None:
    fake = FakeOpenAI()
    print("starting the Temporal dev server ...", flush=True)
    env = await start_dev_env()
    figures: dict[str, list[float]] = {
        "agent step": [],
        "floor (2 bare activities)": [],
        "plain Python loop": [],
    }
    with TemporaryDirectory() as data:
        settings = Settings(
            task_queue=f"overhead-{uuid.uuid4().hex[:6]}",
            data_dir=Path(data),
            workspace=Path(data) / "ws",
            openai_api_key="sk-bench",  # type: ignore[arg-type]
            openai_base_url=fake.url,
            embedded_server=False,
        )
        floor_queue = settings.task_queue + "-floor"
        async with (
            env,
            build_worker(env.client, settings),
            Worker(env.client, task_queue=floor_queue, workflows=[BareLoop], activities=[noop]),
        ):
            runtime = AgentRuntime(env.client, settings)
            for n in range(repeats):
                task = AgentTask(
                    task="count",
                    model=ModelSettings(name=step_model(fake, steps)),
                    max_steps=steps + 1,
                    approval=ApprovalSettings(policy={"calculator": "never"}),
                )
                start = time.perf_counter()
                outcome = await (await runtime.run(task)).result()
                figures["agent step"].append((time.perf_counter() - start) / outcome.steps)

                start = time.perf_counter()
                await env.client.execute_workflow(
                    BareLoop.run, 2 * steps, id=f"floor-{uuid.uuid4().hex}", task_queue=floor_queue
                )
                figures["floor (2 bare activities)"].append((time.perf_counter() - start) / steps)

                figures["plain Python loop"].append(await plain_loop(fake, steps, Path(data)))
                print(f"repeat {n + 1}/{repeats} done", flush=True)
    fake.close()
    floor = statistics.median(figures["floor (2 bare activities)"])
    print(f"\n| per step ({steps} steps, median of {repeats}) | ms | vs floor |")
    print("|---|---|---|")
    for name, values in figures.items():
        median = statistics.median(values)
        print(f"| {name} | {median * 1000:.1f} | {median / floor:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.repeats))
