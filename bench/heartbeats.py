"""The heartbeat timeout's trade-off: spurious retries under load vs recovery after a SIGKILL.

    python -m bench.heartbeats
    python -m bench.heartbeats --timeouts 2 5 --tasks 10 --steps 3
    python -m bench.heartbeats --timeouts 3 5 --tokens 500 --repeats 1   # 10 s calls

For each heartbeat timeout (the task's heartbeat_timeout_seconds; the default is
workflows/options.py's DEFAULT_HEARTBEAT_TIMEOUT):
- under load: two processes burning a CPU each beside a real worker subprocess, `tasks`
  concurrent tasks whose every model call streams for about 3 s. No call fails, so every
  request to the endpoint past one a step is a spurious retry: a live call abandoned because
  its heartbeats came late;
- recovery: a worker SIGKILLed inside a model stream (held open by the fake endpoint, so a
  slow machine cannot finish it first) while a second worker waits, until the call's next
  attempt reaches the endpoint; without the burners. Past the timeout, the model call's
  retry policy waits its initial interval (1 s) before the next attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench.common import Bench, Row, median, percentile, run_alone, say
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings
from waystation.workflows.options import DEFAULT_HEARTBEAT_TIMEOUT

TIMEOUTS = (2.0, 5.0)
TASKS = 10
STEPS = 3
REPEATS = 3
BURNERS = 2
TOKENS = 150
CHUNK_DELAY = 0.02  # 150 chunks: a 3-second stream


@contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """`count` processes spinning on a CPU each, for the duration of the block."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def slow_model_reply(steps: int, tokens: int) -> Any:
    def reply(body: dict[str, Any]) -> Reply:
        done = sum(m["role"] == "tool" for m in body["messages"])
        words = " ".join(["tok"] * tokens)
        if done >= steps - 1:
            return text(words, chunk_delay=CHUNK_DELAY)
        return tools(
            ("calculator", {"expression": f"{done} + 1"}), content=words, chunk_delay=CHUNK_DELAY
        )

    return reply


async def spurious_retries(
    bench: Bench, heartbeat: float, tasks: int, steps: int, tokens: int = TOKENS
) -> tuple[int, int]:
    """Model requests past one a step, and tasks failed, with both burners running."""
    settings = bench.settings("heartbeats")
    model = bench.fake.script(slow_model_reply(steps, tokens), record=False)
    with cpu_burners(BURNERS):
        worker = await WorkerProcess(bench.address, settings).ready()
        try:
            runtime = AgentRuntime(bench.client, settings)
            task = AgentTask(
                task="talk slowly",
                model=ModelSettings(name=model),
                max_steps=steps + 1,
                approval=ApprovalSettings(policy={"calculator": "never"}),
                heartbeat_timeout_seconds=heartbeat,
            )
            handles = await asyncio.gather(*(runtime.run(task) for _ in range(tasks)))
            ends = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
        finally:
            worker.kill()
    failed = [end for end in ends if isinstance(end, BaseException)]
    for end in failed[:1]:
        say(f"a task failed: {end}")
    return bench.fake.calls(model) - tasks * steps, len(failed)


async def kill_inside_stream(bench: Bench, heartbeat: float) -> float:
    """Seconds from SIGKILL of the worker mid-stream to the retry reaching the endpoint."""
    settings = bench.settings("heartbeat-kill")
    gate = threading.Event()
    requests = 0

    def reply(body: dict[str, Any]) -> Reply:
        # Counted here: the fake holds its lock while it asks the script for a reply.
        nonlocal requests
        requests += 1
        if requests == 1:
            return Reply(content=" ".join(["tok"] * 20), hold_after_chunks=5, gate=gate)
        return text("recovered")

    model = bench.fake.script(reply, record=False)
    first = await WorkerProcess(bench.address, settings).ready()
    second: WorkerProcess | None = None
    try:
        runtime = AgentRuntime(bench.client, settings)
        task = AgentTask(
            task="talk", model=ModelSettings(name=model), heartbeat_timeout_seconds=heartbeat
        )
        handle = await runtime.run(task)
        await bench.fake.until_streaming(model, 5, request=0, within=300)
        second = await WorkerProcess(bench.address, settings).ready()
        first.kill()
        killed_at = time.monotonic()
        gate.set()
        async with asyncio.timeout(300):
            while bench.fake.calls(model) < 2:
                await asyncio.sleep(0.01)
        recovered = time.monotonic() - killed_at
        await handle.result()
        return recovered
    finally:
        gate.set()
        first.kill()
        if second is not None:
            second.kill()


async def measure(
    bench: Bench,
    timeouts: Sequence[float] = TIMEOUTS,
    tasks: int = TASKS,
    steps: int = STEPS,
    repeats: int = REPEATS,
    tokens: int = TOKENS,
) -> list[Row]:
    rows = []
    for timeout in timeouts:
        say(f"heartbeats {timeout:g} s: {tasks} x {steps} slow steps beside {BURNERS} burners")
        retries, failed = await spurious_retries(bench, timeout, tasks, steps, tokens)
        say(
            f"heartbeats {timeout:g} s: {retries} spurious retries of {tasks * steps} calls, "
            f"{failed} of {tasks} tasks failed"
        )
        recoveries = []
        for n in range(repeats):
            seconds = await kill_inside_stream(bench, timeout)
            say(f"heartbeats {timeout:g} s: SIGKILL {n + 1}/{repeats} recovered in {seconds:.2f} s")
            recoveries.append(seconds)
        default = " (the default)" if timeout == DEFAULT_HEARTBEAT_TIMEOUT.total_seconds() else ""
        rows += [
            Row(
                f"heartbeat timeout {timeout:g} s{default}: spurious model-call retries "
                f"under {BURNERS} CPU burners",
                f"{retries} of {tasks * steps} calls; {failed} of {tasks} tasks failed",
                f"{tasks} concurrent tasks x {steps} steps of ~{tokens * CHUNK_DELAY:g} s streams",
            ),
            Row(
                f"heartbeat timeout {timeout:g} s{default}: SIGKILL in an LLM stream → "
                "retry reaches the endpoint from another worker, median / max",
                f"{median(recoveries):.2f} / {percentile(recoveries, 1.0):.2f} s",
                f"{median(recoveries) / timeout:.2f}x the timeout",
            ),
        ]
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=list(TIMEOUTS))
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="SIGKILLs per timeout")
    parser.add_argument(
        "--tokens",
        type=int,
        default=TOKENS,
        help=f"chunks a model call streams, {CHUNK_DELAY} s each",
    )
    args = parser.parse_args()
    run_alone(
        lambda bench: measure(
            bench, args.timeouts, args.tasks, args.steps, args.repeats, args.tokens
        )
    )
