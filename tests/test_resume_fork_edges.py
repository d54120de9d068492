"""Resume, fork and encryption as a new user meets them: through the CLI (a real
subprocess), the HTTP API and the Python API, with payload encryption on and off."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type
from tests.test_cli import starter
from waystation.activities.payload_codec import (
    ENCODING,
    EncryptionCodec,
    data_converter,
    new_key,
    payload_codec,
)
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.health import STUCK_AFTER_ATTEMPTS
from waystation.servers.http_api import create_app
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess, running_worker

KEY_1, KEY_2 = new_key(), new_key()


def keys_env(keys: dict[str, str], active: str | None) -> dict[str, str]:
    """The environment a user sets for encryption (empty: encryption off)."""
    if not keys:
        return {}
    return {
        "WAYSTATION_ENCRYPTION_KEYS": json.dumps(keys),
        "WAYSTATION_ENCRYPTION_KEY_ID": active or "",
    }


def with_keys(settings: Settings, keys: dict[str, str], active: str | None) -> Settings:
    values = {**settings.model_dump(), "encryption_keys": keys, "encryption_key_id": active}
    return Settings.model_validate(values)


async def client_for(dev_env: WorkflowEnvironment, settings: Settings) -> Client:
    return await Client.connect(
        dev_env.client.service_client.config.target_host,
        data_converter=data_converter(payload_codec(settings)),
    )


@asynccontextmanager
async def api_over(runtime: AgentRuntime) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API app over `runtime` (no tokens: every local caller is an approver)."""
    app = create_app(runtime.settings, runtime)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as api,
    ):
        yield api


