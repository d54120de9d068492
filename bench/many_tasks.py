"""Many tasks at once, against the floor in the same run: `python -m bench.many_tasks`.

    python -m bench.many_tasks                                   # everything (an hour here)
    python -m bench.many_tasks --parts sweep --tasks 20 --steps 10 --rounds 1 --workers 1
    python -m bench.many_tasks --parts peers --peers-tasks 20
    python -m bench.many_tasks --parts peers --peers-tasks 20 --baseline 5f4714e
    python -m bench.many_tasks --parts start --start-tasks 1000
    python -m bench.many_tasks --parts memory --running 1000 --caches 200 1000

Every system runs in worker processes of its own (`bench.task_worker`), on one dev server,
so the CPU each uses can be read from /proc: the worker processes' and the dev server's,
only in the window from the first task's start to the last task's answer.

Parts:
- sweep: K tasks of N steps started at once, K = 1, 20, 100, 500, on one worker process and
  on two: the floor (bench.floor.FloorAgent: one activity streaming the model's reply, one
  local activity for the calculator, constant-size payloads) and waystation (AgentRuntime,
  default settings but the calculator's approval), both with the instant model in the
  worker (16 bytes of text and one calculator call a step), taking turns round by round;
- peers: the same over HTTP to the fake endpoint (2 KB of text and one calculator call a
  step) for the floor, waystation and each Temporal peer that is installed (`.[bench]`);
  with `--baseline REF`, also the worker of waystation's code at REF (before and after in
  one run; its checkout and venv as bench.one_shot makes them, kept in `--baseline-dir`);
- counts: what one task sends to the server beyond the floor, read from the histories (and
  from the worker, for the `llm_context` queries that no history records), for the sweep's
  tasks and for one 200-step task of 2 KB steps with default settings (context compaction);
- start: 1,000 tasks from `POST /tasks` to their first approval request, against the floor
  starting 1,000 workflows that each run one activity and wait on a signal;
- memory: 1,000 running tasks on one worker, per workflow-cache size: RSS, the SDK's sticky
  cache misses (a miss replays the task's history), steps/s and CPU per step.

Figures, each as a ratio to the floor of the same run: steps/s; median and p95 task latency
(start → answer); worker and server CPU per step; worker RSS (the largest worker process
at the window's end); history events and bytes per step (Temporal's own counts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError

from bench import peers_temporal
from bench.common import Bench, Row, instant_task, median, percentile, run_alone, say
from bench.floor import RELEASE_SIGNAL, FloorAgent, FloorCall, FloorWaiting
from bench.instant_model import INSTANT_MODEL, instant_task_text, parse_task, steps_done
from bench.long_run import http_api
from bench.one_shot import CodeTree, baseline_checkout, run_by_type, run_input
from bench.peer_workload import (
    MESSAGE_BYTES,
    Job,
    PeerSetup,
    ScriptedWorkload,
    answer,
    prompt,
)
from bench.process_figures import cpu_seconds, rss_mb, server_pid
from bench.task_worker import PEER_MODULES
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import Reply, text, tools
from waystation.testing.workers import REPO, WorkerProcess
from waystation.workflows.models import AgentTask, ApprovalSettings, ChatMessage, ModelSettings

INSTANT_BYTES = 16
SAMPLED_HISTORIES = 10  # tasks per round whose whole history is read and counted
REPORT_WITHIN = 60.0
# The start rate's window ends once the worker and the server fall quiet.
QUIET_CPU_SECONDS = 0.03
QUIET_INTERVAL = 0.5
STARTS_IN_FLIGHT = 50


@dataclass(frozen=True)
class Options:
    """What to run (the flags of `python -m bench.many_tasks`)."""

    parts: tuple[str, ...] = ("sweep", "peers", "counts", "start", "memory")
    tasks: tuple[int, ...] = (1, 20, 100, 500)
    steps: int = 20
    workers: tuple[int, ...] = (1, 2)
    rounds: int = 3
    peers_tasks: tuple[int, ...] = (20,)
    count_steps: int = 200
    baseline: str = ""
    baseline_dir: str = ""
    start_tasks: int = 1000
    running: int = 1000
    running_steps: int = 10
    caches: tuple[int, ...] = (200, 1000)


PARTS = Options().parts


@dataclass(frozen=True)
class System:
    """One agent under test: its worker (bench.task_worker's BENCH_SYSTEM) and its model path;
    with `tree`, waystation's worker.py of another checkout (over HTTP, counting nothing)."""

    name: str
    label: str
    http: bool = False
    tree: CodeTree | None = None


FLOOR = System("floor", "floor")
OURS = System("waystation", "waystation")
FLOOR_HTTP = System("floor", "floor", http=True)
OURS_HTTP = System("waystation", "waystation", http=True)
OURS_HTTP_MODEL = "bench-many-waystation"


def installed_peers() -> list[System]:
    by_module = {module: name for name, module in PEER_MODULES.items()}
    return [
        System(by_module[peer.module], peer.label, http=True)
        for peer in peers_temporal.PEERS
        if peer.available()
    ]


# --- worker processes ---------------------------------------------------------------------


class Fleet:
    """A system's worker processes on one task queue, and what they count."""

    def __init__(
        self, bench: Bench, system: System, workers: int, extra_env: dict[str, str] | None = None
    ) -> None:
        self.system = system
        self.settings = bench.settings(f"many-{system.name}")
        self._reports = [
            bench.scratch / f"{self.settings.task_queue}-{n}.json" for n in range(workers)
        ]
        tree = system.tree
        self.processes = [
            WorkerProcess(
                bench.address,
                self.settings,
                extra_env={
                    "BENCH_SYSTEM": system.name,
                    "BENCH_REPORT": str(report),
                    "BENCH_SCRATCH": str(bench.scratch),
                    **(extra_env or {}),
                },
                module=None if tree else "bench.task_worker",
                root=tree.root if tree else REPO,
                python=tree.python if tree else None,
            )
            for report in self._reports
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    async def ready(self) -> Fleet:
        await asyncio.gather(*(p.ready() for p in self.processes))
        return self

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    async def counters(self) -> Counter[str]:
        """What every worker counted so far (each writes its report on SIGUSR1)."""
        total: Counter[str] = Counter()
        if self.system.tree is not None:
            return total  # another checkout's worker.py writes no report
        for process, path in zip(self.processes, self._reports, strict=True):
            before = _read_report(path).get("writes", 0)
            process.process.send_signal(signal.SIGUSR1)
            async with asyncio.timeout(REPORT_WITHIN):
                while (report := _read_report(path)).get("writes", 0) <= before:
                    await asyncio.sleep(0.05)
            total.update(report["counters"])
            total.update(report["metrics"])
        return total

    def stop(self) -> None:
        for process in self.processes:
            process.kill()


def _read_report(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}


@contextlib.asynccontextmanager
async def fleets(
    bench: Bench, systems: Sequence[System], workers: int, extra_env: dict[str, str] | None = None
) -> Any:
    started: list[Fleet] = []
    try:
        for system in systems:
            started.append(Fleet(bench, system, workers, extra_env))
        await asyncio.gather(*(f.ready() for f in started))
        yield started
    finally:
        for fleet in started:
            fleet.stop()


# --- one task of each system ----------------------------------------------------------------

TaskRun = Callable[[str, int], Awaitable[None]]  # (workflow id, steps): the task to its answer


def floor_http_reply(body: dict[str, Any]) -> Reply:
    """The floor's model on the fake endpoint: the peers' workload, read from the floor's
    constant-size request (the task, and how many tool results came so far)."""
    messages = [ChatMessage(role=m["role"], content=m.get("content")) for m in body["messages"]]
    steps, _ = parse_task(messages)
    done = steps_done(messages)
    if done >= steps - 1:
        return text(answer(done + 1))
    return tools(("calculator", {"expression": f"{done} + 1"}), content="x" * MESSAGE_BYTES)


def ours_http_task(workflow_id: str, steps: int) -> AgentTask:
    """waystation's task of the HTTP workload: the fake endpoint plays it by its prompt."""
    return AgentTask(
        task=prompt(Job(run_id=workflow_id, steps=steps)),
        model=ModelSettings(name=OURS_HTTP_MODEL),
        max_steps=steps + 1,
        approval=ApprovalSettings(policy={"calculator": "never"}),
    )


async def task_runner(bench: Bench, fleet: Fleet, instant_bytes: int = INSTANT_BYTES) -> TaskRun:
    """How the bench runs one task of the fleet's system, checking its answer; with the
    instant model, each step's text is `instant_bytes` long."""
    system, queue = fleet.system, fleet.settings.task_queue
    if system.name == "floor":
        model = bench.fake.script(floor_http_reply, record=False) if system.http else INSTANT_MODEL
        size = MESSAGE_BYTES if system.http else instant_bytes

        async def run_floor(workflow_id: str, steps: int) -> None:
            call = FloorCall(model=model, steps=steps, size=size, step=0)
            done = await bench.client.execute_workflow(
                FloorAgent.run, call, id=workflow_id, task_queue=queue
            )
            if done != steps:
                raise RuntimeError(f"{workflow_id} took {done} steps, not {steps}")

        return run_floor
    if system.tree is not None:
        ScriptedWorkload(bench.fake, OURS_HTTP_MODEL)

        async def run_baseline(workflow_id: str, steps: int) -> None:
            payload = run_input(ours_http_task(workflow_id, steps))
            await run_by_type(bench.client, workflow_id, queue, payload, steps)

        return run_baseline
    if system.name == "waystation":
        runtime = AgentRuntime(bench.client, fleet.settings)
        if system.http:
            ScriptedWorkload(bench.fake, OURS_HTTP_MODEL)

        async def run_ours(workflow_id: str, steps: int) -> None:
            task = instant_task(steps, instant_bytes)
            if system.http:
                task = ours_http_task(workflow_id, steps)
            outcome = await (await runtime.run(task, task_id=workflow_id)).result()
            if outcome.steps != steps:
                raise RuntimeError(f"{workflow_id} took {outcome.steps} steps, not {steps}")

        return run_ours
    module = __import__(PEER_MODULES[system.name], fromlist=["SETUP", "MODEL"])
    setup: PeerSetup = module.SETUP
    ScriptedWorkload(bench.fake, module.MODEL)
    client = await setup.connect(bench.address, bench.scratch)

    async def run_peer(workflow_id: str, steps: int) -> None:
        text = prompt(Job(run_id=workflow_id, steps=steps))
        final = await setup.run(client, queue, workflow_id, text)
        if final.strip() != answer(steps):
            raise RuntimeError(f"{workflow_id} answered {final[:80]!r}")

    return run_peer


# --- histories ----------------------------------------------------------------------------


def event_kind(event: HistoryEvent) -> str:
    """An event's type, with the activity, marker or signal it is about."""
    kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
    if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        kind += ":" + event.activity_task_scheduled_event_attributes.activity_type.name
    elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
        kind += ":" + event.marker_recorded_event_attributes.marker_name
    elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        kind += ":" + event.workflow_execution_signaled_event_attributes.signal_name
    elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
        accepted = event.workflow_execution_update_accepted_event_attributes
        kind += ":" + accepted.accepted_request.input.name
    return kind


async def _runs(client: Client, workflow_id: str) -> list[str | None]:
    """The run ids of a task's chain of runs (continue-as-new), latest first."""
    runs: list[str | None] = [None]
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=runs[-1])
        previous = ""
        async for event in handle.fetch_history_events(page_size=1):
            previous = event.workflow_execution_started_event_attributes.continued_execution_run_id
            break
        if not previous:
            return runs
        runs.append(previous)


async def history_totals(client: Client, workflow_id: str) -> tuple[int, int]:
    """Events and bytes of every run of the task, as Temporal counts them."""
    events, size = 0, 0
    for run_id in await _runs(client, workflow_id):
        info = (await client.get_workflow_handle(workflow_id, run_id=run_id).describe()).raw_info
        events += info.history_length
        size += info.history_size_bytes
    return events, size


async def history_kinds(client: Client, workflow_id: str) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for run_id in await _runs(client, workflow_id):
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        async for event in handle.fetch_history_events():
            kinds[event_kind(event)] += 1
    return kinds


async def bounded(jobs: Iterable[Awaitable[Any]], in_flight: int = 50) -> list[Any]:
    gate = asyncio.Semaphore(in_flight)

    async def one(job: Awaitable[Any]) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


# --- one round: K tasks at once -------------------------------------------------------------


@dataclass
class RoundFigures:
    tasks: int
    steps: int
    seconds: float
    latencies: list[float]
    worker_cpu: float
    server_cpu: float
    rss_mb: float
    events: int
    history_bytes: int
    kinds: Counter[str]
    sampled: int  # tasks whose kinds are counted
    counted: Counter[str]  # what the workers counted in the window
    failures: list[str] = field(default_factory=list)  # why each task that failed did

    @property
    def total_steps(self) -> int:
        """Steps of the tasks that finished (a failed task's are not counted)."""
        return (self.tasks - len(self.failures)) * self.steps


async def one_round(
    bench: Bench, fleet: Fleet, run: TaskRun, tasks: int, steps: int, server: int
) -> RoundFigures:
    ids = [f"many-{fleet.system.name}-{uuid.uuid4().hex[:10]}" for _ in range(tasks)]
    counted_before = await fleet.counters()
    latencies: list[float] = []
    failures: list[str] = []
    done: set[str] = set()

    async def timed(workflow_id: str) -> None:
        started = time.perf_counter()
        try:
            await run(workflow_id, steps)
        except Exception as err:  # a task that fails under load is a figure, not the end
            failures.append(f"{type(err).__name__}: {err}")
            return
        latencies.append(time.perf_counter() - started)
        done.add(workflow_id)

    worker_before, server_before = fleet.cpu(), cpu_seconds(server)
    start = time.perf_counter()
    await asyncio.gather(*(timed(i) for i in ids))
    seconds = time.perf_counter() - start
    worker_cpu, server_cpu = fleet.cpu() - worker_before, cpu_seconds(server) - server_before
    rss = max(rss_mb(pid) for pid in fleet.pids)
    counted = await fleet.counters()
    counted.subtract(counted_before)
    if failures:
        say(f"  {len(failures)} of {tasks} tasks failed, the first: {failures[0][:300]}")
    finished = [i for i in ids if i in done]
    totals = await bounded(history_totals(bench.client, i) for i in finished)
    sample = finished[:SAMPLED_HISTORIES]
    kinds: Counter[str] = Counter()
    for found in await bounded(history_kinds(bench.client, i) for i in sample):
        kinds.update(found)
    return RoundFigures(
        tasks=tasks,
        steps=steps,
        seconds=seconds,
        latencies=latencies,
        worker_cpu=worker_cpu,
        server_cpu=server_cpu,
        rss_mb=rss,
        events=sum(e for e, _ in totals),
        history_bytes=sum(b for _, b in totals),
        kinds=kinds,
        sampled=len(sample),
        counted=+counted,
        failures=failures,
    )


@dataclass
class Result:
    """A system's rounds in one configuration, and their medians."""

    block: str
    tasks: int
    workers: int
    system: System
    rounds: list[RoundFigures] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return self.rounds[0].steps

    def _median(self, figure: Callable[[RoundFigures], float]) -> float:
        return median([figure(r) for r in self.rounds])

    @property
    def steps_per_second(self) -> float:
        return self._median(lambda r: r.total_steps / r.seconds)

    @property
    def latency_p50(self) -> float:
        return self._median(lambda r: percentile(r.latencies or [math.nan], 0.5))

    @property
    def latency_p95(self) -> float:
        return self._median(lambda r: percentile(r.latencies or [math.nan], 0.95))

    @property
    def worker_ms(self) -> float:
        return self._median(lambda r: r.worker_cpu / r.total_steps * 1000)

    @property
    def server_ms(self) -> float:
        return self._median(lambda r: r.server_cpu / r.total_steps * 1000)

    @property
    def rss(self) -> float:
        return max(r.rss_mb for r in self.rounds)

    @property
    def events_per_step(self) -> float:
        return self._median(lambda r: r.events / r.total_steps)

    @property
    def bytes_per_step(self) -> float:
        return self._median(lambda r: r.history_bytes / r.total_steps)

    def per_step(self, kind: Callable[[str], bool]) -> float:
        """History events of the kinds `kind` picks, per step of the sampled tasks."""
        counted = sum(n for r in self.rounds for k, n in r.kinds.items() if kind(k))
        steps = sum(r.sampled * r.steps for r in self.rounds)
        return counted / steps

    def counted_per_step(self, name: str) -> float:
        return sum(r.counted[name] for r in self.rounds) / sum(r.total_steps for r in self.rounds)

    @property
    def failed(self) -> int:
        return sum(len(r.failures) for r in self.rounds)

    def describe(self) -> str:
        failed = f"{self.failed} tasks failed, " if self.failed else ""
        return failed + (
            f"{self.steps_per_second:.0f} steps/s, latency {self.latency_p50:.2f}/"
            f"{self.latency_p95:.2f} s, worker {self.worker_ms:.1f} ms/step, server "
            f"{self.server_ms:.1f} ms/step, RSS {self.rss:.0f} MB, "
            f"{self.events_per_step:.1f} events and {self.bytes_per_step / 1000:.2f} KB/step"
        )


async def compare(
    bench: Bench,
    block: str,
    systems: Sequence[System],
    tasks: int,
    steps: int,
    workers: int,
    rounds: int,
    extra_env: dict[str, str] | None = None,
) -> list[Result]:
    """Every system's rounds at K = `tasks`, taking turns (ABBA...) so they share the noise."""
    server = server_pid(bench.address)
    say(f"many tasks [{block}]: {tasks} x {steps} steps on {workers} worker(s): starting workers")
    async with fleets(bench, systems, workers, extra_env) as started:
        runs = [await task_runner(bench, fleet) for fleet in started]
        results = [Result(block, tasks, workers, fleet.system) for fleet in started]
        for run in runs:  # warm up: first calls, imports
            await asyncio.gather(
                *(run(f"warm-{uuid.uuid4().hex[:10]}", 3) for _ in range(min(tasks, 5)))
            )
        order = list(range(len(started)))
        for number in range(rounds):
            for index in order if number % 2 == 0 else order[::-1]:
                found = await one_round(bench, started[index], runs[index], tasks, steps, server)
                results[index].rounds.append(found)
                say(
                    f"  round {number + 1}/{rounds} {started[index].system.label}: "
                    f"{found.total_steps / found.seconds:.0f} steps/s, "
                    f"worker {found.worker_cpu / found.total_steps * 1000:.1f} ms/step, "
                    f"server {found.server_cpu / found.total_steps * 1000:.1f} ms/step"
                )
    return results


# --- the start rate -------------------------------------------------------------------------


@dataclass(frozen=True)
class StartFigures:
    tasks: int
    seconds: float  # first start → the last task waiting
    latencies: list[float]  # each task's start → it waits
    worker_cpu: float
    server_cpu: float
    failed: int

    @property
    def rate(self) -> float:
        return (self.tasks - self.failed) / self.seconds


CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
}


