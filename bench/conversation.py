"""A conversation of 1,000 turns: `python -m bench.conversation` (`--turns 100` for a quick run).

A default task on a real worker subprocess, the model over HTTP to the fake endpoint. Each
follow-up is a 2 KB message; the model answers it with a 2 KB thought and one calculator
call, then a short answer. The thought streams for a third of a second (32 words, 10 ms
apart), past the first token batch (a message done within it streams no tokens: its
thought event has them all). An answered turn closes its run, and the next message starts
the next run of the same id (signal-with-start), so each run is one turn. Measured:
- history bytes per turn in the first and the last follow-up runs (flat?), and the largest
  run; the seconds each turn took;
- the ms from sending a follow-up to its first token at a subscriber, as `ws say` does it
  (send, then follow the stream from the new turn's offset), at turn 1 and at the last
  turn, against a fresh task's first token (run, then follow from offset 0) measured in
  the same run: fresh tasks before the conversation and after it, their median the
  baseline; beside it, the ms until the model was asked (the fake notes the request).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common import Bench, Measure, Row, run_alone, say
from bench.worker_memory import rss_mb
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import AgentTask, ApprovalSettings, ModelSettings
from waystation.workflows.run import AgentRun
from waystation.workflows.stream import TOKENS_TOPIC, TokenDelta

TURNS = 1000
MESSAGE_BYTES = 2048
FRESH_TASKS = 5  # before the conversation, and as many after it
WINDOW = 10  # turns whose median stands beside the first and the last turn's own figure
THOUGHT_WORDS = 32
CHUNK_DELAY = 0.01
_HEAD = re.compile(r"^((?:turn|fresh) \d+):")


def message(head: str) -> str:
    """A person's 2 KB message that starts with `head` ("turn 7", "fresh 2")."""
    start = f"{head}: "
    return start + "m" * (MESSAGE_BYTES - len(start))


class ConversationModel:
    """A 2 KB thought and a calculator call for each person's message, then a short answer;
    a summary when the runtime compacts older turns. Notes when the first request for each
    message arrives, on this process's clock."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.asked: dict[str, float] = {}
        self.name = fake.script(self._reply, record=False)

    def _reply(self, body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text(f"[summary of {len(body['messages'])} messages]")
        last = body["messages"][-1]
        if last["role"] == "tool":
            return text(f"the answer is {last['content']}")
        found = _HEAD.match(last.get("content") or "")
        head = found.group(1) if found else "?"
        self.asked.setdefault(head, time.perf_counter())
        word = "t" * (MESSAGE_BYTES // THOUGHT_WORDS - 1)
        thought = " ".join([word] * THOUGHT_WORDS)
        call = ("calculator", {"expression": f"{len(self.asked)} + 1"})
        return tools(call, content=thought, chunk_delay=CHUNK_DELAY)

    def task(self, head: str) -> AgentTask:
        return AgentTask(
            task=message(head),
            model=ModelSettings(name=self.name),
            approval=ApprovalSettings(policy={"calculator": "never"}),
        )


@dataclass(frozen=True)
class FirstToken:
    """One message's way to its first token: ms until the model was asked, and until a
    subscriber had the token; and the whole turn's seconds."""

    model_asked_ms: float
    token_ms: float
    seconds: float


async def first_token_at(runtime: AgentRuntime, task_id: str, since: int) -> float:
    """Follow the task's tokens from `since` until the first one arrives: when it did."""
    stream = runtime.stream(task_id, since=since, topics=[TOKENS_TOPIC])
    async with contextlib.aclosing(stream):
        async for item in stream:
            if isinstance(item.data, TokenDelta):
                return time.perf_counter()
    raise RuntimeError(f"task {task_id} ended its stream without a token")


async def fresh_task(runtime: AgentRuntime, model: ConversationModel, head: str) -> FirstToken:
    """A fresh task of the same shape: from run() to its first token at a subscriber."""
    started = time.perf_counter()
    handle = await runtime.run(model.task(head))
    token = await first_token_at(runtime, handle.id, 0)
    await handle.result()
    return timings(model, head, started, token)


