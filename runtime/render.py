"""The live view: tokens as they arrive, events as lines, approvals highlighted."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from runtime.commands import command
from runtime.streaming import StreamGap, StreamItem
from runtime.task_tree import TaskTree, TreeNode
from runtime.tree_stream import TreeItem
from runtime.worker_log import AttemptFailure
from workflows.events import (
    Action,
    AgentStarted,
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    Cancelled,
    Done,
    ErrorEvent,
    Failed,
    Interrupted,
    Observation,
    QuestionAnswered,
    QuestionAsked,
    Resumed,
    TaskStarted,
    Thought,
    UserMessage,
)
from workflows.stream import LlmAttemptStarted, TokenDelta


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


PAST_TENSE = {"approve": "approved", "reject": "rejected", "timeout": "timed out"}
# What a failed attempt of each activity is called in the live view.
ATTEMPT_NAMES = {"call_llm": "model", "summarize_context": "summary", "run_tool": "tool"}


def format_call(tool: str, arguments: dict[str, Any] | None) -> str:
    args = ", ".join(f"{k}={_short(v, 60)}" for k, v in (arguments or {}).items())
    return f"{tool}({args})"


@dataclass
class _Track:
    """What the view knows of one task's stream (the task followed, or a sub-agent of it)."""

    prefix: str = ""
    text_shown: set[tuple[int, int]] = field(default_factory=set)  # (step, attempt) shown
    model_step: int | None = None  # the step whose model call is under way
    failures_shown: set[tuple[int | None, int]] = field(default_factory=set)  # failed
    interrupted: dict[int, int] = field(default_factory=dict)  # step -> void up to attempt
    max_attempts: int | None = None


def tree_prefix(path: list[str]) -> str:
    """How a sub-agent's lines begin: indented by its depth, named by its path."""
    return "  " * len(path) + " > ".join(path) + " │ " if path else ""