def waiting_since(events: Sequence[HistoryEvent]) -> float | None:
    """When the task first waited for a person: the completion of the workflow task after
    its first activity (for ours, the one that records the request in the memo)."""
    after_activity = False
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            after_activity = True
        elif after_activity and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return event.event_time.ToDatetime().timestamp()
    return None


async def until_quiet(fleet: Fleet, server: int) -> None:
    """Until the workers and the server have been idle for a moment."""
    while True:
        before = fleet.cpu() + cpu_seconds(server)
        await asyncio.sleep(QUIET_INTERVAL)
        if fleet.cpu() + cpu_seconds(server) - before < QUIET_CPU_SECONDS:
            return


async def start_rate(
    bench: Bench, fleet: Fleet, start: Callable[[], Awaitable[str]], tasks: int
) -> StartFigures:
    server = server_pid(bench.address)
    sent: dict[str, float] = {}

    async def one() -> None:
        at = time.time()
        sent[await start()] = at

    worker_before, server_before = fleet.cpu(), cpu_seconds(server)
    first = time.time()
    await bounded((one() for _ in range(tasks)), STARTS_IN_FLIGHT)
    await until_quiet(fleet, server)
    worker_cpu, server_cpu = fleet.cpu() - worker_before, cpu_seconds(server) - server_before
    waited: dict[str, float] = {}
    failed: set[str] = set()
    while missing := [i for i in sent if i not in waited and i not in failed]:
        for task_id, history in zip(
            missing,
            await bounded(bench.client.get_workflow_handle(i).fetch_history() for i in missing),
            strict=True,
        ):
            if (at := waiting_since(history.events)) is not None:
                waited[task_id] = at
            elif history.events[-1].event_type in CLOSED:
                failed.add(task_id)  # it ended before it waited: it failed on the way
        if len(waited) + len(failed) < len(sent):
            say(f"  {len(sent) - len(waited) - len(failed)} tasks not waiting yet")
            await asyncio.sleep(1.0)
    latencies = [waited[i] - sent[i] for i in waited]
    seconds = max(waited.values()) - first
    return StartFigures(tasks, seconds, latencies, worker_cpu, server_cpu, len(failed))


