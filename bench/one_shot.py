"""A task never followed up costs what a one-shot task cost before conversations:
`python -m bench.one_shot` (`--tasks 200` for a quick run).

The same workload against two worker processes in one run, on one dev server: this tree's
worker, and the worker of the code at `--baseline-ref` (default 5e55f18, main's last commit
before conversations). The baseline is checked out with `git worktree add --detach` into a
temporary directory outside the repository and gets its own venv there (`pip install` of
that checkout, a minute or two); both are removed at the end. With `--baseline-dir DIR`
the checkout and its venv are made in DIR once and reused by later runs.

Workload: 1,000 tasks of 4 steps (a 2 KB thought and a calculator call a step, then the
answer; the model over HTTP to the fake endpoint), 50 at a time, each answered and never
followed up. Tasks start by the workflow's type name with an input both versions read
(`{"task": {...}}`), so the bench's own client code is the same for both. The two workers
take turns wave by wave (the order flips each wave), so both meet the same machine.
Measured for each: ms of wall time per step (each wave's time over its steps; and the
median task's time over its steps), the worker's RSS once all its tasks answered (and
idle, before the first), and history bytes per task; as ratios of this tree to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.common import Bench, Measure, Row, run_alone, say
from bench.worker_memory import rss_mb
from waystation.client.agent_runtime import WORKFLOW_TASK_TIMEOUT
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import REPO, WorkerProcess
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings
from waystation.workflows.run import WORKFLOW_TYPE, AgentRun

BASELINE_REF = "5e55f18"
TASKS = 1000
STEPS = 4
AT_ONCE = 50
MESSAGE_BYTES = 2048
BYTES_SAMPLE = 20  # tasks of the last wave whose history sizes are read


@dataclass(frozen=True)
class CodeTree:
    """A checkout of waystation and the interpreter of its venv."""

    label: str
    root: Path
    python: Path


@dataclass
class Figures:
    """What one tree's worker did: per wave its seconds, per task its seconds."""

    waves: list[float] = field(default_factory=list)
    tasks: list[float] = field(default_factory=list)
    history_bytes: list[int] = field(default_factory=list)
    idle_rss: float = 0.0
    loaded_rss: float = 0.0


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return done.stdout.strip()


