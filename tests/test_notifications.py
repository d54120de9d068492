"""Notifications (issue 30): each notice is a signed webhook sent by an activity of a real
worker process, to a real HTTP receiver started here; retries keep their idempotency key,
outlive a killed worker and never repeat another endpoint's delivery; a refusal is not
retried and becomes an `error` event on the task. Every wait is on the receiver's request
log, the task's events or a process's end, never on the clock.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from tests.test_cli import starter
from tests.test_never_stuck import (
    after_repair,
    drifted_history,
    http_api,
    shell_steps,
    stuck_on_todays_build,
)
from tests.test_resume_fork_edges import KEY_1, client_for, with_keys
from waystation.activities.notify.delivery import webhook_retry
from waystation.activities.notify.payloads import slack_body
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.stuck_notices import notify_stuck_tasks
from waystation.settings import Settings
from waystation.settings.webhooks import WebhookConfigError
from waystation.testing.fake_openai import FakeOpenAI, error, text, tools
from waystation.testing.webhook_receiver import Received, WebhookReceiver, signature_valid
from waystation.testing.workers import WorkerProcess, running_worker
from waystation.workflows.events import ApprovalRequested
from waystation.workflows.notice import (
    NOTIFICATION_WORKFLOW_TYPE,
    DeliveryReport,
    NotificationTargets,
    notice_of,
)

SECRET = "whsec-" + secrets.token_hex(16)
CONSOLE = "http://console.example:8000"
# A path that stands for a Slack URL's token: it must not show anywhere either.
PRIVATE_PATH = "hooks/T0PRIVATE/" + secrets.token_hex(8)
ALL_KINDS = ["approval_requested", "question_asked", "done", "failed", "stuck"]


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver()
    yield server
    server.close()


def endpoint(
    name: str, receiver: WebhookReceiver, events: list[str], **fields: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "url": receiver.url(fields.pop("path", name)),
        "events": events,
        "secret": SECRET,
        **fields,
    }


def webhook_env(*endpoints: dict[str, Any], **more: str) -> dict[str, str]:
    """A worker's environment for these endpoints, with short retry intervals."""
    return {
        "WAYSTATION_WEBHOOKS": json.dumps(list(endpoints)),
        "WAYSTATION_CONSOLE_URL": CONSOLE,
        "WAYSTATION_WEBHOOK_RETRY_INITIAL_SECONDS": "0.05",
        "WAYSTATION_WEBHOOK_RETRY_MAX_SECONDS": "0.2",
        **more,
    }


Spawn = Callable[[dict[str, str]], Awaitable[WorkerProcess]]


@pytest.fixture
def spawn(dev_env: WorkflowEnvironment, settings: Settings) -> Iterator[Spawn]:
    """Start worker processes with an environment on top of the test's; all killed after."""
    started: list[WorkerProcess] = []
    address = dev_env.client.service_client.config.target_host

    async def start(env: dict[str, str]) -> WorkerProcess:
        worker = WorkerProcess(address, settings, env)
        started.append(worker)
        return await worker.ready()

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def runtime(dev_env: WorkflowEnvironment, settings: Settings) -> AgentRuntime:
    return AgentRuntime(dev_env.client, settings)


def keyed(requests: list[Received], key: str) -> list[Received]:
    return [r for r in requests if r.key == key]


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def approve_ask_answer(fake: FakeOpenAI, question: str = "Which colour?") -> str:
    """A model that runs a shell command (approval), asks with choices, then answers."""

    def reply(body: dict[str, Any]) -> Any:
        told = tool_results(body)
        if not told:
            return tools(("run_shell", {"command": "echo hi"}), content="first a command")
        if len(told) == 1:
            return tools(("ask_person", {"question": question, "choices": ["Red", "Blue"]}))
        return text(f"so: {told[-1]}")

    return fake.script(reply)


def asking(fake: FakeOpenAI, question: str = "Which account?") -> str:
    def reply(body: dict[str, Any]) -> Any:
        told = tool_results(body)
        if not told:
            return tools(("ask_person", {"question": question}))
        return text(f"so: {told[-1]}")

    return fake.script(reply)


