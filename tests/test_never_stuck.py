"""Never stuck (issue 12, docs/never-stuck.md): approvals that follow a query replay, and a
task whose workflow task keeps failing is shown as stuck and repaired.

Every history a test produces is replayed with the Replayer; every wait is on a state (the
fake model's request log, events, history, Temporal's view of the task), never a sleep.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.api.workflowservice.v1 import (
    PollWorkflowTaskQueueRequest,
    PollWorkflowTaskQueueResponse,
    RespondWorkflowTaskFailedRequest,
)
from temporalio.client import (
    Client,
    QueryWorkflowInput,
    WorkflowHandle,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from tests.helpers import agent_task, of_type, pending_requests
from tests.never_stuck.drifted_worker import DRIFT_MEMO
from tests.never_stuck.dying_worker import STICKY_SECONDS
from tests.test_cli import starter
from waystation.client import auto_repair, starting
from waystation.client.agent_runtime import AgentRuntime, TaskHandle
from waystation.client.health import Stuck
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.settings.commands import command
from waystation.testing.client_hooks import ClientHooks
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.settings import isolated_settings
from waystation.testing.workers import WorkerProcess, running_worker
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentState
from waystation.workflows.models import Decision

WAIT_SECONDS = 60.0  # bound of every wait on a state


def effects(settings: Settings) -> list[str]:
    path = settings.workspace_dir / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def shell_steps(*lines: str) -> Callable[[dict[str, Any]], Reply]:
    """A model that asks for `echo LINE >> effects.txt` once per line, then answers; what
    it says depends only on the conversation, so a step asked again gets the same reply."""

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if done < len(lines):
            return tools(("run_shell", {"command": f"echo {lines[done]} >> effects.txt"}))
        return text(f"ran {done} commands")

    return reply


async def assert_replays(client: Client, task_id: str) -> None:
    """The task's latest run replays on today's build without a nondeterminism error."""
    history = await client.get_workflow_handle(task_id).fetch_history()
    replayer = Replayer(workflows=[AgentWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


async def until(check: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Ask `check` until it returns something truthy (bounded)."""
    deadline = asyncio.timeout(WAIT_SECONDS)
    try:
        async with deadline:
            while not (found := await check()):
                await asyncio.sleep(0.05)
            return found
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None
    except RPCError:
        # The deadline cancels a call in flight, which the SDK raises as "operation was
        # canceled": still a timeout.
        if deadline.expired():
            raise AssertionError(f"timed out waiting until {what}") from None
        raise


# --- (a) the cold-worker scenario of issue 12 -----------------------------------------------


class StateSpy(ClientHooks):
    """Lets the test see the first `state` answer a client gets (what it acts on)."""

    def __init__(self) -> None:
        super().__init__(after_query=self._note)
        self.answered = asyncio.Event()
        self.first: AgentState | None = None

    def _note(self, input: QueryWorkflowInput, answer: Any) -> None:
        if input.query == AgentWorkflow.state.__name__ and not self.answered.is_set():
            self.first = answer
            self.answered.set()


async def _events(workflow: WorkflowHandle[Any, Any]) -> list[Any]:
    return [e async for e in workflow.fetch_history_events()]


async def _model_call_done(workflow: WorkflowHandle[Any, Any]) -> bool:
    kinds = [e.event_type for e in await _events(workflow)]
    return kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) >= 1


async def hold_parked_task(client: Client, workflow: WorkflowHandle[Any, Any]) -> Any:
    """Take the workflow task parked on the dead worker's sticky queue, as that worker would
    have, so it cannot start before the approval: the poll's answer, or None when it is gone
    (a dead long poll of the killed worker won it, or it left the sticky queue)."""
    scheduled = [
        e
        for e in await _events(workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ][-1].workflow_task_scheduled_event_attributes.task_queue
    if scheduled.kind != TaskQueueKind.TASK_QUEUE_KIND_STICKY:
        return None
    request = PollWorkflowTaskQueueRequest(
        namespace=client.namespace, task_queue=scheduled, identity="the test holds it"
    )
    try:
        held: PollWorkflowTaskQueueResponse = await asyncio.wait_for(
            client.workflow_service.poll_workflow_task_queue(request), STICKY_SECONDS
        )
    except TimeoutError:
        return None
    return held if held.task_token else None


async def approve_as_a_client(kind: str, runtime: AgentRuntime, task_id: str) -> str:
    """Approve the only pending request without naming it, as each client does."""
    if kind == "python_api":
        return (await runtime.get(task_id).approve()).decision
    if kind == "blind_signal":
        # `ws status`, then `temporal workflow signal --name approve`: no second look.
        [request] = (await runtime.get(task_id).state()).pending_approvals
        decision = Decision(request_id=request, approver="cli-user")
        await runtime.client.get_workflow_handle(task_id).signal(AgentWorkflow.approve, decision)
        return "approve"
    async with http_api(runtime) as api:
        answer = await api.post(f"/tasks/{task_id}/approve", json={})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["decision"])