async def follow_up(
    handle: TaskHandle, runtime: AgentRuntime, model: ConversationModel, turn: int
) -> FirstToken:
    """Send turn `turn`'s message and follow the new turn's stream to its first token."""
    head = f"turn {turn}"
    started = time.perf_counter()
    await handle.send(message(head))
    if not handle.began_turn or handle.stream_from is None:
        raise RuntimeError(f"turn {turn} did not start a new run: the task had not answered")
    token = await first_token_at(runtime, handle.id, handle.stream_from)
    outcome = await handle.result()
    if outcome.turn != turn:
        raise RuntimeError(f"the answer to turn {turn} came as turn {outcome.turn}")
    return timings(model, head, started, token)


def timings(model: ConversationModel, head: str, started: float, token: float) -> FirstToken:
    return FirstToken(
        model_asked_ms=(model.asked[head] - started) * 1000,
        token_ms=(token - started) * 1000,
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class RunBytes:
    """One run's history bytes; of them its input's (what the run before handed it), and in
    that input the state's bytes and the stream's publishers (its dedup entries)."""

    history: int
    carry: int
    state: int
    publishers: int


async def run_bytes(bench: Bench, task_id: str, runs: int) -> list[RunBytes]:
    """Every run of the task, oldest first, once visibility lists them all closed (it lags)."""
    async with asyncio.timeout(120):
        while True:
            listed = [e async for e in bench.client.list_workflows(f'WorkflowId="{task_id}"')]
            if len(listed) >= runs and all(e.close_time is not None for e in listed):
                break
            await asyncio.sleep(0.5)
    found: list[tuple[float, RunBytes]] = []
    for execution in listed:
        handle = bench.client.get_workflow_handle(task_id, run_id=execution.run_id)
        size = execution.raw_info.history_size_bytes
        if not size:  # this server's visibility does not say: ask for the run itself
            size = (await handle.describe()).raw_info.history_size_bytes
        async for start in handle.fetch_history_events(page_size=1):
            payloads = start.workflow_execution_started_event_attributes.input
            [run] = await bench.client.data_converter.decode(payloads.payloads, [AgentRun])
            break
        carry = run.carry
        state = len(carry.state.model_dump_json()) if carry is not None else 0
        stream = carry.stream if carry is not None else None
        publishers = len(stream.publishers) if stream is not None else 0
        sizes = RunBytes(size, payloads.ByteSize(), state, publishers)
        found.append((execution.start_time.timestamp(), sizes))
    return [run for _, run in sorted(found, key=lambda pair: pair[0])]


async def measure(bench: Bench, turns: int = TURNS) -> list[Row]:
    settings = bench.settings("conversation")
    worker = await WorkerProcess(bench.address, settings).ready()
    try:
        runtime = AgentRuntime(bench.client, settings)
        model = ConversationModel(bench.fake)
        rss_start = rss_mb(worker.pid)
        say(f"conversation: {FRESH_TASKS} fresh tasks (the first-token baseline)")
        fresh = [await fresh_task(runtime, model, f"fresh {n}") for n in range(FRESH_TASKS)]
        say(f"conversation: {turns} follow-ups of {MESSAGE_BYTES}-byte messages")
        handle = await runtime.run(model.task("turn 0"))
        await handle.result()
        done: list[FirstToken] = []
        started = time.perf_counter()
        for turn in range(1, turns + 1):
            done.append(await follow_up(handle, runtime, model, turn))
            if turn % 50 == 0:
                pace = (time.perf_counter() - started) / turn
                say(f"turn {turn}: first token {done[-1].token_ms:.0f} ms, {pace:.2f} s a turn")
        say(f"conversation: {FRESH_TASKS} fresh tasks again")
        fresh += [
            await fresh_task(runtime, model, f"fresh {n}")
            for n in range(FRESH_TASKS, 2 * FRESH_TASKS)
        ]
        rss_end = rss_mb(worker.pid)
        runs = await run_bytes(bench, handle.id, turns + 1)
    finally:
        worker.kill()
    return conversation_rows(turns, done, fresh, runs, (rss_start, rss_end))


def conversation_rows(
    turns: int,
    done: list[FirstToken],
    fresh: list[FirstToken],
    runs: list[RunBytes],
    rss: tuple[float, float],
) -> list[Row]:
    window = min(WINDOW, len(done))
    first, last = done[:window], done[-window:]
    follow_ups = runs[1:]  # run 0 is the task's own first turn
    baseline = statistics.median(f.token_ms for f in fresh)
    asked = statistics.median(f.model_asked_ms for f in fresh)

    def kb(values: list[RunBytes], part: Callable[[RunBytes], int] = lambda r: r.history) -> float:
        return statistics.median(part(r) for r in values) / 1000

    def count(values: list[RunBytes]) -> int:
        return round(statistics.median(r.publishers for r in values))

    middle = len(follow_ups) // 2 - window // 2
    at = {
        "first": follow_ups[:window],
        "middle": follow_ups[middle : middle + window],
        "last": follow_ups[-window:],
    }

    def against(value: FirstToken) -> str:
        return f"{value.token_ms:.0f} ms ({value.token_ms / baseline:.2f}x)"

    def median_of(values: list[FirstToken]) -> FirstToken:
        return FirstToken(
            statistics.median(v.model_asked_ms for v in values),
            statistics.median(v.token_ms for v in values),
            statistics.median(v.seconds for v in values),
        )

    def asked_ms(value: FirstToken) -> str:
        return f"{value.model_asked_ms:.0f}"

    largest = max(range(len(runs)), key=lambda i: runs[i].history)
    name = f"{turns}-turn conversation ({MESSAGE_BYTES} B messages, a tool call a turn)"
    early, late = median_of(first), median_of(last)
    return [
        Row(
            f"{name}: history bytes per turn (a run each), first / middle / last {window} "
            "follow-ups",
            " / ".join(f"{kb(values):.1f}" for values in at.values()) + " KB",
            f"last {kb(at['last']) / kb(at['first']):.2f}x first; "
            f"{len(runs)} runs for {turns + 1} turns",
        ),
        Row(
            f"{name}: of it, the run's input (the carry from the run before)",
            " / ".join(f"{kb(values, lambda r: r.carry):.1f}" for values in at.values()) + " KB",
            "of which the state "
            + " / ".join(f"{kb(values, lambda r: r.state):.1f}" for values in at.values())
            + " KB; the stream's publisher entries (its dedup state, one per model call "
            "that streamed lately) " + " / ".join(str(count(values)) for values in at.values()),
        ),
        Row(
            f"{name}: largest run",
            f"{runs[largest].history / 1000:.1f} KB",
            f"run {largest}; {sum(r.history for r in runs) / 1e6:.1f} MB in all",
        ),
        Row(
            f"{name}: seconds per turn, first / last {window}",
            f"{early.seconds:.2f} / {late.seconds:.2f} s",
            f"worker RSS {rss[0]:.0f} MB at the start, {rss[1]:.0f} MB at the end",
        ),
        Row(
            f"follow-up sent → its first token at a subscriber, turn 1 / turn {turns}",
            f"{against(done[0])} / {against(done[-1])}",
            f"x a fresh task's first token, {baseline:.0f} ms (median of {len(fresh)})",
        ),
        Row(
            f"follow-up sent → its first token, median of the first / last {window} turns",
            f"{against(early)} / {against(late)}",
            f"the model asked after {asked_ms(early)} / {asked_ms(late)} ms; "
            f"a fresh task's after {asked:.0f} ms",
        ),
    ]


def with_turns(turns: int) -> Measure:
    return lambda bench: measure(bench, turns)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    run_alone(with_turns(parser.parse_args().turns))
