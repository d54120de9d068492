"""Tools from plain functions (`@tool`), the safe retry default, and one definition of a
deployment's tools (WAYSTATION_TOOLS) that workers, the command line and the API share."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
import uvicorn
from pydantic import BaseModel, Field
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type
from tests.test_cli import starter
from waystation import (
    AgentRuntime,
    Settings,
    Tool,
    ToolContext,
    ToolDefinitionError,
    ToolRegistry,
    UnknownToolsError,
    load_tools,
    tool,
)
from waystation.activities.builtin_tools import builtin_registry
from waystation.servers.http_api import create_app
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.testing.mcp import free_port
from waystation.testing.workers import REPO, WorkerProcess, running_worker, worker_environment

USER_TOOLS = ["waystation.activities.builtin_tools", "tests.user_tools"]


class Point(BaseModel):
    x: float
    y: float


def test_a_function_is_named_described_and_typed_by_itself() -> None:
    seen: list[tuple[Any, ...]] = []

    @tool
    def distance(
        start: Point,
        end: Annotated[Point, Field(description="Where the way ends.")],
        context: ToolContext,
        rounding: Annotated[int, Field(ge=0, le=6)] = 2,
    ) -> float:
        """The straight-line distance between two points.

        Measured in the plane, in the points' units.
        """
        seen.append((start, end, context, rounding))
        return round(float(((end.x - start.x) ** 2 + (end.y - start.y) ** 2) ** 0.5), rounding)

    entry = distance.schema()["function"]
    assert entry["name"] == "distance"
    assert entry["description"] == (
        "The straight-line distance between two points.\n\n"
        "Measured in the plane, in the points' units."
    )
    parameters = entry["parameters"]
    assert list(parameters["properties"]) == ["start", "end", "rounding"]  # no context
    assert parameters["required"] == ["start", "end"]
    assert parameters["properties"]["end"]["description"] == "Where the way ends."
    assert parameters["properties"]["rounding"] == {
        "default": 2, "maximum": 6, "minimum": 0, "title": "Rounding", "type": "integer"
    }  # fmt: skip
    arguments = distance.arguments.model_validate(
        {"start": {"x": 0, "y": 0}, "end": {"x": 3, "y": 4}}
    )
    context = ToolContext(Path("."), "t/1/c", None)  # type: ignore[arg-type]
    assert asyncio.run(distance.call(arguments, context)) == "5.0"  # not text: sent as JSON
    [(start, end, given, rounding)] = seen
    assert (start, end, given, rounding) == (Point(x=0, y=0), Point(x=3, y=4), context, 2)
    assert (distance.approval, distance.retry_safe, distance.local) == ("never", False, False)


def test_options_are_keywords_and_tool_is_also_a_function() -> None:
    async def charge(amount_cents: int) -> str:
        """Charge the card on file."""
        return f"charged {amount_cents}"

    made = tool(charge, name="charge_card", approval="always", timeout=5)
    assert (made.name, made.approval, made.timeout_seconds, made.retry_safe) == (
        "charge_card", "always", 5.0, False
    )  # fmt: skip

    @tool(retry_safe=True, local=True, description="Add two numbers.")
    def add(a: int, b: int) -> int:
        return a + b

    assert (add.retry_safe, add.local, add.description) == (True, True, "Add two numbers.")


async def test_a_tool_is_still_the_function_it_was_made_from() -> None:
    from tests import user_tools

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool(name="fetch_page", retry_safe=True)
    async def fetch(url: str) -> str:
        """Fetch a page."""
        await asyncio.sleep(0)
        return f"<html>{url}</html>"

    assert add(2, 3) == 5 and add(a=1, b=1) == 2
    assert await fetch("a.org") == "<html>a.org</html>"
    assert isinstance(add, Tool) and isinstance(fetch, Tool)
    assert (add.__name__, add.__doc__, fetch.name) == ("add", "Add two integers.", "fetch_page")
    assert user_tools.basket_total(items=[user_tools.Item(name="tea", price_cents=450)]) == (
        "1 items: 4.50"
    )
    # The registry and a tools module still take it as a Tool.
    assert ToolRegistry([add]).get("add") is add
    assert "basket_total" in load_tools(["tests.user_tools"]).names()


class Opaque:
    """A class pydantic has no schema for."""


def no_docstring(x: int) -> int:
    return x


def untyped(x):  # type: ignore[no-untyped-def]
    """Has a parameter without a type."""
    return x


def opaque(thing: Opaque) -> str:
    """Takes a type pydantic cannot describe."""
    return ""


def splatted(*numbers: int) -> int:
    """Takes its arguments by position."""
    return sum(numbers)


def pure_but_once(x: int) -> int:
    """Local, not retry-safe."""
    return x


@pytest.mark.parametrize(
    ("function", "options", "sentence"),
    [
        (no_docstring, {}, "tool 'no_docstring' has no docstring: it is the description the "
         "model reads to choose the tool (or pass description=)"),
        (untyped, {}, "tool 'untyped': parameter 'x' has no type hint: the model's schema for "
         "it comes from one"),
        (opaque, {}, "tool 'opaque': parameter 'thing' has type Opaque, which pydantic cannot "
         "describe as JSON schema; use standard types, pydantic models or dataclasses"),
        (splatted, {}, "tool 'splatted': parameter 'numbers' is not a named argument: the model "
         "passes arguments by name"),
        (pure_but_once, {"local": True}, "tool 'pure_but_once' is local but not retry-safe: a "
         "local call runs again with its workflow task, so declare it retry_safe=True (or not "
         "local)"),
        (pure_but_once, {"name": "a b"}, "tool name 'a b' must be 1 to 64 letters, digits, '_' "
         "or '-'"),
    ],
)  # fmt: skip
def test_a_bad_definition_fails_at_once_with_a_sentence(
    function: Any, options: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tool(function, **options)
    assert str(refused.value) == sentence


def test_two_tools_of_one_name_are_refused_by_the_registry() -> None:
    def calculator(expression: str) -> str:
        """A second calculator."""
        return expression

    with pytest.raises(ToolDefinitionError) as refused:
        ToolRegistry([*builtin_registry().allowed(None), tool(calculator)])
    assert (
        str(refused.value) == "two tools are named 'calculator': a name offers the model one tool"
    )


def test_a_tool_runs_at_most_once_unless_declared_retry_safe_as_the_built_ins_are() -> None:
    class Args(BaseModel):
        amount: int

    def charge(args: Args, context: ToolContext) -> str:
        return "charged"

    assert (
        Tool(name="charge", description="Charge.", arguments=Args, function=charge).retry_safe
        is False
    )
    registry = builtin_registry()
    assert {t.name: t.retry_safe for t in registry.allowed(None)} == dict.fromkeys(
        ["calculator", "list_files", "read_file", "write_file", "run_shell", "ask_person"], True
    )
    call = registry.check_call("c", "calculator", '{"expression": "1+1"}', None, {})
    assert call.retry_safe and call.local
    once = ToolRegistry([tool(pure_but_once)]).check_call(
        "c", "pure_but_once", '{"x": 1}', None, {}
    )
    assert not once.retry_safe and not once.local


async def test_function_tools_run_in_a_task_typed_sync_async_with_context_and_timeout(
    ts_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    served = settings.model_copy(update={"tools": USER_TOOLS})
    basket = {"items": [{"name": "tea", "price_cents": 450}, {"name": "jam", "price_cents": 550}]}
    model = fake_openai.script(
        [
            tools(
                ("basket_total", {**basket, "discount_percent": 10}),
                ("keep_note", {"text": "buy milk"}),
                ("slow_lookup", {"query": "waystation"}),
            ),
            text("all done"),
        ]
    )
    runtime = AgentRuntime(ts_env.client, served)
    async with running_worker(ts_env.client, served):
        handle = await runtime.run(
            agent_task(model, tools=["basket_total", "keep_note", "slow_lookup"])
        )
        assert (await handle.result()).result == "all done"
        observations = {o.tool: o for o in of_type(await handle.events(), "observation")}
    assert observations["basket_total"].output == "2 items: 9.00"
    kept = json.loads(observations["keep_note"].output)
    assert kept["chars"] == 8 and (served.workspace_dir / kept["kept"]).read_text() == "buy milk"
    slow = observations["slow_lookup"]
    assert slow.is_error and slow.output == "slow_lookup did not finish within 0.5 s"


async def test_workers_the_cli_and_the_api_share_one_definition_of_the_tools(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    served = settings.model_copy(update={"tools": USER_TOOLS})
    named = {"WAYSTATION_TOOLS": ",".join(USER_TOOLS)}
    address = dev_env.client.service_client.config.target_host
    worker = await WorkerProcess(address, served).ready()  # `python worker.py`, from the setting
    try:
        model = fake_openai.script([tools(("basket_total", {"items": []})), text("empty")])
        code, out, err = await starter(
            dev_env, settings, "run", "--no-worker", "--json", "--tools", "basket_total",
            "--model", model, "What is in my basket?", endpoint=fake_openai, extra_env=named,
        )  # fmt: skip
        assert code == 0, err
        assert '"output":"0 items: 0.00"' in out
    finally:
        worker.kill()

    code, out, err = await starter(dev_env, settings, "tools", extra_env=named)
    assert code == 0, err
    listed = {line.split()[0]: line for line in out.splitlines()}
    assert "retried" in listed["calculator"] and "at most once" in listed["basket_total"]

    code, out, err = await starter(
        dev_env, settings, "run", "--no-wait", "--tools", "teleport", "hi", extra_env=named
    )
    assert code == 2 and err.strip() == (
        "error: unknown tool(s) in the task's tools: 'teleport' (the tools are ask_person, "
        "basket_total, calculator, keep_note, list_files, read_file, run_shell, slow_lookup, "
        "write_file)"
    )

    # The API's runtime reads the same setting: its start form offers them, and it refuses
    # a task naming a tool no worker has.
    app = create_app(served, AgentRuntime(dev_env.client, served))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            session = (await http.get("/console/api/session")).json()
            assert {"name": "keep_note", "approval": "never"} in session["tools"]
            refused = await http.post("/tasks", json={"task": "hi", "tools": ["teleport"]})
            assert refused.status_code == 422 and refused.json()["error"] == "unknown_tools"
            accepted = await http.post("/tasks", json={"task": "hi", "tools": ["keep_note"]})
            assert accepted.status_code == 201, accepted.text
    finally:
        server.should_exit = True
        await serving


async def test_a_tools_module_that_cannot_load_is_one_sentence_everywhere(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    missing = {"WAYSTATION_TOOLS": "waystation.activities.builtin_tools,no_such_tools"}
    sentence = (
        "WAYSTATION_TOOLS names 'no_such_tools', which cannot be imported: No module named "
        "'no_such_tools' (run from the folder that holds it, or put it on PYTHONPATH)"
    )
    code, out, err = await starter(dev_env, settings, "run", "--no-wait", "hi", extra_env=missing)
    assert (code, out, err.strip()) == (2, "", f"error: {sentence}")
    env = worker_environment(dev_env.client.service_client.config.target_host, settings, missing)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "worker.py"), cwd=REPO, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, worker_err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert worker_err.decode().strip() == f"worker cannot start: {sentence}"
    with pytest.raises(ToolDefinitionError, match="no_such_tools"):
        AgentRuntime(dev_env.client, settings.model_copy(update={"tools": ["no_such_tools"]}))
    with pytest.raises(UnknownToolsError):
        AgentRuntime(dev_env.client, settings).check_tools(agent_task("m", tools=["keep_note"]))


def test_a_setting_naming_a_module_where_waystation_had_it_is_told_its_new_name() -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        load_tools(["activities.builtin_tools"])
    assert str(refused.value) == (
        "WAYSTATION_TOOLS names 'activities.builtin_tools', which cannot be imported: "
        "waystation's own modules are in the package waystation now "
        "(waystation.activities.builtin_tools)"
    )