@pytest.mark.parametrize("client_kind", ["python_api", "http_api", "blind_signal"])
async def test_an_approval_right_after_a_cold_workers_query_completes_and_replays(
    dev_env: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    settings: Settings,
    client_kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A workflow task the test holds must outlast the query's wait on the dead sticky queue.
    monkeypatch.setattr(starting, "WORKFLOW_TASK_TIMEOUT", timedelta(seconds=30))
    address = dev_env.client.service_client.config.target_host
    spy = StateSpy()
    client = spy.client(dev_env.client)
    runtime = AgentRuntime(client, settings)
    answer = threading.Event()
    shell = ("run_shell", {"command": "echo approved >> effects.txt"})
    model = fake_openai.script([tools(shell, hold_after_chunks=2, gate=answer), text("ran it")])

    # The sticky worker: it runs the task's first workflow task and dies on the state query.
    sticky = await WorkerProcess(address, settings, module="tests.never_stuck.dying_worker").ready()
    try:
        handle = await runtime.run(agent_task(model, timeout=60))
        workflow = client.get_workflow_handle(handle.id)
        await until(lambda: _events_of(workflow, "ACTIVITY_TASK_SCHEDULED"), "the model call")
        # The cold worker: runs the model call, has never run a workflow task of the task.
        async with running_worker(client, settings):
            await fake_openai.until_streaming(model, 2)
            deciding = asyncio.create_task(approve_as_a_client(client_kind, runtime, handle.id))
            code = await asyncio.to_thread(sticky.process.wait, WAIT_SECONDS)
            assert code == -signal.SIGKILL, "the state query reached the sticky worker"
            # The query waits on the dead sticky queue; the model answers meanwhile, and the
            # workflow task for its answer stays parked, as if the dead worker held it.
            answer.set()
            await until(lambda: _model_call_done(workflow), "the model call completes")
            held = await hold_parked_task(client, workflow)
            await asyncio.wait_for(spy.answered.wait(), WAIT_SECONDS)
            # The cold worker answered from a history whose model answer no workflow task
            # has processed: the client sees the request and acts on it at once.
            assert spy.first is not None and list(spy.first.pending_approvals) == ["1-call_1_0"]
            if client_kind == "blind_signal":
                # Nothing waits for the held task: the signal joins the result's task.
                await asyncio.wait_for(deciding, WAIT_SECONDS)
            if held is not None:
                kinds = [e.event_type for e in await _events(workflow)]
                after = kinds[kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) :]
                assert EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED not in after
                await client.workflow_service.respond_workflow_task_failed(
                    RespondWorkflowTaskFailedRequest(
                        namespace=client.namespace, task_token=held.task_token, identity="test"
                    )
                )
            assert await asyncio.wait_for(deciding, WAIT_SECONDS) == "approve"
            outcome = await asyncio.wait_for(handle.result(), WAIT_SECONDS)
    finally:
        sticky.kill()
    print(f"{client_kind}: parked task held by the test: {held is not None}")
    if held is not None and client_kind == "blind_signal":
        # The signal and the held commands of the cold query went out in one workflow task:
        # the order a replay turns around. It replays all the same (handlers only record).
        kinds = [EventType.Name(e.event_type)[11:] for e in await _events(workflow)]
        failed = kinds.index("WORKFLOW_TASK_FAILED")
        retried = kinds[failed:].index("WORKFLOW_TASK_STARTED") + failed
        assert "WORKFLOW_EXECUTION_SIGNALED" in kinds[failed:retried], kinds
        print(kinds[failed - 4 : retried + 6])
    assert outcome.result == "ran it"
    assert effects(settings) == ["approved"]
    await assert_replays(client, handle.id)


async def _events_of(workflow: WorkflowHandle[Any, Any], kind: str) -> bool:
    wanted = EventType.Value(f"EVENT_TYPE_{kind}")
    return any(e.event_type == wanted for e in await _events(workflow))


# --- (b) a worker caching fewer tasks than it runs ---------------------------------------