class LiveView:
    """Renders a task's stream for people. Colour only on a terminal. On a tree's stream,
    a sub-agent's lines are indented by its depth and begin with its path."""

    def __init__(self, out: TextIO = sys.stdout, *, color: bool | None = None) -> None:
        self.out = out
        self.color = out.isatty() if color is None else color
        # The task followed is None; its sub-agents, on a tree's stream, go by their ids.
        self._tracks: dict[str | None, _Track] = {}
        self._track = self._of(None)
        self._root: str | None = None  # the id of the task followed, once a tree says it
        self._streaming: tuple[str | None, int, int] | None = None  # whose tokens are shown

    @property
    def max_attempts(self) -> int | None:
        """Model attempts per step, for "attempt n of m"; learnt from `task_started`."""
        return self._of(None).max_attempts

    def _of(self, task_id: str | None, path: list[str] | None = None) -> _Track:
        track = self._tracks.get(task_id)
        if track is None:
            track = self._tracks[task_id] = _Track(prefix=tree_prefix(path or []))
        return track

    def _paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def _line(self, text: str) -> None:
        self._end_tokens()
        prefix = self._paint(self._track.prefix, "2") if self._track.prefix else ""
        print(prefix + text, file=self.out, flush=True)

    def _end_tokens(self) -> None:
        if self._streaming is not None:
            print(file=self.out, flush=True)
            self._streaming = None

    def show(self, item: StreamItem) -> None:
        key = self._key(item)
        if isinstance(item, TreeItem) and not item.path:
            self._root = item.task_id
        self._track = self._of(key, item.path if isinstance(item, TreeItem) else None)
        track = self._track
        data = item.data
        match data:
            case TokenDelta():
                streaming = (key, data.step, data.attempt)
                track.model_step = data.step
                track.text_shown.add((data.step, data.attempt))
                if self._streaming != streaming:
                    self._end_tokens()
                    if track.prefix:
                        self.out.write(self._paint(track.prefix, "2"))
                    self.out.write(self._paint(f"[step {data.step}] ", "2"))
                    self._streaming = streaming
                self.out.write(data.text)
                self.out.flush()
            case LlmAttemptStarted():
                track.model_step = data.step
                if data.attempt > track.interrupted.get(data.step, data.attempt):
                    return  # the step starts again after an interrupt, which said so
                void = any(
                    step == data.step and attempt < data.attempt
                    for step, attempt in track.text_shown
                )
                if not void and (data.step, data.attempt - 1) in track.failures_shown:
                    return  # the failure's own line said a next try comes
                note = " (the text above is void)" if void else ""
                self._line(
                    self._paint(f"↻ step {data.step}: {self._attempt(data.attempt)}{note}", "33")
                )
            case StreamGap():
                self._line(self._paint(f"… offsets {data.start}-{data.end - 1} were lost", "31"))
            case TaskStarted():
                track.max_attempts = data.task.model.max_attempts
                track.model_step = 1
                self._line(self._paint(f"▶ {data.task_id}: {_short(data.task.task, 200)}", "1"))
                self._line(self._paint(f"  model: {data.task.model.name}", "2"))
            case Thought():
                track.model_step = data.step + 1
                if self._streaming != (key, data.step, data.attempt) and data.content:
                    self._line(f"[step {data.step}] {data.content}")
                self._end_tokens()
            case Action():
                self._line(self._paint(f"  → {format_call(data.tool, data.arguments)}", "36"))
            case AgentStarted():
                self._line(self._paint(f"  ⤷ sub-agent {data.agent}: {data.child_id}", "36"))
            case Observation():
                code = "31" if data.is_error else "32"
                self._line(self._paint(f"  ← {_short(data.output, 300)}", code))
            case ApprovalRequested():
                self._line(
                    self._paint(
                        f"⏸ approval needed [{data.request_id}]: "
                        f"{format_call(data.tool, data.arguments)} ({data.reason})",
                        "1;33",
                    )
                )
            case QuestionAsked():
                choices = f" [{' / '.join(data.choices)}]" if data.choices else ""
                self._line(
                    self._paint(
                        f"? question [{data.request_id}]: {_short(data.question, 300)}{choices}",
                        "1;35",
                    )
                )
            case QuestionAnswered():
                if data.timed_out:
                    self._line(self._paint(f"  nobody answered [{data.request_id}] in time", "31"))
                else:
                    who = f"{data.answerer} answered" if data.answerer else "answered"
                    self._line(
                        self._paint(f"  {who} [{data.request_id}]: {_short(data.answer)}", "32")
                    )
            case ApprovalResolved():
                who = f" by {data.approver}" if data.approver else ""
                note = f": {data.message}" if data.message else ""
                code = "32" if data.decision == "approve" else "31"
                decided = PAST_TENSE.get(data.decision, data.decision)
                self._line(self._paint(f"  {decided}{who} [{data.request_id}]{note}", code))
            case Resumed():
                self._line(
                    self._paint(
                        f"↺ resumed after: {data.failure} (max_steps {data.max_steps}, "
                        f"token_budget {data.token_budget})",
                        "1;33",
                    )
                )
            case Interrupted():
                void = any(
                    step == data.interrupted_step and attempt <= data.attempt
                    for step, attempt in track.text_shown
                )
                track.interrupted[data.interrupted_step] = data.attempt
                note = " (the text above is void)" if void else ""
                self._line(
                    self._paint(
                        f"✂ step {data.interrupted_step}: interrupted by a message{note}", "33"
                    )
                )
            case UserMessage():
                who = data.sender or "user"
                self._line(self._paint(f"▶ {who}: {_short(data.content, 200)}", "1"))
            case ErrorEvent():
                self._line(self._paint(f"! {data.kind}: {data.message}", "33"))
            case Done():
                self._line(self._paint(f"✔ done after {data.step} step(s): {data.result}", "1;32"))
            case Failed():
                self._line(self._paint(f"✘ failed ({data.kind}): {data.reason}", "1;31"))
            case Cancelled():
                self._line(self._paint(f"✘ cancelled: {data.reason}", "1;31"))

    def _key(self, item: StreamItem) -> str | None:
        return item.task_id if isinstance(item, TreeItem) and item.path else None

    def _attempt(self, attempt: int) -> str:
        most = self._track.max_attempts
        of = f" of {most}" if most else ""
        return f"attempt {attempt}{of}"

    def attempt_failed(self, failure: AttemptFailure) -> bool:
        """One line for a failed attempt the hosted worker ran (see runtime.worker_log), in
        the lines of the task it belongs to: the task followed, or a sub-agent the view has
        shown (False, nothing shown, for another task of the tree)."""
        theirs = self._tracks.get(failure.workflow_id)
        if theirs is None and self._root not in (None, failure.workflow_id):
            return False
        self._track = track = theirs or self._of(None)
        what = ATTEMPT_NAMES.get(failure.activity, failure.activity)
        # The log comes straight from the hosted worker, ahead of the stream: the failure's
        # own step, where it names one, not the step the view has reached.
        step = failure.step if failure.step is not None else track.model_step
        where = f"step {step}: " if step is not None else ""
        track.failures_shown.add((step, failure.attempt))
        self._line(self._paint(f"✗ {where}{what} {failure.describe()}", "33"))
        return True


