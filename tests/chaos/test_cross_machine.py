"""Exactly-once across machines: worker processes with separate data directories (three
machines) share one PostgreSQL storage and one workspace. The worker that holds a running
shell command is SIGKILLed, then the worker whose retry took the call over, while ten tasks
append lines through `write_file` and `run_shell`; PostgreSQL itself is restarted under
running tool calls. Every line must be written exactly once, every task must end done, and
every history must replay.

Kills are chosen by construction, never by the clock: a command signals that it runs (a
file in the workspace) and waits on a gate the test opens; the ledger row of the call names
the attempt that holds it (`<host>/<pid>/<random>`), so the victim is the worker that holds
the call at that moment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.chaos.workload import replay_all
from tests.helpers import agent_task
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.postgres import PostgresServer
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import ApprovalSettings

TASKS = 10
DOUBLE_KILLS = 5  # tasks 0..4: the holder and then the retry's holder die; 5..9: the holder
MACHINES = 3


def gated_command(index: int) -> str:
    """Appends its line, says it runs, and waits for the test to open its gate."""
    return (
        f"echo task{index}-b >> scratch/lines-{index}.txt; touch scratch/running-{index}; "
        f"while [ ! -e scratch/go-{index} ]; do sleep 0.05; done"
    )


def appending_model(fake: FakeOpenAI, index: int) -> str:
    """Append a line, run the gated command, append another line, answer."""
    words = " ".join(f"w{n}" for n in range(8))
    path = f"scratch/lines-{index}.txt"

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        slow = {"chunk_delay": 0.02}
        if done == 0:
            line = {"path": path, "content": f"task{index}-a\n", "append": True}
            return tools(("write_file", line), content=words, **slow)
        if done == 1:
            shell = {"command": gated_command(index), "timeout_seconds": 300}
            return tools(("run_shell", shell), content=words, **slow)
        if done == 2:
            line = {"path": path, "content": f"task{index}-c\n", "append": True}
            return tools(("write_file", line), content=words, **slow)
        return text(f"task {index} finished", **slow)

    return fake.script(reply)


def lines_of(workspace: Path, index: int) -> list[str]:
    path = workspace / "scratch" / f"lines-{index}.txt"
    return path.read_text().splitlines() if path.exists() else []


# Bounds for a machine whose two cores are busy with other work too; reached only on failure.
PATIENCE_SECONDS = 600


async def until(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(PATIENCE_SECONDS):
            while not condition():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what}") from None


class Machines:
    """Worker processes, each with a data directory of its own: separate machines that share
    the database and the workspace. A killed one is replaced by a new machine."""

    def __init__(self, address: str, base: Settings, url: str) -> None:
        self.address = address
        self.base = base
        self.url = url
        self.workers: dict[int, WorkerProcess] = {}
        self.started = 0
        self.kills = 0
        self.replacements: list[asyncio.Task[WorkerProcess]] = []

    def spawn(self) -> WorkerProcess:
        self.started += 1
        settings = Settings.model_validate(
            {
                **self.base.model_dump(),
                "data_dir": self.base.data_dir.parent / f"machine-{self.started}",
                "database_url": self.url,
            }
        )
        worker = WorkerProcess(self.address, settings)
        self.workers[worker.pid] = worker
        return worker

    def alive(self, pid: int) -> bool:
        worker = self.workers.get(pid)
        return worker is not None and worker.process.poll() is None

    def kill(self, pid: int) -> None:
        """SIGKILL the worker `pid` and start a new machine in its place."""
        self.workers[pid].kill()
        self.kills += 1
        self.replacements.append(asyncio.create_task(self.spawn().ready()))

    def stop_all(self) -> None:
        for worker in self.workers.values():
            worker.kill()
        scratch = self.base.workspace_dir / "scratch"
        for index in range(TASKS):  # a failed run leaves no command waiting at its gate
            if scratch.is_dir():
                (scratch / f"go-{index}").touch()


async def holder_of(conn: psycopg.AsyncConnection[Any], task_id: str) -> int | None:
    """The pid of the worker whose attempt holds the task's shell call (None: none yet)."""
    cursor = await conn.execute(
        "SELECT owner FROM ledger WHERE tool = 'run_shell' AND state = 'started' AND key LIKE %s",
        (f"{task_id}/%",),
    )
    row = await cursor.fetchone()
    return int(row[0].split("/")[1]) if row else None


def went_on_without_its_command(workspace: Path, index: int) -> bool:
    """Task `index` wrote its last line while its command still waits at the gate: the
    shell call came back to the model as lost."""
    if f"task{index}-c" in lines_of(workspace, index):
        raise AssertionError(
            f"task {index} went on while its command waited at the gate: its shell call "
            "came back as lost"
        )
    return False


