"""Built-in tools: calculator, files confined to the workspace, and a shell."""

from __future__ import annotations

import ast
import asyncio
import codecs
import contextlib
import fcntl
import hashlib
import math
import operator
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from waystation.activities.program_environment import program_environment
from waystation.activities.storage import LedgerAttempt
from waystation.activities.storage.ledger import HOST
from waystation.activities.tools import Tool, ToolContext, ToolError, ToolRegistry, cap_output
from waystation.activities.workspace_files import (
    WorkspacePath,
    locate,
    open_directory,
    open_regular_file,
)
from waystation.workflows.models import ASK_PERSON_TOOL
from waystation.workflows.questions import ASK_PERSON_DESCRIPTION, AskPersonArgs

# --- calculator -----------------------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "floor": math.floor,
    "ceil": math.ceil,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_MAX_MAGNITUDE = 10**100
_MAX_EXPONENT = 1000


def evaluate(expression: str) -> int | float:
    """Evaluate arithmetic without eval(): only numbers, operators and a few math functions."""
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from err
    try:
        value = _evaluate_node(tree.body)
    except ZeroDivisionError as err:
        raise ToolError("division by zero") from err
    except (OverflowError, ValueError) as err:
        raise ToolError(f"cannot compute {expression!r}: {err}") from err
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"not a number: {expression!r}")
    return value


def _evaluate_node(node: ast.expr) -> Any:
    match node:
        case ast.Constant(value=value) if isinstance(value, int | float) and not isinstance(
            value, bool
        ):
            return value
        case ast.Name(id=name) if name in _CONSTANTS:
            return _CONSTANTS[name]
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            a, b = _evaluate_node(left), _evaluate_node(right)
            if isinstance(op, ast.Pow) and abs(b) > _MAX_EXPONENT:
                raise ToolError(f"exponent {b} is too large")
            result = _BINARY[type(op)](a, b)
            if isinstance(result, int) and abs(result) > _MAX_MAGNITUDE:
                raise ToolError("result is too large")
            return result
        case ast.UnaryOp(op=op, operand=operand) if type(op) in _UNARY:
            return _UNARY[type(op)](_evaluate_node(operand))
        case ast.Call(func=ast.Name(id=name), args=args, keywords=[]) if name in _FUNCTIONS:
            return _FUNCTIONS[name](*(_evaluate_node(a) for a in args))
    raise ToolError(f"unsupported in arithmetic: {ast.unparse(node)!r}")


class CalculatorArgs(BaseModel):
    expression: str = Field(
        min_length=1, max_length=1000, description="Arithmetic such as '(12 + 30) * 7 / 2'."
    )


async def calculator(args: CalculatorArgs, context: ToolContext) -> str:
    value = evaluate(args.expression)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


# --- files ----------------------------------------------------------------------------------
# Every file operation runs in a thread (a slow or shared disk must not stall the worker's
# event loop) on descriptors from activities/workspace_files.py (no link out, no FIFO).


class ListFilesArgs(BaseModel):
    path: str = Field(default=".", description="Directory inside the workspace.")


_LISTED_ENTRIES = 500


async def list_files(args: ListFilesArgs, context: ToolContext) -> str:
    return await asyncio.to_thread(_list_directory, context.workspace, args.path)


def _list_directory(workspace: Path, path: str) -> str:
    place = locate(workspace, path)
    fd = open_directory(place, place.parts, create=False)
    try:
        with os.scandir(fd) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        if not entries:
            return f"{place.shown} is empty"
        lines = [_listed(entry) for entry in entries[:_LISTED_ENTRIES]]
    finally:
        os.close(fd)
    if len(entries) > _LISTED_ENTRIES:
        lines.append(f"... and {len(entries) - _LISTED_ENTRIES} more")
    return "\n".join(lines)