def _data(value: Any) -> str:
    """A typed answer for people: a table for a flat object, else indented JSON."""
    if (
        isinstance(value, dict)
        and value
        and all(isinstance(v, str | int | float | bool) or v is None for v in value.values())
    ):
        width = max(len(str(k)) for k in value)
        return "\n".join(f"{str(k).ljust(width)}  {_short(v, 200)}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False, indent=2)


def render_tree(tree: TaskTree) -> list[str]:
    """The task's caller and its sub-agents, nested, each with its status and id, and the
    command for each request one of them waits for."""
    lines: list[str] = []
    parent = tree.parent
    if parent is not None:
        lines.append(f"parent    {parent.task_id}")
        if parent.root_id != parent.task_id:
            lines.append(f"root      {parent.root_id}")
        lines.append(f"path      {' > '.join(parent.path)}")
    if not tree.children:
        return lines
    lines.append("sub-agents")

    def add(nodes: list[TreeNode], depth: int) -> None:
        width = max(len(n.agent) for n in nodes)
        for node in nodes:
            indent = "  " * depth
            lines.append(f"{indent}{node.agent.ljust(width)}  {node.status:<16}  {node.task_id}")
            for request in node.waiting:
                if request.kind == "approval":
                    hint = f"approve: {command('approve', node.task_id, request.request_id)}"
                else:
                    hint = f"answer: {command('answer', node.task_id, request.request_id)} '...'"
                lines.append(f"{indent}  {hint}")
            if node.children:
                add(node.children, depth + 1)

    add(tree.children, 1)
    if tree.truncated:
        lines.append("  … and more (the tree is too large to show whole)")
    return lines


def render_state(state: AgentState, task_id: str, tree: TaskTree | None = None) -> str:
    lines = [
        f"task      {task_id}",
        f"status    {state.status}",
        f"step      {state.step}" + (f" (turn {state.turn})" if state.turn else ""),
        f"tokens    {state.usage.input_tokens} in / {state.usage.output_tokens} out",
    ]
    if state.output is not None:
        lines.append("output    " + _data(state.output).replace("\n", "\n          "))
    elif state.result is not None:
        lines.append(f"result    {state.result}")
    if state.failure is not None:
        lines.append(f"failure   {state.failure}")
    for question in state.pending_questions.values():
        choices = f" [{' / '.join(question.choices)}]" if question.choices else ""
        lines.append(f"question  [{question.request_id}] {question.question}{choices}")
        lines.append(f"          answer: {command('answer', task_id, question.request_id)} '...'")
    for pending in state.pending_approvals.values():
        lines.append(
            f"pending   [{pending.request_id}] {format_call(pending.tool, pending.arguments)}"
            f" — {pending.reason}"
        )
        lines.append(
            f"          approve: {command('approve', task_id, pending.request_id)}"
            f"   reject: ... --reject --message 'why'"
        )
    if tree is not None:
        lines.extend(render_tree(tree))
    return "\n".join(lines)
