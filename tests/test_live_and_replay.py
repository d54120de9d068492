"""Events are the same live and on replay (issue 12, item 7): the log is a pure function of
history, also for steps whose calls run as local activities (the calculator), whose
results a live run and a replay see in different activations."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pydantic import BaseModel
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.helpers import (
    agent_task,
    of_type,
    pending_requests,
    run_histories,
    same_unless_restamped,
)
from waystation.activities.builtin_tools import builtin_registry
from waystation.activities.tools import Tool, ToolContext, ToolRegistry
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker
from waystation.worker import WORKFLOW_RUNNER
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentEvent
from waystation.workflows.models import ApprovalSettings, Decision

# Longer than 80% of the workflow task timeout (3 s): the worker running it live heartbeats
# its workflow task, so the result comes in a later workflow task than on replay.
SLOW_SECONDS = 3.0


class SumArgs(BaseModel):
    numbers: list[float]


async def slow_sum(args: SumArgs, context: ToolContext) -> str:
    await asyncio.sleep(SLOW_SECONDS)  # the workload itself, not a wait for a state
    return f"{sum(args.numbers):g}"


def with_a_slow_local_tool() -> ToolRegistry:
    registry = builtin_registry()
    registry.register(
        Tool(
            name="slow_sum",
            description="Add.",
            arguments=SumArgs,
            function=slow_sum,
            retry_safe=True,
            local=True,
        )
    )
    return registry


STEPS: list[list[tuple[str, dict[str, Any]]]] = [
    [("calculator", {"expression": "1 + 1"})],
    [("calculator", {"expression": "2 * 3"}), ("calculator", {"expression": "4 + 4"})],
    [("slow_sum", {"numbers": [1, 2, 3]}), ("calculator", {"expression": "2^10"})],
    [("calculator", {"expression": "7 - 2"}), ("calculator", {"expression": "9 / 3"})],
    [("calculator", {"expression": "(12 + 30) * 7"})],
]


def calculating(body: dict[str, Any]) -> Reply:
    step = sum(1 for m in body["messages"] if m["role"] == "assistant")
    # Slow enough that tokens stream live: their signals land around the local activities.
    if step == len(STEPS):
        return text("computed it all", chunk_delay=0.05)
    return tools(*STEPS[step], content=f"working on step {step + 1} now", chunk_delay=0.05)


async def test_the_live_stream_equals_the_log_a_fresh_worker_replays(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(calculating)
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings, registry=with_a_slow_local_tool()):
        handle = await runtime.run(agent_task(model, continue_as_new_after_steps=2))
        items = [item async for item in runtime.stream(handle.id, topics=["events"])]
        assert (await asyncio.wait_for(handle.result(), 60)).result == "computed it all"
    assert all(item.topic == "events" for item in items), [i.data.type for i in items]
    live: list[AgentEvent] = [item.data for item in items]  # type: ignore[misc]
    assert len(of_type(live, "observation")) == 8 and live[-1].type == "done"

    # The worker that ran the task is gone; a fresh one, with nothing cached, replays every
    # run of the chain to answer the events query. The reader is given no storage, so it
    # cannot take the closed runs' events from the archive (written from the live run).
    unarchived = settings.model_copy(update={"data_dir": settings.data_dir / "elsewhere"})
    async with running_worker(dev_env.client, settings, registry=with_a_slow_local_tool()):
        replayed = await AgentRuntime(dev_env.client, unarchived).get(handle.id).events()
    await same_unless_restamped(dev_env.client, handle.id, live, replayed)


async def test_a_query_waiting_with_an_approval_leaves_the_approved_steps_log_as_replayed(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """The approval of a local call and a query wait at the server while no worker polls,
    so the next worker gets both in one workflow task. The SDK answers the query while the
    call runs and completes the task with the call's marker and the answer, asking for a
    new task: live, the workflow gets the result one workflow task later than a replay,
    which takes it from the task whose completion holds the marker. Events stamped with
    the time and history length of the moment they were appended differed here (the
    observation: 32 live, 23 replayed), unless the call outlasted the task's heartbeat."""
    observed = threading.Event()
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "6 * 7"})),
            # Held until the stream has shown the observation: the task is still running,
            # so the worker that ran it live streams it, not a replay.
            Reply(content="it is 42", hold_after_chunks=0, gate=observed),
        ]
    )
    runtime = AgentRuntime(dev_env.client, settings)
    # A long first-chunk clock: the held reply waits on the stream, however busy the machine.
    policy = ApprovalSettings(policy={"calculator": "always"})
    task = agent_task(model, approval=policy, timeout=60)
    async with running_worker(dev_env.client, settings):
        handle = await runtime.run(task)
        [request] = await pending_requests(handle)

    # No worker polls: the approval schedules a workflow task nobody takes, and the query
    # sent after it is held for that task (sent with the Temporal client: our runtime
    # checks with a query first, which nothing answers yet).
    task_workflow = dev_env.client.get_workflow_handle(handle.id)
    await task_workflow.signal(AgentWorkflow.approve, Decision(request_id=request))
    asked = asyncio.create_task(task_workflow.query(AgentWorkflow.state))
    async with running_worker(dev_env.client, settings):
        seen = await asyncio.wait_for(asked, 60)
        items = []
        async for item in runtime.stream(handle.id, topics=["events"]):
            items.append(item)
            if item.data.type == "observation":
                observed.set()
        assert (await asyncio.wait_for(handle.result(), 60)).result == "it is 42"
    live: list[AgentEvent] = [item.data for item in items]  # type: ignore[misc]
    [observation] = of_type(live, "observation")
    assert observation.output == "42" and live[-1].type == "done"
    # The scenario's precondition: the query was answered in the approval's workflow task,
    # after the call was decided and before its result reached the workflow.
    assert request in seen.decisions and seen.last_seq < observation.seq, seen.last_seq

    unarchived = settings.model_copy(update={"data_dir": settings.data_dir / "elsewhere"})
    async with running_worker(dev_env.client, settings):
        replayed = await AgentRuntime(dev_env.client, unarchived).get(handle.id).events()
    await same_unless_restamped(dev_env.client, handle.id, live, replayed)


async def test_every_run_of_a_task_with_local_steps_replays_and_hands_over_alike(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(calculating)
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings, registry=with_a_slow_local_tool()):
        handle = await runtime.run(agent_task(model, continue_as_new_after_steps=2))
        await asyncio.wait_for(handle.result(), 60)
    histories = await run_histories(dev_env.client, handle.id)
    assert len(histories) == 3  # 2 + 2 + 2 steps: two hand-overs, decided alike on replay
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=WORKFLOW_RUNNER,
    )
    for history in histories:
        # Raises on any command that differs from the recorded one, the hand-over included.
        await replayer.replay_workflow(history)
