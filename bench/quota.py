"""Quotas shared by a fleet: `python -m bench.quota`.

    python -m bench.quota               # the issue's targets (about half an hour here)
    python -m bench.quota --tasks 12 --workers 2 --rpm 60 --input-tpm 60000 \\
        --fair-a 12 --fair-b 2          # a smoke run: a minute or two a mode

K tasks of ~4 model calls each (a reply of `--reply-bytes` of text and a calculator call a
step, then the answer) on W worker processes (worker.py), against the fake endpoint, which
enforces a provider's quota as a provider does (waystation.testing.provider_quota: requests
and input tokens per minute over a sliding 60 s window, a 429 with `retry-after` over it).
The same workload runs twice in one run, each mode on a fleet of its own:
- with: the quota declared in WAYSTATION_MODEL_ENDPOINTS (`limits`), which every worker
  honours together;
- without: no limits declared; each call meets the 429s alone and retries on its own.
Each scenario calls the endpoint `bench` under a model name of its own, its quota declared
under `per_model`: the provider's window and the fleet's start empty for each.

Scenarios:
- quota: K tasks started at once, half of tenant `a`, half of tenant `b`;
- fairness: tenant `b`'s tasks alone, then tenant `a`'s backlog and `b`'s tasks started
  together.
Figures, as ratios to the quota (the physical limit here): useful throughput a minute ÷ the
quota, for the limit that binds (input tokens or requests of the calls served, from the
first start to the last answer), refused calls ÷ calls,
failed tasks, p50/p95 task latency (start → answer) per tenant; fairness: `b`'s median
latency beside `a`'s backlog ÷ alone, with where `b`'s time went (starting its tasks, its
calls' waits for the quota that were told to the task, the rest). Targets (issue 41): ≥ 0.9,
≤ 0.01, 0, and ≤ 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.common import Bench, Row, bench_environment, median, percentile, print_table, say
from bench.peer_workload import Job, answer, parse_prompt, prompt
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.settings.model_endpoints import ModelEndpoint
from waystation.testing.fake_openai import Reply, text, tools
from waystation.testing.provider_quota import CHARS_PER_TOKEN, ProviderQuota, prompt_tokens
from waystation.testing.workers import WorkerProcess
from waystation.workflows.events import QuotaGranted
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings

ENDPOINT = "bench"
MODES = ("with", "without")
PARTS = ("quota", "fairness")
PROGRESS_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class Options:
    """What to run (the flags of `python -m bench.quota`)."""

    tasks: int = 200
    calls: int = 4
    workers: int = 3
    rpm: int = 300
    input_tpm: int = 200_000
    output_tpm: int | None = None
    reply_bytes: int = 1024
    model_seconds: float = 0.2
    fair_a: int = 300
    fair_b: int = 5
    parts: tuple[str, ...] = PARTS
    modes: tuple[str, ...] = MODES
    task_seconds: float = 1800.0  # a task not answered by then counts as failed

    def quota(self) -> dict[str, int]:
        limits = {"requests_per_minute": self.rpm, "input_tokens_per_minute": self.input_tpm}
        if self.output_tpm is not None:
            limits["output_tokens_per_minute"] = self.output_tpm
        return limits

    def provider(self) -> ProviderQuota:
        return ProviderQuota(
            requests_per_minute=self.rpm,
            input_tokens_per_minute=self.input_tpm,
            output_tokens_per_minute=self.output_tpm,
        )


@dataclass
class Figures:
    """One scenario's run: what the provider counted and how each task ended, by tenant."""

    seconds: float
    provider: ProviderQuota
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    parts: dict[str, list[Parts]] = field(default_factory=dict)
    """Where the time of each answered task of a tenant went."""


@dataclass(frozen=True)
class Parts:
    """One task's latency, in parts: starting it, its calls waiting for their quota's turn
    (the waits it was told of, over a second each), and the rest (its steps' own work and
    Temporal's dispatch of their tasks); the rest's share that its history shows (queued:
    its workflow and activity tasks waiting for a worker; model calls: `call_llm` from its
    start to its end, the quota's short waits included)."""

    starting: float
    quota: float
    rest: float
    queued: float = 0.0
    model_calls: float = 0.0


# --- the model ----------------------------------------------------------------------------


