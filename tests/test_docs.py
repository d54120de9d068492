"""Docs that cannot drift: every shell and Python block of README.md and docs/*.md runs here,
against the offline model and the embedded Temporal dev server, unless the page marks it
`<!-- not run: REASON -->`; where a page shows a block's output, the output is compared
(the convention: tests/doc_pages.py). Also: README stays short, and every relative link of
the pages leads somewhere.

The pages show the default ports; the blocks run on free ones (the embedded server, its
Web UI, the API and a webhook receiver), each page in a folder of its own (`.waystation`
there, `.venv` linked to this checkout's) with `.venv/bin` first on PATH, as a reader who
activated it.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices

from tests.doc_pages import PYTHON, Block, Page, mismatch, read_page
from waystation.activities.notify.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from waystation.settings import Settings
from waystation.testing.mcp import free_port
from waystation.workflows.stream import STREAM_BYTES_KEPT, STREAM_ITEMS_KEPT

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
DEFAULT_PORTS = {"api": 8000, "server": 7233, "ui": 8233, "receiver": 8080}
BLOCK_SECONDS = 180.0  # one block, on a machine whose cores are busy
READY_SECONDS = 90.0
END = "__doc_block_end__"
STARTED = "__doc_background_started__"


def _pages() -> list[Page]:
    return [read_page(path) for path in PAGES]


@dataclass(frozen=True)
class Ports:
    api: int
    server: int
    ui: int
    receiver: int  # a page's webhook receiver (docs/notifications.md)

    def into_page(self, text: str) -> str:
        """A block's text with the default ports replaced by this run's."""
        for name, default in DEFAULT_PORTS.items():
            text = re.sub(
                rf"\b(localhost|127\.0\.0\.1):{default}\b", rf"\g<1>:{getattr(self, name)}", text
            )
        return text

    def from_output(self, text: str) -> str:
        """Output with this run's ports shown as the defaults the pages show."""
        for name, default in DEFAULT_PORTS.items():
            text = re.sub(
                rf"\b(localhost|127\.0\.0\.1):{getattr(self, name)}\b", rf"\g<1>:{default}", text
            )
        return text