async def haunt(
    machines: Machines, conn: psycopg.AsyncConnection[Any], workspace: Path, index: int
) -> None:
    """Kill the worker holding task `index`'s running command, `rounds` times, each time
    the one whose attempt holds it now; then open the command's gate."""
    scratch = workspace / "scratch"
    running = scratch / f"running-{index}"
    await until(
        lambda: running.exists() or went_on_without_its_command(workspace, index),
        f"task {index}'s command to run",
    )
    rounds = 2 if index < DOUBLE_KILLS else 1
    victims: set[int] = set()
    for _ in range(rounds + 1):
        pid = None
        async with asyncio.timeout(PATIENCE_SECONDS):
            while pid is None:
                held_by = await holder_of(conn, f"xm-{index}")
                if held_by is not None and held_by not in victims and machines.alive(held_by):
                    pid = held_by
                elif not went_on_without_its_command(workspace, index):
                    await asyncio.sleep(0.05)
        if len(victims) == rounds:
            break  # a live attempt holds the call again: let the command finish
        victims.add(pid)
        machines.kill(pid)
    (scratch / f"go-{index}").touch()


@pytest.fixture
def machines(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> Iterator[Machines]:
    address = dev_env.client.service_client.config.target_host
    fleet = Machines(address, settings, postgres.create_database())
    yield fleet
    fleet.stop_all()


def appending_task(fake: FakeOpenAI, index: int) -> Any:
    model = appending_model(fake, index)
    return agent_task(model, approval=ApprovalSettings(policy={"run_shell": "never"}))


@pytest.mark.long(minutes=1.6)
@pytest.mark.timeout(3 * PATIENCE_SECONDS)
async def test_three_machines_killed_while_they_hold_tool_calls_write_every_line_once(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, machines: Machines
) -> None:
    began = time.monotonic()
    await asyncio.gather(*(machines.spawn().ready() for _ in range(MACHINES)))
    runtime = AgentRuntime(dev_env.client, settings)
    handles: list[TaskHandle] = [
        await runtime.run(appending_task(fake_openai, i), task_id=f"xm-{i}") for i in range(TASKS)
    ]
    async with (
        await psycopg.AsyncConnection.connect(machines.url, autocommit=True) as conn,
        asyncio.TaskGroup() as haunts,  # one fails: the others stop killing at once
    ):
        for i in range(TASKS):
            haunts.create_task(haunt(machines, conn, settings.workspace_dir, i))
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(h.result() for h in handles)), PATIENCE_SECONDS
    )
    await asyncio.gather(*machines.replacements)
    assert [o.result for o in outcomes] == [f"task {i} finished" for i in range(TASKS)]
    written = [lines_of(settings.workspace_dir, i) for i in range(TASKS)]
    duplicates = sum(len(lines) - len(set(lines)) for lines in written)
    for i, lines in enumerate(written):
        assert lines == [f"task{i}-a", f"task{i}-b", f"task{i}-c"], f"task {i}: {lines}"
    await replay_all(dev_env.client, handles)
    seconds = time.monotonic() - began
    print(
        f"\ncross-machine chaos: {TASKS} tasks, {machines.started} machines, {machines.kills} "
        f"SIGKILLs of workers holding a running tool call, {sum(map(len, written))} lines, "
        f"{duplicates} duplicates, {seconds:.1f} s"
    )
    assert machines.kills == TASKS + DOUBLE_KILLS  # every round killed a live holder


@pytest.mark.long(minutes=0.4)
@pytest.mark.timeout(2 * PATIENCE_SECONDS)
async def test_postgresql_restarted_under_running_tool_calls_loses_and_repeats_nothing(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    database = PostgresServer()
    database.start()
    address = dev_env.client.service_client.config.target_host
    fleet = Machines(address, settings, database.create_database())
    try:
        await asyncio.gather(*(fleet.spawn().ready() for _ in range(2)))
        runtime = AgentRuntime(dev_env.client, settings)
        indices = range(3)
        handles = [
            await runtime.run(appending_task(fake_openai, i), task_id=f"pg-restart-{i}")
            for i in indices
        ]
        scratch = settings.workspace_dir / "scratch"
        for i in indices:
            await until((scratch / f"running-{i}").exists, f"task {i}'s command to run")
        database.stop("immediate")  # like a crash, with three shell calls in flight
        for i in indices:
            (scratch / f"go-{i}").touch()  # the commands end while the database is down

        def waiting_for_storage() -> bool:
            logs = [w.log.read_text(errors="replace") for w in fleet.workers.values()]
            return any("waiting for storage" in log for log in logs)

        await until(waiting_for_storage, "a tool call to wait for the database")
        database.start()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in handles)), PATIENCE_SECONDS
        )
        assert [o.result for o in outcomes] == [f"task {i} finished" for i in indices]
        for i in indices:
            assert lines_of(settings.workspace_dir, i) == [f"task{i}-a", f"task{i}-b", f"task{i}-c"]
        await replay_all(dev_env.client, handles)
    finally:
        fleet.stop_all()
        database.destroy()
