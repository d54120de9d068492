"""Per-step overhead, side by side in one run: `python -m bench.step_overhead`.

- agent step: an AgentWorkflow step with the instant in-process model and the calculator;
- the same over HTTP: the real `openai` client against the local fake endpoint;
- floor: a bare Temporal workflow running the same number of activities (2 per step), and
  one shaped like our step (an activity and a local activity);
- LangGraph with its SQLite and in-memory checkpointers (the same instant model and tool);
- plain Python loops with no durability at all, in-process and over HTTP.
Median of repeats; ratios against the floor measured in the same run.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import openai
from temporalio.worker import Worker

from bench import peers
from bench.common import Bench, Row, instant_task, median, run_alone, say
from bench.floor import BareLocalLoop, BareLoop, noop
from bench.instant_model import InstantModel, instant_task_text
from waystation.activities.builtin_tools import evaluate
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.workflows.models import AgentTask, ApprovalSettings, ChatMessage, ModelSettings

STEPS = 50
REPEATS = 3
FLOOR = "floor: bare workflow, 2 activities per step"


def http_model(fake: FakeOpenAI, steps: int) -> str:
    def reply(body: dict[str, Any]) -> Reply:
        done = sum(m["role"] == "tool" for m in body["messages"])
        if done >= steps - 1:
            return text("done")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="ok")

    return fake.script(reply)


async def plain_loop_in_process(steps: int) -> float:
    """The instant model and the calculator in a loop: what the work itself costs."""
    model = InstantModel()
    messages = [ChatMessage(role="user", content=instant_task_text(steps))]
    settings = ModelSettings(name="instant")
    start = time.perf_counter()
    for _ in range(steps):
        calls = [d async for d in model.stream(messages, [{}], settings) if d.tool_name]
        if not calls:
            break
        messages.append(ChatMessage(role="assistant", content="x"))
        for call in calls:
            value = evaluate(call.tool_arguments.split('"')[3])
            messages.append(
                ChatMessage(role="tool", tool_call_id=call.tool_call_id, content=str(value))
            )
    return (time.perf_counter() - start) / steps


async def plain_loop_over_http(fake: FakeOpenAI, steps: int) -> float:
    client = openai.AsyncOpenAI(api_key="sk-bench", base_url=fake.url, max_retries=0)
    model = http_model(fake, steps)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
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
            value = evaluate(json.loads(c["arguments"])["expression"])
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": str(value)})
    await client.close()
    return (time.perf_counter() - start) / steps


async def measure(bench: Bench, steps: int = STEPS, repeats: int = REPEATS) -> list[Row]:
    figures: dict[str, list[float]] = {
        "agent step, instant in-process model": [],
        "agent step, openai client over HTTP to the fake": [],
        FLOOR: [],
        "bare workflow, 1 activity + 1 local activity per step": [],
        "LangGraph, SqliteSaver": [],
        "LangGraph, InMemorySaver": [],
        "plain Python loop, in-process": [],
        "plain Python loop, over HTTP": [],
    }
    settings = bench.settings("overhead")
    floor_queue = settings.task_queue + "-floor"
    client = bench.client
    async with (
        bench.worker(settings),
        Worker(
            client,
            task_queue=floor_queue,
            workflows=[BareLoop, BareLocalLoop],
            activities=[noop],
        ),
    ):
        runtime = AgentRuntime(client, settings)
        for n in range(repeats):
            say(f"step overhead: repeat {n + 1}/{repeats}, {steps} steps each")
            start = time.perf_counter()
            outcome = await (await runtime.run(instant_task(steps))).result()
            figures["agent step, instant in-process model"].append(
                (time.perf_counter() - start) / outcome.steps
            )

            task = AgentTask(
                task="count",
                model=ModelSettings(name=http_model(bench.fake, steps)),
                max_steps=steps + 1,
                approval=ApprovalSettings(policy={"calculator": "never"}),
            )
            start = time.perf_counter()
            outcome = await (await runtime.run(task)).result()
            figures["agent step, openai client over HTTP to the fake"].append(
                (time.perf_counter() - start) / outcome.steps
            )

            for workflow, count, name in (
                (BareLoop.run, 2 * steps, FLOOR),
                (BareLocalLoop.run, steps, "bare workflow, 1 activity + 1 local activity per step"),
            ):
                start = time.perf_counter()
                await client.execute_workflow(
                    workflow, count, id=f"floor-{uuid.uuid4().hex}", task_queue=floor_queue
                )
                figures[name].append((time.perf_counter() - start) / steps)

    for n in range(repeats):
        figures["plain Python loop, in-process"].append(await plain_loop_in_process(steps))
        figures["plain Python loop, over HTTP"].append(
            await plain_loop_over_http(bench.fake, steps)
        )
        if peers.available():
            database = bench.scratch / f"langgraph-overhead-{n}.sqlite"
            figures["LangGraph, SqliteSaver"].append(
                await asyncio.to_thread(peers.seconds_per_step_sqlite, steps, database)
            )
            figures["LangGraph, InMemorySaver"].append(
                await asyncio.to_thread(peers.seconds_per_step_in_memory, steps)
            )

    floor = median(figures[FLOOR])
    rows = []
    for name, values in figures.items():
        if not values:
            rows.append(Row(f"ms per step: {name}", "not installed", "pip install -e '.[bench]'"))
            continue
        value = median(values)
        rows.append(
            Row(f"ms per step: {name}", f"{value * 1000:.2f}", f"{value / floor:.2f}x floor")
        )
    return rows


if __name__ == "__main__":
    run_alone(measure)