async def measure_start_rate(bench: Bench, tasks: int) -> list[Row]:
    say(f"many tasks [start]: {tasks} tasks to their first approval request, and the floor")
    async with fleets(bench, [FLOOR, OURS], 1) as (floor, ours):
        call = FloorCall(model=INSTANT_MODEL, steps=2, size=INSTANT_BYTES, step=0)

        async def start_floor() -> str:
            handle = await bench.client.start_workflow(
                FloorWaiting.run,
                call,
                id=f"start-floor-{uuid.uuid4().hex[:10]}",
                task_queue=floor.settings.task_queue,
            )
            return handle.id

        body = AgentTask(
            task=instant_task_text(2, INSTANT_BYTES),
            model=ModelSettings(name=INSTANT_MODEL),
            max_steps=3,
            approval=ApprovalSettings(policy={"calculator": "always"}),
        ).model_dump(mode="json", exclude_defaults=True)
        runtime = AgentRuntime(bench.client, ours.settings)
        async with http_api(ours.settings, runtime) as api:

            async def post_task() -> str:
                response = await api.post("/tasks", json=body)
                if response.status_code != 201:
                    raise RuntimeError(f"POST /tasks: {response.status_code} {response.text}")
                return str(response.json()["id"])

            await bounded((post_task() for _ in range(5)), 5)  # warm up both
            await bounded((start_floor() for _ in range(5)), 5)
            floor_figures = await start_rate(bench, floor, start_floor, tasks)
            say(f"  floor: {floor_figures.rate:.0f} workflows/s")
            ours_figures = await start_rate(bench, ours, post_task, tasks)
            say(f"  waystation: {ours_figures.rate:.0f} tasks/s")
        await _clean_up(bench, floor, ours)
    return _start_rows(tasks, floor_figures, ours_figures)


