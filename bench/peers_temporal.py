"""The Temporal peers side by side: `python -m bench --only peers_temporal`.

One workload (bench.peer_workload: N steps, each a model request whose answer carries 2 KB
of text and one calculator call, then the answer), one dev server, one fake endpoint, for:
- ours: AgentRuntime on an in-process worker, default settings but the calculator's approval;
- pydantic-ai's TemporalAgent (bench.peer_pydantic_ai);
- the OpenAI Agents SDK on Temporal (bench.peer_openai_agents);
- temporal-agent-harness (bench.peer_harness).
The peers are the `bench` extra (pip install -e '.[bench]'); a missing one keeps its rows
empty. Each gets what it needs to run the workload and no more: raised turn and request
limits, a chat-completions provider, a calculator that needs no approval.

Figures:
- ms per step: timing rounds interleaved, ours and each peer in turn (ABCDABCD...), so they
  share the noise of a busy machine; median per agent, and its ratio to ours;
- history bytes per step after each of a few step counts: Temporal's own count
  (`history_size_bytes`), summed over a task's runs when it continues as new;
- where each stops: the step (model request) a task had reached when it failed, with the
  error, driving it up to a limit of steps within a bound on wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib.util import find_spec

from temporalio.service import RPCError

from bench.common import Bench, Row, median, run_alone, say
from bench.peer_workload import (
    Job,
    Runner,
    ScriptedWorkload,
    answer,
    failure_text,
    history_bytes,
    parse_prompt,
    point_at,
    prompt,
)
from waystation.client.agent_runtime import AgentRuntime
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings

OURS = "waystation"
OURS_MODEL = "bench-waystation"
INSTALL = "pip install -e '.[bench]'"


@dataclass(frozen=True)
class PeersOptions:
    """How much to run (flags of `python -m bench`)."""

    steps: int = 50  # steps of each timing round
    rounds: int = 3
    byte_steps: tuple[int, ...] = (10, 50, 200)
    limit_steps: int = 400  # drive each agent this far, or until it fails
    limit_seconds: float = 240.0  # wall-time bound on any one task

    @property
    def round_seconds(self) -> float:
        """The bound on a timing round's task: a hung one should not hold the bench long."""
        return min(self.limit_seconds, 10 + 2 * self.steps)


@dataclass(frozen=True)
class Peer:
    """A peer's label, its module in bench/, and the modules it needs installed."""

    label: str
    module: str
    needs: tuple[str, ...]

    def available(self) -> bool:
        return all(_importable(name) for name in self.needs)


PEERS = (
    Peer("pydantic-ai TemporalAgent", "bench.peer_pydantic_ai", ("pydantic_ai",)),
    Peer(
        "OpenAI Agents SDK on Temporal",
        "bench.peer_openai_agents",
        ("agents", "temporalio.openai_agents"),
    ),
    Peer(
        "temporal-agent-harness (pydantic-ai inside)",
        "bench.peer_harness",
        ("temporal_agent_harness", "pydantic_ai"),
    ),
)


def _importable(name: str) -> bool:
    try:
        return find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def missing_peers() -> list[str]:
    return [peer.label for peer in PEERS if not peer.available()]


@dataclass
class Outcome:
    """One task: how far it went, how long it took, what Temporal recorded, why it stopped."""

    steps: int
    seconds: float
    history: int
    runs: int
    error: str | None = None


@dataclass
class Contender:
    """An agent in the comparison: its runner, its scripted model, its figures."""

    label: str
    run: Runner
    workload: ScriptedWorkload
    seconds_per_step: list[float] = field(default_factory=list)
    failed_rounds: list[Outcome] = field(default_factory=list)
    history: dict[int, Outcome] = field(default_factory=dict)  # by the task's steps
    stopped: Outcome | None = None  # the first of the longer and longer tasks that failed


@asynccontextmanager
async def serve_ours(bench: Bench) -> AsyncIterator[Runner]:
    """Our agent over the public path: AgentRuntime on an in-process worker."""
    settings = bench.settings("peers-ours")
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)

        async def run(workflow_id: str, text: str) -> str:
            task = AgentTask(
                task=text,
                model=ModelSettings(name=OURS_MODEL),
                max_steps=parse_prompt(text).steps + 1,
                approval=ApprovalSettings(policy={"calculator": "never"}),
            )
            return (await (await runtime.run(task, task_id=workflow_id)).result()).result

        yield run


async def attempt(bench: Bench, contender: Contender, steps: int, seconds: float) -> Outcome:
    """Run one task of `steps` steps, bounded by `seconds`; what happened and what it cost."""
    job = Job(run_id=uuid.uuid4().hex[:10], steps=steps)
    workflow_id = f"peers-{job.run_id}"
    error: str | None = None
    start = time.perf_counter()
    try:
        final = await asyncio.wait_for(contender.run(workflow_id, prompt(job)), seconds)
        if final.strip() != answer(steps):
            error = f"unexpected answer {final[:80]!r}"
    except TimeoutError:
        error = f"still running after {seconds:.0f} s{await _pending(bench, workflow_id)}"
        with contextlib.suppress(RPCError):  # unless it ended meanwhile
            await bench.client.get_workflow_handle(workflow_id).terminate("bench: time bound")
    except Exception as err:
        error = failure_text(err)
    elapsed = time.perf_counter() - start
    history, runs = await history_bytes(bench.client, workflow_id)
    return Outcome(contender.workload.served(job.run_id), elapsed, history, runs, error)


