"""`ws deploy` against a real dev server and versioned workers: status shows each version's
workers and pinned tasks and when it can be retired; promote, ramp and rollback move where
new tasks run; retire is refused while tasks are pinned, with their count, and accepted once
the version has drained; check replays the histories in flight against the code here and
names the task, run and event of one that would not replay."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import WorkerDeploymentConfig

import waystation.worker
from tests.helpers import agent_task, pending_requests
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.deploy_check import check
from waystation.client.deploys import DeploymentStatus, VersionStatus, deployment_status
from waystation.client.temporal import DEV_SERVER_TUNING, temporal_binary
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, hang, text, tools
from waystation.testing.servers import DEV_SERVER_STARTUP
from waystation.testing.workers import REPO, running_worker
from waystation.worker import AgentWorker, build_worker
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.notifications import NotificationWorkflow
from waystation.workflows.run import WORKFLOW_TYPE, AgentOutcome, AgentRun

# Versions drain in seconds, not minutes, and a stopped worker is forgotten in seconds while
# a live one, re-polling every 5 s, is always listed (research note r42 §5).
DRAIN_TUNING = {
    "matching.wv.VersionDrainageStatusVisibilityGracePeriod": '"5s"',
    "matching.wv.VersionDrainageStatusRefreshInterval": '"2s"',
    "matching.longPollExpirationInterval": '"5s"',
    "matching.PollerHistoryTTL": '"10s"',
}


def _tuning() -> list[str]:
    flags = list(DEV_SERVER_TUNING)
    for key, value in DRAIN_TUNING.items():
        if not any(flag.startswith(f"{key}=") for flag in flags):
            flags += ["--dynamic-config-value", f"{key}={value}"]
    return flags


@pytest.fixture(scope="module")
async def drain_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=search.REGISTERED,
        dev_server_extra_args=_tuning(),
        dev_server_log_level="error",
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
    )
    async with env:
        yield env


@pytest.fixture
def deployed(settings: Settings) -> Settings:
    """The test's settings in a deployment of its own."""
    return settings.model_copy(
        update={"worker_deployment": f"dep-{uuid.uuid4().hex[:8]}", "worker_versioning": True}
    )


@asynccontextmanager
async def versioned_worker(
    client: Client, settings: Settings, build_id: str
) -> AsyncIterator[AgentWorker]:
    """waystation's worker, joined to the settings' deployment as version `build_id`."""
    config = WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(settings.worker_deployment, build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )

    class Versioned(AgentWorker):
        def __init__(self, *args: Any, **options: Any) -> None:
            super().__init__(*args, **{**options, "deployment_config": config})

    with mock.patch.object(waystation.worker, "AgentWorker", Versioned):
        worker = build_worker(client, settings, identity=worker_name(build_id))
    async with worker:
        yield worker


def worker_name(build_id: str) -> str:
    # This host's name after the '@': a worker elsewhere would make the SQLite ledger refuse.
    return f"{build_id}-{os.getpid()}@{socket.gethostname()}"


async def ws_deploy(env: WorkflowEnvironment, settings: Settings, *args: str) -> tuple[int, str]:
    """`python starter.py deploy ARGS` on the test's task queue and deployment: exit code,
    and stdout then stderr."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYSTATION_"))
    }
    environment.update(
        TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_DEPLOYMENT=settings.worker_deployment,
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "starter.py"),
        "deploy",
        *args,
        cwd=REPO,
        env=environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode() + err.decode()


async def until_version(
    client: Client,
    settings: Settings,
    build_id: str,
    holds: Callable[[VersionStatus], bool],
    within: float = 60,
) -> DeploymentStatus:
    """The deployment's status once `build_id` is listed and `holds` of it (visibility and
    Temporal's view of pollers and drainage catch up in seconds)."""
    async with asyncio.timeout(within):
        while True:
            status = await deployment_status(client, settings.worker_deployment)
            version = next((v for v in status.versions if v.build_id == build_id), None)
            if version is not None and holds(version):
                return status
            await asyncio.sleep(0.2)


async def ran_on(client: Client, task_id: str) -> str:
    """The build id a task's latest run is pinned to."""
    described = await client.get_workflow_handle(task_id).describe()
    info = described.raw_description.workflow_execution_info.versioning_info
    if info.deployment_version.build_id:
        return info.deployment_version.build_id
    return WorkerDeploymentVersion.from_canonical_string(info.version).build_id


