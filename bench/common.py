"""What every benchmark shares: the dev server, the fake endpoint, settings, the table."""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from bench.instant_model import INSTANT_MODEL, InstantModel, instant_task_text
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI
from waystation.testing.servers import start_dev_env
from waystation.testing.settings import isolated_settings
from waystation.worker import build_worker
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def say(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure, its value, and what it compares with."""

    figure: str
    value: str
    versus: str = ""


@dataclass
class Bench:
    """A dev server, a fake OpenAI endpoint and scratch space for one benchmark run."""

    env: WorkflowEnvironment
    fake: FakeOpenAI
    scratch: Path

    @property
    def client(self) -> Client:
        return self.env.client

    @property
    def address(self) -> str:
        return self.env.client.service_client.config.target_host

    def settings(self, name: str) -> Settings:
        return isolated_settings(self.scratch, self.fake.url, name=name)

    def worker(self, settings: Settings) -> Worker:
        """An in-process agent worker that also serves the instant model."""
        return build_worker(self.client, settings, backends={INSTANT_MODEL: InstantModel()})


def instant_task(steps: int, size: int = 16, **fields: object) -> AgentTask:
    """A task the instant model runs for `steps` steps, calling the calculator (no approval)."""
    return AgentTask(
        task=instant_task_text(steps, size),
        model=ModelSettings(name=INSTANT_MODEL),
        max_steps=steps + 1,
        approval=ApprovalSettings(policy={"calculator": "never"}),
        **fields,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def bench_environment() -> AsyncIterator[Bench]:
    say("starting the Temporal dev server and a fake OpenAI endpoint ...")
    fake = FakeOpenAI()
    # Errors only: the peers' long tasks log a warning per event past 10 MB of history.
    env = await start_dev_env(log_level="error")
    try:
        with TemporaryDirectory() as scratch:
            async with env:
                yield Bench(env=env, fake=fake, scratch=Path(scratch))
    finally:
        fake.close()


def print_table(rows: list[Row]) -> None:
    print("\n| figure | value | versus |\n|---|---|---|")
    for row in rows:
        print(f"| {row.figure} | {row.value} | {row.versus} |")


Measure = Callable[[Bench], Awaitable[list[Row]]]


def run_alone(measure: Measure) -> None:
    """`python -m bench.<name>`: one benchmark on its own server, with its table."""

    async def main() -> None:
        async with bench_environment() as bench:
            rows = await measure(bench)
        print_table(rows)

    asyncio.run(main())
