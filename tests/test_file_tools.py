"""The file tools against what a workspace may hold: links planted or swapped in, FIFOs,
huge files, and siblings appending to one file while a call is retried."""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type
from waystation.activities.builtin_tools import (
    ListFilesArgs,
    ReadFileArgs,
    WriteFileArgs,
    builtin_registry,
    list_files,
    read_file,
    write_file,
)
from waystation.activities.storage import LedgerAttempt, Storage
from waystation.activities.storage.postgres import PostgresBackend
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.activities.tool_activities import ToolActivities
from waystation.activities.tools import ToolContext, ToolError
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.workflows.models import ToolRequest


@pytest.fixture(params=["sqlite", "postgresql"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    if request.param == "postgresql":
        backend: Any = PostgresBackend(request.getfixturevalue("postgres").create_database())
    else:
        backend = SqliteBackend(tmp_path / "storage.sqlite3")
    async with Storage(backend) as storage:
        yield storage


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "scratch").mkdir(parents=True)
    return workspace


def context_of(workspace: Path, attempt: LedgerAttempt, key: str = "wf/1/c1") -> ToolContext:
    return ToolContext(workspace=workspace, idempotency_key=key, ledger=attempt)


@pytest.fixture
def context(workspace: Path, storage: Storage) -> ToolContext:
    return context_of(workspace, storage.ledger.attempt())


def call(tool: str, key: str = "wf/1/c", **arguments: Any) -> ToolRequest:
    return ToolRequest(call_id="c", tool=tool, arguments=arguments, idempotency_key=key)


# --- item: a link under scratch/ must not carry a write that needed no approval elsewhere -----


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_a_link_under_scratch_does_not_carry_a_write_out_of_it(
    workspace: Path, storage: Storage
) -> None:
    os.symlink("..", workspace / "scratch" / "up")
    activities = ToolActivities(builtin_registry(), workspace, storage.ledger)
    result = await activities.run_tool(
        call("write_file", path="scratch/up/planted.txt", content="no approval asked")
    )
    assert result.is_error and "leads out of scratch/ through a link" in result.output
    assert not (workspace / "planted.txt").exists()
    # A link that stays in scratch/ is followed, and so is one under a path named outside
    # scratch/ (such a write needs approval): the workspace is the only other bound.
    (workspace / "scratch" / "real").mkdir()
    os.symlink("real", workspace / "scratch" / "alias")
    inside = await activities.run_tool(
        call("write_file", "k2", path="scratch/alias/a", content="1")
    )
    assert not inside.is_error and (workspace / "scratch" / "real" / "a").read_text() == "1"
    os.symlink("scratch/up", workspace / "top")
    approved = await activities.run_tool(call("write_file", "k3", path="top/b.txt", content="2"))
    assert approved.output == "wrote 1 bytes to b.txt" and (workspace / "b.txt").exists()
    # A hard link is a second name of the same file: under scratch/, it is not written.
    (workspace / "config.txt").write_text("kept")
    os.link(workspace / "config.txt", workspace / "scratch" / "hard")
    hard = await activities.run_tool(call("write_file", "k4", path="scratch/hard", content="3"))
    assert hard.is_error and "has another name (a hard link)" in hard.output
    assert (workspace / "config.txt").read_text() == "kept"
    nul = await activities.run_tool(call("write_file", "k5", path="scratch/a\x00b", content="4"))
    assert nul.output == "path 'scratch/a\\x00b' cannot be resolved: embedded null byte"


async def test_a_task_writing_through_a_link_out_of_scratch_is_refused(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    """End to end: the model's write needed no approval, so it is refused, and the model is
    told why."""
    workspace = settings.workspace_dir
    (workspace / "scratch").mkdir(parents=True, exist_ok=True)
    os.symlink("..", workspace / "scratch" / "up")
    model = fake_openai.script(
        [tools(("write_file", {"path": "scratch/up/escaped.txt", "content": "x"})), text("ok")]
    )
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "ok"
    events = await handle.events()
    assert not of_type(events, "approval_requested")
    [observation] = of_type(events, "observation")
    assert observation.is_error and "leads out of scratch/" in observation.output
    assert not (workspace / "escaped.txt").exists()


@pytest.fixture
def swapped_after_resolving(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """Each path named in the dict, as soon as it has been resolved, is replaced by a link
    to the path it maps to: an attacker acting between a tool's check and its open."""
    swaps: dict[str, Path] = {}
    resolve = Path.resolve

    def resolve_then_swap(self: Path, strict: bool = False) -> Path:
        resolved = resolve(self, strict)
        for folder, target in list(swaps.items()):
            if str(resolved).startswith(folder + "/"):
                del swaps[folder]
                os.rename(folder, folder + ".moved")
                os.symlink(target, folder)
        return resolved

    monkeypatch.setattr(Path, "resolve", resolve_then_swap)
    yield swaps


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_a_link_swapped_in_after_the_check_is_not_followed(
    context: ToolContext, swapped_after_resolving: dict[str, Path]
) -> None:
    workspace = context.workspace
    outside = workspace.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (workspace / "scratch" / "dir").mkdir()
    (workspace / "scratch" / "dir" / "secret.txt").write_text("harmless")
    swapped_after_resolving[str(workspace.resolve() / "scratch" / "dir")] = outside
    with pytest.raises(ToolError, match="changed into a link"):
        await write_file(
            WriteFileArgs(path="scratch/dir/secret.txt", content="overwritten"), context
        )
    assert (outside / "secret.txt").read_text() == "secret"
    (workspace / "scratch" / "dir2").mkdir()
    (workspace / "scratch" / "dir2" / "secret.txt").write_text("harmless")
    swapped_after_resolving[str(workspace.resolve() / "scratch" / "dir2")] = outside
    with pytest.raises(ToolError, match="changed into a link"):
        await read_file(ReadFileArgs(path="scratch/dir2/secret.txt"), context)


# --- item: read_file reads what it returns, not the whole file ------------------------------


def bytes_read_by_this_process() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_read_file_reads_only_what_it_returns(context: ToolContext) -> None:
    huge = context.workspace / "huge.log"
    with open(huge, "wb") as handle:
        handle.write("début ✓ ".encode() * 4)
        handle.truncate(64 * 2**20)  # 64 MiB, sparse: cheap to make, not to read
    before = bytes_read_by_this_process()
    head = await read_file(ReadFileArgs(path="huge.log", max_chars=10), context)
    assert bytes_read_by_this_process() - before < 2**20
    shown = ("début ✓ " * 4)[:10]
    assert head.startswith(shown + "\n[file truncated at 10 characters: ")
    assert head.endswith(f"{64 * 2**20 - len(shown.encode())} more bytes]")


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_read_file_counts_characters_not_bytes(context: ToolContext) -> None:
    (context.workspace / "wide.txt").write_text("🙂" * 12 + "é")
    assert await read_file(ReadFileArgs(path="wide.txt", max_chars=13), context) == (
        "🙂" * 12 + "é"
    )
    cut = await read_file(ReadFileArgs(path="wide.txt", max_chars=12), context)
    assert cut == "🙂" * 12 + "\n[file truncated at 12 characters: 2 more bytes]"
    (context.workspace / "exact.txt").write_text("🙂" * 3)  # 12 bytes, all that is read
    assert await read_file(ReadFileArgs(path="exact.txt", max_chars=3), context) == "🙂" * 3
    (context.workspace / "bad.bin").write_bytes(b"ok\xff\xfe!")
    assert await read_file(ReadFileArgs(path="bad.bin"), context) == "ok\ufffd\ufffd!"


# --- item: a FIFO never blocks a tool; only regular files are read or written ---------------


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_a_fifo_is_refused_without_blocking(workspace: Path, storage: Storage) -> None:
    fifo = workspace / "scratch" / "pipe"
    os.mkfifo(fifo)
    returned = threading.Event()

    def unblock_a_stuck_writer() -> None:
        # Only if the call hangs: read the FIFO, so that the test fails instead of hanging.
        if not returned.wait(20):
            with open(fifo, "rb") as reader:
                reader.read()

    threading.Thread(target=unblock_a_stuck_writer, daemon=True).start()
    activities = ToolActivities(builtin_registry(), workspace, storage.ledger)
    try:
        written = await activities.run_tool(call("write_file", path="scratch/pipe", content="x"))
    finally:
        returned.set()
    assert written.is_error and written.output == "'scratch/pipe' is a FIFO, not a regular file"
    read = await activities.run_tool(call("read_file", "k2", path="scratch/pipe"))
    assert read.is_error and read.output == "'scratch/pipe' is a FIFO, not a regular file"
    appended = await activities.run_tool(
        call("write_file", "k3", path="scratch/pipe", content="x", append=True)
    )
    assert appended.is_error and "FIFO" in appended.output
    listed = await activities.run_tool(call("list_files", "k4", path="scratch"))
    assert listed.output == "pipe (0 bytes)"


async def test_a_fifo_in_the_workspace_never_freezes_the_worker(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, spawn_worker: Any
) -> None:
    """End to end, in a worker process: the task that writes to a FIFO is told it cannot,
    and the worker goes on serving the next task."""
    fifo = settings.workspace_dir / "scratch" / "pipe"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    await spawn_worker()
    runtime = AgentRuntime(dev_env.client, settings)
    write = tools(("write_file", {"path": "scratch/pipe", "content": "x"}))
    try:
        async with asyncio.timeout(120):  # only a frozen worker takes this long
            writer = await runtime.run(agent_task(fake_openai.script([write, text("tried")])))
            assert (await writer.result()).result == "tried"
            sum_up = tools(("calculator", {"expression": "6 * 7"}))
            other = await runtime.run(agent_task(fake_openai.script([sum_up, text("42")])))
            assert (await other.result()).result == "42"
    finally:  # a worker frozen on the FIFO is released, so that it can be stopped
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.close(reader)
    [observation] = of_type(await writer.events(), "observation")
    assert (
        observation.is_error
        and observation.output == "'scratch/pipe' is a FIFO, not a regular file"
    )


# --- item: appends of siblings to one file, and a retry that must tell its own bytes ---------


class DiesBeforeFinishing(Exception):
    """The attempt's worker died after writing, before recording the result."""


class SiblingAppendsAtStart(LedgerAttempt):
    """An attempt whose `start` gives a sibling call the chance to append to the same file
    before the attempt writes, and which dies before recording its result."""

    def __init__(self, storage: Storage, sibling: ToolContext, flocks: list[int]) -> None:
        super().__init__(storage.backend, lease=0.2)  # lapses at once: its worker is gone
        self.sibling_call: asyncio.Task[str] | None = None
        self._sibling = sibling
        self._flocks = flocks

    async def start(self, key: str, detail: Any = None) -> None:
        await super().start(key, detail)
        if "offset" not in detail:
            return  # the offset's spot, recorded before the call's own start
        self.sibling_call = asyncio.create_task(
            write_file(
                WriteFileArgs(path="report.md", content="sibling\n", append=True), self._sibling
            )
        )
        # The sibling either appends now (nothing keeps it out) or waits for the file's lock.
        while not self.sibling_call.done() and not self._flocks:
            await asyncio.sleep(0.01)

    async def finish(self, key: str, result: str, *, is_error: bool = False) -> None:
        raise DiesBeforeFinishing


async def test_a_retried_append_finds_its_own_bytes_despite_a_sibling(
    workspace: Path, storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = workspace / "report.md"
    report.write_text("# report\n")
    refused_locks: list[int] = []
    flock = fcntl.flock

    def watched_flock(fd: int, operation: int) -> None:
        try:
            flock(fd, operation)
        except BlockingIOError:
            refused_locks.append(fd)
            raise

    monkeypatch.setattr(fcntl, "flock", watched_flock)
    sibling = context_of(workspace, storage.ledger.attempt(), "wf/1/sibling")
    dying = SiblingAppendsAtStart(storage, sibling, refused_locks)
    mine = WriteFileArgs(path="report.md", content="mine\n", append=True)
    with pytest.raises(DiesBeforeFinishing):
        await write_file(mine, context_of(workspace, dying, "wf/1/mine"))
    assert dying.sibling_call is not None
    assert await dying.sibling_call == "appended 8 bytes to report.md"
    retry = await write_file(mine, context_of(workspace, storage.ledger.attempt(), "wf/1/mine"))
    assert retry == "appended 5 bytes to report.md"
    assert report.read_text() == "# report\nmine\nsibling\n"  # each line once
    recorded = await storage.ledger.lookup("wf/1/mine")
    assert recorded is not None and recorded.detail["offset"] == len("# report\n")


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_an_append_waits_for_the_files_lock_without_stalling_the_worker(
    context: ToolContext,
) -> None:
    log = context.workspace / "log.txt"
    log.write_text("")
    with open(log, "ab") as holder:  # another worker, in the middle of its own append
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        appending = asyncio.create_task(
            write_file(WriteFileArgs(path="log.txt", content="b\n", append=True), context)
        )
        while (entry := await context.ledger.lookup(context.idempotency_key)) is None:
            await asyncio.sleep(0.01)
        # The loop still serves other calls while this one waits for the lock.
        assert await list_files(ListFilesArgs(path="."), context) == "log.txt (0 bytes)\nscratch/"
        assert not appending.done() and entry.detail == {}
        holder.write(b"a\n")
        holder.flush()
    assert await appending == "appended 2 bytes to log.txt"
    assert log.read_text() == "a\nb\n"
    recorded = await context.ledger.lookup(context.idempotency_key)
    assert recorded is not None and recorded.detail["offset"] == 2


class DiesBeforeWriting(Exception):
    """The attempt's worker died after recording its offset, before writing."""


class DyingBeforeWriting(LedgerAttempt):
    def __init__(self, storage: Storage) -> None:
        super().__init__(storage.backend, lease=0.2)  # lapses at once: its worker is gone

    async def start(self, key: str, detail: Any = None) -> None:
        await super().start(key, detail)
        if "offset" in detail:
            raise DiesBeforeWriting


async def test_a_retry_does_not_take_a_siblings_identical_line_for_its_own(
    workspace: Path, storage: Storage
) -> None:
    """The attempt recorded its offset and died; a sibling then appended the very same line
    there. The retry must still append: the line at the offset is not its own."""
    report = workspace / "report.md"
    report.write_text("# report\n")
    line = WriteFileArgs(path="report.md", content="- checked\n", append=True)
    with pytest.raises(DiesBeforeWriting):
        await write_file(line, context_of(workspace, DyingBeforeWriting(storage), "wf/1/mine"))
    sibling = context_of(workspace, storage.ledger.attempt(), "wf/1/sibling")
    assert await write_file(line, sibling) == "appended 10 bytes to report.md"
    retry = await write_file(line, context_of(workspace, storage.ledger.attempt(), "wf/1/mine"))
    assert retry == "appended 10 bytes to report.md"
    assert report.read_text() == "# report\n- checked\n- checked\n"  # neither line lost