async def notification_reports(client: Client, task_id: str) -> dict[str, DeliveryReport]:
    """The result of each notification workflow of the task, by workflow id."""
    query = f'WorkflowType="{NOTIFICATION_WORKFLOW_TYPE}"'
    reports: dict[str, DeliveryReport] = {}
    async for execution in client.list_workflows(query):
        if execution.id.startswith(f"{task_id}/notify/"):
            handle = client.get_workflow_handle(execution.id, result_type=DeliveryReport)
            reports[execution.id] = await handle.result()
    return reports


async def histories_json(client: Client, task_id: str) -> str:
    """Every history the task made: its runs and its notification workflows."""
    texts = []
    async for execution in client.list_workflows(f'WorkflowId="{task_id}"'):
        handle = client.get_workflow_handle(task_id, run_id=execution.run_id)
        texts.append((await handle.fetch_history()).to_json())
    async for execution in client.list_workflows(f'WorkflowType="{NOTIFICATION_WORKFLOW_TYPE}"'):
        if execution.id.startswith(f"{task_id}/notify/"):
            handle = client.get_workflow_handle(execution.id)
            texts.append((await handle.fetch_history()).to_json())
    return "\n".join(texts)


async def test_each_kind_arrives_signed_with_the_documented_body_and_its_actions_work(
    dev_env: WorkflowEnvironment,
    runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    receiver: WebhookReceiver,
    spawn: Spawn,
) -> None:
    ops = endpoint("ops", receiver, ALL_KINDS, path=PRIVATE_PATH)
    worker = await spawn(webhook_env(ops))
    handle = await runtime.run(
        agent_task(approve_ask_answer(fake_openai), task="paint the shed"), task_id="shed-1"
    )
    path = PRIVATE_PATH

    # approval_requested: the call, and the API calls that decide it.
    [asked] = await receiver.until(lambda rs: len(rs) >= 1, path)
    notice = asked.json()
    assert signature_valid(SECRET, asked)
    [request_id] = (await handle.state()).pending_approvals
    assert asked.key == notice["key"] == f"shed-1:{request_id}"
    assert asked.headers["x-waystation-event"] == notice["kind"] == "approval_requested"
    assert notice["task"] == {
        "id": "shed-1",
        "text": "paint the shed",
        "url": f"{CONSOLE}/#/tasks/shed-1",
        "schedule": None,  # started by no schedule (docs/schedules.md)
    }
    assert notice["event"]["type"] == "approval_requested"
    assert notice["event"]["request_id"] == request_id
    assert notice["request"] == {
        "kind": "approval",
        "request_id": request_id,
        "tool": "run_shell",
        "arguments": notice["event"]["arguments"],
        "reason": notice["event"]["reason"],
        "model_reason": "first a command",
    }
    assert notice["request"]["arguments"]["command"] == "echo hi"
    assert (notice["result"], notice["failure"], notice["stuck"]) == (None, None, None)
    approve, reject = notice["actions"]
    assert approve == {
        "name": "approve",
        "method": "POST",
        "path": "/tasks/shed-1/approve",
        "body": {"request_id": request_id},
    }
    assert (reject["name"], reject["path"]) == ("reject", "/tasks/shed-1/reject")

    async with http_api(runtime) as api:
        decided = await api.request(approve["method"], approve["path"], json=approve["body"])
        assert decided.status_code == 200, decided.text

        # question_asked: the question, its choices, one answer call per choice.
        _, question = await receiver.until(lambda rs: len(rs) >= 2, path)
        notice = question.json()
        assert signature_valid(SECRET, question)
        assert notice["kind"] == "question_asked"
        request = notice["request"]
        assert (request["kind"], request["question"], request["choices"]) == (
            "question",
            "Which colour?",
            ["Red", "Blue"],
        )
        assert question.key == f"shed-1:{request['request_id']}"
        red, blue = notice["actions"]
        assert red["body"] == {"request_id": request["request_id"], "answer": "Red"}
        answered = await api.request(blue["method"], blue["path"], json=blue["body"])
        assert answered.status_code == 200, answered.text

    # done: the answer.
    assert (await handle.result()).result == "so: alice answered: Blue"
    *_, done = await receiver.until(lambda rs: len(rs) >= 3, path)
    notice = done.json()
    assert signature_valid(SECRET, done)
    assert notice["kind"] == "done" and notice["result"] == "so: alice answered: Blue"
    assert done.key == f"shed-1:{notice['event']['seq']}"
    assert notice["actions"] == [] and notice["request"] is None

    # failed: the kind and the reason, and the call that resumes it.
    broken = fake_openai.script([error(400, "no such model")])
    failing = await runtime.run(agent_task(broken, task="fail"), task_id="shed-2")
    seen = await receiver.until(lambda rs: any(r.key.startswith("shed-2:") for r in rs), path)
    [failed] = [r for r in seen if r.key.startswith("shed-2:")]
    notice = failed.json()
    assert signature_valid(SECRET, failed)
    assert notice["kind"] == "failed" and notice["failure"]["kind"] == "llm_error"
    assert "no such model" in notice["failure"]["reason"]
    assert notice["actions"] == [
        {"name": "resume", "method": "POST", "path": "/tasks/shed-2/resume", "body": {}}
    ]
    await wait_for_state(failing, lambda s: s.status == "failed")

    # One delivery each; the secret and the URL's private path are in no history and in
    # no line the worker logged.
    assert len({r.key for r in receiver.requests()}) == len(receiver.requests()) == 4
    for task_id in ("shed-1", "shed-2"):
        recorded = await histories_json(dev_env.client, task_id)
        assert "notify" in recorded  # the notification workflows' histories are there
        assert SECRET not in recorded and "T0PRIVATE" not in recorded
    logged = worker.log.read_text()
    assert SECRET not in logged and "T0PRIVATE" not in logged


