"""Deploying new workflow code while tasks wait and run (issue 42), with real worker
processes on the dev server and a Worker Deployment of each test's own.

Version 2 (tests/rollout/code.py) cannot replay version 1's histories. Runs started on
version 1 finish there; runs started after version 2 is promoted (a follow-up turn, a
sub-agent, a new task) run on version 2. Workers of both versions are SIGKILLed during the
roll-out. `ws deploy status` shows version 1's tasks drain to zero, then `ws deploy retire`
retires it (waystation.client.deploys). A compatible change behind `workflow.patched`
reaches the runs in flight when its build replaces their version's workers. `-s` shows what
a deploy costs: promote to the first task on version 2, and version 1's drain time.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.helpers import agent_task, pending_requests, run_histories
from tests.rollout.code import (
    AUDIT_ACTIVITY,
    WARM_UP_ACTIVITY,
    AgentWorkflowV1_1,
    AgentWorkflowV2,
)
from tests.rollout.deployment_api import Deployment, failed_tasks, task_builds
from waystation.client import deploys
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.deploys import DeployRefusedError, PinnedTasks, VersionStatus
from waystation.client.handle import TaskHandle
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentSpec, ApprovalSettings, ModelSettings

V1 = None  # `ws worker` itself: today's workflow code
V1_1 = "tests.rollout.v1_1_worker"
V2 = "tests.rollout.v2_worker"
CODE: dict[str, type[AgentWorkflow]] = {"v1": AgentWorkflow, "v2": AgentWorkflowV2}
WAITING, RUNNING = 20, 10
LATE = WAITING + RUNNING  # the index of the task started after the promote
DELEGATING = WAITING  # the first running task calls a sub-agent once released
HELD_AFTER_CHUNKS = 2
INDEX = re.compile(r"rollout task (\d+)")


class Fleet:
    """The worker processes of one deployment, by build id; all killed at the end."""

    def __init__(self, client: Client, settings: Settings, deployment: str) -> None:
        self.address = client.service_client.config.target_host
        self.settings = settings
        self.deployment = deployment
        self.workers: dict[str, list[WorkerProcess]] = {}

    async def start(self, module: str | None, build_id: str) -> WorkerProcess:
        env = {
            "WAYSTATION_DEPLOYMENT": self.deployment,
            "WAYSTATION_BUILD_ID": build_id,
            "WAYSTATION_WORKER_VERSIONING": "true",
        }
        worker = WorkerProcess(self.address, self.settings, env, module=module)
        self.workers.setdefault(build_id, []).append(worker)
        return await worker.ready()

    def kill(self, build_id: str) -> None:
        """SIGKILL every worker of the version, like machines that crash."""
        for worker in self.workers.pop(build_id, []):
            worker.kill()

    def stop(self) -> None:
        for build_id in list(self.workers):
            self.kill(build_id)


def index_of(body: dict[str, Any]) -> int:
    for message in body["messages"]:
        if message["role"] == "user" and (found := INDEX.search(str(message["content"]))):
            return int(found[1])
    raise AssertionError(f"no task index in {body['messages']}")


def tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "tool")


def appended(index: int) -> tuple[str, dict[str, Any]]:
    """A side effect through the ledger: one line in the task's own file."""
    line = {"path": f"scratch/effect-{index}.txt", "content": f"task-{index}\n", "append": True}
    return ("write_file", line)