async def _clean_up(bench: Bench, floor: Fleet, ours: Fleet) -> None:
    """End the waiting tasks, so later parts share the server with none of them."""

    async def end(execution_id: str, queue: str) -> None:
        handle = bench.client.get_workflow_handle(execution_id)
        with contextlib.suppress(RPCError):
            if queue == floor.settings.task_queue:
                await handle.signal(RELEASE_SIGNAL)
            else:
                await handle.terminate("bench: measured")

    jobs = []
    for fleet in (floor, ours):
        queue = fleet.settings.task_queue
        query = f'TaskQueue="{queue}" AND ExecutionStatus="Running"'
        async for execution in bench.client.list_workflows(query):
            jobs.append(end(execution.id, queue))
    await bounded(jobs)


def _start_rows(tasks: int, floor: StartFigures, ours: StartFigures) -> list[Row]:
    def cell(figures: StartFigures) -> str:
        failed = f"{figures.failed} failed; " if figures.failed else ""
        return failed + (
            f"{figures.rate:.0f}/s; latency {median(figures.latencies):.2f}/"
            f"{percentile(figures.latencies, 0.95):.2f} s; worker "
            f"{figures.worker_cpu / figures.tasks * 1000:.1f}, server "
            f"{figures.server_cpu / figures.tasks * 1000:.1f} CPU-ms per task"
        )

    return [
        Row(
            f"start rate: {tasks} tasks, POST /tasks → first approval request (one worker)",
            cell(ours),
            f"{ours.rate / floor.rate:.2f}x the floor's {cell(floor)}; worker CPU "
            f"{ours.worker_cpu / floor.worker_cpu:.2f}x, server CPU "
            f"{ours.server_cpu / floor.server_cpu:.2f}x",
        )
    ]