async def _pending(bench: Bench, workflow_id: str) -> str:
    """What a task that outran its bound was waiting for: its pending activities."""
    description = await bench.client.get_workflow_handle(workflow_id).describe()
    pending = description.raw_description.pending_activities
    waits = [
        f"{a.activity_type.name} attempt {a.attempt}"
        + (", heartbeating" if a.HasField("last_heartbeat_time") else "")
        for a in pending
    ]
    return f", waiting on {'; '.join(waits)}" if waits else ""


ServeFactory = Callable[[Bench], AbstractAsyncContextManager[Runner]]


async def _enter(
    stack: AsyncExitStack, bench: Bench, label: str, model: str, serve: ServeFactory
) -> Contender:
    """Start an agent's worker for the rest of the section, with its scripted model."""
    workload = ScriptedWorkload(bench.fake, model)
    run = await stack.enter_async_context(serve(bench))
    return Contender(label=label, run=run, workload=workload)


async def measure(bench: Bench, options: PeersOptions | None = None) -> list[Row]:
    options = options or PeersOptions()
    point_at(bench.fake.url)
    async with AsyncExitStack() as stack:
        contenders = [await _enter(stack, bench, OURS, OURS_MODEL, serve_ours)]
        for peer in PEERS:
            if peer.available():
                module = importlib.import_module(peer.module)
                contenders.append(
                    await _enter(stack, bench, peer.label, module.MODEL, module.serve)
                )
        await _timing_rounds(bench, contenders, options)
        await _history_and_limits(bench, contenders, options)
    return _rows(contenders, options)


async def _timing_rounds(bench: Bench, contenders: list[Contender], options: PeersOptions) -> None:
    for number in range(options.rounds):
        say(f"peers: round {number + 1}/{options.rounds}, {options.steps} steps each")
        for contender in contenders:
            outcome = await attempt(bench, contender, options.steps, options.round_seconds)
            if outcome.error is not None:
                contender.failed_rounds.append(outcome)
                continue
            contender.seconds_per_step.append(outcome.seconds / options.steps)
            if options.steps in options.byte_steps:  # its history counts once, like any other
                contender.history.setdefault(options.steps, outcome)


async def _history_and_limits(
    bench: Bench, contenders: list[Contender], options: PeersOptions
) -> None:
    """Longer and longer tasks; an agent that has failed once runs no longer one."""
    for steps in sorted({*options.byte_steps, options.limit_steps}):
        for contender in contenders:
            if contender.stopped is not None or steps in contender.history:
                continue
            outcome = await attempt(bench, contender, steps, options.limit_seconds)
            say(f"peers: {contender.label}, {steps} steps: {outcome.seconds:.0f} s")
            contender.history[steps] = outcome
            if outcome.error is not None:
                contender.stopped = outcome


def _rows(contenders: list[Contender], options: PeersOptions) -> list[Row]:
    ours = contenders[0]
    rows: list[Row] = []
    timing = f"{options.steps} steps of 2 KB, median of {options.rounds} interleaved rounds"
    for contender in contenders:
        figure = f"ms per step ({timing}): {contender.label}"
        rows.append(Row(figure, *_timing_cell(contender, ours)))
    for steps in sorted(options.byte_steps):
        for contender in contenders:
            figure = f"history per step after {steps} steps: {contender.label}"
            rows.append(Row(figure, *_history_cell(contender, ours, steps)))
    limit = f"up to {options.limit_steps} steps, {options.limit_seconds:.0f} s per task"
    for contender in contenders:
        rows.append(Row(f"where it stops ({limit}): {contender.label}", *_stop_cell(contender)))
    for label in missing_peers():
        rows.append(Row(f"Temporal peer: {label}", "not installed", INSTALL))
    return rows


def _timing_cell(contender: Contender, ours: Contender) -> tuple[str, str]:
    failed = len(contender.failed_rounds)
    note = f"; {failed} round(s) did not finish" if failed else ""
    if not contender.seconds_per_step:
        return "no round finished", note.lstrip("; ")
    value = median(contender.seconds_per_step) * 1000
    if contender is ours or not ours.seconds_per_step:
        return f"{value:.1f}", note.lstrip("; ")
    return f"{value:.1f}", f"{value / (median(ours.seconds_per_step) * 1000):.2f}x ours{note}"


def _history_cell(contender: Contender, ours: Contender, steps: int) -> tuple[str, str]:
    outcome = contender.history.get(steps)
    if outcome is None:
        return "not run (failed earlier)", ""
    if outcome.error is not None:
        return f"failed at step {outcome.steps} ({outcome.history / 1e6:.1f} MB)", ""
    value = f"{outcome.history / steps / 1000:.1f} KB ({outcome.history / 1e6:.2f} MB"
    value += f" in {outcome.runs} runs)" if outcome.runs > 1 else ")"
    theirs = ours.history.get(steps)
    versus = ""
    if contender is not ours and theirs is not None and theirs.error is None:
        versus = f"{outcome.history / theirs.history:.1f}x ours"
    return value, versus


def _stop_cell(contender: Contender) -> tuple[str, str]:
    rounds = [f"a round failed at step {o.steps}: {o.error}" for o in contender.failed_rounds]
    outcome = contender.stopped
    if outcome is None:
        longest = max(contender.history)
        done = contender.history[longest]
        found = f"{done.history / 1e6:.1f} MB in {done.runs} run(s)"
        return f"no failure up to {longest} steps", "; ".join([found, *rounds])
    return f"stops at step {outcome.steps}", "; ".join([str(outcome.error), *rounds])


if __name__ == "__main__":
    run_alone(measure)