def _listed(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return f"{entry.name} (link)"
    if entry.is_dir(follow_symlinks=False):
        return f"{entry.name}/"
    return f"{entry.name} ({entry.stat(follow_symlinks=False).st_size} bytes)"


class ReadFileArgs(BaseModel):
    path: str = Field(description="File inside the workspace.")
    max_chars: int = Field(default=16_000, ge=1, le=200_000)


_UTF8_MAX_BYTES = 4  # per character: max_chars characters never take more bytes than this


async def read_file(args: ReadFileArgs, context: ToolContext) -> str:
    return await asyncio.to_thread(_read_text, context.workspace, args.path, args.max_chars)


def _read_text(workspace: Path, path: str, max_chars: int) -> str:
    """The first `max_chars` characters of the file, reading no more bytes than they take
    (a file of any size costs at most 4 bytes a character)."""
    fd = open_regular_file(locate(workspace, path), os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        wanted = max_chars * _UTF8_MAX_BYTES
        head = handle.read(wanted)
    # surrogateescape keeps one character per undecodable byte, so the bytes a prefix took
    # can be counted back; an incomplete character at the cut is held back, not mangled.
    whole = len(head) < wanted or len(head) >= size
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    text = decoder.decode(head, final=whole)
    shown = text[:max_chars].encode("utf-8", "surrogateescape")
    readable = shown.decode("utf-8", errors="replace")
    if whole and len(text) <= max_chars:
        return readable
    rest = max(size - len(shown), 0)
    return readable + f"\n[file truncated at {max_chars} characters: {rest} more bytes]"


class WriteFileArgs(BaseModel):
    path: str = Field(description="File inside the workspace; folders are created as needed.")
    content: str = Field(max_length=1_000_000)
    append: bool = Field(default=False, description="Append instead of replacing the file.")


_LOCK_POLL_SECONDS = (0.005, 0.1)  # first and longest wait between two tries of the lock


async def _lock_exclusively(fd: int) -> None:
    """Hold the file's exclusive lock (released when `fd` closes). Tried without blocking,
    so that writers queued on one file hold no thread and never stall the event loop."""
    delay, longest = _LOCK_POLL_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)


def _holds_at(fd: int, offset: int, data: bytes) -> bool:
    """Whether `data` stands in the file at `offset`."""
    if os.fstat(fd).st_size < offset + len(data):
        return False
    return os.pread(fd, len(data), offset) == data


def _spot(place: WorkspacePath, offset: int) -> str:
    """The ledger key naming who appends at `offset` of the file, by its resolved path (the
    same on every machine sharing the workspace). Without a '/', it is never a tool call's
    key (`task/step/call`)."""
    digest = hashlib.sha256(place.shown.encode()).hexdigest()[:32]
    return f"write_file-append:{digest}:{offset}"


async def _appended_before(
    ledger: LedgerAttempt, key: str, place: WorkspacePath, fd: int, offset: int, data: bytes
) -> bool:
    """Whether an earlier attempt of `key`, which recorded `offset`, appended `data` there.

    The bytes alone cannot tell: that attempt may have died before writing, and a sibling
    appended the same bytes at that offset. Whoever appends at an offset records so under
    the offset's spot first, so the bytes there are this call's only if the spot names it.
    """
    if not await asyncio.to_thread(_holds_at, fd, offset, data):
        return False
    spot = await ledger.lookup(_spot(place, offset))
    return spot is None or spot.detail.get("key") == key  # None: pruned, or an older release


def _write_and_close(fd: int, data: bytes, *, replace: bool) -> None:
    try:
        if replace:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


async def write_file(args: WriteFileArgs, context: ToolContext) -> str:
    place = await asyncio.to_thread(locate, context.workspace, args.path, writing=True)
    ledger, key = context.ledger, context.idempotency_key
    earlier = await ledger.claim(key, "write_file")  # waits while a live attempt holds it
    if earlier is not None and earlier.state == "done" and earlier.result is not None:
        return earlier.result
    data = args.content.encode()
    verb = "appended" if args.append else "wrote"
    result = f"{verb} {len(data)} bytes to {place.shown}"
    flags = os.O_RDWR | os.O_CREAT | (os.O_APPEND if args.append else 0)
    fd = await asyncio.to_thread(open_regular_file, place, flags, create_folders=True)
    handed_over = False
    try:
        # Appenders of one file take turns, so the offset recorded below is where the bytes
        # go, and a retry that finds its bytes there knows they are its own.
        await _lock_exclusively(fd)
        if args.append and earlier is not None:
            offset = earlier.detail["offset"]
            if await _appended_before(ledger, key, place, fd, offset, data):
                await ledger.finish(key, result)  # the dead attempt did append: not twice
                return result
        offset = os.fstat(fd).st_size if args.append else 0
        if args.append:  # replaces the note of an attempt that died before writing here
            await ledger.record(_spot(place, offset), "write_file", {"key": key})
        await ledger.start(key, {"offset": offset, "path": args.path})
        handed_over = True  # the thread closes it, even if this attempt is cancelled
        await asyncio.shield(
            asyncio.ensure_future(
                asyncio.to_thread(_write_and_close, fd, data, replace=not args.append)
            )
        )
    finally:
        if not handed_over:
            os.close(fd)
    await ledger.finish(key, result)
    return result


# --- shell ----------------------------------------------------------------------------------


class RunShellArgs(BaseModel):
    command: str = Field(min_length=1, max_length=10_000, description="A /bin/sh command line.")
    timeout_seconds: float = Field(default=30, gt=0, le=600)


# The command runs in its own session and writes its pid, output and exit code into a
# folder of the workspace named after the idempotency key; a watcher touches `alive` every
# second while it runs. The command outlives a worker that dies, so a retry on any machine
# that shares the workspace can wait for it or read what it did instead of running it again.
_WRAPPER = (
    'echo $$ > "$2/pid"; '
    '(while :; do touch "$2/alive"; sleep 1; done) & watcher=$!; '
    '/bin/sh -c "$1" > "$2/output" 2>&1; code=$?; kill $watcher 2>/dev/null; '
    'echo $code > "$2/exit.tmp"; mv "$2/exit.tmp" "$2/exit_code"'
)
SHELL_RUNS_DIR = ".shell-runs"
_START_GRACE = 1.0
# The watcher touches `alive` every second; this long without a touch, the command is gone.
_ALIVE_STALE_SECONDS = 5.0
SHELL_OUTPUT_CHARS = 1_000_000  # kept whole up to this; the model is sent less


def _run_dir(context: ToolContext) -> Path:
    digest = hashlib.sha256(context.idempotency_key.encode()).hexdigest()[:24]
    return context.workspace / SHELL_RUNS_DIR / digest


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _recently_touched(run_dir: Path) -> bool:
    """Whether the command's watcher touched its files lately, by the workspace's own clock
    (a file written now), which is the same for every machine that shares it."""
    probe = run_dir / f".probe-{uuid.uuid4().hex[:8]}"
    probe.touch()
    try:
        now = probe.stat().st_mtime
    finally:
        probe.unlink()
    signs = [p.stat().st_mtime for p in (run_dir / "pid", run_dir / "alive") if p.exists()]
    return bool(signs) and now - max(signs) < _ALIVE_STALE_SECONDS


def _runs_wrapper_of(pid: int, run_dir: Path) -> bool | None:
    """Whether process `pid` is the wrapper started for `run_dir` (its command line names the
    folder); None where /proc cannot say."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return str(run_dir).encode() in arguments


def _command_alive(run_dir: Path, pid: int) -> bool:
    """A pid means something only on its own host: there, the wrapper's process tells, by
    its pid and its command line (a reused pid names another folder), however slow a loaded
    machine makes the watcher's touches. Elsewhere, or without /proc, the touches tell."""
    host_file = run_dir / "host"
    host = host_file.read_text().strip() if host_file.exists() else HOST
    if host == HOST:
        if not _pid_alive(pid):
            return False
        if (ours := _runs_wrapper_of(pid, run_dir)) is not None:
            return ours
    return _recently_touched(run_dir)


def _finished_result(run_dir: Path) -> str | None:
    exit_file = run_dir / "exit_code"
    if not exit_file.exists():
        return None
    output = (run_dir / "output").read_bytes().decode("utf-8", errors="replace")
    return cap_output(f"exit code {exit_file.read_text().strip()}\n{output}", SHELL_OUTPUT_CHARS)


async def _await_earlier_attempt(run_dir: Path) -> str | None:
    """What an earlier attempt's command did, waiting for it if it still runs.

    None when it never started (it is safe to start it now).
    """
    deadline = time.monotonic() + _START_GRACE
    while not (run_dir / "pid").exists():
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.05)
    pid = int((run_dir / "pid").read_text().strip() or 0)
    while (result := _finished_result(run_dir)) is None:
        if not _command_alive(run_dir, pid):
            raise ToolError(
                "an earlier attempt's command was killed before it finished; what it did is "
                "unknown, so it was not run a second time"
            )
        await asyncio.sleep(0.05)
    return result


