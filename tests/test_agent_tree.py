"""A tree of agents seen whole: the parent's stream carries its sub-agents' items (merged
by the reader, resumable across the tree), `ws status` and GET /tasks/{id} show the tree
with each sub-agent's status, and a sub-agent's approval is decided from the CLI and the
API (real dev server, a worker in this process, uvicorn, the fake OpenAI server, `ws` as
a subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from tests.test_cli import starter
from tests.test_subagents import agent, registry_with
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.tree_stream import OpenStream, TreeCursor, TreeItem, parse_cursor
from waystation.servers.http_api import create_app
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.proc import free_port
from waystation.testing.workers import running_worker
from waystation.workflows.models import AgentSpec

Item = dict[str, Any]


@contextlib.asynccontextmanager
async def serving(
    dev_env: WorkflowEnvironment, settings: Settings, *specs: AgentSpec
) -> AsyncIterator[httpx.AsyncClient]:
    """The API offering these sub-agents on a free port, with a worker offering them too."""
    registry = registry_with(*specs)
    runtime = AgentRuntime(dev_env.client, settings, tools=registry)
    app = create_app(settings, runtime, sse_ping_seconds=0.5)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        async with running_worker(dev_env.client, settings, registry=registry):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as api:
                yield api
    finally:
        server.should_exit = True
        await serving


def seg(task_id: str) -> str:
    """A task id as one path segment (a sub-agent's id holds slashes)."""
    return urllib.parse.quote(task_id, safe="")


async def sse(
    api: httpx.AsyncClient,
    path: str,
    *,
    last_event_id: str | None = None,
    until: Callable[[Item], bool] | None = None,
) -> list[Item]:
    """The SSE items of `path` as {id, event, data}: to the stream's end, or cut off (the
    connection dropped) right after the first item `until` holds for."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    items: list[Item] = []
    current: Item = {}
    async with api.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line:
                if "data" in current:
                    items.append(current)
                    if until is not None and until(current):
                        break
                current = {}
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                current[field] = json.loads(value) if field == "data" else value
    return items


def from_(path: list[str], event: str | None = None) -> Callable[[Item], bool]:
    return lambda i: i["data"]["path"] == path and (event is None or i["event"] == event)


def test_a_cursor_reads_back_as_it_was_written() -> None:
    cursor = TreeCursor(
        13,
        {
            "1/call_1_0": OpenStream(5, False, ("one",)),
            "1/call;=@!,%/x": OpenStream(0, True, ("two", "de ep")),
        },
    )
    assert parse_cursor(cursor.text()) == cursor
    assert TreeCursor(8).text() == "7" and parse_cursor("7") == TreeCursor(8)
    for forged in ("-1", "7;", "7;x=1", "7;x=a@b", "²", "7;x=1@b;"):
        try:
            parse_cursor(forged)
        except ValueError:
            continue
        raise AssertionError(f"{forged!r} was taken as a cursor")


async def test_the_parent_stream_carries_the_tree_and_reconnects_mid_tree_without_loss_or_repeat(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    one_gate, deep_gate = threading.Event(), threading.Event()
    one = fake_openai.script([Reply(content="one found it", hold_after_chunks=2, gate=one_gate)])
    deep = fake_openai.script(
        [Reply(content="deep down here", hold_after_chunks=2, gate=deep_gate)]
    )
    two = fake_openai.script([tools(("agent__deep", {"task": "dig"})), text("two dug")])
    parent = fake_openai.script(
        [
            tools(("agent__one", {"task": "the attic"}), ("agent__two", {"task": "the cellar"})),
            text("both looked"),
        ]
    )
    specs = (agent("one", one), agent("two", two), agent("deep", deep))
    async with serving(dev_env, settings, *specs) as api:
        try:
            created = await api.post("/tasks", json={"task": "find it", "model": {"name": parent}})
            task_id = created.json()["id"]
            events = f"/tasks/{task_id}/events?tree=true"
            # Cut while both sub-agents are provably mid-stream (their models hold at a gate):
            # once a token of `one` and one of `two > deep` have come.
            seen: set[str] = set()

            def both_streaming(item: Item) -> bool:
                if item["event"] == "token":
                    seen.add("/".join(item["data"]["path"]))
                return {"one", "two/deep"} <= seen

            first = await sse(api, events, until=both_streaming)
            assert ";" in first[-1]["id"]  # the cursor names the open streams
            one_gate.set()
            second = await sse(
                api, events, last_event_id=first[-1]["id"], until=from_(["one"], "done")
            )
            deep_gate.set()
            third = await sse(api, events, last_event_id=second[-1]["id"])
        finally:
            one_gate.set()
            deep_gate.set()
        got = first + second + third
        own_streams = {
            task: await sse(api, f"/tasks/{seg(task)}/events")
            for task in dict.fromkeys(i["data"]["task_id"] for i in got)
        }
        plain = await sse(api, f"/tasks/{task_id}/events")
        parent_view = (await api.get(f"/tasks/{task_id}")).json()
        deep_log = (await api.get(f"/tasks/{seg(task_id + '/1/call_1_1/1/call_1_0')}/log")).json()

    one_id, two_id = f"{task_id}/1/call_1_0", f"{task_id}/1/call_1_1"
    deep_id = f"{two_id}/1/call_1_0"
    assert set(own_streams) == {task_id, one_id, two_id, deep_id}
    # No item lost or repeated: each task's items in the tree's stream are its own stream.
    keys = [(i["data"]["task_id"], i["data"]["offset"]) for i in got]
    assert len(keys) == len(set(keys))
    for task, own in own_streams.items():
        mine = [i for i in got if i["data"]["task_id"] == task]
        assert [(i["data"]["offset"], i["event"], i["data"]["data"]) for i in mine] == [
            (int(i["id"]), i["event"], i["data"]) for i in own
        ], task
        assert own[-1]["event"] == "done"
    paths = {i["data"]["task_id"]: i["data"]["path"] for i in got}
    assert paths == {task_id: [], one_id: ["one"], two_id: ["two"], deep_id: ["two", "deep"]}
    # The tokens of each sub-agent are there, marked with it.
    tokens = [i["data"] for i in got if i["event"] == "token"]
    assert "".join(t["data"]["text"] for t in tokens if t["path"] == ["one"]) == "one found it"
    # Cause before effect: a sub-agent's last item comes before its caller observes it; the
    # stream ends with the parent's own answer.
    position = {key: n for n, key in enumerate(keys)}
    for child, caller in ((one_id, task_id), (two_id, task_id), (deep_id, two_id)):
        last = max(n for (task, _), n in position.items() if task == child)
        observed = next(
            n
            for n, i in enumerate(got)
            if i["data"]["task_id"] == caller
            and i["event"] == "observation"
            and i["data"]["data"]["call_id"] == child.rsplit("/", 1)[1]
        )
        assert last < observed
    assert (got[-1]["data"]["path"], got[-1]["event"]) == ([], "done")
    # A client that reads only the parent's items sees today's stream: plain offsets as ids.
    assert [int(i["id"]) for i in plain] == list(range(len(plain)))
    assert [i["id"] for i in got if not i["data"]["path"] and ";" not in i["id"]]
    assert parent_view["state"]["result"] == "both looked"
    # Each sub-agent keeps its own log too.
    last = deep_log["events"][-1]
    assert (last["type"], last["result"]) == ("done", "deep down here")


def approve_hints(out: str) -> list[str]:
    return re.findall(r"^ +approve: (.+ approve \S+ \S+)$", out, re.MULTILINE)


@pytest.mark.long(minutes=0.5)
async def test_status_shows_the_tree_and_a_sub_agents_approval_is_decided_by_cli_and_api(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    shell_a = fake_openai.script([tools(("run_shell", {"command": "echo from-a"})), text("a ran")])
    shell_b = fake_openai.script([tools(("run_shell", {"command": "echo from-b"})), text("b ran")])
    parent = fake_openai.script(
        [
            tools(("agent__shell_a", {"task": "run a"}), ("agent__shell_b", {"task": "run b"})),
            text("both ran"),
        ]
    )
    specs = (agent("shell_a", shell_a), agent("shell_b", shell_b))
    agents = json.dumps([s.model_dump(mode="json") for s in specs])

    async def ws(*args: str) -> tuple[int, str, str]:
        return await starter(
            dev_env,
            settings,
            *args,
            endpoint=fake_openai,
            extra_env={"WAYSTATION_AGENTS": agents},
        )

    async with serving(dev_env, settings, *specs) as api:
        # `ws run` follows the tree: a sub-agent's approval ends it with the command to type.
        code, out, err = await ws("run", "--no-worker", "--id", "tree-cli", "--model", parent, "go")
        assert code == 3, err
        a_id, b_id = "tree-cli/1/call_1_0", "tree-cli/1/call_1_1"
        assert re.search(
            r"task tree-cli: its sub-agent shell_[ab] \(tree-cli/1/call_1_[01]\) waits for "
            r"approval of \[1-call_1_0\]",
            err,
        ), err
        assert "  shell_a │ " in out or "  shell_b │ " in out
        async with asyncio.timeout(60):
            while True:
                view = (await api.get(f"/tasks/{seg('tree-cli')}")).json()
                statuses = {c["agent"]: c["status"] for c in view["tree"]["children"]}
                if statuses == {"shell_a": "waiting_approval", "shell_b": "waiting_approval"}:
                    break
                await asyncio.sleep(0.05)
        assert [c["task_id"] for c in view["tree"]["children"]] == [a_id, b_id]
        assert view["tree"]["parent"] is None
        assert view["tree"]["children"][0]["waiting"] == [
            {"kind": "approval", "request_id": "1-call_1_0"}
        ]
        inbox = (await api.get("/approvals")).json()["approvals"]
        assert sorted(i["task_id"] for i in inbox) == [a_id, b_id]

        code, out, err = await ws("status", "--no-worker", "tree-cli")
        assert code == 0, err
        assert re.search(rf"^  shell_a  waiting_approval +{re.escape(a_id)}$", out, re.M), out
        assert re.search(rf"^  shell_b  waiting_approval +{re.escape(b_id)}$", out, re.M), out
        assert [hint.split(" approve ")[1] for hint in approve_hints(out)] == [
            f"{a_id} 1-call_1_0",
            f"{b_id} 1-call_1_0",
        ], out

        # One by the CLI, the other by the API; then the tree finishes.
        code, out, err = await ws("approve", "--no-worker", "--no-follow", a_id, "1-call_1_0")
        assert code == 0, err
        decided = await api.post(f"/tasks/{seg(b_id)}/approve", json={"request_id": "1-call_1_0"})
        assert decided.status_code == 200, decided.text
        code, out, err = await ws("stream", "--no-worker", "tree-cli")
        assert code == 0, err
        assert "✔ done after 2 step(s): both ran" in out

        code, out, err = await ws("status", "--no-worker", "tree-cli")
        assert code == 0, err
        assert re.search(rf"^  shell_a  done +{re.escape(a_id)}$", out, re.M), out
        assert re.search(rf"^  shell_b  done +{re.escape(b_id)}$", out, re.M), out
        # A sub-agent's views name its parent.
        code, out, err = await ws("status", "--no-worker", a_id)
        assert code == 0, err
        assert "parent    tree-cli\npath      shell_a\n" in out, out
        child_view = (await api.get(f"/tasks/{seg(b_id)}")).json()
        assert child_view["tree"]["parent"] == {
            "task_id": "tree-cli",
            "root_id": "tree-cli",
            "path": ["shell_b"],
        }
        assert child_view["state"]["status"] == "done"
        # A route's task id may hold slashes, but it is never empty.
        assert (await api.get("/tasks//log")).json()["fields"][0]["loc"] == ["path", "task_id"]


async def test_a_cancelled_parents_tree_stream_shows_each_childs_end_before_its_own(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    workers = {
        name: fake_openai.script([Reply(content=f"{name} at work", hold_after_chunks=2, gate=gate)])
        for name in ("left", "right")
    }
    parent = fake_openai.script(
        [tools(("agent__left", {"task": "work"}), ("agent__right", {"task": "work"}))]
    )
    registry = registry_with(*(agent(name, model) for name, model in workers.items()))
    runtime = AgentRuntime(dev_env.client, settings, tools=registry)
    async with running_worker(dev_env.client, settings, registry=registry):
        handle = await runtime.run(agent_task(parent))
        items: list[TreeItem] = []
        streaming: set[str] = set()
        cancelled = False
        try:
            async for item in runtime.stream(handle.id, tree=True):
                items.append(item)
                if item.data.type == "token" and item.path:
                    streaming.add(item.path[0])
                # Both children provably mid-stream (held at the gate): cancel the parent.
                if not cancelled and streaming == {"left", "right"}:
                    cancelled = True
                    await handle.cancel()
        finally:
            gate.set()
        # Resumed from a cursor taken mid-tree, the stream gives exactly what came after it.
        middle = next(n for n, i in enumerate(items) if ";" in i.cursor)
        rest = [i async for i in runtime.stream(handle.id, tree=True, after=items[middle].cursor)]

    ends = [(i.path, i.data.type) for i in items if i.data.type in ("done", "failed", "cancelled")]
    assert sorted(ends[:2]) == [(["left"], "cancelled"), (["right"], "cancelled")]
    assert ends[2:] == [([], "cancelled")]
    assert [i.terminal for i in items].count(True) == 1 and items[-1].terminal
    assert {(i.task_id, i.offset) for i in rest} == {
        (i.task_id, i.offset) for i in items[middle + 1 :]
    }
    assert len(rest) == len(items) - middle - 1