# --- memory at scale ------------------------------------------------------------------------

CACHE_MISS = "temporal_sticky_cache_miss"
CACHE_EVICTION = "temporal_sticky_cache_total_forced_eviction"


async def measure_memory(
    bench: Bench, running: int, steps: int, caches: Sequence[int]
) -> list[Row]:
    rows: list[Row] = []
    metrics = {"BENCH_METRICS": "1"}
    [floor] = await compare(bench, "memory", [FLOOR], running, steps, 1, 1, metrics)
    say(f"  floor: {floor.describe()}")
    for cache in caches:
        env = {**metrics, "WAYSTATION_WORKER_CACHED_TASKS": str(cache)}
        [ours] = await compare(bench, "memory", [OURS], running, steps, 1, 1, env)
        say(f"  waystation, cache {cache}: {ours.describe()}")
        rows.append(
            Row(
                f"{running} running tasks x {steps} steps, one worker, workflow cache {cache}",
                f"RSS {ours.rss:.0f} MB; {ours.steps_per_second:.0f} steps/s "
                f"({ours.steps_per_second / floor.steps_per_second:.2f}x floor)",
                f"cache misses {ours.counted_per_step(CACHE_MISS):.2f}/step, evictions "
                f"{ours.counted_per_step(CACHE_EVICTION):.2f}/step, llm_context queries "
                f"{ours.counted_per_step('queried'):.2f}/step; worker "
                f"{ours.worker_ms:.1f} ms/step ({ours.worker_ms / floor.worker_ms:.2f}x), "
                f"server {ours.server_ms:.1f} ({ours.server_ms / floor.server_ms:.2f}x); floor "
                f"(SDK cache 1,000) RSS {floor.rss:.0f} MB, misses "
                f"{floor.counted_per_step(CACHE_MISS):.2f}/step",
            )
        )
    return rows