async def run_shell(args: RunShellArgs, context: ToolContext) -> str:
    ledger, key = context.ledger, context.idempotency_key
    earlier = await ledger.claim(key, "run_shell")  # waits while a live attempt holds it
    if earlier is not None and earlier.state == "done" and earlier.result is not None:
        if earlier.is_error:
            raise ToolError(earlier.result)
        return earlier.result
    run_dir = _run_dir(context)
    if earlier is not None and (outcome := await _await_earlier_attempt(run_dir)) is not None:
        await ledger.finish(key, outcome)
        return outcome
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    (run_dir / "host").write_text(HOST)
    await ledger.start(key, {"command": args.command, "host": HOST})
    environment = context.environment
    if environment is None:
        environment = program_environment(context.workspace, (), os.environ)
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        _WRAPPER,
        "run_shell",
        args.command,
        str(run_dir),
        cwd=context.workspace,
        env=environment,  # none of the worker's secrets
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # survives its worker; a timeout kills the whole group
    )
    try:
        await asyncio.wait_for(process.wait(), args.timeout_seconds)
    except TimeoutError:
        _kill_group(process.pid)
        await process.wait()
        message = f"command timed out after {args.timeout_seconds:g} s"
        await ledger.finish(key, message, is_error=True)
        raise ToolError(message) from None
    except asyncio.CancelledError:
        _kill_group(process.pid)
        raise
    result = _finished_result(run_dir)
    if result is None:
        raise ToolError("the command's shell ended without recording an exit code")
    await ledger.finish(key, result)
    return result


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# Each declares whether a retry may run it again (the default is at most once): reading and
# arithmetic have no effect to repeat; the file and shell tools guard theirs with the ledger.
CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression exactly.",
    arguments=CalculatorArgs,
    function=calculator,
    retry_safe=True,  # pure
    timeout_seconds=5,
    local=True,  # pure and bounded: no server round trip needed
)
LIST_FILES = Tool(
    name="list_files",
    description="List a directory of the workspace.",
    arguments=ListFilesArgs,
    function=list_files,
    retry_safe=True,  # reads only
)
READ_FILE = Tool(
    name="read_file",
    description="Read a text file of the workspace.",
    arguments=ReadFileArgs,
    function=read_file,
    retry_safe=True,  # reads only
)
WRITE_FILE = Tool(
    name="write_file",
    description="Write (or append to) a text file of the workspace.",
    arguments=WriteFileArgs,
    function=write_file,
    approval="outside_scratch",
    retry_safe=True,  # through the ledger: a retry never appends twice
)
RUN_SHELL = Tool(
    name="run_shell",
    description="Run a shell command with the workspace as working directory.",
    arguments=RunShellArgs,
    function=run_shell,
    approval="always",
    retry_safe=True,  # through the ledger and the command's own record
    timeout_seconds=620,
)


def answered_by_a_person(args: AskPersonArgs, context: ToolContext) -> str:
    """The task itself asks the question and waits (workflows/questions.py): a worker never
    runs this tool, so a call that reaches one is a call the workflow did not recognise."""
    raise ToolError(f"{ASK_PERSON_TOOL} is answered by a person through the task, not run")


ASK_PERSON = Tool(
    name=ASK_PERSON_TOOL,
    description=ASK_PERSON_DESCRIPTION,
    arguments=AskPersonArgs,
    function=answered_by_a_person,
    retry_safe=True,  # no worker runs it: the workflow asks, and an answer counts once
)
BUILTIN_TOOLS: tuple[Tool[Any], ...] = (
    CALCULATOR,
    LIST_FILES,
    READ_FILE,
    WRITE_FILE,
    RUN_SHELL,
    ASK_PERSON,
)


def builtin_registry() -> ToolRegistry:
    """A registry holding the built-in tools with their default approval rules."""
    return ToolRegistry(BUILTIN_TOOLS)
