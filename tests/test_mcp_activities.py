"""MCP tools inside real Temporal activities on the dev server: the `list_tools` activity as
worker.py registers it, heartbeats through a long call, and cancellation that reaches the
MCP server as notifications/cancelled."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.workflow import ActivityCancellationType

from waystation.activities.mcp.activities import McpActivities
from waystation.activities.mcp.manager import McpClientManager
from waystation.settings import Settings
from waystation.testing.mcp import CallLog, demo_stdio
from waystation.testing.workers import running_worker
from waystation.worker import HEARTBEAT_THROTTLE
from waystation.workflows.models import ToolRequest, ToolResult
from waystation.workflows.tool_catalog import ListToolsRequest, ToolCatalog

HEARTBEAT_TIMEOUT = timedelta(seconds=2)


@workflow.defn(name="McpProbe", sandboxed=False)
class McpProbe:
    """Runs one MCP tool call as the agent's `run_tool` would: heartbeats, one attempt."""

    @workflow.run
    async def run(self, request: ToolRequest) -> ToolResult:
        result: ToolResult = await workflow.execute_activity(
            "mcp_probe",
            request,
            result_type=ToolResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        return result


@workflow.defn(name="McpList", sandboxed=False)
class McpList:
    """Runs `list_tools` on the task queue named in the input's first argument."""

    @workflow.run
    async def run(self, queue: str, request: ListToolsRequest) -> ToolCatalog:
        catalog: ToolCatalog = await workflow.execute_activity(
            "list_tools",
            request,
            result_type=ToolCatalog,
            task_queue=queue,
            start_to_close_timeout=timedelta(minutes=2),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
        )
        return catalog


def probe_activity(mcp: McpActivities) -> Callable[[ToolRequest], Any]:
    @activity.defn(name="mcp_probe")
    async def probe(request: ToolRequest) -> ToolResult:
        return await mcp.run(request)

    return probe


@pytest.fixture
def log(tmp_path: Path) -> CallLog:
    return CallLog(tmp_path / "calls.jsonl")


@pytest.fixture
async def probe_queue(dev_env: WorkflowEnvironment, log: CallLog) -> AsyncIterator[str]:
    """A worker hosting McpProbe and the probe activity over the demo server."""
    mcp = McpActivities(McpClientManager({"demo": demo_stdio(log)}))
    queue = f"mcp-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        dev_env.client,
        task_queue=queue,
        workflows=[McpProbe],
        activities=[probe_activity(mcp)],
        workflow_runner=UnsandboxedWorkflowRunner(),
        # As the real worker sends them: the SDK's default holds a beat back for 0.8 of the
        # 2 s timeout, and a busy test machine then misses the deadline.
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
    async with worker:
        yield queue
    await mcp.manager.close()


async def start_probe(
    env: WorkflowEnvironment, queue: str, gate: Path, key: str
) -> WorkflowHandle[Any, ToolResult]:
    request = ToolRequest(
        call_id="call_1",
        tool="demo__slow",
        arguments={"gate": str(gate), "label": key},
        idempotency_key=key,
    )
    return await env.client.start_workflow(
        McpProbe.run, request, id=key.replace("/", "-"), task_queue=queue
    )


async def test_list_tools_activity_as_the_worker_registers_it(
    dev_env: WorkflowEnvironment, settings: Settings, log: CallLog
) -> None:
    configured = settings.model_copy(update={"mcp_servers": {"demo": demo_stdio(log)}})
    queue = f"mcp-list-{uuid.uuid4().hex[:8]}"
    async with (
        running_worker(dev_env.client, configured) as agent_worker,
        Worker(
            dev_env.client,
            task_queue=queue,
            workflows=[McpList],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
    ):
        catalog = await dev_env.client.execute_workflow(
            McpList.run,
            args=[configured.task_queue, ListToolsRequest(servers=["demo", "ghost"])],
            id=f"list-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert agent_worker.mcp.manager.connected("demo")
    # The worker's shutdown stopped the server it had started.
    [started] = [e for e in log.entries() if e["event"] == "started"]
    assert not agent_worker.mcp.manager.connected("demo")
    with pytest.raises(ProcessLookupError):
        os.kill(started["pid"], 0)
    demo, ghost = catalog.servers
    assert demo.error is None and catalog.get("demo__lookup") is not None
    assert ghost.tools == [] and ghost.error is not None
    assert "no MCP server named 'ghost'" in ghost.error


async def test_a_long_call_heartbeats_past_the_heartbeat_timeout(
    dev_env: WorkflowEnvironment, probe_queue: str, log: CallLog, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    handle = await start_probe(dev_env, probe_queue, gate, "hb/1/call_1")
    await log.wait_for("start", key="hb/1/call_1")

    async def beating_past_timeout() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        if not pending or not pending[0].HasField("last_heartbeat_time"):
            return False
        beat = pending[0].last_heartbeat_time.ToDatetime()
        started = pending[0].last_started_time.ToDatetime()
        assert pending[0].attempt == 1
        return beat - started > HEARTBEAT_TIMEOUT

    await until_true(beating_past_timeout)
    gate.touch()
    result = await handle.result()
    assert result == ToolResult(output="hb/1/call_1: released")
    assert log.events("slow", key="hb/1/call_1") == ["start", "done"]


async def test_cancelling_the_activity_cancels_the_mcp_request(
    dev_env: WorkflowEnvironment, probe_queue: str, log: CallLog, tmp_path: Path
) -> None:
    handle = await start_probe(dev_env, probe_queue, tmp_path / "never", "cx/1/call_1")
    await log.wait_for("start", key="cx/1/call_1")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    # The activity's cancellation sent notifications/cancelled; the server stops the tool.
    await log.wait_for("cancelled", key="cx/1/call_1")
    assert log.events("slow", key="cx/1/call_1") == ["start", "cancelled"]


async def until_true(check: Callable[[], Any]) -> None:
    async with asyncio.timeout(60):
        while not await check():
            await asyncio.sleep(0.1)
