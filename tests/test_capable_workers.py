"""No task runs on a worker that cannot serve it: a worker that lacks a task's tool or model
endpoint leaves its model call to one that has it (the task shows
`waiting_worker` meanwhile), a task no live worker can serve is refused before it starts,
and workers and `ws doctor` say how their settings differ."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_cli import starter
from tests.test_resume_fork_edges import api_over
from waystation.activities.storage import Storage
from waystation.activities.tool_activities import ToolActivities
from waystation.activities.tools import ToolRegistry
from waystation.client import agent_runtime, pollers, serving_workers
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.client.serving_workers import offers_of
from waystation.client.task_rights import TaskRefusedError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, error, text
from waystation.testing.workers import running_worker
from waystation.vocabulary import OFFLINE_MODEL
from waystation.workflows import errors
from waystation.workflows.models import ToolRequest

# A tool of the user's own that only some workers load (a sub-agent needs no such worker:
# its task holds its definition, tests/test_frozen_tables.py).
USER_TOOLS = ["waystation.activities.builtin_tools", "tests.user_tools"]
SHOPPING = "What is in my basket?"


async def started_tasks(env: WorkflowEnvironment, settings: Settings) -> int:
    count = await env.client.count_workflows(f"TaskQueue = '{settings.task_queue}'")
    return count.count


async def test_a_task_whose_worker_lacks_its_tool_waits_until_a_worker_that_has_it_comes(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with_tool = settings.model_copy(update={"tools": USER_TOOLS})
    runtime = AgentRuntime(dev_env.client, with_tool)
    # It answers without calling the tool: the model call is what waits for a capable worker.
    model = fake_openai.script([text("empty")])
    # No worker polls yet, so nothing refuses the start: the task waits for one.
    handle = await runtime.run(agent_task(model, SHOPPING, tools=["basket_total"]))
    async with running_worker(dev_env.client, settings):  # started before the tool existed
        state = await wait_for_state(handle, lambda s: s.status == "waiting_worker")
        assert state.missing == ["basket_total"]
        [waiting] = of_type(await handle.events(), "waiting_worker")
        assert waiting.missing == ["basket_total"] and "lacks basket_total" in waiting.message
        code, out, _ = await starter(dev_env, settings, "status", handle.id, "--no-worker")
        assert code == 0, out
        assert "status    waiting_worker" in out
        assert "waiting   for a worker that offers basket_total" in out
        # A worker with the agent comes while the one without it still polls.
        # Another connection: the SDK takes one worker per queue and client.
        base = dev_env.client
        other = await Client.connect(
            base.service_client.config.target_host, data_converter=base.data_converter
        )
        with caplog.at_level(logging.WARNING, logger="waystation.worker"):
            async with running_worker(other, with_tool) as capable:
                await capable.say_how_others_differ()  # as `ws worker` does when it starts
                result = await handle.result()
                events = await handle.events()
    assert result.result == "empty"
    assert len(of_type(events, "worker_found")) >= 1
    differing = [
        r.getMessage() for r in caplog.records if "differs from this one" in r.getMessage()
    ]
    assert any("without basket_total" in line for line in differing), differing


async def until_polled(env: WorkflowEnvironment, settings: Settings) -> None:
    """Until Temporal lists a worker polling the settings' queue, with a known offer."""
    async with asyncio.timeout(60):
        while (
            not (offers := await offers_of(env.client, settings)) or None in dict(offers).values()
        ):
            await asyncio.sleep(0.1)


