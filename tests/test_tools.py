"""Built-in tools and the registry: safe arithmetic, a confined workspace, clear errors."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from waystation.activities.builtin_tools import (
    CalculatorArgs,
    ListFilesArgs,
    ReadFileArgs,
    RunShellArgs,
    WriteFileArgs,
    _run_dir,
    builtin_registry,
    calculator,
    evaluate,
    list_files,
    read_file,
    run_shell,
    write_file,
)
from waystation.activities.storage import Ledger, Storage
from waystation.activities.storage.ledger import HOST
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.activities.tool_activities import ToolActivities
from waystation.activities.tools import ToolContext, ToolError
from waystation.workflows.models import ToolRequest


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[Storage]:
    async with Storage(SqliteBackend(tmp_path / "storage.sqlite3")) as storage:
        yield storage


@pytest.fixture
def context(tmp_path: Path, storage: Storage) -> ToolContext:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return ToolContext(
        workspace=workspace, idempotency_key="wf/1/c1", ledger=storage.ledger.attempt()
    )


async def died_after_start(storage: Storage, key: str, tool: str, detail: dict[str, Any]) -> None:
    """An attempt that claimed `key`, recorded its start, and died (its lease lapses at once)."""
    dead = Ledger(storage.backend, lease=timedelta(seconds=0.2)).attempt()
    assert await dead.claim(key, tool) is None
    await dead.start(key, detail)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("(12 + 30) * 7", 294), ("2^10", 1024), ("7 / 2", 3.5), ("-3 ** 2", -9), ("sqrt(16)", 4.0)],
)
def test_calculator_computes(expression: str, expected: float) -> None:
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('echo hi')", "open('x')", "(1).__class__", "x + 1", "[1, 2]"],
)
def test_calculator_refuses_anything_but_arithmetic(expression: str) -> None:
    with pytest.raises(ToolError):
        evaluate(expression)


def test_calculator_refuses_huge_powers_and_division_by_zero() -> None:
    with pytest.raises(ToolError, match="too large"):
        evaluate("9 ** 9 ** 9")
    with pytest.raises(ToolError, match="division by zero"):
        evaluate("1 / 0")


async def test_calculator_tool_prints_whole_numbers_plainly(context: ToolContext) -> None:
    assert await calculator(CalculatorArgs(expression="6 * 7.0"), context) == "42"


async def test_files_round_trip_inside_the_workspace(context: ToolContext) -> None:
    written = await write_file(WriteFileArgs(path="notes/a.txt", content="hello"), context)
    assert written == "wrote 5 bytes to notes/a.txt"
    await write_file(
        WriteFileArgs(path="notes/a.txt", content=" world", append=True), with_key(context, "k2")
    )
    assert await read_file(ReadFileArgs(path="notes/a.txt"), context) == "hello world"
    assert await list_files(ListFilesArgs(path="notes"), context) == "a.txt (11 bytes)"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "a/../../outside.txt"])
async def test_path_traversal_is_refused(context: ToolContext, path: str) -> None:
    with pytest.raises(ToolError, match="outside the workspace"):
        await write_file(WriteFileArgs(path=path, content="x"), context)
    with pytest.raises(ToolError, match="outside the workspace"):
        await read_file(ReadFileArgs(path=path), context)
    assert not (context.workspace.parent / "outside.txt").exists()


async def test_symlinks_out_of_the_workspace_are_refused(context: ToolContext) -> None:
    outside = context.workspace.parent / "secret.txt"
    outside.write_text("secret")
    os.symlink(outside, context.workspace / "link.txt")
    os.symlink(context.workspace.parent, context.workspace / "up")
    with pytest.raises(ToolError, match="outside the workspace"):
        await read_file(ReadFileArgs(path="link.txt"), context)
    with pytest.raises(ToolError, match="outside the workspace"):
        await write_file(WriteFileArgs(path="link.txt", content="overwritten"), context)
    with pytest.raises(ToolError, match="outside the workspace"):
        await write_file(WriteFileArgs(path="up/secret.txt", content="overwritten"), context)
    assert outside.read_text() == "secret"


async def test_run_shell_runs_in_the_workspace_with_a_timeout(context: ToolContext) -> None:
    output = await run_shell(RunShellArgs(command="pwd; echo hi >&2; exit 3"), context)
    assert output.splitlines() == ["exit code 3", str(context.workspace.resolve()), "hi"]
    slow = with_key(context, "slow")
    with pytest.raises(ToolError, match="timed out"):
        await run_shell(RunShellArgs(command="sleep 30", timeout_seconds=0.3), slow)
    with pytest.raises(ToolError, match="timed out"):  # the retry reports the same outcome
        await run_shell(RunShellArgs(command="sleep 30", timeout_seconds=0.3), slow)


def with_key(context: ToolContext, key: str) -> ToolContext:
    return ToolContext(workspace=context.workspace, idempotency_key=key, ledger=context.ledger)


async def test_a_retried_call_does_its_side_effect_once(context: ToolContext) -> None:
    append = WriteFileArgs(path="log.txt", content="line\n", append=True)
    first = await write_file(append, context)
    assert await write_file(append, context) == first  # same key: the recorded result
    await write_file(append, with_key(context, "another-call"))
    assert (context.workspace / "log.txt").read_text() == "line\nline\n"
    command = RunShellArgs(command="echo ran >> shell.txt")
    assert await run_shell(command, with_key(context, "s1")) == await run_shell(
        command, with_key(context, "s1")
    )
    assert (context.workspace / "shell.txt").read_text() == "ran\n"


async def test_a_lost_response_is_recognised_not_repeated(
    context: ToolContext, storage: Storage
) -> None:
    # An attempt appended, then its worker died before recording the result.
    target = context.workspace / "log.txt"
    target.write_text("before\n")
    await died_after_start(
        storage, "lost", "write_file", {"offset": len("before\n"), "path": "log.txt"}
    )
    with open(target, "a") as handle:
        handle.write("effect\n")
    retry = await write_file(
        WriteFileArgs(path="log.txt", content="effect\n", append=True), with_key(context, "lost")
    )
    assert retry == "appended 7 bytes to log.txt"
    assert target.read_text() == "before\neffect\n"
    # An attempt that recorded its start but never appended: the retry appends once.
    await died_after_start(
        storage, "never-wrote", "write_file", {"offset": target.stat().st_size, "path": "log.txt"}
    )
    await write_file(
        WriteFileArgs(path="log.txt", content="late\n", append=True),
        with_key(context, "never-wrote"),
    )
    assert target.read_text() == "before\neffect\nlate\n"


async def test_a_retried_shell_command_reads_what_the_lost_attempt_did(
    context: ToolContext, storage: Storage
) -> None:
    command = RunShellArgs(command="echo x >> shell.txt")
    detail = {"command": command.command}
    # Recorded as started, but the command never began: it is run now, once.
    await died_after_start(storage, "never-began", "run_shell", detail)
    assert await run_shell(command, with_key(context, "never-began")) == "exit code 0\n"
    assert (context.workspace / "shell.txt").read_text() == "x\n"
    # The command ran to the end after its worker died: the retry returns its output.
    finished = with_key(context, "finished-alone")
    run_dir = _run_dir(finished)
    run_dir.mkdir(parents=True)
    (run_dir / "pid").write_text("999999")
    (run_dir / "output").write_text("it printed this\n")
    (run_dir / "exit_code").write_text("0\n")
    await died_after_start(storage, "finished-alone", "run_shell", detail)
    assert await run_shell(command, finished) == "exit code 0\nit printed this\n"
    # Killed mid-way (its pid is gone, no exit code): unknown, so not run a second time.
    killed = with_key(context, "killed")
    run_dir = _run_dir(killed)
    run_dir.mkdir(parents=True)
    (run_dir / "pid").write_text("999999")
    await died_after_start(storage, "killed", "run_shell", detail)
    with pytest.raises(ToolError, match="not run a second time"):
        await run_shell(command, killed)
    assert (context.workspace / "shell.txt").read_text() == "x\n"


def started_elsewhere(context: ToolContext, *, last_sign_of_life: float) -> Any:
    """The run folder of a command started by a worker on another machine."""
    run_dir = _run_dir(context)
    run_dir.mkdir(parents=True)
    (run_dir / "host").write_text("another-machine")
    (run_dir / "pid").write_text("1")  # another machine's pid: meaningless here
    (run_dir / "alive").touch()
    for name in ("pid", "alive"):
        os.utime(run_dir / name, (last_sign_of_life, last_sign_of_life))
    return run_dir


async def test_a_command_running_on_another_machine_is_awaited_not_repeated(
    context: ToolContext, storage: Storage
) -> None:
    command = RunShellArgs(command="echo y >> shell.txt")
    running = with_key(context, "elsewhere")
    run_dir = started_elsewhere(running, last_sign_of_life=time.time())
    await died_after_start(storage, "elsewhere", "run_shell", {"command": command.command})
    retry = asyncio.create_task(run_shell(command, running))
    while (entry := await storage.ledger.lookup("elsewhere")) is None or (
        entry.owner != context.ledger.owner
    ):
        await asyncio.sleep(0.02)  # until the retry took the key over and inspects
    (run_dir / "alive").touch()  # the command's watcher, on its machine
    (run_dir / "output").write_text("done over there\n")
    (run_dir / "exit_code").write_text("0\n")
    assert await retry == "exit code 0\ndone over there\n"
    assert not (context.workspace / "shell.txt").exists()  # never run here
    # Silent for a minute: that machine is gone, and what the command did is unknown.
    gone = with_key(context, "gone")
    started_elsewhere(gone, last_sign_of_life=time.time() - 60)
    await died_after_start(storage, "gone", "run_shell", {"command": command.command})
    with pytest.raises(ToolError, match="not run a second time"):
        await run_shell(command, gone)
    assert not (context.workspace / "shell.txt").exists()


async def test_a_command_alive_here_is_awaited_however_stale_its_watcher(
    context: ToolContext, storage: Storage
) -> None:
    """On a loaded machine the watcher's touches can lag by more than the staleness limit;
    on the command's own host its wrapper's process decides, by pid and command line."""
    command = RunShellArgs(command="echo z >> shell.txt")
    running = with_key(context, "starved")
    run_dir = _run_dir(running)
    run_dir.mkdir(parents=True)
    (run_dir / "host").write_text(HOST)
    wait = 'while [ ! -e "$1/release" ]; do sleep 0.05; done'
    wrapper = await asyncio.create_subprocess_exec("/bin/sh", "-c", wait, "run_shell", str(run_dir))
    try:
        (run_dir / "pid").write_text(str(wrapper.pid))
        (run_dir / "alive").touch()
        minute_ago = time.time() - 60
        for name in ("pid", "alive"):
            os.utime(run_dir / name, (minute_ago, minute_ago))
        await died_after_start(storage, "starved", "run_shell", {"command": command.command})
        retry = asyncio.create_task(run_shell(command, running))
        while (entry := await storage.ledger.lookup("starved")) is None or (
            entry.owner != context.ledger.owner
        ):
            await asyncio.sleep(0.02)  # until the retry took the key over and inspects
        (run_dir / "output").write_text("finished late\n")
        (run_dir / "exit_code").write_text("0\n")
        (run_dir / "release").touch()
        assert await retry == "exit code 0\nfinished late\n"
    finally:
        if wrapper.returncode is None:
            wrapper.kill()
        await wrapper.wait()
    assert not (context.workspace / "shell.txt").exists()  # never run a second time
    # A live pid that is not the wrapper (reused by another process) means it is gone.
    reused = with_key(context, "reused")
    run_dir = _run_dir(reused)
    run_dir.mkdir(parents=True)
    (run_dir / "host").write_text(HOST)
    (run_dir / "pid").write_text(str(os.getpid()))
    (run_dir / "alive").touch()  # fresh: only the command line tells
    await died_after_start(storage, "reused", "run_shell", {"command": command.command})
    with pytest.raises(ToolError, match="not run a second time"):
        await asyncio.wait_for(run_shell(command, reused), 30)


async def test_long_output_is_sent_truncated_and_kept_whole(
    context: ToolContext, storage: Storage
) -> None:
    activities = ToolActivities(builtin_registry(), context.workspace, storage.ledger)
    result = await activities.run_tool(
        ToolRequest(
            call_id="c",
            tool="run_shell",
            arguments={"command": "yes | head -c 100000"},
            idempotency_key="wf/1/big",
        )
    )
    assert len(result.output) < 17_000 and "[output truncated:" in result.output
    stored = result.output.rsplit("workspace at ", 1)[1].rstrip("]")
    whole = (context.workspace / stored).read_text()
    assert whole.startswith("exit code 0\n") and len(whole) == len("exit code 0\n") + 100_000
    readable = await read_file(ReadFileArgs(path=stored, max_chars=200_000), context)
    assert readable == whole  # the model can read the rest with read_file


def test_registry_reports_unknown_tools_and_bad_arguments() -> None:
    registry = builtin_registry()
    unknown = registry.check_call("c1", "delete_everything", "{}", None, {})
    assert unknown.problem is not None and "unknown tool 'delete_everything'" in unknown.problem
    assert "calculator" in unknown.problem
    not_json = registry.check_call("c2", "calculator", '{"expression": ', None, {})
    assert not_json.problem is not None and "not valid JSON" in not_json.problem
    invalid = registry.check_call("c3", "calculator", '{"expr": "1+1"}', None, {})
    assert invalid.problem is not None and "expression: Field required" in invalid.problem
    not_allowed = registry.check_call("c4", "run_shell", '{"command": "ls"}', ["calculator"], {})
    assert not_allowed.problem is not None and "unknown tool" in not_allowed.problem
    fine = registry.check_call("c5", "calculator", '{"expression": "1+1"}', None, {})
    assert fine.problem is None and fine.arguments == {"expression": "1+1"}


def test_approval_rules_default_per_tool_and_override_per_task() -> None:
    registry = builtin_registry()
    shell = registry.check_call("c1", "run_shell", json.dumps({"command": "ls"}), None, {})
    assert shell.needs_approval
    scratch = registry.check_call(
        "c2", "write_file", json.dumps({"path": "scratch/a.txt", "content": "x"}), None, {}
    )
    assert not scratch.needs_approval
    escape = registry.check_call(
        "c3", "write_file", json.dumps({"path": "scratch/../a.txt", "content": "x"}), None, {}
    )
    assert escape.needs_approval
    assert escape.approval_reason is not None and "scratch" in escape.approval_reason
    calc = registry.check_call(
        "c4", "calculator", '{"expression": "1"}', None, {"calculator": "always"}
    )
    assert calc.needs_approval
    trusted = registry.check_call(
        "c5", "run_shell", json.dumps({"command": "ls"}), None, {"run_shell": "never"}
    )
    assert not trusted.needs_approval


def test_schemas_are_openai_function_tools() -> None:
    schemas = builtin_registry().schemas(["calculator", "write_file"])
    assert [s["function"]["name"] for s in schemas] == ["calculator", "write_file"]
    params = schemas[1]["function"]["parameters"]
    assert params["type"] == "object" and set(params["required"]) == {"path", "content"}


async def test_run_tool_turns_failures_into_error_results(
    context: ToolContext, storage: Storage
) -> None:
    activities = ToolActivities(builtin_registry(), context.workspace, storage.ledger)
    # A tool this worker lacks is not an observation: another worker takes the call.
    with pytest.raises(ApplicationError, match="this worker lacks nope"):
        await activities.run_tool(
            ToolRequest(call_id="c", tool="nope", arguments={}, idempotency_key="k")
        )
    bad = await activities.run_tool(
        ToolRequest(
            call_id="c", tool="calculator", arguments={"expression": 5}, idempotency_key="k"
        )
    )
    assert bad.is_error and "invalid arguments" in bad.output
    refused = await activities.run_tool(
        ToolRequest(call_id="c", tool="read_file", arguments={"path": "../x"}, idempotency_key="k")
    )
    assert refused.is_error and "outside the workspace" in refused.output
    ok = await activities.run_tool(
        ToolRequest(
            call_id="c", tool="calculator", arguments={"expression": "2*21"}, idempotency_key="k"
        )
    )
    assert not ok.is_error and ok.output == "42"
