"""Stream latency and history cost, on the dev server: `python -m bench.stream_latency`.

- token latency: the fake model writes into each chunk the time it sends it; the
  subscriber subtracts that from the time it receives the token (median, p95);
- event latency: an event's `at` (its workflow task's time) to the time it is received;
- history cost: events a 2,000-token answer adds to history, beside a 1-token answer
  measured in the same run (the baseline).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

from temporalio.testing import WorkflowEnvironment

from runtime.agent_runtime import AgentRuntime
from runtime.settings import Settings
from tests.fake_openai import FakeOpenAI, Reply, tools
from tests.servers import start_dev_env
from worker import build_worker
from workflows.models import AgentTask, ModelSettings
from workflows.stream import TokenDelta

TOKENS = 2000
CHUNK_DELAY = 0.002


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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


async def main() -> None:
    fake = FakeOpenAI()
    words = " ".join("w" for _ in range(TOKENS))
    long_answer = fake.script(
        lambda body: Reply(content=words, chunk_delay=CHUNK_DELAY, stamp_chunks=True)
    )
    short_answer = fake.script(lambda body: Reply(content="w", stamp_chunks=True))
    steps = [tools(("calculator", {"expression": f"{i} + 1"}), content="w") for i in range(9)]
    ten_steps = fake.script([*steps, Reply(content="w", stamp_chunks=True)])
    print("starting the Temporal dev server ...", flush=True)
    env = await start_dev_env()
    with TemporaryDirectory() as workspace:
        settings = Settings(
            task_queue=f"bench-{uuid.uuid4().hex[:6]}",
            workspace=Path(workspace),
            openai_api_key="sk-bench",  # type: ignore[arg-type]
            openai_base_url=fake.url,
            embedded_server=False,
        )
        async with env, build_worker(env.client, settings):
            runtime = AgentRuntime(env.client, settings)
            print(
                f"streaming a {TOKENS}-token answer, {CHUNK_DELAY * 1000:g} ms between chunks ...",
                flush=True,
            )
            token_ms, _, long_events = await run_one(env, runtime, long_answer)
            print("streaming the 1-token baseline ...", flush=True)
            _, _, short_events = await run_one(env, runtime, short_answer)
            print("streaming a 10-step task for event latency ...", flush=True)
            _, event_ms, _ = await run_one(env, runtime, ten_steps)
    fake.close()
    added = long_events - short_events
    rows = [
        ("tokens received", f"{len(token_ms)} of {TOKENS}"),
        ("token sent by model → received, median", f"{statistics.median(token_ms):.0f} ms"),
        ("token sent by model → received, p95", f"{percentile(token_ms, 0.95):.0f} ms"),
        ("event appended → received, median", f"{statistics.median(event_ms):.0f} ms"),
        ("event appended → received, p95", f"{percentile(event_ms, 0.95):.0f} ms"),
        (f"history events, {TOKENS}-token answer", str(long_events)),
        ("history events, 1-token answer (baseline, same run)", str(short_events)),
        (f"added by the {TOKENS} tokens", f"{added} (one per {TOKENS / max(added, 1):.1f} tokens)"),
    ]
    print("\n| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    asyncio.run(main())