class Models:
    """The fake model of each kind of task. The running tasks' first calls are held open
    until `release` is set, the late task's until `release_late`."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.release = threading.Event()
        self.release_late = threading.Event()
        self.helper = fake.script(lambda _: text("helped"))
        self.waiting = fake.script(self._waiting)
        self.running = fake.script(self._running)

    def _waiting(self, body: dict[str, Any]) -> Reply:
        index = index_of(body)
        if body["messages"][-1]["role"] == "user" and tool_results(body):
            return text(f"followed up {index}")
        if not tool_results(body):
            command = f"echo task-{index} >> scratch/effect-{index}.txt"
            return tools(("run_shell", {"command": command}))
        return text(f"done {index}")

    def _running(self, body: dict[str, Any]) -> Reply:
        index = index_of(body)
        if tool_results(body):
            return text(f"done {index}")
        gate = self.release_late if index == LATE else self.release
        call = ("agent__helper", {"task": "help"}) if index == DELEGATING else appended(index)
        return tools(call, hold_after_chunks=HELD_AFTER_CHUNKS, gate=gate)

    async def until_held(self, indexes: set[int], within: float = 60.0) -> None:
        """Until a call of each of these tasks is provably mid-stream at its gate."""
        async with asyncio.timeout(within):
            while True:
                log = self.fake.request_log(self.running)
                held = {index_of(body) for body, sent, _ in log if sent >= HELD_AFTER_CHUNKS}
                if indexes <= held:
                    return
                await asyncio.sleep(0.05)

    def agents(self) -> str:
        """WAYSTATION_AGENTS: the helper sub-agent."""
        model = ModelSettings(name=self.helper, request_timeout_seconds=30)
        helper = AgentSpec(name="helper", description="helps", model=model)
        return json.dumps([helper.model_dump(mode="json")])


async def start_waiting(runtime: AgentRuntime, models: Models, count: int) -> list[TaskHandle]:
    asks = ApprovalSettings(policy={"run_shell": "always"})
    handles = [
        await runtime.run(agent_task(models.waiting, f"rollout task {i}", approval=asks))
        for i in range(count)
    ]
    for handle in handles:
        await pending_requests(handle)
    return handles


async def start_running(runtime: AgentRuntime, models: Models, indexes: range) -> list[TaskHandle]:
    handles = [
        await runtime.run(agent_task(models.running, f"rollout task {i}", timeout=60))
        for i in indexes
    ]
    await models.until_held(set(indexes))
    return handles


async def until_first_task(client: Client, task_id: str, within: float = 60.0) -> str:
    """The build id of the first workflow task the task's run completed, once it has."""
    async with asyncio.timeout(within):
        while not (
            builds := task_builds(await client.get_workflow_handle(task_id).fetch_history())
        ):
            await asyncio.sleep(0.02)
    return builds[0]


def scheduled(history: WorkflowHistory) -> list[str]:
    """The activity types the run scheduled, in order."""
    kind = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == kind
    ]


