"""Schedules (docs/schedules.md): each firing is a task whose id comes from the schedule and
its scheduled time; Temporal starts each scheduled time once (a backfill of the same hours
again, or a catch-up, runs nothing twice); an overlapping firing is skipped; a pause stops
firings and a trigger runs one now; a conversation schedule's firings continue one task;
`temporal schedule list` lists it. The dev server (the time-skipping server implements no
schedules: its CreateSchedule is `unimplemented`), a worker, the fake OpenAI server."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import SecretStr
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ActivityError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_cli import starter
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.schedules import ScheduleError, ScheduleInfo, ScheduleSpec, firing_id
from waystation.client.task_rights import TaskRefusedError
from waystation.client.temporal import (
    DevServer,
    connect_when_serving,
    ensure_search_attributes,
    temporal_binary,
)
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.proc import free_port
from waystation.testing.webhook_receiver import WebhookReceiver
from waystation.testing.workers import running_worker
from waystation.workflows.models import AgentTask, ScheduleLink
from waystation.workflows.scheduled import ScheduledTurn
from waystation.workflows.scheduled_turn import ScheduledTurnWorkflow

ANSWER = text("all quiet")


def answering(fake_openai: FakeOpenAI) -> str:
    """A model that answers every call at once."""
    return fake_openai.script(lambda body: ANSWER)


def name() -> str:
    return f"sched-{uuid.uuid4().hex[:8]}"


async def wait_for_info(
    runtime: AgentRuntime,
    schedule: str,
    predicate: Callable[[ScheduleInfo], bool],
    timeout: float = 60.0,
) -> ScheduleInfo:
    """Describe the schedule until `predicate` holds (bounded)."""
    async with asyncio.timeout(timeout):
        while True:
            info = await runtime.schedules.describe(schedule)
            if predicate(info):
                return info
            await asyncio.sleep(0.1)


async def closed(client: Client, task_id: str, timeout: float = 60.0) -> WorkflowExecutionStatus:
    """The task's status once it has started and its latest run has closed."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                described = await client.get_workflow_handle(task_id).describe()
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                await asyncio.sleep(0.1)  # the schedule has not started it yet
                continue
            if described.status != WorkflowExecutionStatus.RUNNING:
                assert described.status is not None
                return described.status
            await asyncio.sleep(0.1)


def every_hour(schedule: str, task: AgentTask, **fields: Any) -> ScheduleSpec:
    return ScheduleSpec(name=schedule, task=task, every_seconds=3600, **fields)


