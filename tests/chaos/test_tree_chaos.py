"""Chaos across trees of agents: SIGKILLed workers never start a child twice or repeat a
side effect, and every tree ends done.

Three parents each call three sub-agents in one step (child workflows whose ids derive
from the parent's id, step and call id), then append a line to a file and answer. Each
child appends a line through the ledger (write_file), appends another by a shell command
(run_shell), and answers. Real worker subprocesses, caching fewer tasks than run, are
SIGKILLed at moments the test proves: inside the model stream of the call that starts a
parent's children, inside a child's model stream, every worker at once while a child's
shell command runs, one picked at random once the children's model has answered a
randomly chosen number of requests, and inside a parent's model stream after its
children answered. Afterwards Temporal holds exactly one execution per derived child id
and no other child, every line stands once in its file, every tree ended done, and the
history of every parent and child replays.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.chaos.workload import (
    SLOW_STREAM,
    WORDS,
    Crew,
    Gates,
    effects,
    replay_all,
    side_effect_step,
    until_file,
)
from tests.helpers import agent_task
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.proc import pid_with_local_port
from waystation.workflows.models import AgentSpec, AgentTask, ApprovalSettings, ModelSettings

PARENTS = (0, 1, 2)
CHILDREN = (0, 1, 2)
AGENT = "worker"
SEED = 31  # which worker dies at the random moment, and when
CACHED_TASKS = 4  # fewer than the twelve tasks that run: evicted runs replay
HELD_PARENT_START = 0  # its call that starts the children is held until a worker dies
HELD_PARENT_AFTER = 2  # its call after the children answered is held until a worker dies
# A held stream outlasts a kill and a retry; a dead worker's call is retried after its
# heartbeat timeout, not this.
MODEL_TIMEOUT = 30
_CHILD = re.compile(r"^child (\d+)$")


def child_index(parent: int, child: int) -> int:
    """The child's number in the workload's files (effects-<n>.txt, task<n>-a/-b)."""
    return 10 * (parent + 1) + child


HELD_CHILD_STREAM = child_index(2, 0)  # its first model stream is held until a worker dies
HELD_CHILD_TOOL = child_index(1, 1)  # its shell command waits while every worker dies


def child_answer(index: int) -> str:
    return f"child {index} finished"


def expected_result(parent: int) -> str:
    answers = "; ".join(child_answer(child_index(parent, c)) for c in CHILDREN)
    return f"tree {parent} finished: {answers}"


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def first_user_message(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def child_model(fake: FakeOpenAI, gates: Gates) -> str:
    """Every child: an append through the ledger, an append by a shell command, the answer;
    each reply a function of its conversation alone (a retry sees the same)."""

    def reply(body: dict[str, Any]) -> Reply:
        found = _CHILD.match(first_user_message(body))
        if found is None:
            return text("this model serves the children only")
        index = int(found.group(1))
        effect = side_effect_step(index, len(tool_results(body)), gates)
        return effect if effect is not None else text(child_answer(index), **SLOW_STREAM)

    return fake.script(reply)


class ParentGates:
    """The parents' model streams a test holds shut: before the children, and after them."""

    def __init__(self) -> None:
        self.starting: dict[int, threading.Event] = {}
        self.after_children: dict[int, threading.Event] = {}

    def release_all(self) -> None:
        for gate in [*self.starting.values(), *self.after_children.values()]:
            gate.set()


def parent_model(fake: FakeOpenAI, parent: int, gates: ParentGates) -> str:
    """A parent: its three children in one step, then a line of its own, then the answer."""

    def reply(body: dict[str, Any]) -> Reply:
        results = tool_results(body)
        slow: dict[str, Any] = {"chunk_delay": 0.03}
        if not results:
            if parent in gates.starting:
                slow = {"hold_after_chunks": 5, "gate": gates.starting[parent]}
            calls = [
                (f"agent__{AGENT}", {"task": f"child {child_index(parent, c)}"}) for c in CHILDREN
            ]
            return tools(*calls, content=WORDS, **slow)
        if len(results) == len(CHILDREN):
            if parent in gates.after_children:
                slow = {"hold_after_chunks": 5, "gate": gates.after_children[parent]}
            line = {"path": f"scratch/tree-{parent}.txt", "content": f"tree{parent}\n"}
            return tools(("write_file", {**line, "append": True}), content=WORDS, **slow)
        answers = "; ".join(results[: len(CHILDREN)])
        return text(f"tree {parent} finished: {answers}", **slow)

    return fake.script(reply)


def tree_settings(settings: Settings, child_model_name: str) -> Settings:
    """The test's settings, offering the `worker` sub-agent (to its worker processes too)."""
    spec = AgentSpec(
        name=AGENT,
        description="does one child's part",
        model=ModelSettings(
            name=child_model_name,
            request_timeout_seconds=MODEL_TIMEOUT,
            first_chunk_timeout_seconds=MODEL_TIMEOUT,
        ),
    )
    agents = json.dumps([spec.model_dump(mode="json", exclude_defaults=True)])
    return settings.model_copy(update={"agents": agents})


def parent_task(model: str, parent: int) -> AgentTask:
    policy = {"run_shell": "never"}  # the children inherit it
    approval = ApprovalSettings(policy=policy)
    return agent_task(model, task=f"tree {parent}", approval=approval, timeout=MODEL_TIMEOUT)


async def held_stream_owner(
    fake: FakeOpenAI,
    model: str,
    asks: Callable[[dict[str, Any]], bool],
    crew: Crew,
    within: float = 120,
) -> int:
    """The worker whose request of `model` (one `asks` picks out) is held open after 5
    chunks: the crew's process that owns the request's connection (the latest such
    request, so a retry of one that timed out counts)."""
    async with asyncio.timeout(within):
        while True:
            for body, chunks, port in reversed(fake.request_log(model)):
                if asks(body) and chunks >= 5:
                    owner = pid_with_local_port(port, crew.pids())
                    if owner is not None:
                        return owner
            await asyncio.sleep(0.05)