async def replays_on(history: WorkflowHistory, code: type[AgentWorkflow]) -> Exception | None:
    replayer = Replayer(workflows=[code], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


async def runs_by_version(client: Client, task_ids: list[str]) -> dict[str, list[WorkflowHistory]]:
    """Every run of these tasks, by the one version that ran all its workflow tasks."""
    runs: dict[str, list[WorkflowHistory]] = {}
    for task_id in task_ids:
        async for history in client.list_workflows(f"WorkflowId = '{task_id}'").map_histories():
            assert failed_tasks(history) == 0, f"{task_id}: a workflow task failed"
            builds = set(task_builds(history))
            assert len(builds) == 1, f"{task_id}: a run moved between versions: {builds}"
            runs.setdefault(builds.pop(), []).append(history)
    return runs


async def check_replays(runs: dict[str, list[WorkflowHistory]]) -> None:
    """Each history replays on its own version's code."""
    for build_id, histories in runs.items():
        for history in histories:
            failure = await replays_on(history, CODE[build_id])
            assert failure is None, f"{history.workflow_id} on {build_id}: {failure}"


async def check_versions(client: Client, started: list[TaskHandle], late: TaskHandle) -> None:
    """The runs started before the promote ran on version 1 only, every later one on version
    2 only (the follow-up's turn of the first task, the late task, the sub-agent the
    delegating task started once released), and each replays on its own version's code."""
    runs = await runs_by_version(client, [h.id for h in [*started, late]])
    assert sorted(h.workflow_id for h in runs["v1"]) == sorted(h.id for h in started)
    assert {h.workflow_id for h in runs["v2"]} == {started[0].id, late.id}
    assert all(WARM_UP_ACTIVITY in scheduled(h) for h in runs["v2"] if "call_llm" in scheduled(h))
    parent = f"ParentWorkflowId = '{started[DELEGATING].id}'"
    [child] = {w.id async for w in client.list_workflows(parent)}
    child_runs = await runs_by_version(client, [child])
    [child_now, *_] = await run_histories(client, child)  # the newest run first
    assert set(task_builds(child_now)) == {"v2"}, child_runs
    # It moves at its first task: its caller's version does none of its work.
    assert not any("call_llm" in scheduled(h) for h in child_runs.get("v1", [])), child_runs
    await check_replays(runs)
    await check_replays(child_runs)
    # Version 2 is the incompatible change: version 1's histories do not replay on it.
    [with_a_call, *_] = [h for h in runs["v1"] if "call_llm" in scheduled(h)]
    assert isinstance(await replays_on(with_a_call, AgentWorkflowV2), NondeterminismError)


def effects(settings: Settings, index: int) -> list[str]:
    path = settings.workspace_dir / "scratch" / f"effect-{index}.txt"
    return path.read_text().splitlines() if path.exists() else []


async def version_status(client: Client, deployment: str, build_id: str) -> VersionStatus:
    """The version as `ws deploy status` shows it."""
    status = await deploys.deployment_status(client, deployment)
    [version] = [v for v in status.versions if v.build_id == build_id]
    return version


async def until_pinned(
    client: Client, deployment: str, build_id: str, pinned: PinnedTasks
) -> VersionStatus:
    """Until `ws deploy status` counts these tasks pinned to the version (visibility lags)."""
    async with asyncio.timeout(30):
        while (version := await version_status(client, deployment, build_id)).pinned != pinned:
            await asyncio.sleep(0.1)
    return version


async def retire(deployment: Deployment, fleet: Fleet, build_id: str) -> tuple[float, float]:
    """`ws deploy status` shows the version drained to zero tasks; its workers stopped, `ws
    deploy retire` retires it. Returns the seconds from its last run's close to the server
    saying it drained, and from its workers' stop to the retirement."""
    client = deployment.client
    await until_pinned(client, deployment.name, build_id, PinnedTasks())
    last_close = await deployment.last_close(build_id)
    async with asyncio.timeout(60):
        while not await deployment.drained(build_id):
            await asyncio.sleep(0.1)
    drained = (datetime.now(UTC) - last_close).total_seconds()
    assert (await version_status(client, deployment.name, build_id)).state == "drained"
    fleet.kill(build_id)
    stopped = time.monotonic()
    async with asyncio.timeout(60):
        while not (await version_status(client, deployment.name, build_id)).retirable:
            await asyncio.sleep(0.2)
    said = await deploys.retire(client, deployment.name, build_id)
    assert said.endswith("is retired (deleted from Temporal)"), said
    return drained, time.monotonic() - stopped


async def roll_out(
    runtime: AgentRuntime, models: Models, deployment: Deployment, fleet: Fleet
) -> tuple[list[TaskHandle], TaskHandle]:
    """Version 2 promoted while version 1's tasks wait and run, workers of both versions
    SIGKILLed meanwhile: every task done. Returns the tasks started on version 1, the task
    started after the promote; prints the seconds from the promote to its first task."""
    waiting = await start_waiting(runtime, models, WAITING)
    running = await start_running(runtime, models, range(WAITING, WAITING + RUNNING))
    await fleet.start(V2, "v2")
    await deployment.until_known("v2")
    promoted = time.monotonic()
    said = await deploys.promote(runtime.client, deployment.name, "v2", None)
    assert said == "version v2 is current now: new tasks start on it (before: v1)"
    late = await runtime.run(agent_task(models.running, f"rollout task {LATE}", timeout=60))
    start_took = time.monotonic() - promoted
    assert await until_first_task(runtime.client, late.id) == "v2"
    first_on_v2 = time.monotonic() - promoted
    every_one = PinnedTasks(waiting=WAITING, running=RUNNING)
    v1 = await until_pinned(runtime.client, deployment.name, "v1", every_one)
    assert v1.state == "draining" and not v1.retirable
    with pytest.raises(DeployRefusedError, match="30 tasks are still pinned to version v1"):
        await deploys.retire(runtime.client, deployment.name, "v1")
    # Version 1's worker dies holding ten model calls, version 2's holding the late task's.
    fleet.kill("v1")
    await models.until_held({LATE})
    fleet.kill("v2")
    await fleet.start(V1, "v1")
    await fleet.start(V2, "v2")
    models.release.set()
    models.release_late.set()
    await asyncio.gather(*(handle.approve() for handle in waiting))
    started = [*waiting, *running]
    outcomes = await asyncio.gather(*(handle.result() for handle in [*started, late]))
    assert [o.result for o in outcomes] == [f"done {i}" for i in range(LATE + 1)]
    print(
        f"\nroll-out: promote -> first task on v2 {first_on_v2:.2f} s "
        f"({start_took:.2f} s of it starting the task)"
    )
    return started, late


async def check_retired_tasks_read_and_follow_up(
    runtime: AgentRuntime, task: TaskHandle, index: int
) -> None:
    """With version 1 retired (no worker of it left to replay its runs), its task still
    reads, from what its run sealed as it closed, and takes a follow-up on version 2."""
    state = await task.state(within=timedelta(seconds=5))
    assert state.status == "done" and state.result == f"done {index}"
    events = await task.events(within=timedelta(seconds=5))
    assert [e.seq for e in events] == list(range(len(events))) and events[-1].type == "done"
    streamed = [i async for i in runtime.stream(task.id)]
    assert streamed[-1].data.type == "done"
    again = await runtime.send(task.id, "and then?")
    assert (await again.result()).result == f"followed up {index}"
    [newest, *_] = await run_histories(runtime.client, task.id)
    assert set(task_builds(newest)) == {"v2"}


@pytest.mark.long(minutes=2)
async def test_an_incompatible_version_rolls_out_while_tasks_wait_and_run_and_workers_die(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    client = dev_env.client
    models = Models(fake_openai)
    served = settings.model_copy(update={"agents": models.agents()})
    (served.workspace_dir / "scratch").mkdir(parents=True)
    deployment = Deployment(client, f"rollout-{uuid.uuid4().hex[:8]}")
    fleet = Fleet(client, served, deployment.name)
    runtime = AgentRuntime(client, served)
    try:
        await fleet.start(V1, "v1")
        # The first version makes itself current (h-core); a promote whether or not it did.
        await deployment.promote("v1")
        started, late = await roll_out(runtime, models, deployment, fleet)
        follow_up = await runtime.send(started[0].id, "and then?")
        assert (await follow_up.result()).result == "followed up 0"

        await check_versions(client, started, late)
        # Each tool's side effect happened once, whoever died meanwhile.
        for index in (*range(WAITING), *range(DELEGATING + 1, LATE + 1)):
            assert effects(served, index) == [f"task-{index}"], index

        drained, retired = await retire(deployment, fleet, "v1")
        await check_retired_tasks_read_and_follow_up(runtime, started[1], 1)
    finally:
        fleet.stop()
    print(
        f"roll-out: v1's last pinned run closed -> drained {drained:.1f} s; "
        f"its workers stopped -> retired {retired:.1f} s"
    )


async def test_a_patched_change_reaches_the_runs_in_flight_when_its_build_replaces_theirs(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """Version 1.1 (a change behind `workflow.patched`) deployed under version 1's build id
    (WAYSTATION_BUILD_ID), its workers replacing version 1's: the tasks pinned to version 1
    that wait for an approval take the change after it; a task started then takes it too.
    Not a new version with the pinned runs moved to it by a versioning override: a pinned
    override goes on through continue-as-new (research §3), so those tasks would stay on it
    at their next turn instead of moving to the current version."""
    client = dev_env.client
    models = Models(fake_openai)
    (settings.workspace_dir / "scratch").mkdir(parents=True)
    deployment = Deployment(client, f"rollout-patch-{uuid.uuid4().hex[:8]}")
    fleet = Fleet(client, settings, deployment.name)
    runtime = AgentRuntime(client, settings)
    try:
        await fleet.start(V1, "v1")
        # The first version makes itself current (h-core); a promote whether or not it did.
        await deployment.promote("v1")
        in_flight = await start_waiting(runtime, models, 2)
        fleet.kill("v1")
        await fleet.start(V1_1, "v1")
        await asyncio.gather(*(handle.approve() for handle in in_flight))
        asks = ApprovalSettings(policy={"run_shell": "always"})
        fresh = await runtime.run(agent_task(models.waiting, "rollout task 2", approval=asks))
        await fresh.approve((await pending_requests(fresh))[0])
        handles = [*in_flight, fresh]
        outcomes = await asyncio.gather(*(handle.result() for handle in handles))
        assert [o.result for o in outcomes] == ["done 0", "done 1", "done 2"]
    finally:
        fleet.stop()
    for index, handle in enumerate(handles):
        [history] = await run_histories(client, handle.id)
        assert set(task_builds(history)) == {"v1"} and failed_tasks(history) == 0
        calls = scheduled(history)
        assert calls.count(AUDIT_ACTIVITY) == 1, calls
        assert calls.index(AUDIT_ACTIVITY) < calls.index("run_tool"), calls
        assert await replays_on(history, AgentWorkflowV1_1) is None
        assert effects(settings, index) == [f"task-{index}"]