async def test_backfilled_hours_fire_at_their_times(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    runtime = dev_runtime
    schedule = name()
    await runtime.create_schedule(every_hour(schedule, agent_task(answering(fake_openai))))
    hour = datetime(2026, 1, 5, 9, tzinfo=UTC)
    start, end = hour - timedelta(minutes=30), hour + timedelta(hours=2, minutes=30)
    await runtime.schedules.backfill(schedule, start, end)
    expected = [firing_id(schedule, hour + timedelta(hours=h)) for h in range(3)]
    assert expected[0] == f"schedule:{schedule}-2026-01-05T09:00:00Z"
    for task_id in expected:
        assert await closed(runtime.client, task_id) == WorkflowExecutionStatus.COMPLETED
        handle = runtime.get(task_id)
        assert (await handle.result()).result == "all quiet"
        [started] = of_type(await handle.events(0), "task_started")
        assert started.task.schedule.name == schedule
    info = await wait_for_info(runtime, schedule, lambda i: i.fired >= 3)
    listed = [
        e.id async for e in runtime.client.list_workflows(f'TemporalScheduledById = "{schedule}"')
    ]
    assert sorted(listed) == expected
    assert {run.task_id for run in info.recent_runs} == set(expected)
    await runtime.schedules.delete(schedule)


async def test_overlapping_firing_is_skipped_and_trigger_runs_one_now(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    runtime = dev_runtime
    waits = fake_openai.script([tools(("run_shell", {"command": "echo hi"})), text("done")])
    schedule = name()
    task = agent_task(waits, approval={"policy": {"run_shell": "always"}})
    await runtime.create_schedule(ScheduleSpec(name=schedule, task=task, every_seconds=1))
    # The first firing waits for a person; the next ones find it running and are skipped.
    info = await wait_for_info(runtime, schedule, lambda i: i.fired >= 1 and i.skipped >= 2)
    assert len(info.running) == 1 and info.fired == 1
    first = runtime.get(info.running[0])
    await wait_for_state(first, lambda s: bool(s.pending_approvals))
    await runtime.schedules.pause(schedule, note="holiday")
    paused = await runtime.schedules.describe(schedule)
    assert paused.paused and paused.note == "holiday"
    # Paused: no firing. A trigger runs one now, beside the one still running (it answers).
    await runtime.schedules.trigger(schedule)
    info = await wait_for_info(runtime, schedule, lambda i: i.fired >= 2)
    assert info.fired == 2 and info.running == [first.id]
    [triggered] = [run.task_id for run in info.recent_runs if run.task_id != first.id]
    assert await closed(runtime.client, triggered) == WorkflowExecutionStatus.COMPLETED
    await runtime.schedules.resume(schedule)
    assert not (await runtime.schedules.describe(schedule)).paused
    await runtime.schedules.delete(schedule)
    await first.cancel()


async def test_conversation_firings_continue_one_task(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    runtime = dev_runtime
    model = fake_openai.script([text("found 3 tickets"), text("found 1 more ticket")])
    schedule = name()
    spec = every_hour(schedule, agent_task(model, "triage the tickets"), conversation=True)
    await runtime.create_schedule(spec)
    await runtime.schedules.trigger(schedule)
    task_id = f"schedule:{schedule}"
    handle = runtime.get(task_id)
    assert await closed(runtime.client, task_id) == WorkflowExecutionStatus.COMPLETED
    await runtime.schedules.trigger(schedule)
    info = await wait_for_info(runtime, schedule, lambda i: i.fired == 2 and not i.running)
    await wait_for_state(handle, lambda s: s.status == "done" and s.result == "found 1 more ticket")
    events = await handle.events(0)
    [started] = of_type(events, "task_started")
    assert started.task.schedule.name == schedule
    [message] = of_type(events, "user_message")
    assert message.content == "triage the tickets"
    # The second turn's model call saw what the first found.
    second = fake_openai.requests[model][-1]["messages"]
    assert any(m.get("content") == "found 3 tickets" for m in second)
    assert info.conversation and info.task_id == task_id
    assert {run.task_id for run in info.recent_runs} == {task_id}
    firings = [run.firing_id for run in info.recent_runs]
    assert len(set(firings)) == 2 and all(f.startswith(f"{task_id}-turn-") for f in firings)
    await runtime.schedules.delete(schedule)


async def test_a_conversation_firing_lasts_its_turn_and_overlapping_ones_are_skipped(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """A conversation schedule firing every second whose first turn waits for a person: the
    firing runs as long as its turn, so the next ones are skipped; once the person decides
    and the turn answers, the next firing is the task's next turn."""
    runtime = dev_runtime
    model = fake_openai.script(
        [tools(("run_shell", {"command": "echo hi"})), text("first turn"), text("second turn")]
    )
    schedule = name()
    task = agent_task(model, "check the deploy", approval={"policy": {"run_shell": "always"}})
    spec = ScheduleSpec(name=schedule, task=task, every_seconds=1, conversation=True)
    await runtime.create_schedule(spec)
    handle = runtime.get(f"schedule:{schedule}")
    info = await wait_for_info(runtime, schedule, lambda i: i.fired >= 1 and i.skipped >= 2)
    assert info.fired == 1 and len(info.running) == 1  # the first firing, its turn waiting
    await runtime.schedules.pause(schedule)  # from here on, only the trigger below fires
    waiting = await wait_for_state(handle, lambda s: bool(s.pending_approvals))
    await handle.approve(next(iter(waiting.pending_approvals)))
    await wait_for_info(runtime, schedule, lambda i: not i.running)  # the turn answered
    await runtime.schedules.trigger(schedule)
    await wait_for_state(handle, lambda s: s.turn == 1 and s.status == "done")
    await runtime.schedules.delete(schedule)
    [message] = of_type(await handle.events(0), "user_message")
    assert message.content == "check the deploy" and message.turn == 1


async def test_schedule_refusals(dev_runtime: AgentRuntime, fake_openai: FakeOpenAI) -> None:
    runtime = dev_runtime
    schedule = name()
    task = agent_task(answering(fake_openai))
    await runtime.create_schedule(every_hour(schedule, task))
    with pytest.raises(ScheduleError) as taken:
        await runtime.create_schedule(every_hour(schedule, task))
    assert taken.value.status == 409
    with pytest.raises(ScheduleError) as malformed:
        await runtime.create_schedule(ScheduleSpec(name=name(), task=task, cron="61 * * * *"))
    assert malformed.value.status == 400
    with pytest.raises(ScheduleError) as unknown:
        await runtime.schedules.describe(name())
    assert unknown.value.status == 404
    with pytest.raises(TaskRefusedError) as reserved:
        await runtime.run(task, task_id=f"schedule:{schedule}")  # a schedule's task id
    assert reserved.value.kind == "reserved_task_id"
    with pytest.raises(ValueError, match="exactly one"):
        ScheduleSpec(name=name(), task=task)
    with pytest.raises(ValueError, match="time zone"):
        ScheduleSpec(name=name(), task=task, cron="0 9 * * *", timezone="Mars/Olympus")
    await runtime.schedules.delete(schedule)


async def test_temporal_cli_lists_the_schedule(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    runtime = dev_runtime
    schedule = name()
    spec = ScheduleSpec(
        name=schedule,
        task=agent_task(answering(fake_openai)),
        cron="0 9 * * 1-5",
        timezone="Europe/Paris",
    )
    info = await runtime.create_schedule(spec)
    assert info.cron == ["0 9 * * 1-5"] and info.timezone == "Europe/Paris"
    paris = [run.astimezone(ZoneInfo("Europe/Paris")) for run in info.next_runs]
    assert paris and all(run.weekday() < 5 and run.hour == 9 for run in paris)
    address = dev_env.client.service_client.config.target_host
    listing = await asyncio.to_thread(
        subprocess.run,
        [temporal_binary(), "schedule", "list", "--address", address, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert schedule in [entry["scheduleId"] for entry in json.loads(listing.stdout)]
    await runtime.schedules.delete(schedule)


async def test_cli_creates_lists_shows_pauses_triggers_and_deletes(
    dev_env: WorkflowEnvironment, settings: Settings, dev_runtime: AgentRuntime
) -> None:
    schedule = name()
    code, out, err = await starter(
        dev_env,
        settings,
        "schedule",
        "create",
        schedule,
        "check the deploy",
        "--every",
        "1h",
        "--model",
        "offline",
        "--max-steps",
        "3",
        "--tenant",
        "acme",
    )
    assert code == 0, err
    assert f"schedule {schedule}: active, every 1h, overlap skip" in out
    info = await dev_runtime.schedules.describe(schedule)
    assert info.tenant == "acme" and info.every_seconds == [3600]
    code, out, _ = await starter(dev_env, settings, "schedule", "list", "--tenant", "acme")
    assert code == 0 and schedule in out
    code, _, err = await starter(dev_env, settings, "schedule", "pause", schedule, "--note", "x")
    assert code == 0 and "paused" in err
    code, _, _ = await starter(dev_env, settings, "schedule", "trigger", schedule)
    info = await wait_for_info(dev_runtime, schedule, lambda i: i.fired == 1)
    assert info.paused and info.note == "x"
    [run] = info.recent_runs
    assert await closed(dev_runtime.client, run.task_id) == WorkflowExecutionStatus.COMPLETED
    code, out, _ = await starter(dev_env, settings, "schedule", "show", schedule)
    assert code == 0 and f"task {run.task_id}" in out
    code, out, _ = await starter(dev_env, settings, "status", run.task_id)
    assert code == 0, out
    code, _, _ = await starter(dev_env, settings, "schedule", "delete", schedule)
    assert code == 0
    code, _, err = await starter(dev_env, settings, "schedule", "show", schedule)
    assert code == 2 and f"no schedule named {schedule!r}" in err
    code, _, err = await starter(
        dev_env, settings, "schedule", "create", name(), "x", "--every", "1 hour"
    )
    assert code == 2 and "is not a duration" in err
    other = name()
    code, out, err = await starter(
        dev_env,
        settings,
        "schedule",
        "create",
        other,
        "look again",
        "--cron",
        "30 8 * * 1-5",
        "--timezone",
        "Europe/Paris",
        "--end-at",
        "2030-01-01T00:00Z",
        "--overlap",
        "buffer_one",
        "--conversation",
        "--paused",
        "--catchup-window",
        "1h",
    )
    assert code == 0, err
    assert f"every firing continues task schedule:{other}" in out
    info = await dev_runtime.schedules.describe(other)
    assert info.cron == ["30 8 * * 1-5"] and info.timezone == "Europe/Paris"
    assert info.end_at == datetime(2030, 1, 1, tzinfo=UTC) and info.overlap == "buffer_one"
    assert info.paused and info.conversation
    await dev_runtime.schedules.delete(other)


async def scheduled_ids(client: Client, schedule: str) -> list[str]:
    """The ids of the executions the schedule started (one per run: a time started twice
    would be listed twice)."""
    query = f'TemporalScheduledById = "{schedule}"'
    return [e.id async for e in client.list_workflows(query)]


def due_times(schedule: str, ids: list[str]) -> list[datetime]:
    return sorted(datetime.fromisoformat(i.removeprefix(f"schedule:{schedule}-")) for i in ids)


async def test_catch_up_after_a_server_restart_runs_each_missed_firing_once(
    settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """The embedded server on its SQLite file, stopped while firings fall due and started
    again: the schedule is still there, and every firing missed meanwhile ran, once. The
    wait while it is down is on the clock by nature (the firings under test are times);
    everything else waits for states."""
    settings = settings.model_copy(
        update={"dev_server_port": free_port(), "dev_server_ui_port": free_port()}
    )
    server = DevServer(settings)
    server.start(timeout=60)
    try:
        client = await connect_when_serving(
            target_host=server.address, data_converter=pydantic_data_converter
        )
        await ensure_search_attributes(client)
        runtime = AgentRuntime(client, settings)
        schedule = name()
        # Every firing runs whatever else runs (no skip), so each missed one shows.
        task = agent_task(answering(fake_openai))
        spec = ScheduleSpec(name=schedule, task=task, every_seconds=2, overlap="allow_all")
        await runtime.create_schedule(spec)
        await wait_for_info(runtime, schedule, lambda i: i.fired >= 1)
        server.stop()
        down_at = datetime.now(UTC)
        await asyncio.sleep(7)  # three or four firings fall due while no server runs
        server.start(timeout=60)
        client = await connect_when_serving(
            target_host=server.address, data_converter=pydantic_data_converter
        )
        runtime = AgentRuntime(client, settings)
        info = await runtime.schedules.describe(schedule)  # it survived the restart
        assert info.every_seconds == [2]
        async with asyncio.timeout(60):
            while True:
                ids = await scheduled_ids(client, schedule)
                times = due_times(schedule, ids)
                missed = [t for t in times if down_at < t < down_at + timedelta(seconds=7)]
                if len(missed) >= 3:
                    break
                await asyncio.sleep(0.2)
        assert len(ids) == len(set(ids))  # no firing ran twice
        gaps = {b - a for a, b in itertools.pairwise(times)}
        assert gaps == {timedelta(seconds=2)}  # none was lost, from the first to the last
        await runtime.schedules.delete(schedule)
    finally:
        server.stop()


async def test_a_conversation_firing_started_again_delivers_nothing_twice(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """Each firing's turn workflow run twice under its id (as a retried or repeated firing
    would be): the task starts once and takes the second firing's message once."""
    runtime = dev_runtime
    model = fake_openai.script([text("first"), text("second"), text("never")])
    task = runtime.with_defaults(agent_task(model, "look again"))
    schedule = name()
    task = task.model_copy(update={"schedule": ScheduleLink(name=schedule)})
    task_id = f"schedule:{schedule}"
    turn = ScheduledTurn(schedule=schedule, task_id=task_id, task=task)
    queue = runtime.settings.task_queue
    outcomes = []
    for firing in (f"{schedule}-turn-1", f"{schedule}-turn-1", f"{schedule}-turn-2"):
        outcomes.append(
            await runtime.client.execute_workflow(
                ScheduledTurnWorkflow.run,
                turn,
                id=firing,
                task_queue=queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
        )
        await closed(runtime.client, task_id)
    again = await runtime.client.execute_workflow(
        ScheduledTurnWorkflow.run,
        turn,
        id=f"{schedule}-turn-2",
        task_queue=queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    assert [o.started for o in outcomes] == [True, True, False]
    assert outcomes[1].duplicate and not outcomes[2].duplicate
    assert again.message_id == outcomes[2].message_id
    handle = runtime.get(task_id)
    state = await wait_for_state(handle, lambda s: s.status == "done")
    assert state.result == "second"
    events = await handle.events(0)
    assert len(of_type(events, "task_started")) == 1
    assert [m.content for m in of_type(events, "user_message")] == ["look again"]
    assert fake_openai.calls(model) == 2


async def test_a_firings_notice_names_its_schedule(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    receiver = WebhookReceiver()
    ops = {"name": "ops", "url": receiver.url("ops"), "events": ["done"], "secret": "s" * 32}
    slack = {"name": "team", "url": receiver.url("team"), "events": ["done"], "format": "slack"}
    notifying = settings.model_copy(update={"webhooks": SecretStr(json.dumps([ops, slack]))})
    schedule = name()
    try:
        async with running_worker(dev_env.client, notifying):
            runtime = AgentRuntime(dev_env.client, notifying)
            await runtime.create_schedule(every_hour(schedule, agent_task(answering(fake_openai))))
            await runtime.schedules.trigger(schedule)
            [told] = await receiver.until(lambda got: len(got) == 1, "ops")
            [posted] = await receiver.until(lambda got: len(got) == 1, "team")
            await runtime.schedules.delete(schedule)
    finally:
        receiver.close()
    body = told.json()
    assert body["kind"] == "done" and body["task"]["schedule"] == schedule
    assert body["task"]["id"].startswith(f"schedule:{schedule}-")
    assert f"(schedule {schedule})" in posted.json()["text"]


async def test_a_conversation_schedule_made_again_for_another_tenant_reaches_no_task(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """Names are global: a schedule deleted and made again under its name for another
    tenant leads to the first one's task, and delivers nothing to it."""
    runtime = dev_runtime
    model = answering(fake_openai)
    schedule = name()
    task_id = f"schedule:{schedule}"
    spec = every_hour(schedule, agent_task(model, "look"), conversation=True)
    await runtime.create_schedule(spec, tenant="acme")
    await runtime.schedules.trigger(schedule)
    assert await closed(runtime.client, task_id) == WorkflowExecutionStatus.COMPLETED
    [first] = (await runtime.schedules.describe(schedule)).recent_runs
    await runtime.schedules.delete(schedule)
    # Temporal names a firing by its second: the new schedule's must not be the old one's.
    while datetime.now(UTC) < first.scheduled_at.replace(microsecond=0) + timedelta(seconds=1):
        await asyncio.sleep(0.05)
    await runtime.create_schedule(spec, tenant="globex")
    await runtime.schedules.trigger(schedule)
    info = await wait_for_info(runtime, schedule, lambda i: i.fired == 1 and not i.running)
    turn = runtime.client.get_workflow_handle(info.recent_runs[0].firing_id)
    with pytest.raises(WorkflowFailureError) as refused:
        await turn.result()
    activity_failure = refused.value.cause
    assert isinstance(activity_failure, ActivityError)
    assert "another tenant's" in str(activity_failure.cause)
    events = await runtime.get(task_id).events(0)
    assert of_type(events, "user_message") == []
    await runtime.schedules.delete(schedule)