def _environment(ports: Ports) -> dict[str, str]:
    """A reader's shell: the venv first on PATH, no model endpoint, no Temporal or waystation
    settings of this machine, the embedded server, its Web UI and the API on this run's
    ports (and Temporal's CLI pointed at that server, as it finds the default one)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(
            ("WAYSTATION_", "OPENAI_", "ANTHROPIC_", "TEMPORAL_", "PYTEST_", "VIRTUAL_ENV")
        )
    }
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",  # stdout and stderr interleave as on a terminal
        WAYSTATION_DEV_SERVER_PORT=str(ports.server),
        WAYSTATION_DEV_SERVER_UI_PORT=str(ports.ui),
        WAYSTATION_API_PORT=str(ports.api),
        # Where Temporal's CLI looks by default (localhost:7233 on a reader's machine).
        TEMPORAL_ADDRESS=f"127.0.0.1:{ports.server}",
    )
    return env


@dataclass(frozen=True)
class DocServer:
    ports: Ports
    folder: Path


@pytest.fixture(scope="session")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServer]:
    """One embedded dev server for the pages a pytest process runs (one after another);
    the pages are spread over the processes like any test, each process with its server."""
    folder = tmp_path_factory.mktemp("docs")
    ports = Ports(api=free_port(), server=free_port(), ui=free_port(), receiver=free_port())
    env = _environment(ports)
    ws = str(VENV_BIN / "ws")
    subprocess.run([ws, "server", "start"], cwd=folder, env=env, check=True, timeout=120)
    try:
        yield DocServer(ports, folder)
    finally:
        subprocess.run([ws, "server", "stop"], cwd=folder, env=env, timeout=60)


class Session:
    """One bash for one page: variables, exports and the working folder carry from block to
    block. Each block is sourced with `set -e`: a command that fails ends the session."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a group of its own, ended with what it runs
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._background: list[int] = []  # process groups of the background blocks
        threading.Thread(target=self._read, daemon=True).start()
        self._send("set -e -o pipefail")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def run(self, block: Block, script: str) -> str:
        """Run the block (a script in the page's folder), return what it printed; fail the
        test if it fails or outlasts BLOCK_SECONDS."""
        path = self.folder / (
            f"_block_{block.line}" + (".py" if block.language in PYTHON else ".sh")
        )
        path.write_text(script, encoding="utf-8")
        command = f"python {path}" if block.language in PYTHON else f". {path}"
        self._send(f"{command} < /dev/null 2>&1; printf '\\n%s\\n' {END}")
        printed: list[str] = []
        deadline = time.monotonic() + BLOCK_SECONDS
        while True:
            try:
                line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(
                    f"{block.where}: still running after {BLOCK_SECONDS:g} s; it "
                    f"printed:\n{''.join(printed)}"
                )
            if line is None:
                code = self.process.wait()
                pytest.fail(
                    f"{block.where}: exited with code {code}; it printed:\n{''.join(printed)}"
                )
            if line.rstrip("\n") == END:
                return "".join(printed).removesuffix("\n")
            printed.append(line)

    def start(self, block: Block, script: str) -> None:
        """Start a background block in a process group of its own (with what the page
        exported, in its folder); return once its log shows the text it is ready at."""
        path = self.folder / f"_block_{block.line}.sh"
        path.write_text(script, encoding="utf-8")
        log = path.with_suffix(".log")
        self._send(f"setsid bash -c '. {path}' > {log} 2>&1 < /dev/null & echo {STARTED} $!")
        started = self._lines.get(timeout=READY_SECONDS)
        assert started is not None and started.startswith(STARTED), started
        self._background.append(int(started.split()[1]))
        deadline = time.monotonic() + READY_SECONDS
        assert block.ready is not None
        while block.ready not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{block.where}: did not print {block.ready!r} within "
                    f"{READY_SECONDS:g} s; its log:\n{log.read_text()}"
                )
            time.sleep(0.2)

    def stop_background(self) -> None:
        """Stop the background blocks as Ctrl-C in their terminals would (SIGTERM, then
        SIGKILL for one that outlasts its grace period)."""
        for group in self._background:
            _end_group(group)
        self._background.clear()

    def close(self) -> None:
        """End the session and everything its blocks started."""
        self.stop_background()
        _end_group(self.process.pid)
        self.process.wait()


def _end_group(group: int, grace: float = 20.0) -> None:
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(group):
        os.killpg(group, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


RUNNABLE = [page for page in _pages() if page.runnable]


@pytest.mark.long(minutes=1)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.path.name for p in RUNNABLE])
def test_the_page_runs_as_written(page: Page, doc_server: DocServer) -> None:
    """Each block runs in order; each block's output is the one the page shows."""
    assert not page.problems, "\n".join(page.problems)
    folder = doc_server.folder / page.path.stem
    folder.mkdir()
    (folder / ".venv").symlink_to(ROOT / ".venv")
    ports = doc_server.ports
    session = Session(folder, _environment(ports))
    try:
        for block in page.blocks:
            if block.not_run is not None:
                continue
            if block.file is not None:
                target = folder / block.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text, encoding="utf-8")
            elif block.ready is not None:
                session.start(block, ports.into_page(block.text))
            elif block.runs:
                if block.stops_background:
                    session.stop_background()
                printed = ports.from_output(session.run(block, ports.into_page(block.text)))
                if block.output is not None and (problem := mismatch(block.output, printed)):
                    pytest.fail(f"{block.where}: {problem}")
    finally:
        session.close()


def test_every_block_runs_or_says_why_not() -> None:
    """A shell or Python block is run, saved as a file, or marked not run with a reason;
    every block has a language; outputs follow blocks that run."""
    problems = [problem for page in _pages() for problem in page.problems]
    assert not problems, "\n".join(problems)
    assert shutil.which("bash"), "the doc tests run their blocks with bash"