def scripted_reply(options: Options, body: dict[str, Any]) -> Reply:
    """The workload, played from the request: `calls` calls, each reporting the usage the
    provider counted (input from the request, output from the reply's text)."""
    messages = body.get("messages", [])
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    job = parse_prompt(" ".join(json.dumps(c) for c in users))
    done = sum(m.get("role") == "tool" for m in messages)
    if done >= job.steps - 1:
        said = answer(done + 1)
        return text(said, usage=_usage(body, said), delay_seconds=options.model_seconds)
    thought = "x" * options.reply_bytes
    return tools(
        ("calculator", {"expression": f"{done} + 1"}),
        content=thought,
        usage=_usage(body, thought),
        delay_seconds=options.model_seconds,
    )


def _usage(body: dict[str, Any], said: str) -> tuple[int, int]:
    return prompt_tokens(body), max(1, len(said) // CHARS_PER_TOKEN)


# --- the fleet ----------------------------------------------------------------------------


def endpoints(url: str, options: Options, mode: str, models: list[str]) -> dict[str, Any]:
    """WAYSTATION_MODEL_ENDPOINTS of a mode: the fake at `url` as `bench`, each scenario's
    model under its quota (with) or none (without)."""
    declared: dict[str, Any] = {
        "protocol": "chat",
        "base_url": url,
        "api_key_env": "OPENAI_API_KEY",
    }
    if mode == "with":
        declared["limits"] = {"per_model": {model: options.quota() for model in models}}
    return {ENDPOINT: declared}


@dataclass(frozen=True)
class Fleet:
    runtime: AgentRuntime
    models: dict[str, str]  # scenario -> model name at the endpoint


@asynccontextmanager
async def fleet(bench: Bench, options: Options, mode: str) -> AsyncIterator[Fleet]:
    """W worker processes of one mode, sharing one ledger, and a runtime that starts tasks."""
    scenarios = ["quota", "alone", "together"]
    tag = uuid.uuid4().hex[:6]
    models = {s: f"quota-{mode}-{s}-{tag}" for s in scenarios}
    declared = endpoints(bench.fake.url, options, mode, list(models.values()))
    settings: Settings = bench.settings(f"quota-{mode}")
    settings = settings.model_copy(
        update={
            "model_endpoints": {
                name: ModelEndpoint.model_validate(entry) for name, entry in declared.items()
            }
        }
    )
    say(f"{mode} quotas: starting {options.workers} worker processes ...")
    env = {"WAYSTATION_MODEL_ENDPOINTS": json.dumps(declared)}
    processes = [WorkerProcess(bench.address, settings, env) for _ in range(options.workers)]
    try:
        await asyncio.gather(*(p.ready() for p in processes))
        yield Fleet(AgentRuntime(bench.client, settings), models)
    finally:
        for process in processes:
            process.kill()


# --- one scenario -------------------------------------------------------------------------


def quota_task(options: Options, model: str, task_id: str, tenant: str) -> AgentTask:
    return AgentTask(
        task=prompt(Job(run_id=task_id, steps=options.calls)),
        model=ModelSettings(name=f"{ENDPOINT}:{model}"),
        max_steps=options.calls + 1,
        approval=ApprovalSettings(policy={"calculator": "never"}),
        tenant=tenant,
    )


async def run_tasks(
    bench: Bench, fleet: Fleet, options: Options, scenario: str, tenants: list[str]
) -> Figures:
    """One task per entry of `tenants` (of that tenant), all started at once, against a
    provider quota of their own; each to its answer."""
    model = fleet.models[scenario]
    provider = options.provider()
    bench.fake.script(lambda body: scripted_reply(options, body), model=model, record=False)
    bench.fake.enforce(provider, model)
    figures = Figures(seconds=0.0, provider=provider)
    ended: list[str] = []

    async def one(number: int, tenant: str) -> None:
        task_id = f"quota-{scenario}-{tenant}-{number}-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        try:
            async with asyncio.timeout(options.task_seconds):
                task = quota_task(options, model, task_id, tenant)
                handle = await fleet.runtime.run(task, task_id=task_id)
                starting = time.perf_counter() - started
                outcome = await handle.result()
            if outcome.steps != options.calls:
                raise RuntimeError(f"took {outcome.steps} steps, not {options.calls}")
        except Exception as err:  # a task that fails under the quota is a figure
            figures.failures.append(f"{task_id}: {type(err).__name__}: {err}")
        else:
            latency = time.perf_counter() - started
            figures.latencies.setdefault(tenant, []).append(latency)
            if tenant == "b":  # the few tasks whose latency is a target
                waited = [e for e in await handle.events() if isinstance(e, QuotaGranted)]
                quota = sum(e.waited_seconds for e in waited)
                queued, model_calls = await history_times(bench, task_id)
                rest = latency - starting - quota
                parts = Parts(starting, quota, rest, queued, model_calls)
                figures.parts.setdefault(tenant, []).append(parts)
        ended.append(task_id)

    start = time.perf_counter()
    jobs = asyncio.gather(*(one(n, tenant) for n, tenant in enumerate(tenants)))
    progress = asyncio.create_task(report_progress(provider, ended, len(tenants), start))
    try:
        await jobs
    finally:
        progress.cancel()
    figures.seconds = time.perf_counter() - start
    counts = provider.counts
    say(
        f"  {scenario}: {len(tenants)} tasks in {figures.seconds:.0f} s, "
        f"{len(figures.failures)} failed; {counts.accepted} calls served, "
        f"{counts.refused} refused"
    )
    if figures.failures:
        say(f"  the first failure: {figures.failures[0][:300]}")
    return figures


async def report_progress(
    provider: ProviderQuota, ended: list[str], tasks: int, start: float
) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_SECONDS)
        counts = provider.counts
        say(
            f"  {time.perf_counter() - start:.0f} s: {len(ended)} of {tasks} tasks ended; "
            f"{counts.accepted} calls served, {counts.refused} refused"
        )


