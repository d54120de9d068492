"""The chaos suite: crash anywhere, lose nothing, do nothing twice.

Real worker subprocesses are SIGKILLed at random moments while tasks stream from the
model, run tools, sit between steps and wait for approval; the Temporal dev server is
stopped and restarted on its SQLite file; the model fails 30% of its calls. Every task
must end done with the result of an uninterrupted run, every side effect exactly once,
and every history must replay.
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from runtime.agent_runtime import AgentRuntime, TaskHandle
from runtime.settings import Settings
from runtime.temporal import (
    DEV_SERVER_TUNING,
    connect_when_serving,
    ensure_search_attributes,
    search_attribute_flags,
    temporal_binary,
)
from testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from testing.workers import WorkerProcess, running_worker
from tests.helpers import agent_task
from workflows.agent import AgentWorkflow
from workflows.models import ApprovalSettings, Decision

TASKS = 10
APPROVAL_TASKS = 3  # their shell step waits for a person
KILLS = 12


def chaos_model(fake: FakeOpenAI, index: int, *, flaky: random.Random | None = None) -> str:
    """Four steps, each a function of the conversation alone (retries see the same)."""
    words = " ".join(f"w{n}" for n in range(12))

    def reply(body: dict[str, Any]) -> Reply:
        if flaky is not None and flaky.random() < 0.3:
            return error(500, "flaky upstream")
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        slow = {"chunk_delay": 0.03}
        if done == 0:
            line = {
                "path": f"scratch/effects-{index}.txt",
                "content": f"task{index}-a\n",
                "append": True,
            }
            return tools(("write_file", line), content=words, **slow)
        if done == 1:
            command = f"sleep 0.3; echo task{index}-b >> scratch/effects-{index}.txt"
            return tools(("run_shell", {"command": command}), content=words, **slow)
        if done == 2:
            return tools(("calculator", {"expression": f"{index} * 7"}), content=words, **slow)
        product = body["messages"][-1]["content"]
        return text(f"task {index} finished: {product}", **slow)

    return fake.script(reply)


def expected_result(index: int) -> str:
    return f"task {index} finished: {index * 7}"


def chaos_task(model: str, index: int) -> Any:
    policy = {"run_shell": "always" if index < APPROVAL_TASKS else "never"}
    return agent_task(model, approval=ApprovalSettings(policy=policy))


def effects(settings: Settings, index: int) -> list[str]:
    path = settings.workspace_dir / "scratch" / f"effects-{index}.txt"
    return path.read_text().splitlines() if path.exists() else []


async def replay_all(client: Client, handles: list[TaskHandle]) -> None:
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter)
    for handle in handles:
        async for history in client.list_workflows(f'WorkflowId="{handle.id}"').map_histories():
            result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            assert result.replay_failure is None, f"{handle.id}: {result.replay_failure}"


async def approve_blindly(client: Client, task_ids: list[str], rng: random.Random) -> None:
    """Signals need no worker: decide at random moments, maybe before the request exists."""
    for task_id in task_ids:
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        await client.get_workflow_handle(task_id).signal(
            "approve", Decision(request_id="2-call_2_0", approver="chaos")
        )


async def test_sigkilled_workers_lose_nothing_and_repeat_nothing(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    rng = random.Random(4242)
    address = dev_env.client.service_client.config.target_host
    runtime = AgentRuntime(dev_env.client, settings)
    workers = [await WorkerProcess(address, settings).ready() for _ in range(2)]
    handles = [
        await runtime.run(chaos_task(chaos_model(fake_openai, i), i), task_id=f"chaos-{i}")
        for i in range(TASKS)
    ]
    approver = asyncio.create_task(
        approve_blindly(dev_env.client, [h.id for h in handles[:APPROVAL_TASKS]], rng)
    )
    results = asyncio.gather(*(h.result() for h in handles))
    kills = 0
    try:
        while kills < KILLS and not results.done():
            await asyncio.sleep(rng.uniform(0.2, 1.2))
            victim = workers.pop(rng.randrange(len(workers)))
            victim.kill()
            kills += 1
            workers.append(await WorkerProcess(address, settings).ready())
        outcomes = await asyncio.wait_for(results, 180)
        await approver
        assert [o.result for o in outcomes] == [expected_result(i) for i in range(TASKS)]
        duplicates = 0
        for i in range(TASKS):
            lines = effects(settings, i)
            duplicates += len(lines) - len(set(lines))
            assert lines == [f"task{i}-a", f"task{i}-b"], f"task {i}: {lines}"
        await replay_all(dev_env.client, handles)
    finally:
        for worker in workers:
            worker.kill()
    print(f"\nchaos: {TASKS} tasks, {kills} SIGKILLs, {duplicates} duplicate side effects")
    assert kills >= 5, "the tasks finished before enough kills: the suite proved little"


async def test_the_flaky_agent_ends_like_a_clean_run(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    flaky = random.Random(30)
    shaky_settings = settings.model_copy(
        update={"task_queue": settings.task_queue + "-flaky", "workspace": tmp_path / "flaky-ws"}
    )
    indices = (7, 8, 9)
    logs: dict[str, list[list[Any]]] = {}
    for name, run_settings, rng in (("clean", settings, None), ("flaky", shaky_settings, flaky)):
        runtime = AgentRuntime(dev_env.client, run_settings)
        async with running_worker(dev_env.client, run_settings):
            handles = [
                await runtime.run(
                    chaos_task(chaos_model(fake_openai, i, flaky=rng), i), task_id=f"{name}-{i}"
                )
                for i in indices
            ]
            await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
            logs[name] = [await h.events() for h in handles]

    def final_state(events: list[Any]) -> list[tuple[Any, ...]]:
        """What the run amounts to: every thought, call, observation and the answer."""
        shape: list[tuple[Any, ...]] = []
        for e in events:
            if e.type == "thought":
                shape.append((e.type, e.content, [(c.tool, c.arguments) for c in e.tool_calls]))
            elif e.type == "observation":
                shape.append((e.type, e.tool, e.output, e.is_error))
            elif e.type in ("done", "failed"):
                shape.append((e.type, getattr(e, "result", None)))
        return shape

    clean_events, flaky_events = logs["clean"], logs["flaky"]
    for clean, shaky in zip(clean_events, flaky_events, strict=True):
        assert final_state(shaky) == final_state(clean)
    for i in indices:
        assert effects(shaky_settings, i) == effects(settings, i) == [f"task{i}-a", f"task{i}-b"]
    retried = [
        e for events in flaky_events for e in events if e.type == "thought" and e.attempt > 1
    ]
    assert retried, "no LLM call failed: the flaky model did not bite"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnDevServer:
    """A dev server on an SQLite file, which this test may stop and start again."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                temporal_binary(),
                "server",
                "start-dev",
                "--headless",
                "--db-filename",
                str(self.database),
                "--port",
                str(self.port),
                "--ip",
                "127.0.0.1",
                "--log-level",
                "error",
                *DEV_SERVER_TUNING,
                *search_attribute_flags(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("dev server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[OwnDevServer]:
    server = OwnDevServer(tmp_path / "temporal.db")
    server.start()
    yield server
    server.stop()


async def test_dev_server_restart_mid_run(
    own_server: OwnDevServer, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    client = await connect_when_serving(
        target_host=f"127.0.0.1:{own_server.port}", data_converter=pydantic_data_converter
    )
    await ensure_search_attributes(client)
    runtime = AgentRuntime(client, settings)
    address = f"127.0.0.1:{own_server.port}"
    worker = await WorkerProcess(address, settings).ready()
    try:
        handles = [
            await runtime.run(chaos_task(chaos_model(fake_openai, i), i), task_id=f"restart-{i}")
            for i in (300, 301, 302)
        ]
        await asyncio.sleep(1.0)
        own_server.stop()
        await asyncio.sleep(2.0)
        own_server.start()
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        assert [o.result for o in outcomes] == [expected_result(i) for i in (300, 301, 302)]
        for i in (300, 301, 302):
            assert effects(settings, i) == [f"task{i}-a", f"task{i}-b"]
        await replay_all(client, handles)
    finally:
        worker.kill()