async def test_a_worker_killed_mid_delivery_is_followed_by_a_retry_with_the_same_key(
    runtime: AgentRuntime, fake_openai: FakeOpenAI, receiver: WebhookReceiver, spawn: Spawn
) -> None:
    env = webhook_env(
        endpoint("ops", receiver, ["question_asked", "done"]), WAYSTATION_HEARTBEAT_TIMEOUT="2"
    )
    first = await spawn(env)
    gate = receiver.hold("ops")
    handle = await runtime.run(agent_task(asking(fake_openai)))
    [held] = await receiver.until(lambda rs: len(rs) == 1, "ops")  # in flight, unanswered
    first.kill()
    gate.set()  # the answer goes to a dead socket
    await spawn(env)
    held_again = await receiver.until(lambda rs: len(keyed(rs, held.key)) >= 2, "ops")
    again = keyed(held_again, held.key)[1]
    assert (held.attempt, again.attempt) == (1, 2)
    assert again.json()["key"] == held.json()["key"] == held.key
    assert signature_valid(SECRET, again) and again.json()["kind"] == "question_asked"

    await handle.answer("ACME", answerer="bob")
    assert (await handle.result()).result == "so: bob answered: ACME"
    everything = await receiver.until(lambda rs: any(r.json()["kind"] == "done" for r in rs))
    assert {r.json()["kind"] for r in everything} == {"question_asked", "done"}


async def test_a_failing_endpoint_is_retried_until_it_takes_the_notice_and_others_get_one(
    dev_env: WorkflowEnvironment,
    runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    receiver: WebhookReceiver,
    spawn: Spawn,
) -> None:
    receiver.answer("flaky", 500, 500, 500)
    receiver.answer("busy", 429, 408, headers={"Retry-After": "0"})
    await spawn(
        webhook_env(
            endpoint("flaky", receiver, ["question_asked"]),
            endpoint("steady", receiver, ["question_asked"]),
            endpoint("busy", receiver, ["question_asked"]),
        )
    )
    handle = await runtime.run(agent_task(asking(fake_openai)))
    attempts = await receiver.until(lambda rs: len(rs) >= 4, "flaky")
    await handle.answer("ACME")
    await handle.result()
    [report] = (await notification_reports(dev_env.client, handle.id)).values()
    delivered = [(d.endpoint, d.status, d.attempt) for d in report.delivered]
    assert delivered == [("flaky", 200, 4), ("steady", 200, 1), ("busy", 200, 3)]
    assert not report.failed
    # Exactly four attempts, one key; the steady endpoint got it once.
    attempts = receiver.requests("flaky")
    assert [r.attempt for r in attempts] == [1, 2, 3, 4]
    assert len({r.key for r in attempts}) == 1
    assert [r.key for r in receiver.requests("steady")] == [attempts[0].key]
    assert [r.attempt for r in receiver.requests("busy")] == [1, 2, 3]  # 429 and 408 retried
    assert not of_type(await handle.events(), "error")