@pytest.mark.long(minutes=1.5)
async def test_status_promote_ramp_rollback_and_retire(
    drain_env: WorkflowEnvironment, deployed: Settings, fake_openai: FakeOpenAI
) -> None:
    client = drain_env.client
    runtime = AgentRuntime(client, deployed)
    shell = ("run_shell", {"command": "echo hi"})
    async with versioned_worker(client, deployed, "v1") as first:
        await until_version(client, deployed, "v1", lambda v: bool(v.workers))
        code, said = await ws_deploy(drain_env, deployed, "promote", "v1")
        assert code == 0 and "version v1 is current now" in said and "before: none" in said

        waiting = await runtime.run(agent_task(fake_openai.script([tools(shell), text("ok")])))
        await pending_requests(waiting)
        running = await runtime.run(agent_task(fake_openai.script([hang(120)])))
        status = await until_version(
            client, deployed, "v1", lambda v: (v.pinned.waiting, v.pinned.running) == (1, 1)
        )
        [v1] = status.versions
        assert (v1.state, v1.workers, v1.retirable) == ("current", [worker_name("v1")], False)
        code, said = await ws_deploy(drain_env, deployed, "status", "--json")
        assert code == 0
        shown = json.loads(said[: said.rindex("}") + 1])
        assert shown["current"] == "v1" and shown["versions"][0]["pinned"]["waiting"] == 1

        code, said = await ws_deploy(drain_env, deployed, "promote", "v2")
        assert code == 1 and "has no version v2" in said

        async with versioned_worker(client, deployed, "v2"):
            await until_version(client, deployed, "v2", lambda v: bool(v.workers))
            code, said = await ws_deploy(drain_env, deployed, "promote", "v2", "--ramp", "100")
            assert code == 0 and "100% of new tasks start on it" in said
            ramped = await runtime.run(agent_task(fake_openai.script([text("ramped")])))
            await ramped.result()
            assert await ran_on(client, ramped.id) == "v2"
            code, said = await ws_deploy(drain_env, deployed, "rollback")
            assert code == 0 and "version v2 no longer takes new tasks (it took 100%)" in said
            unramped = await runtime.run(agent_task(fake_openai.script([text("unramped")])))
            await unramped.result()
            assert await ran_on(client, unramped.id) == "v1"

            code, said = await ws_deploy(drain_env, deployed, "promote", "v2")
            assert code == 0 and "version v2 is current now" in said and "before: v1" in said
            code, said = await ws_deploy(drain_env, deployed, "retire", "v1")
            assert code == 1
            assert (
                "2 tasks are still pinned to version v1 (1 waiting for a person, 1 running, "
                "0 parked between turns)" in said
            )
            code, said = await ws_deploy(drain_env, deployed, "status")
            assert code == 0 and "v1  draining" in said and "not yet: 2 tasks" in said

            code, said = await ws_deploy(drain_env, deployed, "rollback")
            assert code == 0 and "version v1 is current again" in said and "before: v2" in said
            back = await runtime.run(agent_task(fake_openai.script([text("back")])))
            await back.result()
            assert await ran_on(client, back.id) == "v1"
            code, said = await ws_deploy(drain_env, deployed, "promote", "v2")
            assert code == 0

            for task in (waiting, running):
                await client.get_workflow_handle(task.id).terminate("the test is done with it")
            await first.shutdown()
            await until_version(client, deployed, "v1", lambda v: not v.workers)
            code, said = await ws_deploy(drain_env, deployed, "rollback")
            assert code == 1 and "no live worker of version v1 polls" in said

            status = await until_version(client, deployed, "v1", lambda v: v.retirable)
            # `back` and `unramped` answered on v1: a follow-up to either would query v1.
            assert [v.answered_runs for v in status.versions if v.build_id == "v1"] == [2]
            code, said = await ws_deploy(drain_env, deployed, "retire", "v1")
            assert code == 0 and "version v1 of deployment" in said and "is retired" in said
            status = await deployment_status(client, deployed.worker_deployment)
            assert [v.build_id for v in status.versions] == ["v2"]


FIRST_TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


@workflow.defn(name=WORKFLOW_TYPE)
class AuditFirstAgentWorkflow(AgentWorkflow):
    """An incompatible version 2: an activity before the first model call."""

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        await workflow.execute_activity("audit_task", start_to_close_timeout=timedelta(seconds=10))
        return await super().run(run)


@pytest.mark.long(minutes=0.8)
async def test_check_passes_on_this_code_and_names_what_incompatible_code_breaks(
    drain_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    client = drain_env.client
    async with running_worker(client, settings):
        runtime = AgentRuntime(client, settings)
        model = fake_openai.script([tools(("run_shell", {"command": "echo hi"})), text("ok")])
        waiting = await runtime.run(agent_task(model))
        await pending_requests(waiting)

    report = await check(client, settings.task_queue)
    assert (report.in_flight, report.failures) == (1, [])

    lines: list[str] = []
    report = await check(
        client,
        settings.task_queue,
        workflows=[AuditFirstAgentWorkflow, NotificationWorkflow],
        progress=lines.append,
    )
    [failure] = report.failures
    run_id = (await client.get_workflow_handle(waiting.id).describe()).run_id
    assert (failure.task_id, failure.run_id) == (waiting.id, run_id)
    # The code's extra first command meets the first event its first workflow task recorded.
    events = (await client.get_workflow_handle(waiting.id).fetch_history()).events
    first_task = next(e.event_id for e in events if e.event_type == FIRST_TASK_COMPLETED)
    assert failure.event_id == first_task + 1
    assert failure.event_type == "MarkerRecorded"  # the workflow's first command: a patch
    assert f"would not replay: task {waiting.id} run {run_id}" in lines[-2]
    assert "1 would not replay" in report.summary()

    recorded = Path(__file__).parent / "histories"
    code, said = await ws_deploy(drain_env, settings, "check", "--sample", "2")
    assert code == 0, said
    count = len(list(recorded.glob("*.json")))
    assert (
        f"{count + 1} histories replayed against this code (1 in flight, {count} recorded)" in said
    )
