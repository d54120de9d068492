"""A worker process for `bench.many_tasks`: one system's worker, alone in its process, so
its CPU and memory can be read from /proc.

    BENCH_SYSTEM=floor|waystation|pydantic-ai|openai-agents|harness python -m bench.task_worker

The rest comes from the environment as for `worker.py` (TEMPORAL_ADDRESS, WAYSTATION_TASK_QUEUE
and the data directory, OPENAI_BASE_URL for the fake endpoint) and:
- BENCH_REPORT: a file where the worker writes what only it can count (how each model call
  got its conversation; with BENCH_METRICS=1, the SDK's workflow cache counters), each time
  it gets SIGUSR1 and as it stops, with a number that grows with each write;
- BENCH_SCRATCH: where a peer keeps its files.
It says "worker polling" on stderr once it polls (what
waystation.testing.workers.WorkerProcess waits for).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from temporalio.client import Client
from temporalio.runtime import BUFFERED_METRIC_KIND_COUNTER, MetricBuffer, Runtime, TelemetryConfig
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench import peer_workload
from bench.floor import FloorAgent, FloorModel, FloorWaiting, floor_tool
from bench.instant_model import INSTANT_MODEL, InstantModel
from waystation.activities.openai_chat import OpenAIChat
from waystation.activities.payload_codec import data_converter, payload_codec
from waystation.settings import Settings
from waystation.worker import build_worker

PEER_MODULES = {
    "pydantic-ai": "bench.peer_pydantic_ai",
    "openai-agents": "bench.peer_openai_agents",
    "harness": "bench.peer_harness",
}
SYSTEMS = ("floor", "waystation", *PEER_MODULES)
METRICS_DRAINED_EVERY = 1.0


class Report:
    """What the worker counts, written to BENCH_REPORT on request."""

    def __init__(self, path: Path, buffer: MetricBuffer | None) -> None:
        self._path = path
        self._buffer = buffer
        self._writes = 0
        self.counters: Callable[[], dict[str, int]] = dict
        self.metrics: Counter[str] = Counter()

    def drain(self) -> None:
        """Add the SDK's counter updates since the last drain."""
        if self._buffer is None:
            return
        for update in self._buffer.retrieve_updates():
            if update.metric.kind == BUFFERED_METRIC_KIND_COUNTER:
                self.metrics[update.metric.name] += int(update.value)

    def write(self) -> None:
        self.drain()
        self._writes += 1
        body = {"writes": self._writes, "counters": self.counters(), "metrics": self.metrics}
        partial = self._path.with_suffix(".partial")
        partial.write_text(json.dumps(body))
        partial.replace(self._path)

    async def drain_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(METRICS_DRAINED_EVERY)
            self.drain()


def floor_worker(client: Client, queue: str, settings: Settings) -> Worker:
    endpoint = OpenAIChat(settings.api_key, settings.openai_base_url)
    return Worker(
        client,
        task_queue=queue,
        workflows=[FloorAgent, FloorWaiting],
        activities=[FloorModel(endpoint).reply, floor_tool],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def serve(system: str, report: Report, runtime: Runtime) -> None:
    settings = Settings()
    address = os.environ["TEMPORAL_ADDRESS"]
    worker: Worker
    if system == "waystation":
        converter = data_converter(payload_codec(settings))
        client = await Client.connect(address, data_converter=converter, runtime=runtime)
        ours = build_worker(client, settings, backends={INSTANT_MODEL: InstantModel()})
        await ours.prepare()
        report.counters = lambda: {str(k): v for k, v in ours.llm.context_reads.items()}
        worker = ours
    elif system == "floor":
        client = await Client.connect(address, runtime=runtime)
        worker = floor_worker(client, settings.task_queue, settings)
    else:
        setup: peer_workload.PeerSetup = importlib.import_module(PEER_MODULES[system]).SETUP
        peer_workload.point_at(settings.openai_base_url or "")
        client = await setup.connect(address, Path(os.environ["BENCH_SCRATCH"]))
        worker = setup.worker(client, settings.task_queue)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, report.write)
    draining = asyncio.create_task(report.drain_now_and_then())
    async with worker:
        print(f"worker polling ({system})", file=sys.stderr, flush=True)
        await stop.wait()
    draining.cancel()
    report.write()


def main() -> None:
    system = os.environ.get("BENCH_SYSTEM", "")
    if system not in SYSTEMS:
        sys.exit(f"BENCH_SYSTEM must be one of {', '.join(SYSTEMS)}, not {system!r}")
    buffer = MetricBuffer(100_000) if os.environ.get("BENCH_METRICS") == "1" else None
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer)) if buffer else Runtime.default()
    report = Report(Path(os.environ["BENCH_REPORT"]), buffer)
    asyncio.run(serve(system, report, runtime))


if __name__ == "__main__":
    main()