@pytest.mark.long(minutes=0.7)
async def test_approvals_right_after_queries_on_a_worker_caching_5_of_20_tasks(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    settings = isolated_settings(tmp_path, fake_openai.url, worker_cached_tasks=5)
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(shell_steps("first", "second"))

    async with running_worker(dev_env.client, settings):
        handles = [await runtime.run(agent_task(model, timeout=30)) for _ in range(20)]
        # A person going down the list, approving each task's step as soon as a state query
        # shows its request, while the other tasks move on (and push it out of the cache).
        for _ in range(2):
            for handle in handles:
                await pending_requests(handle, timeout=WAIT_SECONDS)
                await handle.approve()
        outcomes = await asyncio.gather(*(h.result() for h in handles))
        resolved = [of_type(await h.events(), "approval_resolved") for h in handles]
    assert [o.result for o in outcomes] == ["ran 2 commands"] * 20
    assert sorted(effects(settings)) == ["first"] * 20 + ["second"] * 20
    assert all([e.decision for e in r] == ["approve", "approve"] for r in resolved)
    for handle in handles:
        await assert_replays(dev_env.client, handle.id)


# --- (c) stuck and repaired ----------------------------------------------------------------


@asynccontextmanager
async def http_api(runtime: AgentRuntime) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API over real HTTP, with an approver's token."""
    token = "approver-token"
    settings = runtime.settings.model_copy(
        update={"api_tokens": {token: ApiToken(role="approver", name="alice")}}
    )
    app = create_app(settings, AgentRuntime(runtime.client, settings))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())

    async def started() -> bool:
        return bool(server.started)

    await until(started, "the API serves")
    port = server.servers[0].sockets[0].getsockname()[1]
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60
        ) as client:
            yield client
    finally:
        server.should_exit = True
        await serving


async def drifted_history(
    dev_env: WorkflowEnvironment, settings: Settings, runtime: AgentRuntime, model: str
) -> TaskHandle:
    """A task that a drifted build ran through step 1 (its command ran) up to step 2's
    approval request; that build's worker is then killed."""
    address = dev_env.client.service_client.config.target_host
    drifted = await WorkerProcess(
        address, settings, module="tests.never_stuck.drifted_worker"
    ).ready()
    try:
        handle = await runtime.run(agent_task(model, timeout=30))
        await pending_requests(handle, timeout=WAIT_SECONDS)
        await handle.approve()
        await until(lambda: _requests_of_step(handle, 2), "the drifted build asks about step 2")
        assert (await handle.overview()).memo.get(DRIFT_MEMO) is not None
        assert effects(settings) == ["step1"]
    finally:
        drifted.kill()
    return handle


async def _requests_of_step(handle: TaskHandle, step: int) -> list[str]:
    state = await handle.state()
    return [r for r in state.pending_approvals if r.startswith(f"{step}-")]


async def stuck_on_todays_build(dev_env: WorkflowEnvironment, handle: TaskHandle) -> Stuck:
    """Approve step 2 the way `temporal workflow signal` does; today's build cannot replay
    the drifted history, so its workflow task fails until the task is reported stuck."""
    request = "2-call_2_0"
    workflow = dev_env.client.get_workflow_handle(handle.id)
    await workflow.signal(AgentWorkflow.approve, Decision(request_id=request, approver="bob"))
    found: Stuck = await until(handle.stuck, "the task is stuck")
    assert "Nondeterminism" in found.problem
    return found


async def after_repair(dev_env: WorkflowEnvironment, settings: Settings, handle: TaskHandle) -> str:
    """The repaired task ends; each command ran once; the log and history say what happened."""
    # A fresh handle: the one from `run` is bound to the run the repair replaced.
    handle = AgentRuntime(dev_env.client, settings).get(handle.id)
    outcome = await asyncio.wait_for(handle.result(), WAIT_SECONDS)
    assert outcome.result == "ran 2 commands"
    assert effects(settings) == ["step1", "step2"]
    [repaired] = of_type(await handle.events(), "repaired")
    assert "Nondeterminism" in repaired.problem
    await assert_replays(dev_env.client, handle.id)
    return str(repaired.by)


