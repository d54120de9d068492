"""The code blocks of README.md and docs/*.md as the doc tests read them (tests/test_docs.py),
and how a block's output is compared with the output the page shows.

The convention (docs/development.md, "Docs that run"):

- A shell block (```sh, ```bash) or a Python block (```python) is run, in page order, by
  one bash session per page; Python blocks run as scripts (`python block.py`) in it.
- `<!-- not run: REASON -->` on the line right before a block: it is not run, and REASON
  (required) says why (needs Docker, a real model, a terminal, ...).
- `<!-- file: PATH -->` before a block (any language): its text is saved as PATH in the
  page's folder, for the blocks after it (a tools module, a JSON Schema).
- `<!-- background, ready when it prints "TEXT" -->` before a shell block: it is started
  in the background (a worker, the API), with the variables the page exported, and runs
  until the page ends; the next block waits until it has printed TEXT.
- `<!-- stop the background blocks first -->` before a block: the background blocks are
  stopped (as a reader presses Ctrl-C in their terminals) before it runs.
- An ```output block after a run block (prose may come between, no other block): what that
  block prints, stdout and stderr together. `…` in a line stands for any text, a line of
  `...` for any number of lines; generated ids, times and the user's name are compared as
  their kind (GENERATED below), so a page may show real ones.

Any other language (```json, ```text, ...) is data: shown, never run. A block without a
language, or a comment before a block that is none of the above, is an error: the test
cannot tell whether it should run.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

SHELL = frozenset({"sh", "bash", "shell", "console"})
PYTHON = frozenset({"python", "py"})
OUTPUT = "output"

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")
_COMMENT = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")
_NOT_RUN = re.compile(r"^not run:\s*(?P<reason>.*)$")
_FILE = re.compile(r"^file:\s*(?P<path>\S+)$")
_BACKGROUND = re.compile(r'^background, ready when it prints "(?P<ready>[^"]+)"$')
_STOP = "stop the background blocks first"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # of its opening fence, from 1
    language: str
    text: str
    not_run: str | None = None  # the reason
    file: str | None = None
    ready: str | None = None  # a background block: the text that says it is ready
    stops_background: bool = False
    output: str | None = None  # what the page shows it prints

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def code(self) -> bool:
        return self.language in SHELL or self.language in PYTHON

    @property
    def runs(self) -> bool:
        """Run in the foreground, its output checked when the page shows it."""
        return self.code and self.not_run is None and self.file is None and self.ready is None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return any(b.runs or b.ready or b.file for b in self.blocks)


def read_page(path: Path) -> Page:
    """The page's blocks with their directives and outputs; `problems` lists each block the
    convention cannot place, as `page:line: what is wrong`."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not _closes(lines[end], fence):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        if end == len(lines):
            page.problems.append(f"{path.name}:{index + 1}: a block that never ends")
        _place(page, index, lines, opening.group("info").lower(), "\n".join(body) + "\n")
        index = end + 1
    return page


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return stripped.startswith(fence) and set(stripped) == {fence[0]}


def _place(page: Page, index: int, lines: list[str], language: str, text: str) -> None:
    where = f"{page.path.name}:{index + 1}"
    directive = _COMMENT.match(lines[index - 1]) if index > 0 else None
    block = Block(page.path, index + 1, language, text)
    if directive is not None:
        body = directive.group("body")
        if m := _NOT_RUN.match(body):
            if not m.group("reason").strip():
                page.problems.append(f"{where}: 'not run:' needs a reason")
            block = dataclasses.replace(block, not_run=m.group("reason").strip() or "?")
        elif m := _FILE.match(body):
            block = dataclasses.replace(block, file=m.group("path"))
        elif m := _BACKGROUND.match(body):
            if language not in SHELL:
                page.problems.append(f"{where}: only a shell block runs in the background")
            block = dataclasses.replace(block, ready=m.group("ready"))
        elif body == _STOP:
            block = dataclasses.replace(block, stops_background=True)
        else:
            page.problems.append(
                f"{where}: the comment before the block is no directive the doc test knows "
                f"({body!r}): 'not run: REASON', 'file: PATH', "
                f"'background, ready when it prints \"TEXT\"' or '{_STOP}'"
            )
    if not language:
        page.problems.append(f"{where}: a block without a language: name it (sh, python, json...)")
    if language == OUTPUT:
        _attach_output(page, where, text)
    else:
        page.blocks.append(block)


def _attach_output(page: Page, where: str, text: str) -> None:
    previous = page.blocks[-1] if page.blocks else None
    if previous is None or not previous.runs or previous.output is not None:
        page.problems.append(f"{where}: an output block must follow a block that runs")
        return
    page.blocks[-1] = dataclasses.replace(previous, output=text)


# What differs from run to run, each replaced by its kind on both sides of a comparison.
GENERATED: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(task-[0-9a-f]{12})(?![0-9a-f])"), "task-<id>"),
    (re.compile(r"\bfork-[0-9a-f]{6}\b"), "fork-<id>"),
    (re.compile(r"\bmsg-[0-9a-f]{32}\b"), "msg-<id>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<hex>"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"[\w.-]+@cli\b"), "you@cli"),
]


def normalized(text: str) -> str:
    for pattern, kind in GENERATED:
        text = pattern.sub(kind, text)
    return text


def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in expected.split("…")) + r"\Z")


def mismatch(expected: str, actual: str) -> str | None:
    """None when `actual` is what `expected` shows (see the module docstring), else the
    first expected line that does not match, with the actual output."""
    want = _lines(normalized(expected))
    got = _lines(normalized(actual))
    if _matches(want, got):
        return None
    seen = 0
    for line in want:
        if line == "..." or any(_line_pattern(line).match(g) for g in got[seen:]):
            seen += 1
            continue
        return f"no line matches {line!r} in order; it printed:\n{actual}"
    return f"it printed other lines than the page shows:\n{actual}"


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _matches(want: list[str], got: list[str]) -> bool:
    """Line by line, a `...` line taking any number of lines (backtracking)."""
    if not want:
        return not got
    head, rest = want[0], want[1:]
    if head == "...":
        return any(_matches(rest, got[skip:]) for skip in range(len(got) + 1))
    return bool(got) and _line_pattern(head).match(got[0]) is not None and _matches(rest, got[1:])