@contextlib.contextmanager
def baseline_checkout(ref: str, keep: Path | None = None) -> Iterator[CodeTree]:
    """The code at `ref` in a worktree outside the repository, with its own venv: made in a
    temporary directory and removed afterwards, or made once in `keep` and reused."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    root = keep or Path(tempfile.mkdtemp(prefix=f"waystation-{commit[:7]}-"))
    if not (root / "worker.py").exists():  # git takes an empty directory
        say(f"baseline: git worktree add --detach {root} {commit[:7]}")
        git("worktree", "add", "--detach", str(root), commit)
    elif git("rev-parse", "HEAD", cwd=root) != commit:
        raise SystemExit(f"{root} holds another commit than {ref}: give another --baseline-dir")
    python = root / ".venv" / "bin" / "python"
    installed = root / ".venv" / ".installed"
    try:
        if not installed.exists():
            say(f"baseline: a venv in {root / '.venv'} (pip install of the checkout)")
            subprocess.run([sys.executable, "-m", "venv", str(root / ".venv")], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, str(root)], check=True)
            installed.touch()
        label = ref if commit.startswith(ref) else f"{ref} ({commit[:7]})"
        yield CodeTree(label, root, python)
    finally:
        if keep is None:
            git("worktree", "remove", "--force", str(root))


def this_tree() -> CodeTree:
    return CodeTree("this tree", REPO, Path(sys.executable))


def counting_model(fake: FakeOpenAI, steps: int) -> str:
    """A 2 KB thought and a calculator call a step, the answer at the last."""

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(m["role"] == "tool" for m in body["messages"])
        if done >= steps - 1:
            return text(f"done after {done + 1} steps")
        return tools(("calculator", {"expression": f"{done} + 1"}), content="x" * MESSAGE_BYTES)

    return fake.script(reply, record=False)


def run_input(task: AgentTask) -> dict[str, Any]:
    """The workflow input as every version reads it: only fields they share, defaults left
    out (each refuses a field it does not know)."""
    return AgentRun(task=task).model_dump(mode="json", exclude_defaults=True)


def task_input(model: str, steps: int) -> dict[str, Any]:
    return run_input(
        AgentTask(
            task=f"count to {steps}",
            model=ModelSettings(name=model),
            max_steps=steps + 1,
            approval=ApprovalSettings(policy={"calculator": "never"}),
        )
    )


async def run_by_type(
    client: Client, task_id: str, queue: str, payload: dict[str, Any], steps: int
) -> None:
    """Run a task by the workflow's type name, started as AgentRuntime.run starts one (its
    workflow-task timeout, its summary), and check it took `steps` steps."""
    handle = await client.start_workflow(
        WORKFLOW_TYPE,
        payload,
        id=task_id,
        task_queue=queue,
        result_type=dict,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        static_summary=str(payload["task"]["task"]),
    )
    outcome = await handle.result()
    if outcome.get("steps") != steps:
        raise RuntimeError(f"{task_id} took {outcome.get('steps')} steps, not {steps}")


async def one_task(bench: Bench, queue: str, payload: dict[str, Any], steps: int) -> str:
    task_id = f"one-shot-{uuid.uuid4().hex[:12]}"
    await run_by_type(bench.client, task_id, queue, payload, steps)
    return task_id


async def wave(
    bench: Bench, queue: str, payload: dict[str, Any], steps: int, size: int, figures: Figures
) -> list[str]:
    started = time.perf_counter()

    async def timed() -> str:
        begun = time.perf_counter()
        task_id = await one_task(bench, queue, payload, steps)
        figures.tasks.append(time.perf_counter() - begun)
        return task_id

    ids = await asyncio.gather(*(timed() for _ in range(size)))
    figures.waves.append(time.perf_counter() - started)
    return list(ids)


async def history_bytes(bench: Bench, task_ids: list[str]) -> list[int]:
    return [
        (await bench.client.get_workflow_handle(i).describe()).raw_info.history_size_bytes
        for i in task_ids
    ]


async def measure(
    bench: Bench,
    baseline: CodeTree,
    tasks: int = TASKS,
    steps: int = STEPS,
    at_once: int = AT_ONCE,
) -> list[Row]:
    trees = [baseline, this_tree()]
    model = counting_model(bench.fake, steps)
    figures = {tree.label: Figures() for tree in trees}
    workers: dict[str, tuple[str, WorkerProcess]] = {}
    try:
        for tree in trees:
            settings = bench.settings("one-shot")
            process = WorkerProcess(bench.address, settings, root=tree.root, python=tree.python)
            workers[tree.label] = (settings.task_queue, await process.ready())
        await asyncio.sleep(2.0)  # imports done, connections open: the idle figure
        for tree in trees:
            figures[tree.label].idle_rss = rss_mb(workers[tree.label][1].pid)
        payload = task_input(model, steps)
        waves = -(-tasks // at_once)
        last: dict[str, list[str]] = {}
        for number in range(waves):
            size = min(at_once, tasks - number * at_once)
            order = trees if number % 2 == 0 else trees[::-1]
            for tree in order:
                queue = workers[tree.label][0]
                last[tree.label] = await wave(
                    bench, queue, payload, steps, size, figures[tree.label]
                )
            say(
                f"one-shot: wave {number + 1}/{waves}, "
                + ", ".join(f"{t.label} {figures[t.label].waves[-1]:.1f} s" for t in trees)
            )
        await asyncio.sleep(2.0)  # the last workflow tasks finish; caches let closed runs go
        for tree in trees:
            figures[tree.label].loaded_rss = rss_mb(workers[tree.label][1].pid)
            sample = last[tree.label][:BYTES_SAMPLE]
            figures[tree.label].history_bytes = await history_bytes(bench, sample)
    finally:
        for _, process in workers.values():
            process.kill()
    return one_shot_rows(
        tasks, steps, at_once, figures[trees[1].label], figures[baseline.label], baseline.label
    )


def one_shot_rows(
    tasks: int, steps: int, at_once: int, ours: Figures, theirs: Figures, label: str
) -> list[Row]:
    def per_step(f: Figures) -> float:
        return sum(f.waves) / (tasks * steps) * 1000

    def task_step(f: Figures) -> float:
        return statistics.median(f.tasks) / steps * 1000

    def kb(f: Figures) -> float:
        return statistics.median(f.history_bytes) / 1000

    name = f"{tasks} one-shot {steps}-step tasks, {at_once} at once, never followed up"
    return [
        Row(
            f"{name}: ms of wall time per step, this tree / {label}",
            f"{per_step(ours):.1f} / {per_step(theirs):.1f} "
            f"({per_step(ours) / per_step(theirs):.2f}x)",
            f"median task {task_step(ours):.0f} / {task_step(theirs):.0f} ms a step "
            f"({task_step(ours) / task_step(theirs):.2f}x)",
        ),
        Row(
            f"{name}: worker RSS once all answered, this tree / {label}",
            f"{ours.loaded_rss:.0f} / {theirs.loaded_rss:.0f} MB "
            f"({ours.loaded_rss / theirs.loaded_rss:.2f}x)",
            f"idle {ours.idle_rss:.0f} / {theirs.idle_rss:.0f} MB",
        ),
        Row(
            f"{name}: history bytes per task, this tree / {label}",
            f"{kb(ours):.1f} / {kb(theirs):.1f} KB ({kb(ours) / kb(theirs):.2f}x)",
            f"median of {len(ours.history_bytes)} tasks each",
        ),
    ]


def with_baseline(ref: str, keep: Path | None, tasks: int = TASKS) -> Measure:
    """The benchmark as `python -m bench` runs it: the baseline checked out around it."""

    async def run(bench: Bench) -> list[Row]:
        with baseline_checkout(ref, keep) as baseline:
            return await measure(bench, baseline, tasks)

    return run


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="the code to compare with")
    parser.add_argument(
        "--baseline-dir", type=Path, default=None, help="keep its checkout and venv here"
    )
    parser.add_argument("--tasks", type=int, default=TASKS)
    args = parser.parse_args()
    # Checked out (and installed) before the dev server starts, so pip waits for nobody.
    with baseline_checkout(args.baseline_ref, args.baseline_dir) as tree:
        run_alone(lambda bench: measure(bench, tree, args.tasks))