async def test_a_refused_notice_is_not_retried_and_becomes_an_error_event(
    dev_env: WorkflowEnvironment,
    runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    receiver: WebhookReceiver,
    spawn: Spawn,
) -> None:
    receiver.answer("strict", 400, body="unknown field 'kind'")
    receiver.answer("late", 400)
    receiver.answer("down", *[503] * 1000)
    worker = await spawn(
        webhook_env(
            endpoint("strict", receiver, ["question_asked"]),
            endpoint("late", receiver, ["done"]),
            endpoint("down", receiver, ["question_asked"]),
            WAYSTATION_WEBHOOK_RETRY_HOURS="0.002",  # 7.2 s: room for a retry on a busy machine
        )
    )
    handle = await runtime.run(agent_task(asking(fake_openai)))

    async def errors() -> list[Any]:
        return of_type(await handle.events(), "error")

    async with asyncio.timeout(60):
        while len(noted := await errors()) < 2:
            await asyncio.sleep(0.05)
    refused, gave_up = sorted(noted, key=lambda e: "'down'" in e.message)
    assert refused.kind == gave_up.kind == "notification_failed"
    assert "'strict'" in refused.message and "HTTP 400" in refused.message
    assert "unknown field 'kind'" in refused.message and "not retried" in refused.message
    assert "still failing after 0.002 h of retries" in gave_up.message
    assert "'down' answered HTTP 503" in gave_up.message
    assert len(receiver.requests("strict")) == 1
    assert len(receiver.requests("down")) > 1
    state = await handle.state()
    assert state.status == "waiting_input"  # the task goes on waiting, not failed

    await handle.answer("ACME")
    assert (await handle.result()).result == "so: the person answered: ACME"
    # A task that has closed when its delivery fails: the worker says so in its log.
    async with asyncio.timeout(60):
        while "has closed" not in worker.log.read_text():
            await asyncio.sleep(0.05)
    assert "'late'" in worker.log.read_text()
    reports = await notification_reports(dev_env.client, handle.id)
    failed = sorted(f.endpoint for r in reports.values() for f in r.failed)
    assert failed == ["down", "late", "strict"]
    assert len(receiver.requests("strict")) == len(receiver.requests("late")) == 1


async def test_a_wait_asked_past_the_deadline_gives_up_at_once_as_out_of_time(
    runtime: AgentRuntime, fake_openai: FakeOpenAI, receiver: WebhookReceiver, spawn: Spawn
) -> None:
    # The server does not wait for a deadline that the next attempt would start after: it
    # fails the delivery with the last attempt's failure there and then, and that too reads
    # as out of time (the path a busy machine takes when the deadline falls in a backoff).
    receiver.answer("down", 503, headers={"Retry-After": "3600"})
    await spawn(
        webhook_env(
            endpoint("down", receiver, ["question_asked"]),
            WAYSTATION_WEBHOOK_RETRY_HOURS="0.01",
        )
    )
    handle = await runtime.run(agent_task(asking(fake_openai)))
    async with asyncio.timeout(60):
        while not (noted := of_type(await handle.events(), "error")):
            await asyncio.sleep(0.05)
    [gave_up] = noted
    assert "still failing after 0.01 h of retries" in gave_up.message
    assert "'down' answered HTTP 503" in gave_up.message
    assert len(receiver.requests("down")) == 1
    await handle.answer("ACME")
    assert (await handle.result()).result == "so: the person answered: ACME"