async def history_times(bench: Bench, task_id: str) -> tuple[float, float]:
    """From a task's history: how long its workflow and activity tasks waited for a worker,
    and how long its model calls ran (started to closed)."""
    history = await bench.client.get_workflow_handle(task_id).fetch_history()
    queued = model_calls = 0.0
    scheduled: dict[int, tuple[float, str]] = {}
    started: dict[int, float] = {}
    for event in history.events:
        at = event.event_time.ToDatetime().timestamp()
        kind = event.WhichOneof("attributes") or ""
        if kind == "workflow_task_scheduled_event_attributes":
            scheduled[event.event_id] = (at, "workflow")
        elif kind == "workflow_task_started_event_attributes":
            workflow_task = event.workflow_task_started_event_attributes
            queued += at - scheduled[workflow_task.scheduled_event_id][0]
        elif kind == "activity_task_scheduled_event_attributes":
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = (at, name)
        elif kind == "activity_task_started_event_attributes":
            activity_task = event.activity_task_started_event_attributes
            queued += at - scheduled[activity_task.scheduled_event_id][0]
            started[activity_task.scheduled_event_id] = at
        elif kind in (
            "activity_task_completed_event_attributes",
            "activity_task_failed_event_attributes",
        ):
            closed = getattr(event, kind).scheduled_event_id
            at_start = started.get(closed)
            if at_start is not None and scheduled[closed][1] == "call_llm":
                model_calls += at - at_start
    return queued, model_calls


# --- the figures --------------------------------------------------------------------------


def quota_rows(options: Options, mode: str, figures: Figures) -> list[Row]:
    counts = figures.provider.counts
    minutes = figures.seconds / 60
    label = f"quota, {mode} limits declared, {options.tasks} tasks on {options.workers} workers"
    shares = {
        "input tokens": counts.input_tokens / minutes / options.input_tpm,
        "requests": counts.accepted / minutes / options.rpm,
    }
    if options.output_tpm is not None:
        shares["output tokens"] = counts.output_tokens / minutes / options.output_tpm
    binding = max(shares, key=lambda kind: shares[kind])
    per_call = counts.input_tokens / counts.accepted if counts.accepted else 0.0
    each = ", ".join(f"{kind} {share:.2f}" for kind, share in shares.items())
    needed = sum(map(len, figures.latencies.values())) * options.calls  # by the answered tasks
    rows = [
        Row(
            f"{label}: useful throughput a minute ÷ the quota",
            f"{shares[binding]:.2f}",
            f"≥ 0.9; {each} ({counts.accepted} calls served for {needed} needed, "
            f"{counts.input_tokens:,} input "
            f"tokens, {per_call:,.0f} a call, in {figures.seconds:.0f} s; quota "
            f"{options.rpm} requests and {options.input_tpm:,} input tokens a minute)",
        ),
        Row(
            f"{label}: refused calls ÷ calls",
            f"{counts.refused_share:.3f}",
            f"≤ 0.01 ({counts.refused} of {counts.calls})",
        ),
        Row(f"{label}: failed tasks", str(len(figures.failures)), "0"),
    ]
    for tenant, latencies in sorted(figures.latencies.items()):
        rows.append(
            Row(
                f"{label}: task latency, tenant {tenant}, p50 / p95",
                f"{median(latencies):.1f} / {percentile(latencies, 0.95):.1f} s",
                f"{len(latencies)} tasks answered",
            )
        )
    return rows