# --- what each step sends -------------------------------------------------------------------

COUNTED: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("workflow tasks", lambda k: k == "workflow_task_completed"),
    ("workflow task timeouts", lambda k: k == "workflow_task_timed_out"),
    ("workflow task failures", lambda k: k == "workflow_task_failed"),
    ("events", lambda k: True),
    ("activities", lambda k: k.startswith("activity_task_scheduled")),
    ("local activities", lambda k: k == "marker_recorded:core_local_activity"),
    ("search-attribute upserts", lambda k: k == "upsert_workflow_search_attributes"),
    ("memo upserts", lambda k: k == "workflow_properties_modified"),
    ("signals", lambda k: k.startswith("workflow_execution_signaled")),
    ("updates", lambda k: k.startswith("workflow_execution_update_accepted")),
    ("timers", lambda k: k == "timer_started"),
    ("summarize_context", lambda k: k == "activity_task_scheduled:summarize_context"),
)


def counts_table(results: Sequence[Result]) -> list[str]:
    """Per step, what each system's tasks sent the server (their histories) and the
    `llm_context` queries the workers made (no history records a query)."""
    header = ["tasks", "workers", "system", *(name for name, _ in COUNTED), "llm_context queries"]
    lines = [_line(header), _line(["---"] * len(header))]
    for r in results:
        cells = [f"{r.per_step(kind):.2f}" for _, kind in COUNTED]
        counts_queries = r.system.name == "waystation" and r.system.tree is None
        queries = f"{r.counted_per_step('queried'):.2f}" if counts_queries else ""
        lines.append(_line([str(r.tasks), str(r.workers), _label(r), *cells, queries]))
    return lines