@pytest.mark.long(minutes=0.5)
async def test_a_stuck_task_is_told_once_whatever_the_workers_watching_it(
    dev_env: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    settings: Settings,
    receiver: WebhookReceiver,
    spawn: Spawn,
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    handle = await drifted_history(
        dev_env, settings, runtime, fake_openai.script(shell_steps("step1", "step2"))
    )
    watching = webhook_env(
        endpoint("ops", receiver, ["stuck"]), WAYSTATION_WEBHOOK_STUCK_CHECK_SECONDS="0.2"
    )
    for _ in range(2):  # two workers watch the task queue
        await spawn(watching)
    found = await stuck_on_todays_build(dev_env, handle)
    run_id = (await handle.overview()).run_id
    [told] = await receiver.until(lambda rs: len(rs) >= 1, "ops")
    notice = told.json()
    assert signature_valid(SECRET, told)
    assert told.key == notice["key"] == f"{handle.id}:stuck:{run_id}:{found.reset_to_event}"
    assert notice["kind"] == "stuck" and notice["event"] is None
    assert notice["stuck"]["run_id"] == run_id
    assert notice["stuck"]["reset_to_event"] == found.reset_to_event
    assert "Nondeterminism" in notice["stuck"]["problem"]
    assert notice["actions"] == [
        {"name": "repair", "method": "POST", "path": f"/tasks/{handle.id}/repair", "body": {}}
    ]
    # Another look at the same failure point (as each worker takes every 0.2 s) tells no one.
    targets = NotificationTargets(endpoints={"ops": ["stuck"]}, retry=webhook_retry(settings))
    assert await notify_stuck_tasks(dev_env.client, settings.task_queue, targets) == []
    assert len(receiver.requests("ops")) == 1
    await runtime.repair(handle.id, by="alice")
    await after_repair(dev_env, settings, handle)


async def test_a_run_begun_by_a_worker_that_serves_no_activities_asks_one_that_does(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    receiver: WebhookReceiver,
    spawn: Spawn,
) -> None:
    # What a command hosts to answer a query: workflow tasks only, and no webhooks set.
    async with running_worker(dev_env.client, settings, activities=False):
        handle = await runtime.run(agent_task(asking(fake_openai)))
        await wait_for_state(handle, lambda s: s.status == "running")  # its first task ran
        history = await dev_env.client.get_workflow_handle(handle.id).fetch_history()
        assert any(e.HasField("marker_recorded_event_attributes") for e in history.events)
        await spawn(webhook_env(endpoint("ops", receiver, ["question_asked"])))
        [told] = await receiver.until(lambda rs: len(rs) >= 1, "ops")
    assert told.json()["kind"] == "question_asked" and signature_valid(SECRET, told)
    await handle.answer("ACME")
    await handle.result()


def slack_shape_problems(message: Any) -> list[str]:
    """Where `message` leaves Slack's documented incoming-webhook payload: a `text` (the
    notification's fallback) and `blocks` (at most 50) of section (mrkdwn text, at most
    3,000 characters), context (at most 10 mrkdwn elements) and actions (buttons with a
    plain_text label of at most 75 characters and a url)."""
    problems = []
    if set(message) != {"text", "blocks"}:
        problems.append(f"keys {sorted(message)}")
    if not isinstance(message.get("text"), str) or not message["text"]:
        problems.append("no text")
    blocks = message.get("blocks")
    if not isinstance(blocks, list) or not 0 < len(blocks) <= 50:
        return [*problems, "blocks"]
    for block in blocks:
        kind = block.get("type")
        if kind == "section":
            body = block.get("text", {})
            if body.get("type") != "mrkdwn" or not 0 < len(body.get("text", "")) <= 3000:
                problems.append(f"section {block}")
        elif kind == "context":
            elements = block.get("elements", [])
            if not 0 < len(elements) <= 10 or any(e.get("type") != "mrkdwn" for e in elements):
                problems.append(f"context {block}")
        elif kind == "actions":
            for button in block.get("elements", []):
                label = button.get("text", {})
                if (
                    button.get("type") != "button"
                    or label.get("type") != "plain_text"
                    or not 0 < len(label.get("text", "")) <= 75
                    or not str(button.get("url", "")).startswith("http")
                ):
                    problems.append(f"button {button}")
        else:
            problems.append(f"block type {kind}")
    return problems


async def test_a_slack_endpoint_gets_a_slack_message_with_the_question_and_a_link(
    runtime: AgentRuntime, fake_openai: FakeOpenAI, receiver: WebhookReceiver, spawn: Spawn
) -> None:
    slack = endpoint("team", receiver, ["approval_requested", "question_asked"], format="slack")
    del slack["secret"]  # a Slack URL is its own credential
    await spawn(webhook_env(slack))
    model = approve_ask_answer(fake_openai, question="Ping <!channel> & co?")
    handle = await runtime.run(agent_task(model, task="tidy up"), task_id="slack-1")
    [call] = await receiver.until(lambda rs: len(rs) >= 1, "team")
    message = call.json()
    assert slack_shape_problems(message) == []
    sections = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]
    assert any("`run_shell`" in s and "echo hi" in s for s in sections)
    assert "x-waystation-signature" not in call.headers  # no secret: nothing to sign with
    await handle.approve()

    *_, asked = await receiver.until(lambda rs: len(rs) >= 2, "team")
    message = asked.json()
    assert slack_shape_problems(message) == []
    assert message["text"] == "Task slack-1 asks a question: Ping &lt;!channel&gt; &amp; co?"
    sections = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]
    assert sections[0] == "*Task slack-1 asks a question*\n>tidy up"
    assert "*Question:* Ping &lt;!channel&gt; &amp; co?" in sections
    assert "*Choices:* Red · Blue" in sections
    [context] = [b for b in message["blocks"] if b["type"] == "context"]
    assert "POST /tasks/slack-1/answer" in context["elements"][0]["text"]
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert actions["elements"][0]["url"] == f"{CONSOLE}/#/tasks/slack-1"
    await handle.answer("Red")
    await handle.result()


