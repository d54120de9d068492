"""The schedule routes, as a promise table: what a reader and an approver may do, what a
token bound to a tenant sees (its tenant's schedules only; another's is unknown, 404), and
bad input answered with a clear 4xx. The real API on a port, the dev server, a worker, the
fake OpenAI server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import api_with_tokens
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools

READER, APPROVER, ACME, GLOBEX = "reader-token", "approver-token", "acme-token", "globex-token"


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tenants() -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return {"acme": f"acme-{suffix}", "globex": f"globex-{suffix}"}


@pytest.fixture
async def api(
    dev_env: WorkflowEnvironment, settings: Settings, tenants: dict[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    tokens = {
        READER: ApiToken(role="reader", name="rita"),
        APPROVER: ApiToken(role="approver", name="alice"),
        ACME: ApiToken(role="approver", name="acme-bot", tenant=tenants["acme"]),
        GLOBEX: ApiToken(role="approver", name="globex-bot", tenant=tenants["globex"]),
    }
    async with api_with_tokens(dev_env, settings, tokens) as client:
        yield client


def new_schedule(model: str, **fields: Any) -> dict[str, Any]:
    task = {"task": "check the deploy", "model": {"name": model}, **fields.pop("task", {})}
    return {"name": f"s-{uuid.uuid4().hex[:8]}", "every_seconds": 3600, "task": task, **fields}


async def fired(api: httpx.AsyncClient, name: str, token: str) -> dict[str, Any]:
    """The schedule once a firing has started (bounded)."""
    async with asyncio.timeout(60):
        while True:
            info: dict[str, Any] = (await api.get(f"/schedules/{name}", headers=as_(token))).json()
            if info["recent_runs"]:
                return info
            await asyncio.sleep(0.1)


async def test_a_reader_may_create_read_and_trigger_an_approver_may_also_manage(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: text("fine"))
    wider = new_schedule(model, task={"approval": {"policy": {"run_shell": "never"}}})
    refused = await api.post("/schedules", json=wider, headers=as_(READER))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden_setting"
    assert (await api.post("/schedules", json=wider, headers=as_(APPROVER))).status_code == 201

    body = new_schedule(model)
    name = body["name"]
    created = await api.post("/schedules", json=body, headers=as_(READER))
    assert created.status_code == 201, created.text
    assert created.json()["every_seconds"] == [3600] and created.json()["overlap"] == "skip"
    listed = (await api.get("/schedules", headers=as_(READER))).json()["schedules"]
    assert name in [s["name"] for s in listed]
    for verb in ("pause", "resume"):
        denied = await api.post(f"/schedules/{name}/{verb}", headers=as_(READER))
        assert denied.status_code == 403, verb
    assert (await api.patch(f"/schedules/{name}", json={}, headers=as_(READER))).status_code == 403
    assert (await api.delete(f"/schedules/{name}", headers=as_(READER))).status_code == 403

    triggered = await api.post(f"/schedules/{name}/trigger", headers=as_(READER))
    assert triggered.status_code == 202
    task_id = (await fired(api, name, READER))["recent_runs"][0]["task_id"]
    assert task_id.startswith(f"schedule:{name}-")
    task = (await api.get(f"/tasks/{task_id}", headers=as_(READER))).json()
    assert task["id"] == task_id

    paused = await api.post(
        f"/schedules/{name}/pause", json={"note": "hold"}, headers=as_(APPROVER)
    )
    assert paused.json()["paused"] and paused.json()["note"] == "hold"
    changed = await api.patch(
        f"/schedules/{name}",
        json={"cron": "30 8 * * 1-5", "timezone": "Europe/Paris", "overlap": "buffer_one"},
        headers=as_(APPROVER),
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["cron"] == ["30 8 * * 1-5"] and changed.json()["every_seconds"] == []
    assert changed.json()["overlap"] == "buffer_one"
    assert (await api.delete(f"/schedules/{name}", headers=as_(APPROVER))).status_code == 200
    assert (await api.get(f"/schedules/{name}", headers=as_(READER))).status_code == 404
    await api.delete(f"/schedules/{wider['name']}", headers=as_(APPROVER))


async def test_a_tenant_token_sees_only_its_tenants_schedules(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, tenants: dict[str, str]
) -> None:
    model = fake_openai.script(lambda body: text("fine"))
    body = new_schedule(model)
    name = body["name"]
    created = await api.post("/schedules", json=body, headers=as_(ACME))
    assert created.status_code == 201 and created.json()["tenant"] == tenants["acme"]
    other = new_schedule(model, task={"tenant": tenants["globex"]})
    refused = await api.post("/schedules", json=other, headers=as_(ACME))
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden_tenant"

    assert (await api.get(f"/schedules/{name}", headers=as_(GLOBEX))).status_code == 404
    for verb in ("pause", "resume", "trigger"):
        foreign = await api.post(f"/schedules/{name}/{verb}", headers=as_(GLOBEX))
        assert foreign.status_code == 404, verb
    assert (await api.patch(f"/schedules/{name}", json={}, headers=as_(GLOBEX))).status_code == 404
    assert (await api.delete(f"/schedules/{name}", headers=as_(GLOBEX))).status_code == 404
    listed = (await api.get("/schedules", headers=as_(GLOBEX))).json()["schedules"]
    assert name not in [s["name"] for s in listed]
    asked = await api.get("/schedules", params={"tenant": tenants["globex"]}, headers=as_(ACME))
    assert asked.status_code == 403
    own = (await api.get("/schedules", headers=as_(ACME))).json()["schedules"]
    assert [s["name"] for s in own] == [name]

    await api.post(f"/schedules/{name}/trigger", headers=as_(ACME))
    task_id = (await fired(api, name, ACME))["recent_runs"][0]["task_id"]
    assert (await api.get(f"/tasks/{task_id}", headers=as_(ACME))).status_code == 200
    assert (await api.get(f"/tasks/{task_id}", headers=as_(GLOBEX))).status_code == 404
    assert (await api.delete(f"/schedules/{name}", headers=as_(ACME))).status_code == 200


async def test_bad_input_gets_a_clear_error(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: text("fine"))
    body = new_schedule(model)
    assert (await api.post("/schedules", json=body, headers=as_(APPROVER))).status_code == 201
    taken = await api.post("/schedules", json=body, headers=as_(APPROVER))
    assert taken.status_code == 409 and taken.json()["error"] == "schedule_exists"
    neither = {k: v for k, v in new_schedule(model).items() if k != "every_seconds"}
    assert (await api.post("/schedules", json=neither, headers=as_(APPROVER))).status_code == 422
    cron = {**new_schedule(model), "every_seconds": None, "cron": "61 * * * *"}
    bad_cron = await api.post("/schedules", json=cron, headers=as_(APPROVER))
    assert bad_cron.status_code == 400 and bad_cron.json()["error"] == "invalid_schedule"
    zone = {**new_schedule(model), "timezone": "Mars/Olympus"}
    bad_zone = await api.post("/schedules", json=zone, headers=as_(APPROVER))
    assert bad_zone.status_code == 422 and "Mars/Olympus" in bad_zone.text
    tools = new_schedule(model, task={"tools": ["no_such_tool"]})
    assert (await api.post("/schedules", json=tools, headers=as_(APPROVER))).status_code == 422
    slash = {**new_schedule(model), "name": "a/b"}
    assert (await api.post("/schedules", json=slash, headers=as_(APPROVER))).status_code == 422
    forged = {"task": "x", "model": {"name": model}, "schedule": {"name": body["name"]}}
    refused = await api.post("/tasks", json=forged, headers=as_(APPROVER))
    assert refused.status_code == 400 and refused.json()["error"] == "reserved_field"
    unknown = await api.get("/schedules/no-such-schedule", headers=as_(APPROVER))
    assert unknown.status_code == 404 and unknown.json()["error"] == "schedule_not_found"
    await api.delete(f"/schedules/{body['name']}", headers=as_(APPROVER))


async def test_a_firing_is_listed_waits_in_the_inbox_and_is_approved_under_its_id(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    """A firing's id holds its scheduled time (`:` and all): the task list, the inbox, a
    task's routes and an approval take it as any task id."""
    model = fake_openai.script([tools(("run_shell", {"command": "echo hi"})), text("ran it")])
    body = new_schedule(model, task={"approval": {"policy": {"run_shell": "always"}}})
    name = body["name"]
    assert (await api.post("/schedules", json=body, headers=as_(APPROVER))).status_code == 201
    await api.post(f"/schedules/{name}/trigger", headers=as_(APPROVER))
    task_id = (await fired(api, name, APPROVER))["recent_runs"][0]["task_id"]
    assert ":" in task_id
    async with asyncio.timeout(60):
        while True:
            inbox = (await api.get("/approvals", headers=as_(APPROVER))).json()
            if any(item["task_id"] == task_id for item in inbox["approvals"]):
                break
            await asyncio.sleep(0.1)
    listed = await api.get("/tasks", params={"status": "waiting_approval"}, headers=as_(APPROVER))
    assert task_id in [task["id"] for task in listed.json()["tasks"]]
    decided = await api.post(f"/tasks/{task_id}/approve", json={}, headers=as_(APPROVER))
    assert decided.status_code == 200, decided.text
    async with asyncio.timeout(60):
        while (await api.get(f"/tasks/{task_id}", headers=as_(READER))).json()["state"][
            "status"
        ] != "done":
            await asyncio.sleep(0.1)
    await api.delete(f"/schedules/{name}", headers=as_(APPROVER))
