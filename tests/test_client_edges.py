"""Small client-side promises: queries end instead of hanging, a repeated approval gets the
same answer, the memo forgets a wait once it is over, a signal Temporal refuses as busy is
sent again, and a read it refuses in passing is read again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import (
    Client,
    QueryWorkflowInput,
    SignalWorkflowInput,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, pending_requests
from tests.test_cli import starter
from tests.test_resume_fork_edges import api_over
from waystation.client.agent_runtime import AgentRuntime, NoWorkerError, TaskHandle
from waystation.client.busy import BusyRetry, reading, sending
from waystation.client.temporal import temporal_binary
from waystation.settings import Settings
from waystation.testing.client_hooks import ClientHooks
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows import search

BUSY = "Workflow is busy"


# --- queries no worker answers ---------------------------------------------------------------


async def test_queries_no_worker_answers_end_with_a_clear_error(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    handle = await runtime.run(agent_task("offline"))  # no worker polls this task queue
    second = timedelta(seconds=1)
    nobody = (
        r"no worker answered (the state query|the events query|the stream's head query|a query)"
        rf" within 1 s: no "
        rf"worker polls task queue '{settings.task_queue}'"
    )
    for query in (
        handle.state(within=second),
        handle.events(within=second),
        handle.conversation(within=second),
        runtime.stream_head(handle.id, within=second),
    ):
        with pytest.raises(NoWorkerError, match=nobody):
            await query

    async def follow() -> None:
        async for _ in runtime.stream(handle.id):
            pass

    following = asyncio.create_task(follow())  # its poll's 10 s run beside the CLI's
    code, out, err = await starter(dev_env, settings, "approve", handle.id, "--no-worker")
    assert code == 1 and out == "", err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: no worker answered"), err
    # A stream asks again after an unanswered poll, unless no worker polls at all.
    with pytest.raises(
        NoWorkerError,
        match=rf"no worker answered the stream's poll within 10 s: no worker polls task queue "
        rf"'{settings.task_queue}'",
    ):
        await following


async def test_a_query_the_server_gives_up_on_is_unanswered_not_a_raw_rpc_error(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """The server drops a query whose worker died while holding it ("context canceled");
    the caller is told no worker answered, which a caller may ask again."""

    async def server_gives_up(_: QueryWorkflowInput) -> None:
        raise RPCError("context canceled", RPCStatusCode.CANCELLED, b"")

    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(
            ClientHooks(before_query=server_gives_up).client(dev_env.client), settings
        )
        handle = await runtime.run(agent_task("offline"))
        with pytest.raises(NoWorkerError, match="no worker answered the state query"):
            await handle.state(within=timedelta(seconds=1))


async def test_a_query_its_worker_was_too_busy_to_answer_is_unanswered(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A worker on a starved machine fails a query whose replay did not yield in time (the
    SDK's deadlock detector); the caller is told no worker answered, and may ask again."""

    async def worker_too_slow(_: QueryWorkflowInput) -> None:
        raise WorkflowQueryFailedError(
            "[TMPRL1101] Potential deadlock detected: workflow didn't yield within 2 second(s)."
        )

    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(
            ClientHooks(before_query=worker_too_slow).client(dev_env.client), settings
        )
        handle = await runtime.run(agent_task("offline"))
        with pytest.raises(NoWorkerError, match="no worker answered the state query"):
            await handle.state(within=timedelta(seconds=1))


# --- a repeated approval, and the memo after the wait ---------------------------------------


async def memo_of(handle: TaskHandle) -> Mapping[str, Any]:
    return await (await handle.describe()).memo()


