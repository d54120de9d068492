"""Tools from MCP servers, through the worker's McpClientManager, against real servers: the
demo server of tests/mcp_servers (stdio and streamable HTTP, both protocol eras) and the
third-party `mcp-server-time` and `mcp-server-git` from PyPI."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx2
import pytest
from temporalio.testing import ActivityEnvironment

from waystation.activities.mcp.activities import McpActivities, check_call
from waystation.activities.mcp.calls import argument_problem
from waystation.activities.mcp.connection import forgot_session
from waystation.activities.mcp.manager import McpClientManager
from waystation.activities.redaction import REDACTED, Redactor
from waystation.settings import Settings
from waystation.settings.mcp_servers import McpConfigError, McpServerConfig, parse_servers
from waystation.testing.mcp import (
    NOT_MCP_LINE,
    CallLog,
    demo_http_server,
    demo_stdio,
    not_mcp_stdio,
    running_http_server,
)
from waystation.workflows.tool_catalog import (
    FUNCTION_NAME,
    ListToolsRequest,
    McpServerTools,
    McpToolHints,
    McpToolSpec,
    ToolCatalog,
    default_policy,
    exposed_name,
    split_name,
)

BIN = Path(sys.executable).parent


@pytest.fixture
def log(tmp_path: Path) -> CallLog:
    return CallLog(tmp_path / "calls.jsonl")


@pytest.fixture
async def managers() -> AsyncIterator[list[McpClientManager]]:
    """Managers a test makes; each is closed after it, as a worker shutting down does."""
    made: list[McpClientManager] = []
    yield made
    for manager in made:
        await manager.close()


@pytest.fixture(scope="module")
async def shared(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[McpClientManager, CallLog]]:
    """One manager for the tests that leave its servers as they were (each start costs
    seconds): the demo server, and the demo server again with settings over its hints."""
    log = CallLog(tmp_path_factory.mktemp("shared") / "calls.jsonl")
    trusted = demo_stdio(log, approval={"delete_note": "never"}, retry_safe={"*": True})
    manager = McpClientManager({"demo": demo_stdio(log), "trusted": trusted})
    yield manager, log
    await manager.close()


def manage(made: list[McpClientManager], **servers: McpServerConfig) -> McpClientManager:
    manager = McpClientManager(servers, environ={**os.environ, "DEMO_TOKEN": "s3cret"})
    made.append(manager)
    return manager


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll a state until it holds, e.g. a connection seen as gone (bounded: 30 s)."""
    try:
        async with asyncio.timeout(60):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None


# --- names and rules (pure) -------------------------------------------------------------


def test_annotations_give_approval_and_retry_defaults() -> None:
    def policy(**hints: bool) -> tuple[str, bool]:
        return default_policy(McpToolHints(**hints))

    assert policy(read_only_hint=True) == ("never", True)
    assert policy(read_only_hint=True, idempotent_hint=False) == ("never", True)
    assert policy(destructive_hint=True) == ("always", False)
    assert policy() == ("always", False)
    assert policy(idempotent_hint=True) == ("always", True)
    assert policy(destructive_hint=False) == ("always", False)
    assert policy(destructive_hint=False, idempotent_hint=True) == ("always", True)


def test_tool_names_fit_openai_and_stay_unambiguous() -> None:
    assert exposed_name("git", "git_status") == "git__git_status"
    odd = [
        "files.read",
        "files/read",
        "x" * 80,
        "x" * 80 + "y",
        "ünïcode tool",
        "a.b",
        "a/b",
    ]
    names = [exposed_name("server-1", tool) for tool in odd]
    assert all(FUNCTION_NAME.match(n) for n in names), names
    assert len(set(names)) == len(odd)  # cleaned alike, still distinct
    assert names == [exposed_name("server-1", tool) for tool in odd]  # stable
    longest = exposed_name("s" * 30, "t" * 200)
    assert len(longest) == 64 and split_name(longest) == ("s" * 30, longest[32:])
    assert split_name("calculator") is None
    assert split_name("a-b___x") == ("a-b", "_x")