async def measure_counts(bench: Bench, steps: int) -> tuple[list[Row], list[str]]:
    """One default task of `steps` steps of 2 KB: what it sends beyond the floor."""
    say(f"many tasks [counts]: one {steps}-step task of 2 KB steps with default settings")
    results: list[Result] = []
    async with fleets(bench, [FLOOR, OURS], 1) as started:
        for fleet in started:
            run = await task_runner(bench, fleet, MESSAGE_BYTES)
            result = Result("counts", 1, 1, fleet.system)
            server = server_pid(bench.address)
            result.rounds.append(await one_round(bench, fleet, run, 1, steps, server))
            results.append(result)
    floor, ours = results
    summaries = ours.per_step(lambda k: k == "activity_task_scheduled:summarize_context")
    rows = [
        Row(
            f"one {steps}-step task of 2 KB steps, default settings (unknown model): "
            "summarize_context calls",
            f"{summaries * steps:.0f}",
            f"llm_context queries {ours.counted_per_step('queried') * steps:.0f}, "
            f"{ours.events_per_step:.1f} events/step (floor {floor.events_per_step:.1f}), "
            f"{ours.bytes_per_step / 1000:.1f} KB/step (floor {floor.bytes_per_step / 1000:.1f})",
        )
    ]
    return rows, counts_table(results)


# --- tables -----------------------------------------------------------------------------------


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _label(result: Result) -> str:
    return result.system.label + (" (HTTP)" if result.system.http else "")


def _floor_of(result: Result, results: Sequence[Result]) -> Result:
    return next(
        r
        for r in results
        if r.system.name == "floor"
        and (r.block, r.tasks, r.workers) == (result.block, result.tasks, result.workers)
    )


def _ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x" if floor else "-"


def figures_table(results: Sequence[Result]) -> list[str]:
    header = [
        "tasks",
        "workers",
        "system",
        "steps/s",
        "x floor",
        "latency p50 / p95 s",
        "x floor",
        "worker CPU ms/step",
        "x floor",
        "server CPU ms/step",
        "x floor",
        "worker RSS MB",
        "failed tasks",
        "events/step",
        "x floor",
        "history KB/step",
        "x floor",
    ]
    lines = [_line(header), _line(["---"] * len(header))]
    for r in results:
        f = _floor_of(r, results)
        lines.append(
            _line(
                [
                    str(r.tasks),
                    str(r.workers),
                    _label(r),
                    f"{r.steps_per_second:.0f}",
                    _ratio(r.steps_per_second, f.steps_per_second),
                    f"{r.latency_p50:.2f} / {r.latency_p95:.2f}",
                    f"{_ratio(r.latency_p50, f.latency_p50)} / "
                    f"{_ratio(r.latency_p95, f.latency_p95)}",
                    f"{r.worker_ms:.1f}",
                    _ratio(r.worker_ms, f.worker_ms),
                    f"{r.server_ms:.1f}",
                    _ratio(r.server_ms, f.server_ms),
                    f"{r.rss:.0f}",
                    str(r.failed),
                    f"{r.events_per_step:.1f}",
                    _ratio(r.events_per_step, f.events_per_step),
                    f"{r.bytes_per_step / 1000:.2f}",
                    _ratio(r.bytes_per_step, f.bytes_per_step),
                ]
            )
        )
    return lines


