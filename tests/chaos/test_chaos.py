"""The chaos suite: crash anywhere, lose nothing, do nothing twice, never get stuck.

Real worker subprocesses are SIGKILLed at moments the test proves: inside a model stream
(the fake server holds it open), inside a tool (the command waits for the test), while a
task waits for a person, right after a person decided, between steps. People decide the
way they do (as soon as a `state` query shows a request) and by blind Signals sent before
the request exists, while the workers cache fewer tasks than run. The Temporal dev server
is stopped and restarted on its SQLite file; the model fails 30% of its calls. Every task
must end done with the result of an uninterrupted run, every side effect must happen
exactly once, and every history must replay.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.chaos.workload import (
    Crew,
    Gates,
    chaos_model,
    chaos_task,
    effects,
    expected_result,
    replay_all,
    until_file,
)
from tests.helpers import wait_for_state
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.client.pollers import polling_workers
from waystation.client.temporal import (
    DEV_SERVER_TUNING,
    connect_when_serving,
    ensure_search_attributes,
    search_attribute_flags,
    temporal_binary,
)
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI
from waystation.testing.proc import free_port, pid_with_local_port
from waystation.testing.workers import WorkerProcess, running_worker
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import Decision
from waystation.workflows.run import AgentOutcome

TASKS = 10
HELD_STREAM = 0  # its first model answer is held open until a worker dies under it
HELD_TOOL = 1  # its shell command waits until a worker dies under it
ASKING = (0, 1, 2, 3)  # their shell step waits for a person
WATCHED = (0, 1)  # decided by a person as soon as a state query shows the request
KEPT_WAITING = 2  # its request waits while a worker dies, then a person decides
BLIND = 3  # decided by a Signal sent before its request exists
# Fewer than run at once: evicted tasks answer queries cold (see docs/never-stuck.md).
CACHED_TASKS = 3


async def approve_when_shown(handle: TaskHandle) -> None:
    """A person: decides as soon as the state query shows the request."""
    state = await wait_for_state(handle, lambda s: bool(s.pending_approvals), timeout=120)
    await handle.approve(next(iter(state.pending_approvals)), approver=f"watcher of {handle.id}")


@pytest.mark.long(minutes=0.5)
async def test_sigkilled_workers_lose_nothing_repeat_nothing_and_never_get_stuck(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    client = dev_env.client
    runtime = AgentRuntime(client, settings)
    gates = Gates(settings.workspace_dir)
    stream_gate = gates.hold_stream(HELD_STREAM)
    gates.hold_tool(HELD_TOOL)
    crew = Crew(client.service_client.config.target_host, settings, 2, CACHED_TASKS)
    await crew.start()
    models = [chaos_model(fake_openai, i, gates=gates) for i in range(TASKS)]
    handles = [
        await runtime.run(chaos_task(models[i], i, asks=i in ASKING), task_id=f"chaos-{i}")
        for i in range(TASKS)
    ]
    blind: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, handles[BLIND].id
    )
    await blind.signal(AgentWorkflow.approve, Decision(request_id="2-call_2_0", approver="blind"))
    people = [asyncio.create_task(approve_when_shown(handles[i])) for i in WATCHED]
    results = asyncio.gather(*(h.result() for h in handles))

    def pids() -> list[int]:
        return [w.pid for w in crew.workers]

    try:
        # 1. Inside a model stream: the held answer's connection belongs to its worker.
        await fake_openai.until_streaming(models[HELD_STREAM], chunks=5, request=0)
        port = fake_openai.client_ports[models[HELD_STREAM]][0]
        await crew.kill(pid_with_local_port(port, pids()), "inside a model stream")
        stream_gate.set()
        # 2. While a task waits for a person (its request is shown by a query), who then
        # decides at once.
        waiting = handles[KEPT_WAITING]
        await wait_for_state(waiting, lambda s: bool(s.pending_approvals), timeout=120)
        await crew.kill(None, "while a task waits for approval")
        people.append(asyncio.create_task(approve_when_shown(waiting)))
        # 3. Inside a tool: the command wrote which worker runs it, and waits.
        worker_pid = int(await until_file(gates.tool_pid_file(HELD_TOOL), within=120))
        await crew.kill(worker_pid, "inside a tool")
        gates.release_tool(HELD_TOOL)
        # 4. Between steps: a task's first observation is in its log, its next call not yet.
        await wait_for_state(handles[5], lambda s: s.step >= 2, timeout=120)
        await crew.kill(None, "between steps")
        # 5. Right after a person decided.
        await asyncio.wait_for(asyncio.gather(*people), 120)
        await crew.kill(None, "right after a decision")
        # 6. Inside the stream of a late step of some task still running.
        await wait_for_state(handles[9], lambda s: s.step >= 3, timeout=120)
        await crew.kill(None, "late in a task")
        outcomes = await asyncio.wait_for(results, 240)
    finally:
        gates.release_all()
        crew.stop()
    assert [o.result for o in outcomes] == [expected_result(i) for i in range(TASKS)]
    duplicates = 0
    for i in range(TASKS):
        lines = effects(settings, i)
        duplicates += len(lines) - len(set(lines))
        assert lines == [f"task{i}-a", f"task{i}-b"], f"task {i}: {lines}"
    replayed = await replay_all(client, handles)
    print(
        f"\nchaos: {TASKS} tasks, {len(crew.kills)} SIGKILLs ({'; '.join(crew.kills)}), "
        f"{duplicates} duplicate side effects, {replayed} histories replayed"
    )
    assert len(crew.kills) == 6


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
                    chaos_task(chaos_model(fake_openai, i, flaky=rng), i, asks=False),
                    task_id=f"{name}-{i}",
                )
                for i in indices
            ]
            await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
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


START_ATTEMPTS = 3


class OwnDevServer:
    """A dev server on an SQLite file, which this test may stop and start again.

    Started means that its own process answers on the port and is still alive. A port free
    when it was picked can be taken before the server binds it (by another server, or as
    the local end of any connection); so can one of the five other ports the dev server
    picks and binds by itself, after its frontend already listens, and then it exits. Seen
    at load 10: the test's client reached the server before it died, its worker did not.
    A start that fails so is tried again (on a new port, the first time), and the server's
    own output says why.
    """

    def __init__(self, database: Path) -> None:
        self.database = database
        self.log = database.with_suffix(".log")
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, new_port_if_taken: bool = False) -> None:
        for _ in range(START_ATTEMPTS):
            if self._started():
                return
            if new_port_if_taken:
                self.port = free_port()
        raise RuntimeError(f"dev server did not start:\n{self.log.read_text(errors='replace')}")

    def _started(self) -> bool:
        with open(self.log, "ab") as log:
            process = self.process = subprocess.Popen(
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
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if pid_with_local_port(self.port, [process.pid]) == process.pid and self._healthy():
                return process.poll() is None
            time.sleep(0.1)
        self.stop()
        return False

    def _healthy(self) -> bool:
        answer = subprocess.run(
            [temporal_binary(), "operator", "cluster", "health", "--address", self.address],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return "SERVING" in answer.stdout

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


async def until_polled(client: Client, task_queue: str) -> None:
    """Until the server says a worker polls the task queue for workflow tasks."""
    async with asyncio.timeout(60):
        while not await polling_workers(client, task_queue, "workflow"):
            await asyncio.sleep(0.1)


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[OwnDevServer]:
    server = OwnDevServer(tmp_path / "temporal.db")
    server.start(new_port_if_taken=True)
    yield server
    server.stop()


async def test_dev_server_restart_mid_run(
    own_server: OwnDevServer, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    """The server goes down while every task provably has a model stream held open."""
    client = await connect_when_serving(
        target_host=own_server.address, data_converter=pydantic_data_converter
    )
    await ensure_search_attributes(client)
    runtime = AgentRuntime(client, settings)
    worker = await WorkerProcess(own_server.address, settings).ready()
    await until_polled(client, settings.task_queue)  # the server knows the worker: it is up
    indices = (300, 301, 302)
    gates = Gates(settings.workspace_dir)
    held = [gates.hold_stream(i) for i in indices]
    models = {i: chaos_model(fake_openai, i, gates=gates) for i in indices}
    try:
        handles = [
            await runtime.run(chaos_task(models[i], i, asks=False), task_id=f"restart-{i}")
            for i in indices
        ]
        for i in indices:
            await fake_openai.until_streaming(models[i], chunks=5, request=0)
        own_server.stop()
        for gate in held:
            gate.set()  # the streams end while the server is down
        own_server.start()
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 180)
        assert [o.result for o in outcomes] == [expected_result(i) for i in indices]
        for i in indices:
            assert effects(settings, i) == [f"task{i}-a", f"task{i}-b"]
        await replay_all(client, handles)
    finally:
        gates.release_all()
        worker.kill()


async def test_a_worker_started_before_its_server_waits_for_it_and_then_serves(
    tmp_path: Path, settings: Settings
) -> None:
    server = OwnDevServer(tmp_path / "temporal.db")  # its port picked, nothing listens yet
    worker = WorkerProcess(server.address, settings)
    try:
        async with asyncio.timeout(60):
            while "does not answer yet" not in worker.log.read_text():
                assert worker.process.poll() is None, worker.log.read_text()
                await asyncio.sleep(0.05)
        server.start()
        await worker.ready()
        log = worker.log.read_text()
        waited = f"Temporal at {server.address} does not answer yet; waiting up to 60 s for it"
        assert f"{waited} (Connection refused)" in log, log
        assert "Traceback" not in log, log
        client = await connect_when_serving(
            target_host=server.address, data_converter=pydantic_data_converter
        )
        await until_polled(client, settings.task_queue)
    finally:
        worker.kill()
        server.stop()


async def test_a_worker_whose_server_never_answers_gives_up_in_one_line(
    settings: Settings,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    worker = WorkerProcess(address, settings, {"WAYSTATION_WORKER_CONNECT_WAIT_SECONDS": "0.5"})
    try:
        code = await asyncio.to_thread(worker.process.wait, 60)
    finally:
        worker.kill()
    log = worker.log.read_text()
    assert code == 1, log
    gave_up = (
        f"worker cannot start: cannot connect to Temporal at {address} (TEMPORAL_ADDRESS) "
        "(waited 0.5 s): "
    )
    assert f"{gave_up}Connection refused\n" in log, log
    assert "Traceback" not in log, log