def test_arguments_are_checked_against_the_schema_unless_the_schema_is_broken() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    spec = McpToolSpec(
        name="s__t", server="s", tool="t", input_schema=schema, approval="never", retry_safe=True
    )
    assert argument_problem(spec, {"n": 1}) is None
    assert argument_problem(spec, {"n": "x"}) == (
        "invalid arguments for s__t: n: 'x' is not of type 'integer'"
    )
    broken = spec.model_copy(update={"input_schema": {"type": "no-such-type"}})
    assert argument_problem(broken, {"anything": 1}) is None  # the server judges


def test_server_settings_are_checked_and_read_from_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "mcp.json"
    file.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
                    "docs": {"type": "http", "url": "https://example.test/mcp"},
                }
            }
        )
    )
    monkeypatch.setenv(
        "WAYSTATION_MCP_SERVERS",
        json.dumps({"docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"X": "${T}"}}}),
    )
    monkeypatch.setenv("WAYSTATION_MCP_SERVERS_FILE", str(file))
    servers = Settings().mcp_server_configs()
    assert servers["time"].transport == "stdio"
    assert servers["docs"].url == "http://127.0.0.1:9/mcp"  # the variable wins over the file

    shown = McpServerConfig(
        url="https://h/mcp", headers={"Authorization": "Bearer ${T}", "X-Key": "literal-secret"}
    ).shown()
    assert shown == {
        "url": "https://h/mcp",
        "headers": {"Authorization": "****", "X-Key": "****"},
    }
    assert McpServerConfig(url="https://h", headers={"A": "${T}"}).shown()["headers"] == {
        "A": "${T}"
    }

    with pytest.raises(McpConfigError, match="'a__b'"):
        parse_servers({"a__b": {"command": "x"}}, "test")
    with pytest.raises(McpConfigError, match="either command"):
        parse_servers({"both": {"command": "x", "url": "http://h"}}, "test")
    with pytest.raises(McpConfigError, match="does not match"):
        parse_servers({"t": {"type": "stdio", "url": "http://h"}}, "test")
    monkeypatch.setenv("WAYSTATION_MCP_SERVERS", json.dumps({"_x": {"command": "x"}}))
    with pytest.raises(ValueError, match="'_x'"):
        Settings()


# --- listing -----------------------------------------------------------------------------


async def test_listing_maps_each_annotation_and_settings_override_it(
    shared: tuple[McpClientManager, CallLog],
) -> None:
    manager, _ = shared
    catalog = await manager.list_tools()
    rules = {t.name: (t.approval, t.retry_safe) for t in catalog.tools()}
    assert rules["demo__lookup"] == ("never", True)  # readOnlyHint
    assert rules["demo__delete_note"] == ("always", False)  # destructiveHint
    assert rules["demo__set_flag"] == ("always", True)  # idempotentHint
    assert rules["demo__add_note"] == ("always", False)  # destructiveHint: false only
    assert rules["demo__append_line"] == ("always", False)  # no hints
    assert rules["trusted__delete_note"] == ("never", True)
    assert rules["trusted__append_line"] == ("always", True)
    lookup = catalog.get("demo__lookup")
    assert lookup is not None and lookup.tool == "lookup"
    assert lookup.hints.read_only_hint is True
    assert lookup.timeout_seconds == 300  # the server's call timeout, for run_tool's own
    assert lookup.input_schema["required"] == ["key"]
    entry = lookup.openai_tool()
    assert entry["function"]["name"] == "demo__lookup"
    assert entry["function"]["parameters"]["type"] == "object"
    # What list_tools records round-trips through JSON (history) unchanged.
    assert ToolCatalog.model_validate_json(catalog.model_dump_json()) == catalog


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one untracked file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "hello.txt").write_text("hi\n")
    return repo


async def test_third_party_servers_time_and_git(
    repo: Path, managers: list[McpClientManager]
) -> None:
    manager = manage(
        managers,
        time=McpServerConfig(
            command=str(BIN / "mcp-server-time"), args=["--local-timezone", "UTC"]
        ),
        git=McpServerConfig(command=str(BIN / "mcp-server-git"), args=["--repository", str(repo)]),
    )
    catalog = await manager.list_tools()
    assert [s.error for s in catalog.servers] == [None, None]
    names = {t.name for t in catalog.tools()}
    assert {"time__get_current_time", "time__convert_time", "git__git_status"} <= names
    current = catalog.get("time__get_current_time")
    assert current is not None and (current.approval, current.retry_safe) == ("never", True)

    converted = await manager.call_tool(
        "time__convert_time",
        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        "wf/1/call_1",
    )
    assert not converted.is_error and "21:00" in converted.output
    status = await manager.call_tool("git__git_status", {"repo_path": str(repo)}, "wf/1/call_2")
    assert not status.is_error and "hello.txt" in status.output
    bad_zone = await manager.call_tool(
        "time__get_current_time", {"timezone": "Mars/Olympus"}, "wf/1/call_3"
    )
    assert bad_zone.is_error and "Mars/Olympus" in bad_zone.output


# --- calls over both transports and both protocol eras -----------------------------------


async def test_stdio_call_carries_the_idempotency_key(
    shared: tuple[McpClientManager, CallLog], log: CallLog, managers: list[McpClientManager]
) -> None:
    for manager, calls in [shared, (manage(managers, demo=demo_stdio(log, "legacy")), log)]:
        result = await manager.call_tool("demo__lookup", {"key": "k1"}, "task-1/3/call_7")
        assert (result.output, result.is_error) == ("value of k1", False)
        assert calls.entries()[-1]["key"] == "task-1/3/call_7"


async def test_http_server_gets_headers_expanded_on_the_worker(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    async with demo_http_server(log) as url:
        config = McpServerConfig(url=url, headers={"Authorization": "Bearer ${DEMO_TOKEN}"})
        manager = manage(managers, remote=config)
        catalog = await manager.list_tools()
        assert catalog.get("remote__lookup") is not None
        result = await manager.call_tool("remote__lookup", {"key": "k"}, "task-2/1/call_1")
        assert (result.output, result.is_error) == ("value of k", False)
        entry = log.entries()[-1]
        assert entry["key"] == "task-2/1/call_1"
        assert entry["authorization"] == "Bearer s3cret"
        assert "s3cret" not in catalog.model_dump_json()  # never in what history records

        missing = McpServerConfig(url=url, headers={"Authorization": "Bearer ${NOT_SET_X}"})
        listing = await manage(managers, remote=missing).list_tools()
        assert listing.servers[0].error is not None
        assert "NOT_SET_X" in listing.servers[0].error


# --- errors the model reads --------------------------------------------------------------


async def test_errors_come_back_as_observations(shared: tuple[McpClientManager, CallLog]) -> None:
    manager, log = shared
    failed = await manager.call_tool("demo__fail", {"reason": "no disk"}, "t/1/a")
    assert failed.is_error and "failed as asked: no disk" in failed.output
    unknown = await manager.call_tool("demo__nope", {}, "t/1/b")
    assert unknown.is_error and "unknown tool 'demo__nope'" in unknown.output
    assert "demo__lookup" in unknown.output  # what it could call instead
    invalid = await manager.call_tool("demo__set_flag", {"name": 3}, "t/1/c")
    assert invalid.is_error
    assert "name: 3 is not of type 'string'" in invalid.output
    assert "'value' is a required property" in invalid.output
    assert log.events(key="t/1/c") == []  # never sent
    nowhere = await manager.call_tool("elsewhere__tool", {}, "t/1/d")
    assert nowhere.is_error and "no MCP server named 'elsewhere'" in nowhere.output
    picture = await manager.call_tool("demo__picture", {}, "t/1/e")
    assert picture.output == "a one-pixel picture\n[image: image/png, 67 bytes, not shown]"


async def test_a_server_that_cannot_start_reports_its_stderr(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    manager = manage(
        managers,
        broken=demo_stdio(log, env={"DEMO_FAIL_ON_START": "1"}),
        missing=McpServerConfig(command="/nonexistent/mcp-server"),
    )
    catalog = await manager.list_tools()
    broken, missing = catalog.servers
    assert broken.tools == [] and broken.error is not None
    assert "could not start" in broken.error and "refusing to start" in broken.error
    assert missing.error is not None and "/nonexistent/mcp-server" in missing.error
    call = await manager.call_tool("broken__lookup", {"key": "k"}, "t/1/a")
    assert call.is_error and "refusing to start" in call.output


async def test_a_secret_a_server_prints_when_it_cannot_start_is_redacted_from_the_catalog(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    token = "ghp_" + "7" * 20  # a value its configured environment expanded
    manager = manage(
        managers,
        broken=demo_stdio(log, env={"DEMO_FAIL_ON_START": "1", "DEMO_STDERR_SAYS": token}),
    )
    listing = McpActivities(manager, Redactor([token])).list_tools
    catalog = await ActivityEnvironment().run(listing, ListToolsRequest())
    [broken] = catalog.servers
    assert broken.error is not None and "refusing to start" in broken.error
    assert token not in broken.error and REDACTED in broken.error


async def test_hung_servers_time_out_and_are_restarted(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    manager = manage(
        managers,
        mute=demo_stdio(log, env={"DEMO_HANG_ON_START": "1"}, connect_timeout_seconds=1),
        stuck=demo_stdio(log, env={"DEMO_HANG_ON_LIST": "1"}, list_timeout_seconds=1),
    )
    mute, stuck = (await manager.list_tools()).servers
    assert mute.error is not None and "did not connect within 1 s" in mute.error
    assert stuck.error == "MCP server 'stuck' did not list its tools within 1 s"
    assert not manager.connected("stuck")  # dropped: the next use starts it anew


async def test_a_server_whose_stdout_is_not_mcp_is_named_in_one_line_logged_once(
    log: CallLog, managers: list[McpClientManager], caplog: pytest.LogCaptureFixture
) -> None:
    # The chatty one writes a line every 50 ms from its first (it imports nothing): many
    # lines before the timeout.
    manager = manage(
        managers,
        chatty=not_mcp_stdio(connect_timeout_seconds=10),
        quits=not_mcp_stdio(exits=True),
        banner=demo_stdio(log, env={"DEMO_BANNER": "1"}),
    )
    with caplog.at_level(logging.INFO):
        chatty, quits, banner = (await manager.list_tools()).servers
    not_mcp = f"its stdout is not MCP (first line: {NOT_MCP_LINE})"
    assert chatty.error == f"MCP server 'chatty' did not connect within 10 s: {not_mcp}"
    assert quits.error == f"MCP server 'quits' could not start: {not_mcp}"
    assert banner.error is None and banner.tools  # a line before it speaks MCP is forgiven
    said = [r.getMessage() for r in caplog.records if "not MCP" in r.getMessage()]
    assert sorted(said) == [
        f"MCP server {name}: {not_mcp}; such lines are ignored"
        for name in ("banner", "chatty", "quits")
    ]  # once each, though chatty wrote ~200 lines and quits 20
    assert [r for r in caplog.records if r.exc_info] == []  # no traceback per line


async def test_call_timeout_cancels_the_request_on_the_server(
    tmp_path: Path, log: CallLog, managers: list[McpClientManager]
) -> None:
    # 3 s: the server's handler has begun (logged "start") before the cancel, however busy.
    manager = manage(managers, demo=demo_stdio(log, call_timeout_seconds=3))
    gate = tmp_path / "never-opened"
    result = await manager.call_tool("demo__slow", {"gate": str(gate), "label": "late"}, "t/1/slow")
    assert result.is_error
    assert "did not finish within 3 s and was cancelled" in result.output
    assert "may or may not have taken effect" in result.output
    await log.wait_for("cancelled", key="t/1/slow")  # MCP's notifications/cancelled arrived
    assert log.events("slow", key="t/1/slow") == ["start", "cancelled"]


async def test_crash_mid_call_is_reported_and_the_server_restarts(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    manager = manage(managers, demo=demo_stdio(log))
    crashed = await manager.call_tool("demo__crash", {}, "t/1/crash")
    assert crashed.is_error
    assert "went away during demo__crash; it may or may not have taken effect" in crashed.output
    assert "crashing on purpose" in crashed.output  # the stderr tail
    after = await manager.call_tool("demo__lookup", {"key": "again"}, "t/1/after")
    assert after.output == "value of again"
    first, second = (e["pid"] for e in log.entries() if e["tool"] != "server")
    assert first != second


async def test_a_server_killed_between_calls_is_restarted(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    manager = manage(managers, demo=demo_stdio(log))
    await manager.call_tool("demo__lookup", {"key": "one"}, "t/1/a")
    pid = log.entries()[-1]["pid"]
    os.kill(pid, signal.SIGKILL)
    await until(lambda: not manager.connected("demo"), "the connection seen as gone")
    result = await manager.call_tool("demo__lookup", {"key": "two"}, "t/1/b")
    assert (result.output, result.is_error) == ("value of two", False)
    assert log.entries()[-1]["pid"] != pid


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_list_changed_marks_the_catalog_stale(
    log: CallLog, managers: list[McpClientManager], protocol: str
) -> None:
    manager = manage(managers, demo=demo_stdio(log, protocol))  # type: ignore[arg-type]
    heard: list[str] = []
    manager.add_tools_changed_listener(heard.append)
    catalog = await manager.list_tools(["demo"])
    assert manager.stale_servers(catalog) == []
    added = await manager.call_tool("demo__add_tool", {"name": "fresh"}, "t/1/add")
    assert added.output == "added fresh"
    await until(lambda: manager.stale_servers(catalog) == ["demo"], "the change notified")
    assert "demo" in heard
    relisted = await manager.list_tools(["demo"])
    assert relisted.get("demo__fresh") is not None
    assert manager.stale_servers(relisted) == []
    # A catalog recorded before the change is still stale: this worker listed it anew.
    assert manager.stale_servers(catalog) == ["demo"]
    merged = catalog.merged(relisted)
    assert merged.get("demo__fresh") is not None and len(merged.servers) == 1
    ran = await manager.call_tool("demo__fresh", {}, "t/1/fresh")
    assert ran.output == "fresh ran"
    # A task that could not list the server when it started gets its tools once it can.
    unlisted = ToolCatalog(servers=[McpServerTools(server="demo", error="did not connect")])
    assert manager.stale_servers(unlisted) == ["demo"]


async def test_only_an_answer_about_the_session_counts_as_a_lost_session() -> None:
    def error(status: int, code: int, message: str) -> httpx2.Response:
        body = {"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": message}}
        return httpx2.Response(status, json=body)

    assert await forgot_session(error(404, -32600, "Session not found"))  # the SDK's server
    assert await forgot_session(error(400, -32000, "Bad Request: No valid session ID provided"))
    assert await forgot_session(httpx2.Response(404, text="Not Found"))
    # A server may send a JSON-RPC error with these statuses: not about the session.
    assert not await forgot_session(error(400, -32602, "invalid params: session_name missing"))
    assert not await forgot_session(error(404, -32601, "Method not found"))
    assert not await forgot_session(error(400, -32600, "Bad Request: the body is not JSON"))
    assert not await forgot_session(error(500, -32603, "the session store is down"))


def rejected_sessions_were_dropped(log: CallLog) -> list[str]:
    """The sessions the server refused (404, or 400 naming the session), after checking
    that no request carried one of them once the worker had a new session."""
    requests = [e for e in log.entries() if e["tool"] == "http"]
    rejected = [e["label"] for e in requests if e["label"] and e["status"] in (400, 404)]
    for session in rejected:
        last = max(i for i, e in enumerate(requests) if e["label"] == session)
        later = {e["label"] for e in requests[last:]} - {session, ""}
        carried_on = [e for e in requests if e["label"] in later]
        assert carried_on, f"no new session followed the refusal of {session}"
        assert requests.index(carried_on[0]) > last, f"{session} was sent again"
    return rejected


@pytest.mark.parametrize("refusal", ["404", "400"])
async def test_an_http_server_that_restarts_is_given_a_new_session(
    log: CallLog, managers: list[McpClientManager], refusal: str
) -> None:
    """The SDK's server answers a session it does not know with 404, the reference server
    (@modelcontextprotocol/server-everything) with 400: either way the worker opens a new
    session, and a retry-safe call that met the old one runs once more on the new one. The
    server offers no GET stream: the SDK reopens its GET stream a second after the server
    went away, and finds the session forgotten by itself, so on a slow machine the next
    call would go to a new session at once and none would meet the old one."""
    env = {"DEMO_HTTP_LOG": "1", "DEMO_UNKNOWN_SESSION": refusal, "DEMO_NO_GET_STREAM": "1"}
    async with running_http_server(log, env) as server:
        # Sessions belong to the 2025 revisions: 2026-07-28 connections have none.
        manager = manage(managers, remote=McpServerConfig(url=server.url, protocol="legacy"))
        assert (await manager.call_tool("remote__lookup", {"key": "a"}, "t/1/a")).output == (
            "value of a"
        )
        await server.restart()
        retried = await manager.call_tool("remote__lookup", {"key": "b"}, "t/2/b")
        assert (retried.output, retried.is_error) == ("value of b", False)
        assert retried.stale_servers == ["remote"]  # it came back: the task lists it again
        await manager.list_tools()
        await server.restart()
        once = await manager.call_tool("remote__add_note", {"text": "c"}, "t/3/c")
        assert once.is_error
        assert once.output == (
            "MCP server 'remote' no longer knew this worker's session when remote__add_note "
            "was sent (it restarted?); it may or may not have taken effect; the next call "
            "opens a new session"
        )
        assert log.events("add_note") == []  # not retried: add_note is not retry-safe
        after = await manager.call_tool("remote__add_note", {"text": "d"}, "t/4/d")
        assert (after.output, after.is_error) == ("added 'd'", False)
        await server.restart()
        catalog = await manager.list_tools()  # what the next new task is given
        assert catalog.servers[0].error is None and catalog.get("remote__lookup") is not None
    assert len(rejected_sessions_were_dropped(log)) == 3  # one refusal per restart


async def test_a_restarted_server_counts_as_changed_and_its_changes_are_still_heard(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    """A 2026-07-28 HTTP connection has no session to lose, so a restart ends only its change
    subscription: the worker subscribes again (or connects anew), and counts the server as
    changed, since it may have come back with other tools."""
    async with running_http_server(log) as server:
        manager = manage(managers, remote=McpServerConfig(url=server.url))
        catalog = await manager.list_tools()
        assert manager.stale_servers(catalog) == []
        await server.restart()
        await until(
            lambda: not manager.connected("remote") or manager.stale_servers(catalog) != [],
            "the worker noticed the restart",
        )
        looked = await manager.call_tool("remote__lookup", {"key": "k"}, "t/1/a")
        assert (looked.output, looked.stale_servers) == ("value of k", ["remote"])
        relisted = await manager.list_tools()
        assert manager.stale_servers(relisted) == []
        added = await manager.call_tool("remote__add_tool", {"name": "fresh"}, "t/2/add")
        assert added.output == "added fresh"
        await until(lambda: manager.stale_servers(relisted) == ["remote"], "the change heard")


async def test_close_stops_stdio_servers(log: CallLog) -> None:
    manager = McpClientManager({"demo": demo_stdio(log)})
    await manager.call_tool("demo__lookup", {"key": "k"}, "t/1/a")
    pid = log.entries()[-1]["pid"]
    await manager.close()
    assert not manager.connected("demo")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    refused = await manager.call_tool("demo__lookup", {"key": "k"}, "t/1/b")
    assert refused.is_error and "shutting down" in refused.output


async def test_a_models_call_is_checked_against_the_recorded_catalog(
    shared: tuple[McpClientManager, CallLog],
) -> None:
    catalog = await shared[0].list_tools(["demo"])
    read = check_call(catalog, "c1", "demo__lookup", '{"key": "k"}', None, {})
    assert (read.problem, read.needs_approval, read.retry_safe) == (None, False, True)
    delete = check_call(catalog, "c2", "demo__delete_note", '{"name": "n"}', None, {})
    assert (delete.needs_approval, delete.retry_safe) == (True, False)
    assert delete.approval_reason == "this tool always needs approval"
    waived = check_call(
        catalog, "c3", "demo__delete_note", '{"name": "n"}', None, {"demo__delete_note": "never"}
    )
    assert not waived.needs_approval  # the task's policy wins over the annotation
    strict = check_call(
        catalog, "c4", "demo__lookup", '{"key": "k"}', None, {"demo__lookup": "always"}
    )
    assert strict.needs_approval
    bad = check_call(catalog, "c5", "demo__lookup", '{"key": 1}', None, {})
    assert bad.problem is not None and "is not of type 'string'" in bad.problem
    broken = check_call(catalog, "c6", "demo__lookup", "{not json", None, {})
    assert broken.problem is not None and "not valid JSON" in broken.problem
    hidden = check_call(catalog, "c7", "demo__lookup", "{}", ["demo__set_flag"], {})
    assert hidden.problem is not None and "demo__set_flag" in hidden.problem


HOLD_A_CALL = """
import asyncio, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from waystation.activities.mcp.manager import McpClientManager
from waystation.testing.mcp import CallLog, demo_stdio
manager = McpClientManager({"demo": demo_stdio(CallLog(Path(sys.argv[2])))})
asyncio.run(manager.call_tool("demo__slow", {"gate": sys.argv[3], "label": "held"}, sys.argv[4]))
"""


def hold_a_call(log: CallLog, gate: Path, key: str) -> subprocess.Popen[bytes]:
    """A process that calls the slow tool through a manager, as a worker's activity does."""
    repo = str(Path(__file__).resolve().parent.parent)
    command = [sys.executable, "-c", HOLD_A_CALL, repo, str(log.path), str(gate), key]
    return subprocess.Popen(command)


async def test_when_the_calling_worker_dies_its_server_cancels_and_exits(
    log: CallLog, tmp_path: Path
) -> None:
    holder = hold_a_call(log, tmp_path / "never", "chaos/1/call_1")
    try:
        await log.wait_for("start", key="chaos/1/call_1")
    finally:
        holder.send_signal(signal.SIGKILL)  # like a crashed worker: no shutdown at all
        holder.wait()
    server = log.entries()[-1]["pid"]
    await log.wait_for("cancelled", key="chaos/1/call_1")  # stdin closed: the call ends

    def gone() -> bool:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return True
        return False

    await until(gone, "the orphaned server exits")
    assert log.events(key="chaos/1/call_1") == ["start", "cancelled"]


def test_ws_tools_lists_mcp_tools_with_their_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], log: CallLog
) -> None:
    from waystation.cli import starter

    servers = {
        "time": {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "gone": {"command": "/nonexistent/server"},
        "jobs": demo_stdio(log, env={"DEMO_TASK_TOOL": "1"}).model_dump(mode="json"),
    }
    monkeypatch.setenv("WAYSTATION_MCP_SERVERS", json.dumps(servers))
    assert starter.main(["tools"]) == 1  # a server that cannot start is an error
    out, err = capsys.readouterr()
    assert "time__convert_time" in out and "approval: never" in out
    assert "run_shell" in out
    assert "MCP server gone: MCP server 'gone' could not start" in err
    # A tool that runs only as an MCP task is not offered (every call to it would fail).
    assert "jobs__lookup" in out and "jobs__background_job" not in out
    assert (
        "MCP server jobs: tool 'background_job' was left out: it runs only as an MCP task "
        "(execution.taskSupport: required), which waystation does not support"
    ) in err


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_tools_that_run_only_as_mcp_tasks_are_not_offered(
    log: CallLog, managers: list[McpClientManager], protocol: str
) -> None:
    config = demo_stdio(log, protocol, env={"DEMO_TASK_TOOL": "1"})  # type: ignore[arg-type]
    manager = manage(managers, demo=config)
    catalog = await manager.list_tools()
    [demo] = catalog.servers
    assert demo.error is None and catalog.get("demo__lookup") is not None
    assert catalog.get("demo__background_job") is None
    assert demo.notes == [
        "tool 'background_job' was left out: it runs only as an MCP task "
        "(execution.taskSupport: required), which waystation does not support"
    ]
    refused = await manager.call_tool("demo__background_job", {"name": "j"}, "t/1/job")
    assert refused.is_error and "unknown tool 'demo__background_job'" in refused.output


async def test_concurrent_calls_share_one_server(
    log: CallLog, managers: list[McpClientManager]
) -> None:
    manager = manage(managers, demo=demo_stdio(log))
    keys = [f"t/1/call_{n}" for n in range(6)]
    results = await asyncio.gather(
        *(manager.call_tool("demo__lookup", {"key": key}, key) for key in keys)
    )
    assert [r.output for r in results] == [f"value of {key}" for key in keys]
    assert log.events("server") == ["started"]  # one process, started once
    assert sorted(e["key"] for e in log.entries() if e["tool"] == "lookup") == keys
