"""Ten sub-agents at once against the same ten one after another: `python -m bench.subagents`.

A parent calls the sub-agent `helper` ten times in one step (they run in parallel as child
workflows), against a parent that calls it once a step for ten steps (they run one after
another); each child takes 5 steps (a 2 KB thought and a calculator call a step, then its
answer). One worker subprocess, the model over HTTP to the fake endpoint, which answers
each call at once, then again after holding each call's stream `--model-seconds` (0.5 s,
a fast real model's pace): the first measures the runtime alone, the second what a tree
waiting on a model gains. The two shapes alternate, `--rounds` times each. Measured: the
wall time of each (median), as a ratio; the parent's history bytes against a single task
doing the 50 steps itself, and against a parent whose ten children answer at once (1 step
each): a child's result enters its parent's history once, so the parent's size does not
grow with its children's length.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from typing import Any

from bench.common import Bench, Measure, Row, run_alone, say
from bench.durable_bytes import chain_history_bytes
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentSpec, AgentTask, ApprovalSettings, ModelSettings

CHILDREN = 10
CHILD_STEPS = 5
ROUNDS = 2
MODEL_SECONDS = 0.5
MESSAGE_BYTES = 2048
AGENT = "helper"
_PART = re.compile(r"part (\d+) of (\d+) steps, (\d+) ms a call")


def instruction(part: int, steps: int, pause: float) -> str:
    return f"part {part} of {steps} steps, {round(pause * 1000)} ms a call"


def paced(reply: Reply, pause: float) -> Reply:
    """The reply, its stream held `pause` seconds before its first chunk (a model thinking)."""
    if pause:
        reply.stall_before_chunk, reply.stall_seconds = 0, pause
    return reply


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def child_model(fake: FakeOpenAI) -> str:
    """A child: as many steps as its instruction says, at its pace; a 2 KB thought and a
    calculator call a step, then its answer."""

    def reply(body: dict[str, Any]) -> Reply:
        asked = next(m["content"] for m in body["messages"] if m["role"] == "user")
        found = _PART.search(asked)
        if found is None:
            return text(f"no part in {asked[:80]!r}")
        part, steps, pause = int(found[1]), int(found[2]), int(found[3]) / 1000
        done = len(tool_results(body))
        if done >= steps - 1:
            return paced(text(f"part {part} is done after {done + 1} steps"), pause)
        call = ("calculator", {"expression": f"{part} + {done}"})
        return paced(tools(call, content="c" * MESSAGE_BYTES), pause)

    return fake.script(reply, record=False)


def parallel_parent(fake: FakeOpenAI, children: int, child_steps: int, pause: float) -> str:
    """Calls every child in its first step, then answers."""

    def reply(body: dict[str, Any]) -> Reply:
        if tool_results(body):
            return paced(text("every part is done"), pause)
        calls = [
            (f"agent__{AGENT}", {"task": instruction(i, child_steps, pause)})
            for i in range(children)
        ]
        return paced(tools(*calls), pause)

    return fake.script(reply, record=False)


def sequential_parent(fake: FakeOpenAI, children: int, child_steps: int, pause: float) -> str:
    """Calls one child a step, the next once the last answered, then answers."""

    def reply(body: dict[str, Any]) -> Reply:
        done = len(tool_results(body))
        if done >= children:
            return paced(text("every part is done"), pause)
        call = (f"agent__{AGENT}", {"task": instruction(done, child_steps, pause)})
        return paced(tools(call), pause)

    return fake.script(reply, record=False)


def single_model(fake: FakeOpenAI, steps: int) -> str:
    """One task doing every step itself: a 2 KB thought and a calculator call a step. Its
    older turns get summarized (past the default context window), so the steps done so far
    are counted by the calculator: its latest result."""

    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text("[the earlier steps, summarized]")
        results = tool_results(body)
        done = int(results[-1]) if results else 0
        if done >= steps - 1:
            return text("every part is done")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="c" * MESSAGE_BYTES)

    return fake.script(reply, record=False)


def task(model: str, calls_a_step: int) -> AgentTask:
    return AgentTask(
        task="do every part",
        model=ModelSettings(name=model),
        max_steps=CHILDREN * CHILD_STEPS + 1,
        max_agent_calls=calls_a_step,
        approval=ApprovalSettings(policy={"calculator": "never"}),
    )


async def timed_tree(runtime: AgentRuntime, model: str, children: int) -> tuple[float, str]:
    """Run a parent to its answer: its seconds and its id (its children all done)."""
    started = time.perf_counter()
    handle = await runtime.run(task(model, children))
    await handle.result()
    seconds = time.perf_counter() - started
    state = await handle.state()
    ended = [c.status for c in state.children.values()]
    if ended != ["done"] * children:
        raise RuntimeError(f"{handle.id}: its children ended {ended}")
    return seconds, handle.id


async def tree_bytes(bench: Bench, runtime: AgentRuntime, task_id: str) -> tuple[int, int]:
    """The parent's history bytes, and its children's together."""
    parent, _ = await chain_history_bytes(bench, task_id)
    state = await runtime.get(task_id).state()
    children = 0
    for child in state.children.values():
        children += (await chain_history_bytes(bench, child.task_id))[0]
    return parent, children


async def wall_times(
    bench: Bench, runtime: AgentRuntime, children: int, child_steps: int, rounds: int, pause: float
) -> tuple[dict[str, float], str]:
    """Median seconds of each shape at this pace, and the id of a parallel parent."""
    fake = bench.fake
    models = {
        "at once": parallel_parent(fake, children, child_steps, pause),
        "one after another": sequential_parent(fake, children, child_steps, pause),
    }
    times: dict[str, list[float]] = {shape: [] for shape in models}
    parallel_id = ""
    for number in range(rounds):
        for shape, model in models.items():
            say(f"sub-agents, {pause:g} s a call: round {number + 1}/{rounds}, {shape}")
            seconds, task_id = await timed_tree(runtime, model, children)
            times[shape].append(seconds)
            parallel_id = task_id if shape == "at once" else parallel_id
    return {shape: statistics.median(values) for shape, values in times.items()}, parallel_id


async def measure(
    bench: Bench,
    children: int = CHILDREN,
    child_steps: int = CHILD_STEPS,
    rounds: int = ROUNDS,
    model_seconds: float = MODEL_SECONDS,
) -> list[Row]:
    spec = AgentSpec(
        name=AGENT,
        description="does one part",
        model=ModelSettings(name=child_model(bench.fake)),
        max_steps=child_steps + 1,
    )
    definitions = json.dumps([spec.model_dump(mode="json", exclude_defaults=True)])
    settings = bench.settings("subagents").model_copy(update={"agents": definitions})
    worker = await WorkerProcess(bench.address, settings).ready()
    try:
        runtime = AgentRuntime(bench.client, settings)
        paces = {
            pause: await wall_times(bench, runtime, children, child_steps, rounds, pause)
            for pause in (0.0, model_seconds)
        }
        parallel_bytes = await tree_bytes(bench, runtime, paces[0.0][1])
        say(f"sub-agents: {children} children of 1 step at once (the flatness baseline)")
        quick = parallel_parent(bench.fake, children, 1, 0.0)
        quick_bytes = await tree_bytes(
            bench, runtime, (await timed_tree(runtime, quick, children))[1]
        )
        say(f"sub-agents: one task doing the {children * child_steps} steps itself")
        single = await runtime.run(task(single_model(bench.fake, children * child_steps), 1))
        await single.result()
        single_bytes, _ = await chain_history_bytes(bench, single.id)
    finally:
        worker.kill()
    rows = []
    for pause, (times, _) in paces.items():
        at_once, one_by_one = times["at once"], times["one after another"]
        rows.append(
            Row(
                f"{children} sub-agents of {child_steps} steps called in one step, a model "
                f"answering in {pause:g} s: wall time",
                f"{at_once:.1f} s",
                f"{one_by_one / at_once:.2f}x faster than the same {children} one after "
                f"another ({one_by_one:.1f} s; median of {rounds})",
            )
        )
    steps = children * child_steps
    return [
        *rows,
        Row(
            f"parent's history bytes, {children} sub-agents of {child_steps} steps at once",
            f"{parallel_bytes[0] / 1000:.1f} KB",
            f"{parallel_bytes[0] / single_bytes:.2f}x a single task doing the {steps} steps "
            f"({single_bytes / 1000:.1f} KB); the children's {parallel_bytes[1] / 1000:.1f} KB "
            "are in their own histories",
        ),
        Row(
            f"parent's history bytes, sub-agents of {child_steps} steps / of 1 step (the "
            "same answers)",
            f"{parallel_bytes[0] / 1000:.1f} / {quick_bytes[0] / 1000:.1f} KB",
            f"{parallel_bytes[0] / quick_bytes[0]:.2f}x: a child's length stays out of its "
            "parent's history",
        ),
    ]


def with_sizes(children: int, child_steps: int, rounds: int, model_seconds: float) -> Measure:
    return lambda bench: measure(bench, children, child_steps, rounds, model_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, default=CHILDREN)
    parser.add_argument("--child-steps", type=int, default=CHILD_STEPS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--model-seconds", type=float, default=MODEL_SECONDS)
    args = parser.parse_args()
    run_alone(with_sizes(args.children, args.child_steps, args.rounds, args.model_seconds))
