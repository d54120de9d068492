"""Worker Versioning, on by default: workers join their Worker Deployment as the version of
their code, the first version becomes current by itself, a task's run stays on the version
it started on, and its new runs (a follow-up turn, a sub-agent) start on the current one
(real worker processes on the dev server, the fake model; each test its own deployment)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.worker_versions import make_current
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.worker.first_version import _polled_by, current_build_id
from waystation.workflows.models import AgentSpec, ModelSettings

Versions = Callable[..., Awaitable[WorkerProcess]]
SHELL = ("run_shell", {"command": "echo ran"})
# A model call's timeout: with both cores busy, 5 s has been too short for a worker process.
CALL_SECONDS = 30


# How often a test asks the server about a deployment: it refuses many requests at once.
ASK_EVERY = 0.5


@pytest.fixture
def deployment() -> str:
    return f"wv-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def version_worker(
    dev_env: WorkflowEnvironment, settings: Settings, deployment: str
) -> AsyncIterator[Versions]:
    """`await version_worker("v1")`: a worker process of the test's deployment, as that
    build id (the same code: only the id differs). All are killed after the test."""
    started: list[WorkerProcess] = []
    address = dev_env.client.service_client.config.target_host

    async def start(build_id: str, agents: str | None = None) -> WorkerProcess:
        env = {
            "WAYSTATION_DEPLOYMENT": deployment,
            "WAYSTATION_BUILD_ID": build_id,
            "WAYSTATION_WORKER_VERSIONING": "true",
        }
        if agents is not None:
            env["WAYSTATION_AGENTS"] = agents
        worker = WorkerProcess(address, settings, env)
        started.append(worker)
        return await worker.ready()

    yield start
    for worker in started:
        worker.kill()


async def current_version(client: Client, deployment: str) -> str | None:
    """The current build id; None before the deployment exists (its first worker's poll
    creates it). The server refuses to describe a deployment busy with many requests, as
    while its workers start: asked again then."""
    async with asyncio.timeout(60):
        while True:
            try:
                described = await client.workflow_service.describe_worker_deployment(
                    DescribeWorkerDeploymentRequest(
                        namespace=client.namespace, deployment_name=deployment
                    )
                )
                return current_build_id(described.worker_deployment_info.routing_config)
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return None
                if err.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                    raise
            await asyncio.sleep(ASK_EVERY)


async def promote(client: Client, deployment: str, build_id: str) -> None:
    """Make `build_id` current once the server knows it and all its task queues (it records
    each of a worker's pollers a second or so after their first poll)."""
    async with asyncio.timeout(60):
        while True:
            try:
                described = await client.workflow_service.describe_worker_deployment(
                    DescribeWorkerDeploymentRequest(
                        namespace=client.namespace, deployment_name=deployment
                    )
                )
                await make_current(client, deployment, build_id, described.conflict_token)
                return
            except RPCError as err:
                if err.status not in (
                    RPCStatusCode.NOT_FOUND,
                    RPCStatusCode.FAILED_PRECONDITION,
                    RPCStatusCode.RESOURCE_EXHAUSTED,
                ):
                    raise
            await asyncio.sleep(ASK_EVERY)


async def built_by(client: Client, workflow_id: str) -> list[list[str]]:
    """For each run of the workflow id, oldest first: the build id of each workflow task it
    completed."""
    runs = [r async for r in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    runs.sort(key=lambda run: run.start_time)
    seen = []
    for run in runs:
        history = await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()
        completed = [
            e.workflow_task_completed_event_attributes
            for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")
        ]
        seen.append([c.deployment_version.build_id for c in completed])
    return seen


async def until_runs(client: Client, workflow_id: str, count: int) -> list[list[str]]:
    """The runs' build ids once there are `count` runs, all closed (visibility lags)."""
    async with asyncio.timeout(60):
        while True:
            runs = [r async for r in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
            if len(runs) >= count and all(r.close_time is not None for r in runs):
                return await built_by(client, workflow_id)
            await asyncio.sleep(0.1)


async def test_the_first_worker_makes_its_version_current_and_a_later_one_waits_for_a_promote(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    deployment: str,
    version_worker: Versions,
) -> None:
    client = dev_env.client
    first = await version_worker("v1")
    async with asyncio.timeout(60):
        while "version v1 is now the current version" not in first.log.read_text():
            await asyncio.sleep(0.05)
    assert await current_version(client, deployment) == "v1"
    second = await version_worker("v2")
    async with asyncio.timeout(60):
        while "version v2 is not current" not in second.log.read_text():
            await asyncio.sleep(0.05)
    said = [line for line in second.log.read_text().splitlines() if "is not current" in line]
    assert said == [
        "version v2 is not current (current: v1): serving the tasks pinned to it; "
        "`ws deploy promote v2` to make it current"
    ]
    assert await current_version(client, deployment) == "v1"
    # New tasks run on the current version only, though both versions' workers poll.
    runtime = AgentRuntime(client, settings)
    for n in range(3):
        handle = await runtime.run(
            agent_task(fake_openai.script([text(f"done {n}")]), timeout=CALL_SECONDS)
        )
        assert (await handle.result()).result == f"done {n}"
        [run] = await built_by(client, handle.id)
        assert set(run) == {"v1"}


async def test_a_worker_whose_current_version_has_no_worker_left_makes_its_own_current(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    deployment: str,
    version_worker: Versions,
) -> None:
    """As after a deploy that replaced every worker, or a new build on a laptop whose
    embedded server remembers the last one: new tasks would otherwise wait for ever."""
    client = dev_env.client
    first = await version_worker("v1")
    async with asyncio.timeout(60):
        while await current_version(client, deployment) != "v1":
            await asyncio.sleep(ASK_EVERY)
    first.kill()
    # The tests' dev server forgets a stopped worker's polls after 10 s.
    async with asyncio.timeout(60):
        while await _polled_by(client, settings.task_queue, deployment, "v1"):
            await asyncio.sleep(ASK_EVERY)
    second = await version_worker("v2")
    async with asyncio.timeout(60):
        while "version v2 is now the current version" not in second.log.read_text():
            await asyncio.sleep(0.05)
    assert f"no worker of version v1 polls task queue {settings.task_queue!r}" in (
        second.log.read_text()
    )
    assert await current_version(client, deployment) == "v2"
    runtime = AgentRuntime(client, settings)
    handle = await runtime.run(agent_task(fake_openai.script([text("done")]), timeout=CALL_SECONDS))
    assert (await handle.result()).result == "done"
    [run] = await built_by(client, handle.id)
    assert set(run) == {"v2"}


@pytest.mark.long(minutes=1)
async def test_after_a_promote_pinned_runs_stay_and_new_runs_start_on_the_new_version(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    deployment: str,
    version_worker: Versions,
) -> None:
    client = dev_env.client
    child_model = fake_openai.script([text("child done")])
    helper = AgentSpec(
        name="helper",
        description="the helper",
        model=ModelSettings(name=child_model, request_timeout_seconds=CALL_SECONDS),
    )
    agents = json.dumps([helper.model_dump(mode="json")])
    await version_worker("v1", agents)
    # The client defines the agent as the workers do: a task holds what it may call.
    runtime = AgentRuntime(client, settings.model_copy(update={"agents": agents}))
    # Waits for approval on v1, then runs its shell call.
    waiting = await runtime.run(
        agent_task(
            fake_openai.script([tools(SHELL), text("approved and ran")]), timeout=CALL_SECONDS
        )
    )
    # Waits for approval on v1, then starts a sub-agent.
    parent = await runtime.run(
        agent_task(
            fake_openai.script(
                [tools(SHELL), tools(("agent__helper", {"task": "help"})), text("parent done")]
            ),
            timeout=CALL_SECONDS,
        )
    )
    # Answers on v1; its follow-up comes after the promote.
    answered = await runtime.run(
        agent_task(
            fake_openai.script([text("first answer"), text("second answer")]),
            timeout=CALL_SECONDS,
        )
    )
    assert (await answered.result()).result == "first answer"
    await pending_requests(waiting)
    await pending_requests(parent)

    await version_worker("v2", agents)
    await promote(client, deployment, "v2")

    await waiting.approve()
    assert (await waiting.result()).result == "approved and ran"
    [waiting_run] = await until_runs(client, waiting.id, 1)
    assert set(waiting_run) == {"v1"}

    followed = await answered.send("and then?")
    assert (await followed.result()).result == "second answer"
    [before, after] = await until_runs(client, answered.id, 2)
    assert set(before) == {"v1"} and set(after) == {"v2"}

    await parent.approve()
    assert (await parent.result()).result == "parent done"
    [parent_run] = await until_runs(client, parent.id, 1)
    assert set(parent_run) == {"v1"}
    [child_id] = [c.task_id for c in (await parent.state()).children.values()]
    # The sub-agent's first run inherits its caller's v1 and moves at once; the rest is v2.
    [inherited, current] = await until_runs(client, child_id, 2)
    assert inherited == ["v1"] and set(current) == {"v2"}