async def input_is_encrypted(dev_env: WorkflowEnvironment, task_id: str) -> bool:
    """Whether the task's start input is ciphertext in history (read without any key)."""
    history = await dev_env.client.get_workflow_handle(task_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return bool(started.input.payloads[0].metadata.get("encoding") == ENCODING)


async def run_closed(dev_env: WorkflowEnvironment, task_id: str) -> None:
    """Wait until Temporal closes the task's run (its resume grace is over)."""
    handle = dev_env.client.get_workflow_handle(task_id)
    async with asyncio.timeout(30):
        while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await asyncio.sleep(0.05)


def steps_then_answer(fake: FakeOpenAI, steps: int, answer: str = "finished") -> str:
    """A model that makes `steps` calculator steps, then answers."""
    replies = [tools(("calculator", {"expression": f"{i} + {i}"})) for i in range(1, steps + 1)]
    return fake.script([*replies, text(answer)])


# --- 1. encryption on: a task failed on its step limit resumes ------------------------------


async def test_encrypted_task_failed_on_its_step_limit_resumes_by_cli(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    encryption = keys_env({"k1": KEY_1}, "k1")
    model = steps_then_answer(fake_openai, steps=3)
    task_id = f"enc-cli-{model}"
    code, _, err = await starter(
        dev_env,
        settings,
        *("run", "--id", task_id, "--model", model, "--max-steps", "2", "--quiet", "count"),
        endpoint=fake_openai,
        extra_env=encryption,
    )
    assert code == 1 and "max_steps=2" in err, err
    assert await input_is_encrypted(dev_env, task_id)

    code, out, err = await starter(
        dev_env,
        settings,
        *("resume", task_id, "--max-steps", "10"),
        endpoint=fake_openai,
        extra_env=encryption,
    )
    assert code == 0, err
    assert "Traceback" not in err
    assert f"task {task_id} done in 4 step(s)" in err
    assert "finished" in out


async def test_encrypted_task_failed_on_its_step_limit_resumes_by_api(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    secure = with_keys(settings, {"k1": KEY_1}, "k1")
    runtime = AgentRuntime(await client_for(dev_env, secure), secure)
    model = steps_then_answer(fake_openai, steps=3)
    async with running_worker(runtime.client, secure), api_over(runtime) as api:
        body = {"task": "count", "model": {"name": model}, "max_steps": 2}
        task_id = (await api.post("/tasks", json=body)).json()["id"]
        await run_closed(dev_env, task_id)
        assert await input_is_encrypted(dev_env, task_id)
        state = (await api.get(f"/tasks/{task_id}")).json()["state"]
        assert state["status"] == "failed" and state["failure_kind"] == "max_steps"

        resumed = await api.post(f"/tasks/{task_id}/resume", json={"max_steps": 10})
        assert resumed.status_code == 200, resumed.text
        outcome = await runtime.get(task_id).result()
    assert outcome.result == "finished" and outcome.steps == 4


# --- 2. a payload encrypted with a key this side does not hold ------------------------------


async def test_a_task_under_a_retired_key_is_one_clear_error_in_api_and_cli(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    old = with_keys(settings, {"k1": KEY_1}, "k1")
    old_runtime = AgentRuntime(await client_for(dev_env, old), old)
    model = fake_openai.script([tools(("calculator", {"expression": "6*7"})), text("42")])
    async with running_worker(old_runtime.client, old):
        handle = await old_runtime.run(agent_task(model))
        assert (await handle.result()).result == "42"

    # After the rotation, worker, API and CLI hold only the new key.
    new = with_keys(settings, {"k2": KEY_2}, "k2")
    runtime = AgentRuntime(await client_for(dev_env, new), new)
    sentence = "payload encrypted with unknown key 'k1'"
    async with running_worker(runtime.client, new), api_over(runtime) as api:
        paths = (f"/tasks/{handle.id}", f"/tasks/{handle.id}/log", f"/tasks/{handle.id}/events")
        for path in paths:
            answer = await api.get(path)
            assert answer.status_code == 500, (path, answer.text)
            assert answer.headers["content-type"] == "application/json", answer.text
            assert answer.json()["error"] == "unreadable_task"
            assert sentence in answer.json()["detail"], answer.text

    for command in ("events", "status", "stream"):
        code, out, err = await starter(
            dev_env, settings, command, handle.id, extra_env=keys_env({"k2": KEY_2}, "k2")
        )
        assert code == 1 and out == "", (command, out, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith("error: ") and sentence in err, err


async def test_a_key_that_changed_under_its_id_says_so() -> None:
    written = EncryptionCodec({"k1": base64.b64decode(KEY_1)}, "k1")
    [sealed] = await written.encode([Payload(metadata={"encoding": b"json/plain"}, data=b"1")])
    changed = EncryptionCodec({"k1": base64.b64decode(KEY_2)}, "k1")
    with pytest.raises(ValueError, match="payload does not decrypt with key 'k1'"):
        await changed.decode([sealed])


# --- 2b. the worker and the client disagree about encryption --------------------------------

DISAGREE = "the worker and the client disagree about encryption"


def one_error_line(err: str) -> str:
    """The command's whole stderr after the line saying the task started: one error line."""
    lines = [line for line in err.strip().splitlines() if not line.startswith("task ")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


async def until_stuck(dev_env: WorkflowEnvironment, task_id: str) -> None:
    """Until Temporal has retried the task's failing workflow task enough to call it stuck."""
    handle = dev_env.client.get_workflow_handle(task_id)
    async with asyncio.timeout(120):
        while True:
            pending = (await handle.describe()).raw_description.pending_workflow_task
            if pending.attempt >= STUCK_AFTER_ATTEMPTS:
                return
            await asyncio.sleep(0.2)


@pytest.mark.long(minutes=0.6)
async def test_a_worker_without_the_clients_keys_leaves_the_task_stuck_and_says_why(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    address = dev_env.client.service_client.config.target_host
    worker = await WorkerProcess(address, settings).ready()  # no WAYSTATION_ENCRYPTION_KEYS
    encryption = keys_env({"k1": KEY_1}, "k1")
    lacks = "the worker has no encryption keys, but a payload of task 'nokey' is encrypted"
    try:
        code, _, err = await starter(
            dev_env,
            settings,
            "run",
            "--no-worker",
            "--id",
            "nokey",
            "add 2+2",
            extra_env=encryption,
        )
        assert code == 1, err
        line = one_error_line(err)
        assert line.startswith("error: task nokey: ") and lacks in line, line
        assert "with key 'k1'" in line and DISAGREE in line, line

        await until_stuck(dev_env, "nokey")
        for command, env in (("status", encryption), ("events", encryption), ("status", {})):
            code, out, err = await starter(
                dev_env, settings, command, "--no-worker", "nokey", extra_env=env
            )
            assert code == 1 and out == "", (command, out, err)
            line = one_error_line(err)
            assert lacks in line and DISAGREE in line, (command, line)

        secure = with_keys(settings, {"k1": KEY_1}, "k1")
        runtime = AgentRuntime(await client_for(dev_env, secure), secure)
        async with asyncio.timeout(120):  # Temporal lists it stuck: visible without a worker
            while "nokey" not in [t.id for t in (await runtime.list_tasks("stuck"))[0]]:
                await asyncio.sleep(0.2)
        async with api_over(runtime) as api:
            answer = await api.get("/tasks/nokey")
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"] == "unreadable_task", answer.text
        assert lacks in answer.json()["detail"], answer.text

        # The worker lives on and says it once, in one line: no traceback at each retry.
        assert worker.process.poll() is None
        log = worker.log.read_text()
        [said] = [line for line in log.splitlines() if DISAGREE in line]
        assert lacks in said, log
        assert "Traceback" not in log and "SDK bug" not in log, log
        assert KEY_1 not in log + line + answer.text
    finally:
        worker.kill()


async def test_a_client_without_the_workers_keys_says_so_and_so_does_the_worker(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    address = dev_env.client.service_client.config.target_host
    worker = WorkerProcess(address, settings, keys_env({"k1": KEY_1}, "k1"))
    await worker.ready()
    lacks = "this client has no encryption keys, but a payload"
    try:
        code, _, err = await starter(
            dev_env, settings, "run", "--no-worker", "--id", "plain", "2+2"
        )
        assert code == 1, err
        line = one_error_line(err)
        assert line.startswith("error: task plain: ") and lacks in line, line
        assert "encrypted with key 'k1'" in line and DISAGREE in line, line

        for command in ("status", "events"):
            code, out, err = await starter(dev_env, settings, command, "plain")
            assert code == 1 and out == "", (command, out, err)
            line = one_error_line(err)
            assert lacks in line and "key 'k1'" in line and DISAGREE in line, (command, line)

        runtime = AgentRuntime(await client_for(dev_env, settings), settings)
        async with api_over(runtime) as api:
            answer = await api.get("/tasks/plain")
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"] == "unreadable_task", answer.text
        assert lacks in answer.json()["detail"] and "key 'k1'" in answer.json()["detail"]

        # The worker, sent the task in plaintext, says which side lacks the key, once.
        log = worker.log.read_text()
        [said] = [line for line in log.splitlines() if "'plain'" in line]
        assert "not encrypted, though the worker encrypts with key 'k1'" in said, log
        assert DISAGREE in said and "Traceback" not in log, log
        assert KEY_1 not in log + line + answer.text
    finally:
        worker.kill()


# --- 3. fork with a message at a thought that asked for two calls ---------------------------


def unanswered_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Tool calls the conversation sends with no tool reply before the next other message
    (OpenAI's API refuses such a conversation with a 400)."""
    missing: list[str] = []
    open_calls: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            if message.get("tool_call_id") in open_calls:
                open_calls.remove(message["tool_call_id"])
            continue
        missing += open_calls
        open_calls = [c["id"] for c in message.get("tool_calls") or []]
    return missing + open_calls


def two_call_model(body: dict[str, Any]) -> Reply:
    """Two calculator calls in one thought; then the sum, or what a later user message says."""
    messages = body["messages"]
    users = [m for m in messages if m["role"] == "user"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if len(users) > 1:
        return text(f"new direction: {users[-1]['content']} after {' and '.join(results)}")
    if not results:
        return tools(("calculator", {"expression": "1 + 1"}), ("calculator", {"expression": "2*3"}))
    return text(f"sum of {' and '.join(results)}")


@pytest.mark.long(minutes=0.45)
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_fork_with_a_message_runs_the_thoughts_calls_first(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, encrypted: bool
) -> None:
    keys = {"k1": KEY_1} if encrypted else {}
    secure = with_keys(settings, keys, "k1" if encrypted else None)
    runtime = AgentRuntime(await client_for(dev_env, secure), secure)
    model = fake_openai.script(two_call_model)
    async with running_worker(runtime.client, secure):
        original = await runtime.run(agent_task(model))
        assert (await original.result()).result == "sum of 2 and 6"
        before = await original.events()
        thought = of_type(before, "thought")[0]
        first, second = of_type(before, "observation")
        assert len(thought.tool_calls) == 2 and thought.seq < first.seq < second.seq

        # At the thought: both calls have yet to run. Mid-step: one has run. At the step's
        # end: both have run. Every fork runs what is left, then adds the message.
        for at in (thought.seq, first.seq, second.seq):
            fork_id = f"{original.id}-at-{at}"
            code, _, err = await starter(
                dev_env,
                settings,
                *("fork", original.id, "--at", str(at), "--message", "use hex"),
                *("--new-id", fork_id),
                endpoint=fake_openai,
                extra_env=keys_env(keys, "k1" if encrypted else None),
            )
            assert code == 0, err
            assert f"task {fork_id} done" in err, err
            forked = await runtime.get(fork_id).events()
            assert forked[: at + 1] == before[: at + 1]
            assert [e.type for e in forked[-3:]] == ["user_message", "thought", "done"]
            assert len(of_type(forked, "observation")) == 2
            [done] = of_type(forked, "done")
            assert done.result == "new direction: use hex after 2 and 6"
            assert (await input_is_encrypted(dev_env, fork_id)) == encrypted

    requests = fake_openai.requests[model]
    assert len(requests) == 2 + 3
    for request in requests:
        assert unanswered_calls(request["messages"]) == [], request["messages"]
    for request in requests[2:]:
        roles = [m["role"] for m in request["messages"]]
        assert roles[-4:] == ["assistant", "tool", "tool", "user"], roles


# --- 4. a task that reads `failed` resumes at once -----------------------------------------


async def failed_task(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task that fails on its step limit; returns once its state reads `failed`."""
    model = steps_then_answer(fake, steps=1, answer="resumed fine")
    handle = await runtime.run(agent_task(model, max_steps=1))
    async with asyncio.timeout(30):
        while (await handle.state()).status != "failed":
            await asyncio.sleep(0.02)
    return handle.id


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_a_task_that_reads_failed_resumes_at_once(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, encrypted: bool
) -> None:
    keys = {"k1": KEY_1} if encrypted else {}
    secure = with_keys(settings, keys, "k1" if encrypted else None)
    runtime = AgentRuntime(await client_for(dev_env, secure), secure)
    async with running_worker(runtime.client, secure), api_over(runtime) as api:
        by_python = await failed_task(runtime, fake_openai)
        resumed = await runtime.resume(by_python, max_steps=5)
        assert (await resumed.result()).result == "resumed fine"

        by_api = await failed_task(runtime, fake_openai)
        answer = await api.post(f"/tasks/{by_api}/resume", json={"max_steps": 5})
        assert answer.status_code == 200, answer.text
        assert (await runtime.get(by_api).result()).result == "resumed fine"

        by_cli = await failed_task(runtime, fake_openai)
        code, _, err = await starter(
            dev_env,
            settings,
            *("resume", by_cli, "--max-steps", "5", "--no-worker"),
            extra_env=keys_env(keys, "k1" if encrypted else None),
        )
        assert code == 0, err
        assert (await runtime.get(by_cli).result()).result == "resumed fine"
        for task_id in (by_python, by_api, by_cli):
            [note] = of_type(await runtime.get(task_id).events(), "resumed")
            assert note.failure_kind == "max_steps" and note.max_steps == 5
