"""A long task with default settings, and reading its log a page at a time.

    python -m bench.long_run                  # 1,000 steps
    python -m bench.long_run --steps 10000

A default AgentTask (no limits of ours but max_steps): the model, over HTTP to the fake
endpoint, answers each step with a 2 KB message and one calculator call; a real worker
subprocess runs it. The task hands over to a fresh run (continue-as-new) on its own and
compacts its conversation past the default 16,000-token window. Measured per run, oldest
first, so the first run shows the start and the last the end: ms per step, history bytes
per step; with the number of runs, the largest run's history and the worker's RSS.

Then pages of 1,000 events of the finished task (its runs closed: read from the event
archive, a run that is not there answered by the same worker) at the start, the middle and
the end: GET /tasks/{id}/log?since=N&limit=1000 and TaskHandle.events, each read cold (the
first time) then warm (again); then TaskHandle.events again once the worker is killed, and,
for comparison, one in-process replay of the largest run (what a query of a closed run that
is not archived costs a worker).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import uvicorn
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from bench.common import Bench, Row, run_alone, say
from bench.worker_memory import rss_mb
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.http_api import create_app
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.worker import WORKFLOW_RUNNER
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentTask, ModelSettings

STEPS = 1000
MESSAGE_BYTES = 2048
PAGE = 1000
PAGE_BOUND = timedelta(minutes=2)


@dataclass(frozen=True)
class RunFigures:
    """One run of the task's chain."""

    run_id: str
    history_bytes: int
    steps: int
    seconds: float


def counting_model(fake: FakeOpenAI, steps: int) -> str:
    """2 KB and a calculator call a step, the answer at the last; summaries on request."""
    served = 0

    def reply(body: dict[str, Any]) -> Reply:
        nonlocal served
        if not body.get("tools"):  # the runtime asks for a summary of older turns
            return text(f"[summary of {len(body['messages'])} messages]")
        served += 1
        if served >= steps:
            return text("done")
        return tools(("calculator", {"expression": f"{served} + 1"}), content="x" * MESSAGE_BYTES)

    return fake.script(reply, record=False)


async def chain_runs(bench: Bench, task_id: str) -> list[RunFigures]:
    """Every run of the task, oldest first."""
    runs: list[RunFigures] = []
    run_id: str | None = None
    while True:
        handle = bench.client.get_workflow_handle(task_id, run_id=run_id)
        info = (await handle.describe()).raw_info
        steps, previous = 0, ""
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                attrs = event.workflow_execution_started_event_attributes
                previous = attrs.continued_execution_run_id
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled = event.activity_task_scheduled_event_attributes
                steps += scheduled.activity_type.name == "call_llm"
        seconds = (info.close_time.ToDatetime() - info.start_time.ToDatetime()).total_seconds()
        runs.append(RunFigures(info.execution.run_id, info.history_size_bytes, steps, seconds))
        if not previous:
            return runs[::-1]
        run_id = previous


async def replay_seconds(bench: Bench, task_id: str, run: RunFigures) -> float:
    """One replay of a closed run in this process: what a query of that run costs a worker."""
    history = await bench.client.get_workflow_handle(task_id, run_id=run.run_id).fetch_history()
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=WORKFLOW_RUNNER,
    )
    start = time.perf_counter()
    await replayer.replay_workflow(history, raise_on_replay_failure=True)
    return time.perf_counter() - start


