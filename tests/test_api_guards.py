"""What stands in front of every route of the HTTP API, over real HTTP (uvicorn in this
process, the dev server): the names it answers to, the bodies it reads, what other origins
may call, and what it serves besides the API."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from temporalio.testing import WorkflowEnvironment

from tests.helpers import serving_api
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.workers import running_worker

TOKEN = "guard-approver"
REBOUND = "rebind.evil.example"


@contextlib.asynccontextmanager
async def serving(settings: Settings, runtime: AgentRuntime) -> AsyncIterator[int]:
    """The API with `settings` on a free loopback port; yields the port."""
    async with serving_api(create_app(settings, runtime)) as port:
        yield port


def with_token(settings: Settings, **update: Any) -> Settings:
    tokens = {TOKEN: ApiToken(role="approver", name="alice")}
    return settings.model_copy(update={"api_tokens": tokens, **update})


# --- Host and Origin: DNS rebinding ---------------------------------------------------------


async def test_a_tokenless_api_refuses_every_route_under_another_name(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    """A page of rebind.evil.example whose name now points at 127.0.0.1 reaches the
    tokenless API with its own name as Host: nothing it sends is served."""
    effect = settings.workspace_dir / "rebound.txt"
    model = fake_openai.script(
        [tools(("run_shell", {"command": f"echo ran >> {effect}"})), text("done")]
    )
    runtime = AgentRuntime(dev_env.client, settings)
    async with (
        running_worker(dev_env.client, settings),
        serving(settings, runtime) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as local,
    ):
        rebound = {"Host": f"{REBOUND}:{port}"}
        body = {"task": "run it", "model": {"name": model}}
        refused = await local.post("/tasks", json=body, headers=rebound)
        assert refused.status_code == 421, refused.text
        assert refused.json()["error"] == "misdirected_request"
        assert "WAYSTATION_API_ALLOWED_HOSTS" in refused.json()["detail"]

        created = await local.post("/tasks", json=body)  # the README's tour, from this machine
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        async with asyncio.timeout(60):
            while not (pending := (await local.get(f"/tasks/{task_id}")).json()["state"])[
                "pending_approvals"
            ]:
                await asyncio.sleep(0.05)
        [request_id] = pending["pending_approvals"]

        for method, path, payload in [
            ("GET", "/tasks", None),
            ("GET", f"/tasks/{task_id}", None),
            ("POST", f"/tasks/{task_id}/approve", {"request_id": request_id}),
            ("GET", "/approvals", None),
            ("GET", "/", None),
            ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        ]:
            answer = await local.request(method, path, json=payload, headers=rebound)
            assert answer.status_code == 421, (path, answer.text)
        # A page on another origin that reaches 127.0.0.1 under its right name: 403.
        foreign = await local.post(
            f"/tasks/{task_id}/approve",
            json={"request_id": request_id},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403 and foreign.json()["error"] == "forbidden_origin"
        assert (await local.get(f"/tasks/{task_id}")).json()["state"]["status"] == (
            "waiting_approval"
        )
        assert not effect.exists()

        # Every loopback name works, and the console's own origin may post.
        for name in ("localhost", "[::1]", "127.0.0.1"):
            assert (await local.get("/tasks", headers={"Host": f"{name}:{port}"})).is_success
        approved = await local.post(
            f"/tasks/{task_id}/approve",
            json={"request_id": request_id},
            headers={"Origin": f"http://127.0.0.1:{port}"},
        )
        assert approved.status_code == 200, approved.text
        async with asyncio.timeout(60):
            while (await local.get(f"/tasks/{task_id}")).json()["state"]["status"] != "done":
                await asyncio.sleep(0.05)
    assert effect.read_text() == "ran\n"


async def test_allowed_hosts_name_a_proxied_deployment_and_tokens_on_a_public_bind_take_any(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    proxied = settings.model_copy(update={"api_allowed_hosts": ["waystation.example.com"]})
    async with (
        serving(proxied, runtime) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        named = await http.get("/tasks", headers={"Host": "waystation.example.com"})
        assert named.status_code == 200, named.text
        assert (await http.get("/tasks")).status_code == 421  # only the names listed
        assert (await http.get("/tasks", headers={"Host": f"{REBOUND}:{port}"})).status_code == 421

    # With tokens and a public bind (docker-compose.yml), the token authenticates the caller:
    # any name the deployment is reached by is served.
    public = with_token(settings, api_host="0.0.0.0")
    async with (
        serving(public, runtime) as port,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http,
    ):
        assert (await http.get("/tasks", headers={"Host": "10.0.0.7:8000"})).status_code == 200


# --- bodies: authenticated before they are read, and capped ---------------------------------


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    sent: int  # body bytes the client had written when the answer came


async def post_while_sending(
    port: int, path: str, total: int, *, token: str | None = None, chunked: bool = False
) -> Answer:
    """POST a body of `total` bytes, written in pieces while the answer is awaited: an API
    that answers before reading it all answers while the client is still sending."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}",
    ]
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    sent = 0

    async def send_body() -> None:
        nonlocal sent
        piece = b" " * 65536
        while sent < total:
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            await writer.drain()
            sent += len(piece)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    sending = asyncio.create_task(send_body())
    async with asyncio.timeout(120):  # a server that never answers fails, not hangs
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        written = sent
        payload = await reader.readexactly(length)
    sending.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await sending
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return Answer(int(status_line.split()[1]), json.loads(payload), written)