async def test_a_task_no_live_worker_can_serve_is_refused_before_it_starts(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    offline_only = settings.model_copy(update={"openai_api_key": None, "openai_base_url": None})
    with_tool = settings.model_copy(update={"tools": USER_TOOLS})
    async with running_worker(dev_env.client, offline_only):
        await until_polled(dev_env, offline_only)
        runtime = AgentRuntime(dev_env.client, offline_only)
        with pytest.raises(TaskRefusedError, match="a model endpoint for 'gpt-4o-mini'") as model:
            await runtime.run(agent_task("gpt-4o-mini"))
        assert model.value.kind == "no_capable_worker" and model.value.status == 409
        with pytest.raises(TaskRefusedError, match="lacks basket_total"):
            await AgentRuntime(dev_env.client, with_tool).run(
                agent_task(OFFLINE_MODEL, SHOPPING, tools=["basket_total"])
            )
        # The API answers 409 with the same sentence, and starts nothing either.
        async with api_over(AgentRuntime(dev_env.client, with_tool)) as api:
            body = {"task": SHOPPING, "model": {"name": "offline"}, "tools": ["basket_total"]}
            answer = await api.post("/tasks", json=body)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"] == "no_capable_worker"
        assert "lacks basket_total" in answer.json()["detail"]
        assert await started_tasks(dev_env, settings) == 0
        # What it can serve starts as ever.
        handle = await runtime.run(agent_task(OFFLINE_MODEL, "What is 2 + 3?"))
        assert (await handle.result()).result
        # The CLI says the same in one sentence; `ws doctor` names the difference.
        named = {"WAYSTATION_TOOLS": ",".join(USER_TOOLS)}
        code, _, err = await starter(
            dev_env, settings, "run", SHOPPING, "--tools", "basket_total", "--no-worker",
            extra_env=named,
        )  # fmt: skip
        assert code == 2 and err.count("\n") == 1 and "lacks basket_total" in err, err
        code, out, err = await starter(dev_env, settings, "doctor", extra_env=named)
        assert code == 1, (out, err)
        assert f"task queue  {settings.task_queue}" in out
        assert "differs" in out and "without basket_total" in out, out


async def test_ws_status_without_an_id_names_the_project_queue_and_workers(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    async with running_worker(dev_env.client, settings):
        code, out, err = await starter(dev_env, settings, "status")
    assert code == 0, err
    assert f"project     {settings.project}" in out
    assert f"task queue  {settings.task_queue}" in out
    assert "worker      " in out and "model endpoint http://" in out, out


async def test_a_waited_for_call_that_keeps_failing_fails_the_task_after_its_attempts(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """The worker that has what the task needs makes the call as often as max_attempts
    says, however many attempts met a worker without it; then the task fails as any other."""
    with_tool = settings.model_copy(update={"tools": USER_TOOLS})
    model = fake_openai.script(lambda body: error(500, "the endpoint is down"))
    task = agent_task(model, "anything", tools=["basket_total"]).model_copy(
        update={"model": agent_task(model).model.model_copy(update={"max_attempts": 2})}
    )
    handle = await AgentRuntime(dev_env.client, with_tool).run(task)
    async with running_worker(dev_env.client, settings):
        await wait_for_state(handle, lambda s: s.status == "waiting_worker")
        base = dev_env.client
        other = await Client.connect(
            base.service_client.config.target_host, data_converter=base.data_converter
        )
        async with running_worker(other, with_tool):
            with pytest.raises(TaskFailedError, match="the endpoint is down"):
                await handle.result()
            events = await handle.events()
    assert len(fake_openai.requests[model]) == 2
    assert [e.type for e in events if e.type in ("waiting_worker", "worker_found", "failed")] == [
        "waiting_worker",
        "worker_found",
        "failed",
    ]


async def test_a_tool_call_on_a_worker_without_the_tool_runs_nothing_and_says_so(
    settings: Settings,
) -> None:
    """A call that reaches a worker lacking its tool fails as WorkerLacks (the workflow asks
    another worker), never as an observation that the tool is unknown."""
    storage = Storage.from_settings(settings)
    await storage.open()
    activities = ToolActivities(ToolRegistry([]), settings.workspace_dir, storage.ledger)
    request = ToolRequest(call_id="c", tool="shopper_tool", arguments={}, idempotency_key="t/1/c")
    try:
        with pytest.raises(ApplicationError) as lacking:
            await ActivityEnvironment().run(activities.run_tool, request)
    finally:
        await storage.close()
    assert lacking.value.type == errors.WORKER_LACKS and lacking.value.non_retryable
    assert "lacks shopper_tool" in lacking.value.message


async def test_tasks_started_at_once_ask_temporal_for_the_workers_once(
    dev_env: WorkflowEnvironment, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    listing = pollers.polling_workers

    async def counted(client: Client, queue: str, *args: object, **kwargs: object) -> list[str]:
        asked.append(queue)
        return await listing(client, queue, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(serving_workers, "polling_workers", counted)
    async with running_worker(dev_env.client, settings):
        runtime = AgentRuntime(dev_env.client, settings)
        handles = await asyncio.gather(
            *(runtime.run(agent_task(OFFLINE_MODEL, f"task {n}")) for n in range(20))
        )
        assert len(asked) < 5  # one listing in flight served the starts that came meanwhile
        for handle in handles:
            await handle.result()
        # Asked again later, the answer is a fresh one.
        await runtime.run(agent_task(OFFLINE_MODEL, "one more"))
        assert len(asked) >= 2


def listing_that_misses(misses: Callable[[int], bool]) -> tuple[list[int], Any]:
    """A stand-in for Temporal's listing of a queue's workers that misses them when
    `misses(n)` for its n-th listing (from 1), as Temporal does for a moment when it reloads
    a queue; the listings it made, and itself."""
    listing = pollers.polling_workers
    made: list[int] = []

    async def blinking(client: Client, queue: str, *args: object, **kwargs: object) -> list[str]:
        found = await listing(client, queue, *args, **kwargs)  # type: ignore[arg-type]
        made.append(len(found))
        return [] if misses(len(made)) else found

    return made, blinking


async def test_a_worker_missing_from_one_listing_does_not_let_a_refused_task_start(
    dev_env: WorkflowEnvironment, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing with no worker just after one named it is a worker missed, not a worker
    gone or come: asked again (the first listing here), and a refusal stands (the others)."""
    offline_only = settings.model_copy(update={"openai_api_key": None, "openai_base_url": None})
    async with running_worker(dev_env.client, offline_only):
        await until_polled(dev_env, offline_only)
        runtime = AgentRuntime(dev_env.client, offline_only)
        made, blinking = listing_that_misses(lambda n: n % 2 == 1)  # the first, every other
        monkeypatch.setattr(serving_workers, "polling_workers", blinking)
        with pytest.raises(TaskRefusedError, match="a model endpoint for 'gpt-4o-mini'"):
            await runtime.run(agent_task("gpt-4o-mini"))
        assert len(made) >= 3
        # Only the refusal keeps it now: no listing is taken as a miss by its recency.
        monkeypatch.setattr(agent_runtime, "seen_lately", lambda *_: False)
        made, blinking = listing_that_misses(lambda n: n > 1)  # all but the first
        monkeypatch.setattr(serving_workers, "polling_workers", blinking)
        with pytest.raises(TaskRefusedError, match="a model endpoint for 'gpt-4o-mini'"):
            await runtime.run(agent_task("gpt-4o-mini"))
        assert len(made) >= 2
        # No worker listed since one was, through the grace: gone, so the task starts to
        # wait for one (a worker that can serve it).
        monkeypatch.undo()
        made, blinking = listing_that_misses(lambda n: True)
        monkeypatch.setattr(serving_workers, "polling_workers", blinking)
        waiting = await runtime.run(agent_task("gpt-4o-mini"))
        assert len(made) >= 2
    assert await started_tasks(dev_env, settings) == 1
    await waiting.cancel()
