"""Memory outside a task, as a promise table: through the HTTP API (which the console's
Memory page calls) and MCP, a token bound to a tenant reaches only its tenant's namespaces,
a reader reads and never writes, an unbound approver reaches all; bad input is refused with
a kind and a sentence, and nothing is lost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import serving_api
from waystation.client.agent_runtime import AgentRuntime
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings

ACME, ACME_READER, GLOBEX, OPS = "acme-token", "acme-reader", "globex-token", "ops-token"
TOKENS = {
    ACME: ApiToken(role="approver", name="acme-bot", tenant="acme"),
    ACME_READER: ApiToken(role="reader", name="acme-viewer", tenant="acme"),
    GLOBEX: ApiToken(role="approver", name="globex-bot", tenant="globex"),
    OPS: ApiToken(role="approver", name="ops"),  # unbound: every namespace
}


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(dev_env: WorkflowEnvironment, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    settings = settings.model_copy(update={"api_tokens": TOKENS, "memory_max_value_chars": 50})
    app = create_app(settings, AgentRuntime(dev_env.client, settings))
    async with serving_api(app) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client


@asynccontextmanager
async def mcp_as(api: httpx.AsyncClient, token: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=as_(token), timeout=60) as http,
        Client(streamable_http_client(f"{api.base_url}/mcp", http_client=http)) as client,
    ):
        yield client


async def put(api: httpx.AsyncClient, token: str, path: str, **body: Any) -> httpx.Response:
    return await api.put(f"/memory/{path}", json=body, headers=as_(token))


async def test_the_api_holds_each_token_to_its_tenant_and_role(api: httpx.AsyncClient) -> None:
    written = await put(api, ACME, "acme:main/timezone", value="Europe/Paris", metadata={"by": 1})
    assert written.status_code == 200, written.text
    assert written.json()["value"] == "Europe/Paris" and written.json()["revision"] == 1
    got = await api.get("/memory/acme:main/timezone", headers=as_(ACME_READER))
    assert got.status_code == 200 and got.json()["metadata"] == {"by": 1}
    found = await api.get("/memory/acme:main", params={"q": "timezone"}, headers=as_(ACME))
    assert [i["key"] for i in found.json()["items"]] == ["timezone"]
    listed = await api.get("/memory", headers=as_(ACME))
    assert listed.json() == {"namespaces": [{"namespace": "acme:main", "items": 1}]}

    # Another tenant: refused on every route, the namespace named in the sentence.
    for method, path, body in (
        ("GET", "/memory/acme:main/timezone", None),
        ("GET", "/memory/acme:main", None),
        ("GET", "/memory/acme:main?q=timezone", None),
        ("PUT", "/memory/acme:main/timezone", {"value": "stolen"}),
        ("DELETE", "/memory/acme:main/timezone", None),
    ):
        refused = await api.request(method, path, json=body, headers=as_(GLOBEX))
        assert refused.status_code == 403, (method, path)
        assert refused.json()["error"] == "forbidden_namespace"
    assert (await api.get("/memory", headers=as_(GLOBEX))).json() == {"namespaces": []}

    # A reader reads and never writes.
    for method, body in (("PUT", {"value": "x"}), ("DELETE", None)):
        refused = await api.request(
            method, "/memory/acme:main/timezone", json=body, headers=as_(ACME_READER)
        )
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    kept = await api.get("/memory/acme:main/timezone", headers=as_(OPS))  # unbound: all
    assert kept.json()["value"] == "Europe/Paris"

    deleted = await api.delete("/memory/acme:main/timezone", headers=as_(ACME))
    assert deleted.status_code == 204
    gone = await api.get("/memory/acme:main/timezone", headers=as_(ACME))
    assert gone.status_code == 404 and gone.json()["error"] == "unknown_namespace"


async def test_bad_input_gets_a_clear_error_and_loses_nothing(api: httpx.AsyncClient) -> None:
    assert (await put(api, ACME, "acme:main/notes", value="kept")).status_code == 200
    too_large = await put(api, ACME, "acme:main/notes", value="x" * 51)
    assert too_large.status_code == 413 and too_large.json()["error"] == "value_too_large"
    assert "WAYSTATION_MEMORY_MAX_VALUE_CHARS" in too_large.json()["detail"]
    kept = await api.get("/memory/acme:main/notes", headers=as_(ACME))
    assert kept.json()["value"] == "kept"
    unknown_item = await api.get("/memory/acme:main/nothing", headers=as_(ACME))
    assert unknown_item.status_code == 404 and unknown_item.json()["error"] == "unknown_item"
    unknown = await api.get("/memory/acme:nobody", headers=as_(ACME))
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_namespace"
    malformed = await api.get("/memory/acme:main:extra", headers=as_(OPS))
    assert malformed.status_code == 422
    expired = await put(api, ACME, "acme:main/soon", value="v", ttl_seconds=0)
    assert expired.status_code == 422  # a TTL is above 0


async def test_mcp_tools_hold_each_token_to_its_tenant_and_role(api: httpx.AsyncClient) -> None:
    async with mcp_as(api, ACME) as mcp:
        written = await mcp.call_tool(
            "memory_put", {"namespace": "acme:main", "key": "plan", "value": "ship on Friday"}
        )
        assert not written.is_error, written.content
        got = await mcp.call_tool("memory_get", {"namespace": "acme:main", "key": "plan"})
        assert got.structured_content["value"] == "ship on Friday"  # type: ignore[index]
        found = await mcp.call_tool("memory_search", {"namespace": "acme:main", "query": "ship"})
        assert [i["key"] for i in found.structured_content["items"]] == ["plan"]  # type: ignore[index]
    async with mcp_as(api, GLOBEX) as mcp:
        for tool, arguments in (
            ("memory_get", {"key": "plan"}),
            ("memory_list", {}),
            ("memory_search", {"query": "ship"}),
            ("memory_put", {"key": "plan", "value": "stolen"}),
            ("memory_delete", {"key": "plan"}),
        ):
            refused = await mcp.call_tool(tool, {"namespace": "acme:main", **arguments})
            assert refused.is_error, tool
            assert "bound to tenant 'globex'" in refused.content[0].text  # type: ignore[union-attr]
        listed = await mcp.call_tool("memory_namespaces", {})
        assert listed.structured_content == {"namespaces": {}}
    async with mcp_as(api, ACME_READER) as mcp:
        refused = await mcp.call_tool("memory_delete", {"namespace": "acme:main", "key": "plan"})
        assert refused.is_error and "needs an approver" in refused.content[0].text  # type: ignore[union-attr]
    kept = await api.get("/memory/acme:main/plan", headers=as_(OPS))
    assert kept.json()["value"] == "ship on Friday"


async def test_a_task_cannot_be_given_another_tenants_namespace(api: httpx.AsyncClient) -> None:
    body = {"task": "what do you remember?", "memory_namespace": "acme:main", "recall": "x"}
    refused = await api.post("/tasks", json=body, headers=as_(GLOBEX))
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == "forbidden_namespace"
    assert refused.json()["fields"][0]["loc"] == ["body", "memory_namespace"]