def result_rows(results: Sequence[Result]) -> list[Row]:
    rows = []
    for r in results:
        if r.system.name == "floor":
            continue
        f = _floor_of(r, results)
        rows.append(
            Row(
                f"{r.tasks} x {r.steps} steps at once, {r.workers} worker(s): {_label(r)}",
                f"{_ratio(r.steps_per_second, f.steps_per_second)} the floor's steps/s",
                f"worker CPU {_ratio(r.worker_ms, f.worker_ms)}, server CPU "
                f"{_ratio(r.server_ms, f.server_ms)}, latency p50 "
                f"{_ratio(r.latency_p50, f.latency_p50)}, events "
                f"{_ratio(r.events_per_step, f.events_per_step)}; {r.describe()}",
            )
        )
    return rows


def print_lines(title: str, lines: list[str]) -> None:
    print(f"\n{title}\n")
    print("\n".join(lines), flush=True)


# --- all of it ------------------------------------------------------------------------------


async def measure(bench: Bench, options: Options | None = None) -> list[Row]:
    options = options or Options()
    say(f"many tasks: load average {load_average()} at the start")
    results: list[Result] = []
    rows: list[Row] = []
    if "sweep" in options.parts:
        for tasks in options.tasks:
            for workers in options.workers:
                results += await compare(
                    bench, "sweep", [FLOOR, OURS], tasks, options.steps, workers, options.rounds
                )
    if "peers" in options.parts:
        for label in peers_temporal.missing_peers():
            say(f"{label} is not installed: its rows stay empty (pip install -e '.[bench]')")
        systems = [FLOOR_HTTP, OURS_HTTP, *installed_peers()]
        with contextlib.ExitStack() as trees:
            if options.baseline:
                keep = Path(options.baseline_dir) if options.baseline_dir else None
                tree = trees.enter_context(baseline_checkout(options.baseline, keep))
                systems.insert(2, System("waystation", f"waystation at {tree.label}", True, tree))
            for tasks in options.peers_tasks:
                results += await compare(
                    bench, "peers", systems, tasks, options.steps, 1, options.rounds
                )
    if results:
        print_lines("Many tasks at once (medians of rounds)", figures_table(results))
        print_lines("What each step sends the server, per step", counts_table(results))
        rows += result_rows(results)
    if "counts" in options.parts:
        count_rows, lines = await measure_counts(bench, options.count_steps)
        print_lines(f"One {options.count_steps}-step task of 2 KB steps, per step", lines)
        rows += count_rows
    if "start" in options.parts:
        rows += await measure_start_rate(bench, options.start_tasks)
    if "memory" in options.parts:
        rows += await measure_memory(bench, options.running, options.running_steps, options.caches)
    say(f"many tasks: load average {load_average()} at the end")
    return rows


def load_average() -> str:
    """The machine's load over 1, 5 and 15 minutes: how busy it was beside the bench."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def options_from(args: argparse.Namespace, prefix: str = "") -> Options:
    """The options from flags that `add_arguments` added (with the same prefix)."""
    found: dict[str, Any] = {}
    for option in fields(Options):
        value = getattr(args, prefix.replace("-", "_") + option.name)
        found[option.name] = tuple(value) if isinstance(value, list) else value
    return Options(**found)


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The flags of every option, each as `--<prefix><name>`."""
    helps = {
        "tasks": "K: tasks started at once",
        "steps": "N: steps of each task",
        "workers": "worker processes per system",
        "peers_tasks": "K for the peers (over HTTP)",
        "count_steps": "steps of the one task whose sends are counted",
        "start_tasks": "tasks started for the start rate",
        "running": "tasks running at once for memory at scale",
        "caches": "workflow-cache sizes for memory at scale",
        "baseline": "a git ref: its waystation worker runs beside this tree's (peers part only)",
        "baseline_dir": "where the baseline's checkout and venv are made once and kept",
    }
    for option in fields(Options):
        default = getattr(Options(), option.name)
        flag = f"--{prefix}{option.name.replace('_', '-')}"
        if isinstance(default, tuple):
            kind = str if option.name == "parts" else int
            choices = PARTS if option.name == "parts" else None
            parser.add_argument(
                flag,
                type=kind,
                nargs="+",
                default=list(default),
                choices=choices,
                help=helps.get(option.name),
            )
        else:
            kind = str if isinstance(default, str) else int
            parser.add_argument(flag, type=kind, default=default, help=helps.get(option.name))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    chosen = options_from(parser.parse_args())
    run_alone(lambda bench: measure(bench, chosen))