async def test_a_body_is_refused_before_it_is_read_without_a_token_or_past_the_limit(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    total = 64 * 1024 * 1024
    limited = with_token(settings, api_max_body_bytes=1024 * 1024)
    async with serving(limited, AgentRuntime(dev_env.client, limited)) as port:
        for path in ("/tasks", "/mcp", "/codec/decode"):
            for chunked in (False, True):
                anonymous = await post_while_sending(port, path, total, chunked=chunked)
                assert anonymous.status == 401, (path, chunked, anonymous)
                assert anonymous.body["error"] == "unauthorized"
                assert anonymous.sent < total // 2, (path, chunked, anonymous.sent)

                too_large = await post_while_sending(
                    port, path, total, token=TOKEN, chunked=chunked
                )
                assert too_large.status == 413, (path, chunked, too_large)
                assert too_large.body["error"] == "body_too_large"
                assert "WAYSTATION_API_MAX_BODY_BYTES" in too_large.body["detail"]
                assert too_large.sent < total // 2, (path, chunked, too_large.sent)


async def test_the_default_limit_takes_the_longest_task_the_models_allow(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A task and a system prompt of 200,000 characters each, every one escaped by json as a
    surrogate pair (12 bytes): read whole and validated (here: refused for max_steps only)."""
    served = with_token(settings)
    longest = "\U0001f600" * 200_000
    body = json.dumps({"task": longest, "system_prompt": longest, "max_steps": 0})
    assert len(body) > 4_800_000
    async with (
        serving(served, AgentRuntime(dev_env.client, served)) as port,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            timeout=60,
        ) as http,
    ):
        refused = await http.post("/tasks", content=body)
    assert refused.status_code == 422, refused.text[:300]
    assert [f["loc"][-1] for f in refused.json()["fields"]] == ["max_steps"]


# --- CORS for the codec only; no page that loads scripts from elsewhere ---------------------


async def test_the_temporal_uis_origin_may_call_the_codec_and_nothing_else(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    served = with_token(settings)
    ui = served.codec_cors_origins[0]
    preflight = {"Origin": ui, "Access-Control-Request-Method": "POST"}
    preflight["Access-Control-Request-Headers"] = "authorization,content-type"
    async with (
        serving(served, AgentRuntime(dev_env.client, served)) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        codec = await http.options("/codec/decode", headers=preflight)
        assert codec.status_code == 200 and codec.headers["access-control-allow-origin"] == ui
        for path in ("/tasks", "/approvals", "/console/api/session", "/mcp"):
            other = await http.options(path, headers=preflight)
            assert "access-control-allow-origin" not in other.headers, path
        read = await http.get("/tasks", headers={"Origin": ui, "Authorization": f"Bearer {TOKEN}"})
        assert read.status_code == 200 and "access-control-allow-origin" not in read.headers


async def test_no_api_docs_page_loads_scripts_from_elsewhere_and_the_schema_stays(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    runtime = AgentRuntime(dev_env.client, settings)
    async with (
        serving(settings, runtime) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            gone = await http.get(page)
            assert gone.status_code == 404, page
            assert gone.json()["error"] == "not_found" and "cdn" not in gone.text
        schema = await http.get("/openapi.json")
        assert schema.status_code == 200 and "/tasks" in schema.json()["paths"]
