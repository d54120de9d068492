"""The HTTP API over real HTTP: uvicorn in this process, the dev server, a worker."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.helpers import same_unless_restamped, serving_api, wait_for_state
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.api.paging import encode_page_token
from waystation.servers.api.tasks import task_id_for
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker

READER = "reader-token"
APPROVER = "approver-token"


@pytest.fixture
async def api(dev_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API on a free port, with a reader and an approver token, and a worker."""
    settings = settings.model_copy(
        update={
            "api_tokens": {
                READER: ApiToken(role="reader", name="rita"),
                APPROVER: ApiToken(role="approver", name="alice"),
            }
        }
    )
    runtime = AgentRuntime(dev_env.client, settings)
    app = create_app(settings, runtime, sse_ping_seconds=0.5)
    async with serving_api(app) as port:
        async with running_worker(dev_env.client, settings):
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": f"Bearer {APPROVER}"},
                timeout=60,  # past the API's longest wait: a decision's, 30 s, then a 503
            ) as client:
                client._transport_runtime = runtime  # type: ignore[attr-defined]
                yield client


async def sse_items(
    client: httpx.AsyncClient,
    path: str,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Parse a Server-Sent Events response into {id, event, data} dicts."""
    items: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if not line:
                if "data" in current:
                    items.append(current)
                    if limit is not None and len(items) >= limit:
                        break
                current = {}
            elif line.startswith(":"):
                continue  # heartbeat comment
            else:
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                current[field] = json.loads(value) if field == "data" else value
    return items


async def wait_pending(client: httpx.AsyncClient, task_id: str) -> list[str]:
    async with asyncio.timeout(60):
        while True:
            state = (await client.get(f"/tasks/{task_id}")).json()["state"]
            if state["pending_approvals"]:
                return list(state["pending_approvals"])
            await asyncio.sleep(0.05)


async def test_start_stream_approve_done_and_reconnect(
    api: httpx.AsyncClient,
    dev_env: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = fake_openai.script(
        [
            tools(("run_shell", {"command": "echo via-http >> effects.txt"}), content="shall I?"),
            text("done via http"),
        ]
    )
    created = await api.post("/tasks", json={"task": "run it", "model": {"name": model}})
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]
    assert created.json()["links"]["events"] == f"/tasks/{task_id}/events"

    [request] = await wait_pending(api, task_id)
    approved = await api.post(f"/tasks/{task_id}/approve", json={"request_id": request})
    assert approved.status_code == 200, approved.text
    assert approved.json()["approver"] == "alice"

    everything = await sse_items(api, f"/tasks/{task_id}/events")
    assert everything[-1]["event"] == "done"
    assert everything[-1]["data"]["result"] == "done via http"
    offsets = [int(i["id"]) for i in everything]
    assert offsets == list(range(len(everything)))
    resolved = [i for i in everything if i["event"] == "approval_resolved"]
    assert resolved[0]["data"]["approver"] == "alice"  # from the token, not the body

    # A client cut off after 5 items reconnects with Last-Event-ID: exactly the rest.
    first = await sse_items(api, f"/tasks/{task_id}/events", limit=5)
    rest = await sse_items(
        api, f"/tasks/{task_id}/events", headers={"Last-Event-ID": first[-1]["id"]}
    )
    assert [i["id"] for i in first + rest] == [i["id"] for i in everything]
    await same_unless_restamped(dev_env.client, task_id, everything, first + rest)
    from_query = await sse_items(api, f"/tasks/{task_id}/events?since=3&topics=events")
    assert [i["id"] for i in from_query] == [
        i["id"] for i in everything[3:] if i["event"] != "token"
    ]

    log = (await api.get(f"/tasks/{task_id}/log?since=2&limit=3")).json()
    assert [e["seq"] for e in log["events"]] == [2, 3, 4] and log["next_seq"] == 5
    assert (settings.workspace_dir / "effects.txt").read_text() == "via-http\n"


async def wait_status(api: httpx.AsyncClient, task_id: str, status: str) -> None:
    async with asyncio.timeout(60):
        while (await api.get(f"/tasks/{task_id}")).json()["state"]["status"] != status:
            await asyncio.sleep(0.05)


async def test_cancelling_a_task_that_has_ended_is_a_409_saying_so(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("over already")])
    created = await api.post("/tasks", json={"task": "end", "model": {"name": model}})
    task_id = created.json()["id"]
    await wait_status(api, task_id, "done")
    refused = await api.post(f"/tasks/{task_id}/cancel")
    assert refused.status_code == 409, refused.text
    assert refused.json() == {
        "error": "task_ended",
        "detail": f"task {task_id} has already ended (done): there is nothing to cancel",
    }


async def test_a_negative_last_event_id_is_refused_like_a_negative_since(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("hi")])
    created = await api.post("/tasks", json={"task": "say hi", "model": {"name": model}})
    task_id = created.json()["id"]
    by_query = await api.get(f"/tasks/{task_id}/events?since=-1")
    by_header = await api.get(f"/tasks/{task_id}/events", headers={"Last-Event-ID": "-5"})
    assert (by_query.status_code, by_header.status_code) == (422, 422), by_header.text
    assert by_header.json()["fields"][0]["loc"] == ["header", "last-event-id"]
    # The task it asked about is untouched: its stream is whole from 0.
    items = await sse_items(api, f"/tasks/{task_id}/events?topics=events")
    assert [int(i["id"]) for i in items][:1] == [0] and items[-1]["event"] == "done"


async def test_a_blank_task_or_unknown_tools_are_refused_naming_the_problem(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("never asked")])
    blank = await api.post("/tasks", json={"task": " \n\t ", "model": {"name": model}})
    assert blank.status_code == 422
    [field] = blank.json()["fields"]
    assert field["loc"][-1] == "task" and "whitespace" in field["msg"]

    body = {"task": "x", "model": {"name": model}, "tools": ["calculator", "teleport", "no__such"]}
    unknown = await api.post("/tasks", json=body, headers={"Idempotency-Key": "unknown-tools"})
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["error"] == "unknown_tools"
    assert "'teleport', 'no__such'" in unknown.json()["detail"]
    assert [f["msg"] for f in unknown.json()["fields"]] == [
        "unknown tool 'teleport'",
        "unknown tool 'no__such'",
    ]
    assert (await api.get(f"/tasks/{task_id_for('unknown-tools')}")).status_code == 404
    assert fake_openai.calls(model) == 0


async def test_sse_sends_heartbeat_comments_while_a_task_waits(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("run_shell", {"command": "true"})), text("ok")])
    task_id = (await api.post("/tasks", json={"task": "x", "model": {"name": model}})).json()["id"]
    await wait_pending(api, task_id)
    comments = 0
    async with asyncio.timeout(60), api.stream("GET", f"/tasks/{task_id}/events") as response:
        async for line in response.aiter_lines():
            comments += line.startswith(":")
            if comments >= 2:
                break
    assert comments >= 2
    await api.post(f"/tasks/{task_id}/cancel")


async def test_twenty_identical_approvals_run_the_tool_once(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    model = fake_openai.script(
        [tools(("run_shell", {"command": "echo once >> effects.txt"})), text("ok")]
    )
    task_id = (await api.post("/tasks", json={"task": "x", "model": {"name": model}})).json()["id"]
    [request] = await wait_pending(api, task_id)

    async def approve() -> httpx.Response:
        # A 503 says no worker answered in time (a starved machine): a client sends it again.
        async with asyncio.timeout(120):
            while (
                answer := await api.post(approval, json={"request_id": request})
            ).status_code == 503:
                assert "no worker answered" in answer.json()["detail"]
        return answer

    approval = f"/tasks/{task_id}/approve"
    answers = await asyncio.gather(*(approve() for _ in range(20)))
    assert {a.status_code for a in answers} == {200}
    assert len({a.text for a in answers}) == 1
    conflict = await api.post(f"/tasks/{task_id}/reject", json={"request_id": request})
    assert conflict.status_code == 409 and conflict.json()["error"] == "decision_conflict"
    async with asyncio.timeout(60):
        while (await api.get(f"/tasks/{task_id}")).json()["state"]["status"] != "done":
            await asyncio.sleep(0.05)
    assert (settings.workspace_dir / "effects.txt").read_text() == "once\n"
    not_waiting = await api.post(f"/tasks/{task_id}/approve", json={"request_id": "5-other"})
    assert not_waiting.status_code == 409 and not_waiting.json()["error"] == "task_not_waiting"


async def test_idempotency_key_returns_the_same_task(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("hi")])
    body = {"task": "greet", "model": {"name": model}}
    first = await api.post("/tasks", json=body, headers={"Idempotency-Key": "k-123"})
    again = await api.post("/tasks", json=body, headers={"Idempotency-Key": "k-123"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    different = await api.post(
        "/tasks", json={**body, "task": "something else"}, headers={"Idempotency-Key": "k-123"}
    )
    assert different.status_code == 409 and different.json()["error"] == "idempotency_conflict"
    assert fake_openai.calls(model) <= 1


async def test_task_pages_walk_every_task_and_refuse_forged_tokens(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: text("hi"))
    started = set()
    for i in range(5):
        response = await api.post("/tasks", json={"task": f"page {i}", "model": {"name": model}})
        started.add(response.json()["id"])
    seen: list[str] = []
    token: str | None = None
    async with asyncio.timeout(60):
        while started - set(seen):  # until they are done and visibility has caught up
            seen, token = [], None
            while True:
                # Finished tasks only: a task that closes mid-walk moves in the order.
                params: dict[str, str | int] = {"page_size": 2, "status": "done"}
                if token:
                    params["page_token"] = token
                page = (await api.get("/tasks", params=params)).json()
                assert len(page["tasks"]) <= 2
                seen += [t["id"] for t in page["tasks"]]
                token = page["next_page_token"]
                if token is None:
                    break
            await asyncio.sleep(0.2)
    assert len(seen) == len(set(seen))  # no task twice across pages
    # Temporal retries a token it did not make for seconds and then fails; we refuse it.
    for forged in ("AAAA", "Z2FyYmFnZQ==", token_of(b"{}")[:-2] + "xx", "%%%"):
        response = await api.get("/tasks", params={"page_token": forged})
        assert response.status_code == 400, forged
        assert response.json()["error"] == "invalid_page_token"


async def test_tasks_are_listed_newest_started_first_and_keep_their_place_as_they_close(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    waits = fake_openai.script([tools(("run_shell", {"command": "echo older"})), text("o")])
    quick = fake_openai.script([text("n")])
    older = (await api.post("/tasks", json={"task": "older", "model": {"name": waits}})).json()
    [request] = await wait_pending(api, older["id"])
    newer = (await api.post("/tasks", json={"task": "newer", "model": {"name": quick}})).json()
    await wait_status(api, newer["id"], "done")
    ours = {older["id"]: "older", newer["id"]: "newer"}

    async def listed(**params: str | int) -> tuple[list[str], str | None]:
        page = (await api.get("/tasks", params=params)).json()
        return [ours.get(t["id"], t["id"]) for t in page["tasks"]], page["next_page_token"]

    async with asyncio.timeout(60):  # until visibility shows both
        while not set(ours.values()) <= set((await listed(page_size=500))[0]):
            await asyncio.sleep(0.1)
    # Newest started first, though the older one still runs (Temporal lists those first).
    first, token = await listed(page_size=1)
    assert first == ["newer"] and token is not None
    approved = await api.post(f"/tasks/{older['id']}/approve", json={"request_id": request})
    assert approved.status_code == 200, approved.text
    await wait_status(api, older["id"], "done")
    async with asyncio.timeout(60):
        while "older" not in (await listed(status="done", page_size=500))[0]:
            await asyncio.sleep(0.1)
    # Closed since page 1 was read, the older task is on page 2 still, not skipped.
    second, _ = await listed(page_size=1, page_token=token)
    assert second == ["older"]
    # The newer one finished first, yet comes first: the order is by start, not by end.
    done, _ = await listed(status="done", page_size=500)
    assert [n for n in done if n in ours.values()] == ["newer", "older"]
    response = await api.get("/tasks", params={"page_token": encode_page_token(b"{}")})
    assert response.status_code == 400 and response.json()["error"] == "invalid_page_token"


async def test_a_task_that_continued_as_new_is_listed_once(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    add = ("calculator", {"expression": "1 + 1"})
    model = fake_openai.script([tools(add), tools(add), text("2 and 2")])
    body = {"task": "long", "model": {"name": model}, "continue_as_new_after_steps": 1}
    task_id = (await api.post("/tasks", json=body)).json()["id"]
    await wait_status(api, task_id, "done")
    async with asyncio.timeout(60):  # until visibility has the last run as done
        while True:
            tasks = (await api.get("/tasks", params={"page_size": 500})).json()["tasks"]
            mine = [t for t in tasks if t["id"] == task_id]
            if any(t["status"] == "done" for t in mine):
                break
            await asyncio.sleep(0.1)
    assert [(t["status"], t["step"]) for t in mine] == [("done", 3)]


def token_of(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


async def test_auth_roles_and_clear_errors(api: httpx.AsyncClient, fake_openai: FakeOpenAI) -> None:
    anonymous = await api.get("/tasks", headers={"Authorization": ""})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    wrong = await api.get("/tasks", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"] == "unauthorized"
    reader = {"Authorization": f"Bearer {READER}"}
    model = fake_openai.script([tools(("run_shell", {"command": "true"})), text("ok")])
    created = await api.post("/tasks", json={"task": "x", "model": {"name": model}}, headers=reader)
    assert created.status_code == 201
    task_id = created.json()["id"]
    [request] = await wait_pending(api, task_id)
    unknown = await api.post(f"/tasks/{task_id}/approve", json={"request_id": "9-nope"})
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_request"
    refused = await api.post(
        f"/tasks/{task_id}/approve", json={"request_id": request}, headers=reader
    )
    assert refused.status_code == 403 and "rita" in refused.json()["detail"]
    async with asyncio.timeout(60):  # visibility lists it soon after its state shows it
        while True:
            listed = (await api.get("/tasks?status=waiting_approval", headers=reader)).json()
            if task_id in [t["id"] for t in listed["tasks"]]:
                break
            await asyncio.sleep(0.05)
    assert (await api.get("/tasks/nope", headers=reader)).status_code == 404
    bad = await api.post("/tasks", json={"task": "", "max_steps": 0}, headers=reader)
    assert bad.status_code == 422
    assert {tuple(f["loc"][-1:]) for f in bad.json()["fields"]} == {("task",), ("max_steps",)}
    await api.post(f"/tasks/{task_id}/cancel")


@pytest.mark.long(minutes=0.6)
async def test_no_input_makes_the_server_fail(api: httpx.AsyncClient) -> None:
    """Schemathesis over the OpenAPI schema: no 500, whatever it sends; still healthy after."""
    import schemathesis
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hypothesis_settings
    from hypothesis import strategies as st
    from schemathesis.generation import GenerationMode

    schema = (await api.get("/openapi.json")).json()
    assert {
        "/tasks",
        "/tasks/{task_id}",
        "/tasks/{task_id}/events",
        "/tasks/{task_id}/approve",
    } <= set(schema["paths"])
    for path in schema["paths"].values():
        for operation in path.values():
            assert (
                "200" in operation["responses"]
                or "201" in operation["responses"]
                or "202" in operation["responses"]
                or "204" in operation["responses"]
            )
    loaded = schemathesis.openapi.from_dict(schema)
    base_url = str(api.base_url)
    failures: list[str] = []
    sent: list[int] = []

    def check_all() -> None:
        for result in loaded.get_all_operations():
            operation = result.ok()  # type: ignore[union-attr]
            if operation.path.endswith("/events"):
                continue  # an open SSE stream is not a request/response exchange
            # Task inputs reach the workflow: fuzz them hardest (a bad one could wedge a task).
            examples = (
                80 if (operation.method.upper(), operation.path) == ("POST", "/tasks") else 20
            )

            @hypothesis_settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
            def exercise(case: Any) -> None:
                response = case.call(
                    base_url=base_url, headers={"Authorization": f"Bearer {APPROVER}"}, timeout=30
                )
                sent.append(response.status_code)
                if response.status_code >= 500:
                    where = f"{case.method} {case.formatted_path}"
                    failures.append(f"{where}: {response.status_code} {response.text[:200]}")

            exercise()

    def check_malformed() -> None:
        """Malformed input of every kind: a clear 4xx, never a 500."""
        json_value = st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=8), inner, max_size=3)
            ),
            max_leaves=8,
        )
        task_body = st.fixed_dictionaries(
            {},
            optional={
                "task": json_value,
                "max_steps": json_value,
                "token_budget": json_value,
                "tools": json_value,
                "model": json_value
                | st.fixed_dictionaries(
                    {"name": st.just("offline")},
                    optional={
                        "request_timeout_seconds": json_value,
                        "temperature": json_value,
                        "max_tokens": json_value,
                    },
                ),
                "approval": json_value,
                "surprise": json_value,
            },
        )
        with httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {APPROVER}"}, timeout=30
        ) as http:
            printable = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)

            @hypothesis_settings(
                max_examples=60,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            @given(body=task_body | json_value, task_id=printable.filter(bool), query=printable)
            def exercise(body: Any, task_id: str, query: str) -> None:
                task = "/tasks/" + urllib.parse.quote(task_id, safe="")
                # json.dumps writes NaN and Infinity, which Python's JSON reader accepts.
                raw = json.dumps(body)
                headers = {"Content-Type": "application/json"}
                for response in (
                    http.post("/tasks", content=raw, headers=headers),
                    http.post(f"{task}/approve", content=raw, headers=headers),
                    http.post(f"{task}/resume", content=raw, headers=headers),
                    http.get("/tasks", params={"status": query, "page_token": query}),
                    http.get(f"{task}/log", params={"since": query}),
                ):
                    sent.append(response.status_code)
                    if response.status_code >= 500:
                        where = f"{response.request.method} {response.request.url}"
                        failures.append(f"{where}: {response.text[:200]}")

            exercise()

    await asyncio.to_thread(check_all)
    await asyncio.to_thread(check_malformed)
    assert failures == []
    assert len(sent) >= 100 and {200, 404, 422} <= set(sent)
    # Nothing it accepted may wedge a task: no workflow task failed on any input.
    runtime: AgentRuntime = api._transport_runtime  # type: ignore[attr-defined]
    mine = f'WorkflowType="AgentWorkflow" AND TaskQueue="{runtime.settings.task_queue}"'
    async for execution in runtime.client.list_workflows(mine):
        history = await runtime.client.get_workflow_handle(execution.id).fetch_history()
        broken = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            # a reset (POST /resume) records its own workflow task failure: not a wedge
            and e.workflow_task_failed_event_attributes.cause
            != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
        ]
        if broken:
            started = history.events[0].workflow_execution_started_event_attributes
            why = broken[0].workflow_task_failed_event_attributes.failure.message
            failures.append(f"{execution.id}: {why}; input {started.input.payloads[0].data!r}")
    assert failures == []
    assert (await api.get("/tasks")).status_code == 200


async def test_reading_a_failed_task_leaves_it_failed(
    dev_env: WorkflowEnvironment, api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: tools(("calculator", {"expression": "1"})))
    body = {"task": "loop", "model": {"name": model}, "max_steps": 1}
    task_id = (await api.post("/tasks", json=body)).json()["id"]
    workflow = dev_env.client.get_workflow_handle(task_id)
    async with asyncio.timeout(60):
        while (await workflow.describe()).status != WorkflowExecutionStatus.FAILED:
            await asyncio.sleep(0.1)
    first_run = (await workflow.describe()).run_id
    assert (await api.get(f"/tasks/{task_id}")).json()["state"]["status"] == "failed"
    assert (await api.get(f"/tasks/{task_id}/log")).status_code == 200
    refused = await api.post(f"/tasks/{task_id}/approve", json={"request_id": "1-x"})
    assert refused.status_code == 409
    # Only an explicit resume resets a failed task; reading and deciding never do.
    described = await workflow.describe()
    assert described.status == WorkflowExecutionStatus.FAILED and described.run_id == first_run


async def test_messages_follow_up_a_task_over_http_and_the_stream_follows_the_turns(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("first answer"), text("second answer"), text("third")])
    created = await api.post("/tasks", json={"task": "hello", "model": {"name": model}})
    task_id = created.json()["id"]
    first = await sse_items(api, f"/tasks/{task_id}/events")
    assert first[-1]["event"] == "done"
    last = int(first[-1]["id"])

    # A follower across turns: it goes on past each answer.
    async def follow_two_answers() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        path = f"/tasks/{task_id}/events?follow=true&since={last + 1}"
        async with api.stream("GET", path) as response:
            current: dict[str, Any] = {}
            async for line in response.aiter_lines():
                if not line and "data" in current:
                    items.append(current)
                    current = {}
                    if sum(i["event"] == "done" for i in items) == 2:
                        return items
                elif line and not line.startswith(":"):
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    current[field] = json.loads(value) if field == "data" else value
        return items

    follower = asyncio.create_task(follow_two_answers())
    sent = await api.post(
        f"/tasks/{task_id}/messages",
        json={"content": "and then?"},
        headers={"Idempotency-Key": "msg-1"},
    )
    assert sent.status_code == 202, sent.text
    body = sent.json()
    assert body["follow_up"] is True and body["message_id"].startswith("key-")
    # A retried POST with the same key sends the message once.
    again = await api.post(
        f"/tasks/{task_id}/messages",
        json={"content": "and then?"},
        headers={"Idempotency-Key": "msg-1"},
    )
    assert again.status_code == 202 and again.json()["message_id"] == body["message_id"]
    # Without follow, a client resubscribes from the last offset + 1 and gets one turn.
    second = await sse_items(api, f"/tasks/{task_id}/events?since={last + 1}")
    assert second[0]["event"] == "user_message" and second[-1]["data"]["result"] == "second answer"
    assert second[0]["data"]["sender"] == "alice" and second[0]["data"]["turn"] == 1
    await api.post(f"/tasks/{task_id}/messages", json={"content": "one more"})
    followed = await asyncio.wait_for(follower, 60)
    answers = [i["data"]["result"] for i in followed if i["event"] == "done"]
    assert answers == ["second answer", "third"]
    offsets = [int(i["id"]) for i in followed]
    assert offsets == list(range(last + 1, last + 1 + len(offsets)))
    state = (await api.get(f"/tasks/{task_id}")).json()["state"]
    assert (state["status"], state["turn"], state["result"]) == ("done", 2, "third")
    messages = [
        e
        for e in (await api.get(f"/tasks/{task_id}/log")).json()["events"]
        if e["type"] == "user_message"
    ]
    assert [m["content"] for m in messages] == ["and then?", "one more"]


async def test_bad_messages_are_refused_with_a_sentence(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    unknown = await api.post("/tasks/no-such-task/messages", json={"content": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
    for content in ("", "   ", "x" * 200_001):
        bad = await api.post("/tasks/no-such-task/messages", json={"content": content})
        assert bad.status_code == 422, content[:10]
    model = fake_openai.script([tools(("calculator", {"expression": "1+1"}))] * 3)
    created = await api.post(
        "/tasks", json={"task": "loop", "model": {"name": model}, "max_steps": 1}
    )
    task_id = created.json()["id"]
    ended = await sse_items(api, f"/tasks/{task_id}/events")
    assert ended[-1]["event"] == "failed"
    refused = await api.post(f"/tasks/{task_id}/messages", json={"content": "go on"})
    assert refused.status_code == 409
    assert refused.json()["error"] == "task_not_taking_messages"
    assert "resume" in refused.json()["detail"]
    reader = await api.post(
        f"/tasks/{task_id}/messages",
        json={"content": "go on"},
        headers={"Authorization": f"Bearer {READER}"},
    )
    assert reader.status_code == 403


async def test_messages_past_the_queues_bound_are_refused_with_429(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    held = Reply(content="working", hold_after_chunks=1, gate=gate)
    model = fake_openai.script([held, text("took them")])
    big = "m" * 190_000
    try:
        created = await api.post(
            "/tasks",
            json={"task": "hello", "model": {"name": model}, "context_limit_tokens": 1_000_000},
        )
        task_id = created.json()["id"]
        await fake_openai.until_streaming(model, 1, request=0)
        for _ in range(2):
            sent = await api.post(f"/tasks/{task_id}/messages", json={"content": big})
            assert sent.status_code == 202, sent.text
        refused = await api.post(f"/tasks/{task_id}/messages", json={"content": big})
    finally:
        gate.set()
    assert refused.status_code == 429
    assert refused.json()["error"] == "too_many_messages"
    assert "bytes of messages waiting" in refused.json()["detail"]
    runtime: AgentRuntime = api._transport_runtime  # type: ignore[attr-defined]
    await wait_for_state(runtime.get(task_id), lambda s: s.result == "took them")


async def test_a_question_is_in_the_inbox_and_answered_over_http(
    api: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    def reply(body: dict[str, Any]) -> Any:
        told = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not told:
            return tools(("ask_person", {"question": "Which size?", "choices": ["S", "M"]}))
        return text(f"so: {told[-1]}")

    model = fake_openai.script(reply)
    created = await api.post("/tasks", json={"task": "order a shirt", "model": {"name": model}})
    task_id = created.json()["id"]
    async with asyncio.timeout(60):
        while not (inbox := (await api.get("/approvals")).json())["questions"]:
            await asyncio.sleep(0.1)
    [question] = inbox["questions"]
    assert (question["task_id"], question["question"], question["choices"]) == (
        task_id,
        "Which size?",
        ["S", "M"],
    )
    waiting = (await api.get("/tasks", params={"status": "waiting_input"})).json()["tasks"]
    assert task_id in {t["id"] for t in waiting}
    wrong = await api.post(f"/tasks/{task_id}/answer", json={"answer": "XL"})
    assert wrong.status_code == 422 and wrong.json()["error"] == "invalid_choice"
    assert "'S', 'M'" in wrong.json()["detail"]
    reader = await api.post(
        f"/tasks/{task_id}/answer",
        json={"answer": "M"},
        headers={"Authorization": f"Bearer {READER}"},
    )
    assert reader.status_code == 403
    answered = await api.post(f"/tasks/{task_id}/answer", json={"answer": "m"})
    assert answered.status_code == 200, answered.text
    assert (answered.json()["answer"], answered.json()["answerer"]) == ("M", "alice")
    done = await sse_items(api, f"/tasks/{task_id}/events")
    assert done[-1]["data"]["result"] == "so: alice answered: M"
    again = await api.post(
        f"/tasks/{task_id}/answer",
        json={"request_id": question["request_id"], "answer": "S"},
    )
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert again.json()["answer"] == "M"


async def test_an_output_schema_that_is_not_one_is_a_422_naming_the_problem(
    api: httpx.AsyncClient,
) -> None:
    refused = await api.post("/tasks", json={"task": "x", "output_schema": {"type": "thing"}})
    assert refused.status_code == 422
    assert "not a valid JSON Schema at type" in json.dumps(refused.json())
