"""Stream latency and its history cost: `python -m bench.stream_latency`.

- token latency: the fake model writes into each chunk the time it sends it; the
  subscriber subtracts that from the time it receives the token (median, p95);
- event latency: an event's `at` (its workflow task's time) to the time it is received;
- history cost: events a 2,000-token answer adds to history, beside a 1-token answer
  measured in the same run (the baseline).
"""

from __future__ import annotations

import statistics
import time

from temporalio.testing import WorkflowEnvironment

from bench.common import Bench, Row, percentile, run_alone, say
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import Reply, tools
from waystation.workflows.models import AgentTask, ModelSettings
from waystation.workflows.stream import TokenDelta

TOKENS = 2000
CHUNK_DELAY = 0.002


async def run_one(
    env: WorkflowEnvironment, runtime: AgentRuntime, model: str
) -> tuple[list[float], list[float], int]:
    """Stream one task live; return token and event latencies (ms) and its history size."""
    handle = await runtime.run(AgentTask(task="talk", model=ModelSettings(name=model)))
    token_ms: list[float] = []
    event_ms: list[float] = []
    async for item in runtime.stream(handle.id):
        now = time.time()
        if isinstance(item.data, TokenDelta) and item.data.text.strip() != "w":
            token_ms.append((now - float(item.data.text)) * 1000)
        elif item.topic == "events" and item.data.type != "task_started":
            # task_started is appended before anyone can subscribe: not a latency.
            event_ms.append((now - item.data.at.timestamp()) * 1000)  # type: ignore[union-attr]
    history = await env.client.get_workflow_handle(handle.id).fetch_history()
    return token_ms, event_ms, len(history.events)


async def measure(bench: Bench) -> list[Row]:
    fake = bench.fake
    words = " ".join("w" for _ in range(TOKENS))
    long_answer = fake.script(
        lambda body: Reply(content=words, chunk_delay=CHUNK_DELAY, stamp_chunks=True)
    )
    short_answer = fake.script(lambda body: Reply(content="w", stamp_chunks=True))
    steps = [tools(("calculator", {"expression": f"{i} + 1"}), content="w") for i in range(9)]
    ten_steps = fake.script([*steps, Reply(content="w", stamp_chunks=True)])
    settings = bench.settings("stream")
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)
        say(f"stream latency: a {TOKENS}-token answer, {CHUNK_DELAY * 1000:g} ms between chunks")
        started = time.perf_counter()
        token_ms, _, long_events = await run_one(bench.env, runtime, long_answer)
        seconds = time.perf_counter() - started
        say("stream latency: the 1-token baseline")
        _, _, short_events = await run_one(bench.env, runtime, short_answer)
        say("stream latency: a 10-step task for event latency")
        _, event_ms, _ = await run_one(bench.env, runtime, ten_steps)
    added = long_events - short_events
    return [
        Row(
            "token sent by the model → received by a subscriber, median / p95",
            f"{statistics.median(token_ms):.0f} / {percentile(token_ms, 0.95):.0f} ms",
            f"{len(token_ms)} of {TOKENS} tokens received, at {TOKENS / seconds:.0f} tokens/s",
        ),
        Row(
            "event appended → received by a subscriber, median / p95",
            f"{statistics.median(event_ms):.0f} / {percentile(event_ms, 0.95):.0f} ms",
        ),
        Row(
            f"history events added by a {TOKENS}-token answer",
            f"{added}: one per {TOKENS / max(added, 1):.1f} tokens",
            f"over a 1-token answer in the same run ({short_events} events)",
        ),
    ]


if __name__ == "__main__":
    run_alone(measure)