def fairness_row(options: Options, mode: str, alone: Figures, together: Figures) -> Row:
    alone_b = alone.latencies.get("b", [])
    beside_b = together.latencies.get("b", [])
    if not alone_b or not beside_b:
        return Row(
            f"fairness, {mode} limits declared: tenant b's median latency",
            "n/a",
            f"b's tasks failed ({len(alone.failures)} alone, {len(together.failures)} beside a)",
        )
    ratio = median(beside_b) / median(alone_b)
    failed = len(together.failures)
    return Row(
        f"fairness, {mode} limits declared: tenant b's median latency beside a's "
        f"{options.fair_a} tasks ÷ b's {options.fair_b} alone",
        f"{ratio:.2f}",
        f"≤ 1.5 ({median(beside_b):.1f} s / {median(alone_b):.1f} s; {failed} tasks failed; "
        f"median parts beside / alone: {_parts(together)} / {_parts(alone)})",
    )


def _parts(figures: Figures) -> str:
    parts = figures.parts.get("b", [])
    if not parts:
        return "n/a"
    starting = median([p.starting for p in parts])
    quota = median([p.quota for p in parts])
    rest = median([p.rest for p in parts])
    queued = median([p.queued for p in parts])
    model_calls = median([p.model_calls for p in parts])
    return (
        f"starting {starting:.1f} s, quota {quota:.1f} s, the rest {rest:.1f} s (queued "
        f"{queued:.1f} s, model calls {model_calls:.1f} s)"
    )


# --- the run ------------------------------------------------------------------------------


async def measure_mode(bench: Bench, options: Options, mode: str) -> list[Row]:
    rows: list[Row] = []
    async with fleet(bench, options, mode) as workers:
        if "quota" in options.parts:
            say(f"{mode} quotas: {options.tasks} tasks of {options.calls} calls at once ...")
            tenants = ["a" if n % 2 == 0 else "b" for n in range(options.tasks)]
            figures = await run_tasks(bench, workers, options, "quota", tenants)
            rows += quota_rows(options, mode, figures)
        if "fairness" in options.parts:
            say(f"{mode} quotas: tenant b's {options.fair_b} tasks alone ...")
            alone = await run_tasks(bench, workers, options, "alone", ["b"] * options.fair_b)
            say(
                f"{mode} quotas: tenant a's {options.fair_a} tasks and b's {options.fair_b} "
                "started together ..."
            )
            both = ["a"] * options.fair_a + ["b"] * options.fair_b
            together = await run_tasks(bench, workers, options, "together", both)
            rows.append(fairness_row(options, mode, alone, together))
    return rows


async def measure(bench: Bench, options: Options | None = None) -> list[Row]:
    options = options or Options()
    rows: list[Row] = []
    for mode in options.modes:
        rows += await measure_mode(bench, options, mode)
    return rows


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        tasks=args.tasks,
        calls=args.calls,
        workers=args.workers,
        rpm=args.rpm,
        input_tpm=args.input_tpm,
        output_tpm=args.output_tpm,
        reply_bytes=args.reply_bytes,
        model_seconds=args.model_seconds,
        fair_a=args.fair_a,
        fair_b=args.fair_b,
        parts=tuple(args.parts),
        modes=tuple(args.modes),
        task_seconds=args.task_seconds,
    )


def main() -> None:
    defaults = Options()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=defaults.tasks)
    parser.add_argument("--calls", type=int, default=defaults.calls, help="model calls a task")
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--rpm", type=int, default=defaults.rpm, help="requests a minute")
    parser.add_argument("--input-tpm", type=int, default=defaults.input_tpm)
    parser.add_argument("--output-tpm", type=int, default=defaults.output_tpm)
    parser.add_argument("--reply-bytes", type=int, default=defaults.reply_bytes)
    parser.add_argument("--model-seconds", type=float, default=defaults.model_seconds)
    parser.add_argument("--fair-a", type=int, default=defaults.fair_a)
    parser.add_argument("--fair-b", type=int, default=defaults.fair_b)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--task-seconds", type=float, default=defaults.task_seconds)
    options = options_from(parser.parse_args())

    async def run() -> None:
        async with bench_environment() as bench:
            rows = await measure(bench, options)
        print_table(rows)

    asyncio.run(run())


if __name__ == "__main__":
    main()
