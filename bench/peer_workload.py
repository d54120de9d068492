"""What our agent and the Temporal peers share in `bench.peers_temporal`: the workload, the
scripted model that plays it on the fake endpoint, the calculator, and Temporal's own count
of a task's history.

The workload: a task of N steps, one model request each; every answer before the last
carries MESSAGE_BYTES of text and one calculator call, the last one is the answer
"done after N steps". The prompt names its run, so one scripted model serves all the runs
of one agent and counts each run's requests: the step a run had reached when it stopped.

The peers' workflow modules import this module passed through Temporal's sandbox, so the
fake's client below is one object, pointed at the fake before any worker starts.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from temporalio.client import Client
from temporalio.worker import Worker

from waystation.activities.builtin_tools import evaluate
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools

MESSAGE_BYTES = 2048
CALCULATOR_DOC = "Evaluate an arithmetic expression such as '2 * (3 + 4)'."
_PROMPT = re.compile(r"run (\S+): (\d+) steps")

# Starts a run and returns its final answer, or raises what stopped it: (workflow id, prompt).
Runner = Callable[[str, str], Awaitable[str]]

# The peers' models reach the fake through this client (no retries: Temporal retries).
FAKE_CLIENT = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-bench", max_retries=0)


@dataclass(frozen=True)
class PeerSetup:
    """How a peer runs, in parts a benchmark may put in different processes: a client with
    the peer's plugins, a worker on a task queue, and one task's run to its answer."""

    name: str
    connect: Callable[[str, Path], Awaitable[Client]]  # (server address, scratch directory)
    worker: Callable[[Client, str], Worker]  # (client, task queue)
    run: Callable[[Client, str, str, str], Awaitable[str]]  # (client, queue, workflow id, prompt)


@asynccontextmanager
async def serve_in_process(setup: PeerSetup, address: str, scratch: Path) -> AsyncIterator[Runner]:
    """The peer's worker in this process, and the runner that starts a task on it."""
    client = await setup.connect(address, scratch)
    queue = f"peer-{setup.name}-{uuid.uuid4().hex[:8]}"

    async def run(workflow_id: str, text: str) -> str:
        return await setup.run(client, queue, workflow_id, text)

    async with setup.worker(client, queue):
        yield run


def point_at(url: str) -> None:
    """Send the peers' model requests to the fake endpoint at `url`."""
    FAKE_CLIENT.base_url = url


@dataclass(frozen=True)
class Job:
    run_id: str
    steps: int


def prompt(job: Job) -> str:
    return f"run {job.run_id}: {job.steps} steps, one calculator call each, then the answer"


def parse_prompt(content: str) -> Job:
    found = _PROMPT.search(content)
    if found is None:
        raise ValueError(f"not a bench prompt: {content[:80]!r}")
    return Job(run_id=found.group(1), steps=int(found.group(2)))


def answer(steps: int) -> str:
    return f"done after {steps} steps"


def calculate(expression: str) -> str:
    return str(evaluate(expression))


def _user_text(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = " ".join(str(part.get("text", "")) for part in content)
        if isinstance(content, str) and _PROMPT.search(content):
            return content
    return ""


class ScriptedWorkload:
    """One agent's model on the fake endpoint: plays the workload, counts requests per run."""

    def __init__(self, fake: FakeOpenAI, name: str) -> None:
        self._served: Counter[str] = Counter()
        # Bodies are not kept: each request resends the whole conversation.
        self.model = fake.script(self._reply, model=name, record=False)

    def served(self, run_id: str) -> int:
        """Model requests the run made: the step it had reached."""
        return self._served[run_id]

    def _reply(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages", [])
        job = parse_prompt(_user_text(messages))
        self._served[job.run_id] += 1
        done = sum(message.get("role") == "tool" for message in messages)
        if done >= job.steps - 1:
            return text(answer(done + 1))
        return tools(("calculator", {"expression": f"{done} + 1"}), content="x" * MESSAGE_BYTES)


async def history_bytes(client: Client, workflow_id: str) -> tuple[int, int]:
    """Temporal's own history size (`history_size_bytes`) summed over every run of the
    workflow (a chain of continue-as-new), and the number of runs."""
    total, runs = 0, 0
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        total += (await handle.describe()).raw_info.history_size_bytes
        runs += 1
        previous = ""
        async for event in handle.fetch_history_events(page_size=1):
            previous = event.workflow_execution_started_event_attributes.continued_execution_run_id
            break  # the first event says which run this one continues
        if not previous:
            return total, runs
        run_id = previous


def failure_text(error: BaseException) -> str:
    """The innermost cause of a failure, as `Kind: message`."""
    while True:
        inner = getattr(error, "cause", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    return f"{type(error).__name__}: {error}"
