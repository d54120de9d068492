"""The chaos workload: tasks of four steps with side effects, the gates that let a test
kill a worker at a moment it can prove (a model stream held open, a tool mid-run), and the
crew of worker processes it kills."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.helpers import agent_task
from waystation.client.agent_runtime import TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentTask, ApprovalSettings

WORDS = " ".join(f"w{n}" for n in range(12))


class Crew:
    """The worker processes serving a test's task queue, each caching at most
    `cached_tasks` tasks; kills are counted."""

    def __init__(self, address: str, settings: Settings, size: int, cached_tasks: int) -> None:
        self.address = address
        self.settings = settings
        self.size = size
        self.cached_tasks = cached_tasks
        self.workers: list[WorkerProcess] = []
        self.kills: list[str] = []

    def _spawn(self) -> WorkerProcess:
        extra = {"WAYSTATION_WORKER_CACHED_TASKS": str(self.cached_tasks)}
        return WorkerProcess(self.address, self.settings, extra_env=extra)

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def start(self) -> None:
        self.workers = [self._spawn() for _ in range(self.size)]
        await asyncio.gather(*(w.ready() for w in self.workers))

    async def kill(
        self, pid: int | None, moment: str, then: Callable[[], object] | None = None
    ) -> None:
        """SIGKILL the worker with this pid (or the oldest), do `then` (say, open the gate
        the dead worker was held at), and bring the crew back."""
        victim = next((w for w in self.workers if w.pid == pid), self.workers[0])
        self.workers.remove(victim)
        victim.kill()
        self.kills.append(moment)
        if then is not None:
            then()
        replacement = self._spawn()
        self.workers.append(replacement)
        await replacement.ready()

    async def kill_all(self, moment: str, then: Callable[[], object] | None = None) -> None:
        """SIGKILL every worker at once (no task keeps a cached run), then start as many."""
        for worker in self.workers:
            worker.kill()
        self.kills.append(moment)
        if then is not None:
            then()
        await self.start()

    def stop(self) -> None:
        for worker in self.workers:
            worker.kill()


class Gates:
    """What a test holds shut: a model stream per task, a shell command per task."""

    def __init__(self, workspace: Path) -> None:
        self.streams: dict[int, threading.Event] = {}
        self.tools: set[int] = set()
        self.workspace = workspace

    def hold_stream(self, index: int) -> threading.Event:
        self.streams[index] = threading.Event()
        return self.streams[index]

    def hold_tool(self, index: int) -> None:
        self.tools.add(index)

    def tool_pid_file(self, index: int) -> Path:
        return self.workspace / "scratch" / f"worker-of-{index}"

    def release_tool(self, index: int) -> None:
        (self.workspace / "scratch" / f"release-{index}").touch()

    def release_all(self) -> None:
        for gate in self.streams.values():
            gate.set()
        for index in self.tools:
            self.release_tool(index)


def shell_command(index: int, gates: Gates | None) -> str:
    line = f"echo task{index}-b >> scratch/effects-{index}.txt"
    if gates is None or index not in gates.tools:
        return f"sleep 0.3; {line}"
    # The command's parent is the wrapper the worker started: its parent is the worker.
    pid_file = gates.tool_pid_file(index).name
    wait = f"while [ ! -e scratch/release-{index} ]; do sleep 0.05; done"
    return f"cut -d' ' -f4 /proc/$PPID/stat > scratch/{pid_file}; {wait}; {line}"


SLOW_STREAM: dict[str, Any] = {"chunk_delay": 0.03}


def side_effect_step(index: int, done: int, gates: Gates | None) -> Reply | None:
    """The reply of a chaos task's first two steps, after `done` tool results: an append
    through the ledger (write_file), then one by a shell command; None after those."""
    if done == 0:
        slow = SLOW_STREAM
        if gates is not None and index in gates.streams:
            slow = {"hold_after_chunks": 5, "gate": gates.streams[index]}
        line = {
            "path": f"scratch/effects-{index}.txt",
            "content": f"task{index}-a\n",
            "append": True,
        }
        return tools(("write_file", line), content=WORDS, **slow)
    if done == 1:
        command = shell_command(index, gates)
        return tools(("run_shell", {"command": command}), content=WORDS, **SLOW_STREAM)
    return None


def chaos_model(
    fake: FakeOpenAI, index: int, *, gates: Gates | None = None, flaky: Any = None
) -> str:
    """Four steps, each a function of the conversation alone (retries see the same)."""

    def reply(body: dict[str, Any]) -> Reply:
        if flaky is not None and flaky.random() < 0.3:
            return error(500, "flaky upstream")
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if (effect := side_effect_step(index, done, gates)) is not None:
            return effect
        slow = SLOW_STREAM
        if done == 2:
            return tools(("calculator", {"expression": f"{index} * 7"}), content=WORDS, **slow)
        product = body["messages"][-1]["content"]
        return text(f"task {index} finished: {product}", **slow)

    return fake.script(reply)


def expected_result(index: int) -> str:
    return f"task {index} finished: {index * 7}"


def chaos_task(model: str, index: int, *, asks: bool) -> AgentTask:
    policy = {"run_shell": "always" if asks else "never"}
    return agent_task(model, approval=ApprovalSettings(policy=policy))


def effects(settings: Settings, index: int) -> list[str]:
    path = settings.workspace_dir / "scratch" / f"effects-{index}.txt"
    return path.read_text().splitlines() if path.exists() else []


async def replay_all(client: Client, handles: list[TaskHandle]) -> int:
    """Replay every run of every task; returns how many histories replayed."""
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter)
    replayed = 0
    for handle in handles:
        async for history in client.list_workflows(f'WorkflowId="{handle.id}"').map_histories():
            result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            assert result.replay_failure is None, f"{handle.id}: {result.replay_failure}"
            replayed += 1
    return replayed


async def until_file(path: Path, within: float = 60.0) -> str:
    """The content of `path` once it exists and is not empty (bounded)."""
    async with asyncio.timeout(within):
        while not (path.exists() and path.read_text().strip()):
            await asyncio.sleep(0.05)
    return path.read_text().strip()