@pytest.mark.parametrize(
    ("entry", "sentence"),
    [
        (
            {"url": "ftp://example.com/x"},
            "webhook endpoint 'ops' needs a url that is an http:// or https:// URL",
        ),
        (
            {"events": ["question_asked", "approved"]},
            "webhook endpoint 'ops' wants an unknown event 'approved'; known: "
            "approval_requested, question_asked, done, failed, stuck",
        ),
        (
            {"secret": None},
            "webhook endpoint 'ops' has no secret: give one, so receivers can check the signature",
        ),
    ],
    ids=["bad-url", "unknown-event", "no-secret"],
)
async def test_a_bad_setting_stops_the_worker_with_a_sentence_naming_the_endpoint(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    receiver: WebhookReceiver,
    entry: dict[str, Any],
    sentence: str,
) -> None:
    bad = {**endpoint("ops", receiver, ["question_asked"]), **entry}
    bad = {k: v for k, v in bad.items() if v is not None}
    address = dev_env.client.service_client.config.target_host
    worker = WorkerProcess(address, settings, webhook_env(bad))
    code = await asyncio.to_thread(worker.process.wait, 120)
    assert code == 1
    logged = worker.log.read_text()
    assert logged.strip().splitlines()[-1] == f"worker cannot start: {sentence}"
    assert SECRET not in logged