def test_readme_fits_in_five_minutes() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The page's lines outside code blocks, with code spans removed."""
    kept: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if fence is None and re.match(r"(`{3,}|~{3,})", stripped):
            fence = re.match(r"(`{3,}|~{3,})", stripped).group(1)  # type: ignore[union-attr]
            continue
        if fence is not None:
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            continue
        kept.append((number, _CODE_SPAN.sub("", line)))
    return kept


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose(path):
        if (heading := _HEADING.match(line)) is None:
            continue
        title = re.sub(r"[*_`]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.group("title"))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_every_relative_link_leads_somewhere() -> None:
    broken: list[str] = []
    for page in PAGES:
        for number, line in _prose(page):
            for link in _LINK.finditer(line):
                target = link.group("target")
                if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = target.partition("#")
                destination = (page.parent / file_part).resolve() if file_part else page
                where = f"{page.relative_to(ROOT)}:{number}: {target}"
                if not destination.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and (destination.suffix != ".md" or anchor not in anchors(destination)):
                    broken.append(f"{where}: no heading with that anchor")
    assert not broken, "\n".join(broken)


def _setting_variables() -> dict[str, list[str]]:
    """Each setting's environment variables, as pydantic-settings reads them."""
    variables: dict[str, list[str]] = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            variables[name] = [choice for choice in alias.choices if isinstance(choice, str)]
        else:
            variables[name] = [f"WAYSTATION_{name.upper()}"]
    return variables


# Read by a script, not by Settings (scripts/real_model.py); the image `ws init`'s Dockerfile
# and compose file build on (waystation/project_template/).
OTHER_VARIABLES = {"WAYSTATION_MODEL_CACHE", "WAYSTATION_IMAGE"}


def test_the_configuration_table_has_every_setting() -> None:
    """docs/production.md lists every variable the settings read, and the pages name no
    WAYSTATION_ variable that nothing reads."""
    page = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    table = page[page.index("## Configuration") :]
    missing = [
        names[0]
        for names in _setting_variables().values()
        if not any(f"`{variable}`" in table for variable in names)
    ]
    assert not missing, f"docs/production.md#configuration lacks {missing}"
    known = {v for names in _setting_variables().values() for v in names} | OTHER_VARIABLES
    named = {
        (page_path.name, found)
        for page_path in PAGES
        for found in re.findall(r"\bWAYSTATION_[A-Z_]*[A-Z]", page_path.read_text("utf-8"))
    }
    unknown = sorted(f"{page}: {name}" for page, name in named if name not in known)
    assert not unknown, f"variables nothing reads: {unknown}"


def test_quoted_limits_are_the_codes() -> None:
    """Figures the pages quote from constants say what the code does."""
    carried = f"at most {STREAM_ITEMS_KEPT} items and {STREAM_BYTES_KEPT:,} bytes"
    for page in ("architecture.md", "streaming.md"):
        text = " ".join((ROOT / "docs" / page).read_text(encoding="utf-8").split())
        assert carried in text, f"docs/{page} does not say a run carries {carried}"


def test_the_readmes_signature_check_accepts_a_notice_a_worker_signs() -> None:
    """README's receiver check against the signing a worker does
    (waystation.activities.notify.signing):
    it accepts a notice as signed, and refuses it tampered, stale or with another secret."""
    [block] = [b for b in read_page(ROOT / "README.md").blocks if b.file == "signature.py"]
    namespace: dict[str, Any] = {}
    exec(compile(block.text, "README.md signature.py", "exec"), namespace)
    check = namespace["signed_by_waystation"]
    body = b'{"kind": "question_asked", "task": {"id": "deploy"}}'
    now = str(int(time.time()))

    def headers(stamp: str, secret: str = "s3cret", signed: bytes = body) -> dict[str, str]:
        return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature(secret, stamp, signed)}

    assert check(b"s3cret", headers(now), body)
    assert not check(b"s3cret", headers(now), body.replace(b"deploy", b"delete"))
    assert not check(b"s3cret", headers(now, secret="another"), body)
    assert not check(b"s3cret", headers(str(int(time.time()) - 301)), body)
    assert not check(b"s3cret", {}, body)