CHILD_REQUESTS = len(PARENTS) * len(CHILDREN) * 3  # each child: two tool calls, an answer


def child_requests_made(fake: FakeOpenAI, model: str) -> int:
    """How many of the children's distinct requests (a child's call at some step, a retry
    of it not counted again) the model has answered."""
    made = {(first_user_message(b), len(tool_results(b))) for b, _, _ in fake.request_log(model)}
    return len(made)


async def until_child_requests(
    fake: FakeOpenAI, model: str, count: int, within: float = 120
) -> None:
    async with asyncio.timeout(within):
        while child_requests_made(fake, model) < count:
            await asyncio.sleep(0.05)


async def executions(client: Client, query: str) -> list[str]:
    """The workflow ids of every execution the query lists, once every one is closed."""
    async with asyncio.timeout(60):
        while True:
            listed = [e async for e in client.list_workflows(query)]
            if listed and all(e.close_time is not None for e in listed):
                return sorted(e.id for e in listed)
            await asyncio.sleep(0.2)


@pytest.mark.long(minutes=1)
async def test_sigkilled_workers_start_every_child_once_and_every_tree_ends_done(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    client = dev_env.client
    gates = Gates(settings.workspace_dir)
    child_stream = gates.hold_stream(HELD_CHILD_STREAM)
    gates.hold_tool(HELD_CHILD_TOOL)
    held = ParentGates()
    start_stream = held.starting[HELD_PARENT_START] = threading.Event()
    after_stream = held.after_children[HELD_PARENT_AFTER] = threading.Event()
    children_model = child_model(fake_openai, gates)
    tree = tree_settings(settings, children_model)
    runtime = AgentRuntime(client, tree)
    crew = Crew(client.service_client.config.target_host, tree, 2, CACHED_TASKS)
    await crew.start()
    models = {p: parent_model(fake_openai, p, held) for p in PARENTS}
    handles = [
        await runtime.run(parent_task(models[p], p), task_id=f"tree-chaos-{p}") for p in PARENTS
    ]
    results = asyncio.gather(*(h.result() for h in handles))
    chance = random.Random(SEED)

    def child_asks(index: int) -> Callable[[dict[str, Any]], bool]:
        return lambda body: first_user_message(body) == f"child {index}"

    try:
        # 1. Inside the model stream of the call that starts a parent's children.
        owner = await held_stream_owner(
            fake_openai, models[HELD_PARENT_START], lambda body: True, crew
        )
        await crew.kill(owner, "inside the call that starts a parent's children", start_stream.set)
        # 2. Inside a child's model stream.
        owner = await held_stream_owner(
            fake_openai, children_model, child_asks(HELD_CHILD_STREAM), crew
        )
        await crew.kill(owner, "inside a child's model stream", child_stream.set)
        # 3. Every worker at once, while a child's shell command runs: every parent and child
        # still running is replayed from its history by workers that never saw it.
        await until_file(gates.tool_pid_file(HELD_CHILD_TOOL), within=120)
        await crew.kill_all(
            "every worker, inside a child's tool", lambda: gates.release_tool(HELD_CHILD_TOOL)
        )
        # 4. A worker picked at random, once the children's model has answered a number of
        # requests picked at random among those still to come.
        # Retries are not counted, and it waits for no more than are still to come (by then
        # the children may be nearly done).
        made = child_requests_made(fake_openai, children_model)
        more = min(chance.randint(1, 6), CHILD_REQUESTS - made)
        await until_child_requests(fake_openai, children_model, made + more)
        victim = chance.choice(crew.pids())
        await crew.kill(victim, "a random worker, at a random child request")
        # 5. Inside a parent's model stream after its children answered.
        owner = await held_stream_owner(
            fake_openai, models[HELD_PARENT_AFTER], lambda body: bool(tool_results(body)), crew
        )
        moment = "inside a parent's call after its children answered"
        await crew.kill(owner, moment, after_stream.set)
        outcomes = await asyncio.wait_for(results, 240)
        states = [await handle.state() for handle in handles]  # a worker answers
    finally:
        gates.release_all()
        held.release_all()
        crew.stop()

    assert [o.result for o in outcomes] == [expected_result(p) for p in PARENTS]
    child_handles: list[TaskHandle] = []
    for p, handle, state in zip(PARENTS, handles, states, strict=True):
        derived = sorted(f"{handle.id}/1/call_1_{c}" for c in CHILDREN)
        # Temporal started each derived id once, and no other child of this parent.
        assert await executions(client, f'ParentWorkflowId="{handle.id}"') == derived
        for child_id in derived:
            assert await executions(client, f'WorkflowId="{child_id}"') == [child_id]
        assert sorted(c.task_id for c in state.children.values()) == derived
        assert {c.status for c in state.children.values()} == {"done"}
        child_handles += [runtime.get(child_id) for child_id in derived]
        tree_lines = (settings.workspace_dir / "scratch" / f"tree-{p}.txt").read_text()
        assert tree_lines.splitlines() == [f"tree{p}"]
        for c in CHILDREN:
            index = child_index(p, c)
            assert effects(settings, index) == [f"task{index}-a", f"task{index}-b"], index
    replayed = await replay_all(client, [*handles, *child_handles])
    print(
        f"\ntree chaos: {len(PARENTS)} parents x {len(CHILDREN)} children, {len(crew.kills)} "
        f"kills ({'; '.join(crew.kills)}), {replayed} histories replayed"
    )
    assert len(crew.kills) == 5