async def sample_rss(pid: int, samples: list[float]) -> None:
    while True:
        samples.append(rss_mb(pid))
        await asyncio.sleep(1.0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def http_api(settings: Settings, runtime: AgentRuntime) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API served by uvicorn in this process, and a client of it."""
    port = free_port()
    config = uvicorn.Config(create_app(settings, runtime), port=port, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            yield client
    finally:
        server.should_exit = True
        await serving


async def timed(read: Awaitable[Any]) -> str:
    """How long a page read took, or how long until it failed and why."""
    start = time.perf_counter()
    try:
        await read
    except Exception as err:  # a failed read is a figure too: the time it took to fail
        reason = str(err).split(":")[0][:60]  # the table cell stays readable
        return f"failed after {time.perf_counter() - start:.1f} s ({type(err).__name__}: {reason})"
    return f"{(time.perf_counter() - start) * 1000:.0f} ms"


async def get_page(api: httpx.AsyncClient, task_id: str, since: int, expected: int) -> None:
    response = await api.get(f"/tasks/{task_id}/log?since={since}&limit={PAGE}")
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.json().get('detail')}")
    if len(response.json()["events"]) != expected:
        raise RuntimeError(f"the page at {since} is short")


async def page_seconds(
    settings: Settings, runtime: AgentRuntime, task_id: str, last_seq: int
) -> dict[str, tuple[str, str]]:
    """(first, second) read times of a 1,000-event page per reader and place in the log."""
    places = {"start": 0, "middle": last_seq // 2, "end": max(0, last_seq + 1 - PAGE)}
    figures: dict[str, tuple[str, str]] = {}
    async with http_api(settings, runtime) as api:
        for where, since in places.items():
            expected = min(PAGE, last_seq + 1 - since)
            first = await timed(get_page(api, task_id, since, expected))
            again = await timed(get_page(api, task_id, since, expected))
            figures[f"GET /tasks/{{id}}/log, {where}"] = (first, again)
            say(f"log page at {since} over HTTP: {first}, then {again}")
    figures.update(await handle_page_seconds(settings, runtime, task_id, last_seq))
    return figures


async def handle_page_seconds(
    settings: Settings, runtime: AgentRuntime, task_id: str, last_seq: int, label: str = ""
) -> dict[str, tuple[str, str]]:
    """(first, second) read times of a 1,000-event page by TaskHandle.events, per place."""
    places = {"start": 0, "middle": last_seq // 2, "end": max(0, last_seq + 1 - PAGE)}
    figures: dict[str, tuple[str, str]] = {}
    fresh = AgentRuntime(runtime.client, settings)  # nothing learnt of the runs yet
    for where, since in places.items():
        # A generous bound: the figure is how long the read takes, not the API's 10 s limit.
        reads = [
            await timed(fresh.get(task_id).events(since, limit=PAGE, within=PAGE_BOUND))
            for _ in range(2)
        ]
        figures[f"TaskHandle.events{label}, {where}"] = (reads[0], reads[1])
        say(f"log page at {since} by TaskHandle.events{label}: {reads[0]}, then {reads[1]}")
    return figures


async def measure(bench: Bench, steps: int = STEPS) -> list[Row]:
    # A longer run than the deployment's default cap allows, as WAYSTATION_MAX_STEPS_CAP would.
    long = bench.settings("long")
    settings = long.model_copy(update={"max_steps_cap": max(steps, long.max_steps_cap)})
    worker = await WorkerProcess(bench.address, settings).ready()
    rss: list[float] = []
    sampler = asyncio.create_task(sample_rss(worker.pid, rss))
    try:
        runtime = AgentRuntime(bench.client, settings)
        model = counting_model(bench.fake, steps)
        say(f"long run: {steps} default steps of {MESSAGE_BYTES}-byte messages")
        task = AgentTask(task="count", model=ModelSettings(name=model), max_steps=steps)
        started = time.perf_counter()
        handle = await runtime.run(task)
        outcome = await handle.result()
        seconds = time.perf_counter() - started
        if outcome.steps != steps:
            raise RuntimeError(f"expected {steps} steps, the task took {outcome.steps}")
        sampler.cancel()
        runs = await chain_runs(bench, handle.id)
        last_seq = (await handle.state()).last_seq
        for row in long_run_rows(steps, seconds, runs, rss):
            say(f"{row.figure}: {row.value} ({row.versus})")
        say(f"long run: {len(runs)} runs, {last_seq + 1} events; reading pages")
        pages = await page_seconds(settings, runtime, handle.id, last_seq)
        worker.kill()
        pages.update(
            await handle_page_seconds(settings, runtime, handle.id, last_seq, " (no worker)")
        )
        biggest = max(runs, key=lambda run: run.history_bytes)
        replay = await replay_seconds(bench, handle.id, biggest)
    finally:
        sampler.cancel()
        worker.kill()
    return [
        *long_run_rows(steps, seconds, runs, rss),
        *page_rows(steps, last_seq, pages),
        Row(
            f"replay of the {steps}-step task's largest run, in-process",
            f"{replay * 1000:.0f} ms",
            f"{biggest.steps} steps, {biggest.history_bytes / 1e6:.2f} MB: what a worker "
            "spends on each query of that closed run when it is not archived",
        ),
    ]


def long_run_rows(
    steps: int, seconds: float, runs: list[RunFigures], rss: list[float]
) -> list[Row]:
    first, last = runs[0], runs[-1]

    def per_step(run: RunFigures) -> str:
        return (
            f"{run.seconds / run.steps * 1000:.0f} ms/step, "
            f"{run.history_bytes / run.steps / 1000:.1f} KB/step ({run.steps} steps)"
        )

    biggest = max(runs, key=lambda run: run.history_bytes)
    return [
        Row(
            f"{steps}-step default task ({MESSAGE_BYTES} B messages): ms/step overall",
            f"{seconds / steps * 1000:.0f}",
            f"first run {per_step(first)}; last run {per_step(last)}",
        ),
        Row(
            f"{steps}-step default task: runs (continue-as-new), largest run history",
            f"{len(runs)} runs, largest {biggest.history_bytes / 1e6:.2f} MB",
            f"{sum(r.history_bytes for r in runs) / 1e6:.1f} MB in all",
        ),
        Row(
            f"{steps}-step default task: worker RSS",
            f"{rss[-1]:.0f} MB at the end",
            f"{rss[0]:.0f} MB at the start, at most {max(rss):.0f} MB",
        ),
    ]


def page_rows(steps: int, last_seq: int, pages: dict[str, tuple[str, str]]) -> list[Row]:
    return [
        Row(
            f"{PAGE}-event page of the {steps}-step task's log ({last_seq + 1} events): {name}",
            f"{first} first read",
            f"{again} read again",
        )
        for name, (first, again) in pages.items()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    steps = parser.parse_args().steps
    run_alone(lambda bench: measure(bench, steps))