async def test_a_repeated_approval_without_request_id_gets_the_same_answer(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("run_shell", {"command": "echo approved"})), text("ran")])
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings), api_over(runtime) as api:
        created = await api.post("/tasks", json={"task": "run it", "model": {"name": model}})
        task_id = created.json()["id"]
        handle = runtime.get(task_id)
        [request] = await pending_requests(handle)
        async with asyncio.timeout(20):  # the memo is written by the task that made the request
            while not (await memo_of(handle)).get(search.MEMO_PENDING):
                await asyncio.sleep(0.05)
        [waiting] = (await memo_of(handle))[search.MEMO_PENDING]
        assert waiting["request_id"] == request

        first = await api.post(f"/tasks/{task_id}/approve")
        assert first.status_code == 200, first.text
        assert first.json()["request_id"] == request and first.json()["decision"] == "approve"
        again = await api.post(f"/tasks/{task_id}/approve")
        assert (again.status_code, again.json()) == (200, first.json())
        assert (await handle.result()).result == "ran"
        after_done = await api.post(f"/tasks/{task_id}/approve")
        assert (after_done.status_code, after_done.json()) == (200, first.json())
        refused = await api.post(f"/tasks/{task_id}/reject")
        assert refused.status_code == 409 and refused.json()["error"] == "decision_conflict"

        code, _, err = await starter(dev_env, settings, "approve", task_id, "--no-follow")
        assert code == 0, err
        assert f"request {request}: approve (already decided earlier)" in err

        # Nothing waits any more: the memo says so, to the SDK and to the Temporal CLI.
        memo = await memo_of(handle)
        assert memo[search.MEMO_STATUS] == "done" and search.MEMO_PENDING not in memo
    address = dev_env.client.service_client.config.target_host
    process = await asyncio.create_subprocess_exec(
        temporal_binary(),
        *("workflow", "describe", "--workflow-id", task_id, "--address", address),
        *("--output", "json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    raw, _ = await process.communicate()
    assert process.returncode == 0, raw.decode()
    fields = json.loads(raw)["workflowExecutionInfo"]["memo"]["fields"]
    # the CLI shows plain JSON decoded
    usage = fields.pop(search.MEMO_USAGE)
    assert fields == {search.MEMO_STATUS: "done", search.MEMO_TURNS: 1}, fields
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


# --- "Workflow is busy" ------------------------------------------------------------------------


def busy() -> RPCError:
    return RPCError(BUSY, RPCStatusCode.RESOURCE_EXHAUSTED, b"")


async def test_a_busy_refusal_is_sent_again_with_growing_pauses() -> None:
    pauses: list[float] = []

    async def record(seconds: float) -> None:
        pauses.append(seconds)

    tries = 0

    async def refused_three_times() -> str:
        nonlocal tries
        tries += 1
        if tries <= 3:
            raise busy()
        return "sent"

    policy = BusyRetry(tries=8, first_pause=0.1, factor=2.0, max_pause=3.0, jitter=0.2)
    assert await sending(refused_three_times, policy, sleep=record) == "sent"
    assert tries == 4 and len(pauses) == 3
    for attempt, pause in enumerate(pauses, start=1):
        assert policy.pause(attempt) * 0.8 <= pause <= policy.pause(attempt) * 1.2
    assert [policy.pause(a) for a in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0]

    async def always_busy() -> str:
        raise busy()

    pauses.clear()
    with pytest.raises(RPCError, match=BUSY):
        await sending(always_busy, policy, sleep=record)
    assert len(pauses) == policy.tries - 1  # no pause after the last refusal

    async def not_found() -> str:
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")

    pauses.clear()
    with pytest.raises(RPCError, match="not found"):
        await sending(not_found, policy, sleep=record)
    assert pauses == []  # anything but busy is raised at once


async def test_an_approval_refused_as_busy_is_sent_again(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("run_shell", {"command": "echo ok"})), text("ran")])
    refusals_left = 2

    async def refuse_as_busy(_: SignalWorkflowInput) -> None:
        nonlocal refusals_left
        if refusals_left > 0:
            refusals_left -= 1
            raise busy()

    runtime = AgentRuntime(
        ClientHooks(before_signal=refuse_as_busy).client(dev_env.client), settings
    )
    async with running_worker(dev_env.client, settings), api_over(runtime) as api:
        handle = await AgentRuntime(dev_env.client, settings).run(agent_task(model))
        [request] = await pending_requests(handle)
        answer = await api.post(f"/tasks/{handle.id}/approve")
        assert answer.status_code == 200, answer.text
        assert answer.json()["request_id"] == request and refusals_left == 0
        assert (await handle.result()).result == "ran"


# --- reads refused in passing ------------------------------------------------------------------


async def test_a_read_refused_in_passing_is_read_again_and_a_signal_is_not() -> None:
    pauses: list[float] = []

    async def record(seconds: float) -> None:
        pauses.append(seconds)

    refusals = [RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED]

    async def refused_three_ways() -> str:
        if refusals:
            raise RPCError("operation was canceled", refusals.pop(0), b"")
        return "read"

    policy = BusyRetry(tries=8, first_pause=0.1, factor=2.0, max_pause=3.0, jitter=0.2)
    assert await reading(refused_three_ways, policy, sleep=record) == "read"
    assert len(pauses) == 3

    async def canceled() -> str:
        raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")

    pauses.clear()
    with pytest.raises(RPCError, match="canceled"):
        await sending(canceled, policy, sleep=record)  # a signal may have landed: not resent
    assert pauses == []

    async def not_found() -> str:
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")

    with pytest.raises(RPCError, match="not found"):
        await reading(not_found, policy, sleep=record)
    assert pauses == []


async def test_a_task_described_while_the_server_cancels_describes_is_described(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """The dev server answered DescribeWorkflowExecution with CANCELLED while it reset the
    same task; `ws status`, the API and the auto-repair loop read through this call."""
    client = await Client.connect(
        dev_env.client.service_client.config.target_host, data_converter=pydantic_data_converter
    )
    service = client.workflow_service
    real_describe = service.describe_workflow_execution
    refusals = {"left": 2}

    async def canceled_twice(*args: Any, **kwargs: Any) -> Any:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
        return await real_describe(*args, **kwargs)

    service.describe_workflow_execution = canceled_twice  # type: ignore[method-assign]
    runtime = AgentRuntime(client, settings)
    handle = await runtime.run(agent_task("offline"))  # no worker: it stays running
    try:
        seen = await handle.overview()
        assert seen.status == WorkflowExecutionStatus.RUNNING and refusals["left"] == 0
        refusals["left"] = 2
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert refusals["left"] == 0
    finally:
        await dev_env.client.get_workflow_handle(handle.id).terminate("test over")