async def test_ws_config_shows_the_endpoints_with_secrets_and_private_paths_masked(
    dev_env: WorkflowEnvironment, settings: Settings, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    file = tmp_path / "webhooks.json"
    ops = endpoint("ops", receiver, ["question_asked", "stuck"], path=PRIVATE_PATH)
    file.write_text(json.dumps([ops]))
    env = {"WAYSTATION_WEBHOOKS": str(file), "WAYSTATION_CONSOLE_URL": CONSOLE}
    code, out, err = await starter(dev_env, settings, "config", extra_env=env)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["webhooks"] == [
        {
            "name": "ops",
            "url": f"{receiver.base}/****",
            "events": ["question_asked", "stuck"],
            "secret": "****",
            "format": "json",
        }
    ]
    assert shown["console_url"] == CONSOLE
    assert SECRET not in out and "T0PRIVATE" not in out


@pytest.mark.parametrize(
    ("raw", "sentence"),
    [
        ("[{", "WAYSTATION_WEBHOOKS is not JSON: Expecting property name"),
        ("{}", "WAYSTATION_WEBHOOKS must be a JSON list of endpoints"),
        ("/nowhere/webhooks.json", "WAYSTATION_WEBHOOKS is neither JSON nor a file that can"),
        ('[{"url": "https://x.example"}]', "webhook endpoint 1 needs a name of 1 to 64"),
        (
            '[{"name": "a", "url": "https://x.example", "events": ["done"], "secret": "s"},'
            ' {"name": "a", "url": "https://y.example", "events": ["done"], "secret": "s"}]',
            "WAYSTATION_WEBHOOKS names webhook endpoint 'a' twice",
        ),
        (
            '[{"name": "a", "url": "https://x.example", "events": ["done"], "secret": "s",'
            ' "format": "teams"}]',
            "webhook endpoint 'a' has format 'teams'; it is json or slack",
        ),
        (
            '[{"name": "a", "url": "https://x.example", "events": [], "secret": "s"}]',
            "webhook endpoint 'a' needs events, a list of some of: approval_requested",
        ),
        (
            '[{"name": "a", "url": "https://x.example", "events": ["done"], "secrt": "s"}]',
            "webhook endpoint 'a' has an unknown field 'secrt'",
        ),
    ],
)
def test_every_problem_of_the_setting_is_one_sentence(raw: str, sentence: str) -> None:
    with pytest.raises(WebhookConfigError) as refused:
        Settings(webhooks=raw).webhook_endpoints()  # type: ignore[arg-type]
    assert str(refused.value).startswith(sentence)
    assert "\n" not in str(refused.value)


def test_a_slack_endpoint_needs_no_secret_and_a_file_holds_the_same_list(tmp_path: Path) -> None:
    team = {"name": "team", "url": "https://hooks.slack.com/services/T/B/X", "events": ["done"]}
    file = tmp_path / "hooks.json"
    file.write_text(json.dumps([{**team, "format": "slack"}]))
    [endpoint] = Settings(webhooks=str(file)).webhook_endpoints()  # type: ignore[arg-type]
    assert (endpoint.name, endpoint.format, endpoint.secret) == ("team", "slack", None)
    assert endpoint.shown()["url"] == "https://hooks.slack.com/****"
    with pytest.raises(WebhookConfigError, match="WAYSTATION_CONSOLE_URL must be an http"):
        Settings(console_url="localhost:8000").webhook_endpoints()


@pytest.mark.long(minutes=0.8)
async def test_every_stuck_task_is_told_even_without_a_repair_point_or_a_readable_text(
    dev_env: WorkflowEnvironment, settings: Settings, receiver: WebhookReceiver, spawn: Spawn
) -> None:
    # The worker lacks the key the tasks are encrypted with: each is stuck on its first
    # workflow task (no repair point) and its text cannot be decoded there.
    await spawn(
        webhook_env(
            endpoint("ops", receiver, ["stuck"]), WAYSTATION_WEBHOOK_STUCK_CHECK_SECONDS="0.2"
        )
    )
    secure = with_keys(settings, {"k1": KEY_1}, "k1")
    runtime = AgentRuntime(await client_for(dev_env, secure), secure)
    ids = {"stuck-first-a", "stuck-first-b"}
    for task_id in sorted(ids):
        await runtime.run(agent_task("offline", "add 2+2"), task_id=task_id)
    told = await receiver.until(lambda rs: {r.json()["task"]["id"] for r in rs} >= ids, "ops", 120)
    for request in told:
        notice = request.json()
        assert signature_valid(SECRET, request)
        assert notice["kind"] == "stuck" and notice["task"]["text"] == ""
        assert notice["stuck"]["reset_to_event"] is None and notice["actions"] == []
        task_id, run_id = notice["task"]["id"], notice["stuck"]["run_id"]
        assert request.key == notice["key"] == f"{task_id}:stuck:{run_id}:start"
    assert len(told) == len(ids)


@pytest.mark.parametrize("size", [8_000, 400_000])
def test_a_slack_approval_notice_holds_the_whole_call_or_says_what_it_left_out(
    size: int,
) -> None:
    command = "echo <start> & " + "y" * size + " && rm -rf ~/the-end"
    requested = ApprovalRequested(
        seq=2,
        step=1,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        request_id="1-call_1_0",
        call_id="call_1",
        tool="run_shell",
        arguments={"command": command},
        reason="run_shell needs approval",
    )
    notice = notice_of(
        requested,
        "slack-long",
        "tidy up",
        NotificationTargets(
            endpoints={"team": ["approval_requested"]}, retry=webhook_retry(Settings())
        ),
    )
    assert notice is not None
    message = slack_body(notice, CONSOLE)
    assert slack_shape_problems(message) == []
    sections = [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]
    shown = "".join(re.findall(r"```(.*?)```", "".join(sections), re.DOTALL))
    if size < 100_000:  # all of it, in order, however many sections it takes
        assert json.loads(html.unescape(shown)) == {"command": command}
    else:
        assert "rm -rf ~/the-end" not in shown
        assert any("more characters, not shown here" in s for s in sections), sections[-2:]