@pytest.mark.long(minutes=0.5)
@pytest.mark.timeout(600)  # four CLI processes start while both cores are busy
async def test_a_stuck_task_is_shown_by_the_cli_and_repaired_by_command(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(shell_steps("step1", "step2"))
    handle = await drifted_history(dev_env, settings, runtime, model)
    async with running_worker(dev_env.client, settings):
        found = await stuck_on_todays_build(dev_env, handle)

        code, _, err = await starter(dev_env, settings, "status", handle.id)
        assert code == 1
        assert f"task {handle.id} is stuck" in err and "Nondeterminism" in err
        assert f"repair it with: {command('repair', handle.id)}" in err

        async def listed_stuck() -> bool:
            tasks, _ = await runtime.list_tasks("stuck")
            return handle.id in [t.id for t in tasks]

        await until(listed_stuck, "visibility lists the task stuck")
        _, listing, _ = await starter(dev_env, settings, "list", "--status", "stuck")
        [line] = [row for row in listing.splitlines() if row.startswith(handle.id)]
        assert line.split()[1] == "stuck"

        code, _, err = await starter(dev_env, settings, "repair", handle.id, "--no-worker")
        assert code == 0, err
        assert f"task {handle.id} repaired" in err
        by = await after_repair(dev_env, settings, handle)
    assert by != "worker"
    assert found.reset_to_event is not None and found.reset_to_event > 0


async def test_a_stuck_task_is_shown_by_the_api_and_repaired_by_post(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(shell_steps("step1", "step2"))
    handle = await drifted_history(dev_env, settings, runtime, model)
    async with running_worker(dev_env.client, settings), http_api(runtime) as api:
        await stuck_on_todays_build(dev_env, handle)

        shown = await api.get(f"/tasks/{handle.id}")
        assert shown.status_code == 409, shown.text
        assert shown.json()["error"] == "stuck"
        assert "Nondeterminism" in shown.json()["detail"]

        async def listed_stuck() -> bool:
            # Other tests' stuck tasks share the server: wait for this one.
            page = await api.get("/tasks", params={"status": "stuck"})
            return handle.id in [t["id"] for t in page.json()["tasks"] if t["status"] == "stuck"]

        assert await until(listed_stuck, "the API lists the task stuck")

        repaired = await api.post(f"/tasks/{handle.id}/repair")
        assert repaired.status_code == 200, repaired.text
        assert await after_repair(dev_env, settings, handle) == "alice"

        again = await api.post(f"/tasks/{handle.id}/repair")
        assert again.status_code == 409
        assert "not stuck" in again.json()["detail"]


async def test_a_worker_with_auto_repair_repairs_a_stuck_task_once(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    model = fake_openai.script(shell_steps("step1", "step2"))
    handle = await drifted_history(dev_env, settings, runtime, model)
    healing = settings.model_copy(update={"auto_repair": True, "auto_repair_interval_seconds": 1})
    stuck_run = (await handle.overview()).run_id
    async with running_worker(dev_env.client, healing):
        request = Decision(request_id="2-call_2_0", approver="bob")
        await dev_env.client.get_workflow_handle(handle.id).signal(AgentWorkflow.approve, request)

        async def reset_by_the_worker() -> bool:
            return (await handle.overview()).run_id != stuck_run

        try:
            await until(reset_by_the_worker, "the worker resets the stuck run")
        except AssertionError as err:
            # What the worker's repair loop would have seen, for the one who reads this.
            described = await dev_env.client.get_workflow_handle(handle.id).describe()
            pending = described.raw_description.pending_workflow_task
            raise AssertionError(
                f"{err}; stuck: {await handle.stuck()!r}; pending workflow task: state "
                f"{pending.state}, attempt {pending.attempt}"
            ) from None
        assert await after_repair(dev_env, settings, handle) == "worker"


async def test_the_repair_loop_outlives_an_unexpected_error(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One round failing with something other than an RPC error is logged with its traceback,
    and the worker looks again at the next round instead of never again."""
    rounds: list[int] = []
    second_round = asyncio.Event()

    async def failing_once(runtime: AgentRuntime, refused: set[str]) -> list[str]:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise ValueError("a surprise")
        second_round.set()
        return []

    monkeypatch.setattr(auto_repair, "repair_stuck_tasks", failing_once)
    quick = settings.model_copy(update={"auto_repair_interval_seconds": 0.01})
    looking = asyncio.create_task(
        auto_repair.repair_now_and_then(AgentRuntime(dev_env.client, quick))
    )
    seen_again = asyncio.create_task(second_round.wait())
    try:
        await asyncio.wait(
            {looking, seen_again}, timeout=WAIT_SECONDS, return_when="FIRST_COMPLETED"
        )
        assert not looking.done(), f"the loop ended: {looking.exception()!r}"
        assert second_round.is_set(), "no second round"
    finally:
        looking.cancel()
        seen_again.cancel()
    [logged] = [r for r in caplog.records if "looking for stuck tasks failed" in r.getMessage()]
    assert logged.exc_info is not None and "a surprise" in str(logged.exc_info[1])
