"""The live view: tokens as they arrive, events as lines, approvals highlighted."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from waystation.client.streaming import StreamGap, StreamItem
from waystation.client.task_tree import TaskTree, TreeNode
from waystation.client.tree_stream import TreeItem
from waystation.settings.commands import command
from waystation.worker.log import AttemptFailure
from waystation.workflows.events import (
    Action,
    AgentEvent,
    AgentStarted,
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    Cancelled,
    Done,
    ErrorEvent,
    Failed,
    Interrupted,
    MemoryRecalled,
    ModelSwitched,
    Observation,
    QuestionAnswered,
    QuestionAsked,
    QuotaGranted,
    Resumed,
    TaskStarted,
    Thought,
    UserMessage,
    WaitingQuota,
    WaitingWorker,
    WorkerFound,
)
from waystation.workflows.models import Usage
from waystation.workflows.stream import LlmAttemptStarted, TokenDelta

# Characters a terminal acts on instead of showing (C0 and C1 controls, DEL) and the ones
# that reorder or hide the text around them (bidirectional overrides, line separators).
_BIDI_AND_SEPARATORS = frozenset(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def _inert(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or char in _BIDI_AND_SEPARATORS


def _escape(char: str) -> str:
    code = ord(char)
    named = {"\r": "\\r", "\t": "\\t", "\n": "\\n"}.get(char)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, indent: str | None = None) -> str:
    """Text from a task, made visible and inert for a terminal: every control character and
    every character that reorders or hides text is shown as an escape (`\\x1b`, `\\r`,
    `\\u202e`), so what a person reads is what the task holds. A newline is `⏎ ` on one
    line (`indent` None); with `indent`, it stays and the next line begins with `indent`, so
    a task's text cannot pass for a line of our own. Ordinary Unicode and tabs stay."""
    text = text.replace("\r\n", "\n")
    shown: list[str] = []
    for char in text:
        if char == "\n":
            shown.append("⏎ " if indent is None else "\n" + indent)
        elif char != "\t" and _inert(char):
            shown.append(_escape(char))
        else:
            shown.append(char)
    return "".join(shown)


def visible_json(text: str) -> str:
    """JSON text (`--json` output) with the characters `visible` escapes that JSON keeps raw
    (DEL, C1 controls, bidirectional overrides: only ever inside strings) as \\u escapes,
    so the output is still the same JSON, and inert on a terminal."""
    # JSON escapes every control character in a string itself: one outside is whitespace.
    return "".join(f"\\u{ord(c):04x}" if _inert(c) and c not in "\n\r\t " else c for c in text)


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = visible(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


PAST_TENSE = {"approve": "approved", "reject": "rejected", "timeout": "timed out"}
# What a failed attempt of each activity is called in the live view.
ATTEMPT_NAMES = {"call_llm": "model", "summarize_context": "summary", "run_tool": "tool"}


ARGUMENT_CHARS = 60  # an argument's length in a call's one-line summary


def _cached(usage: Usage) -> str:
    """What of the input the prompt cache served or took, in brackets ("" for none)."""
    parts = [
        f"{n:,} {what}"
        for n, what in ((usage.cache_read_tokens, "cached"), (usage.cache_write_tokens, "to cache"))
        if n
    ]
    return f" ({', '.join(parts)})" if parts else ""


def usage_text(usage: Usage) -> str:
    """A step's tokens on one line, only the counts that are not zero:
    "1,234 in (1,100 cached) · 56 out · 20 reasoning"."""
    parts = []
    if usage.input_tokens:
        parts.append(f"{usage.input_tokens:,} in{_cached(usage)}")
    if usage.output_tokens:
        parts.append(f"{usage.output_tokens:,} out")
    if usage.reasoning_tokens:
        parts.append(f"{usage.reasoning_tokens:,} reasoning")
    if parts and (cost := cost_text(usage)) is not None:
        parts.append(cost)
    return " · ".join(parts)


def cost_text(usage: Usage) -> str | None:
    """What the priced calls cost, "$0.0123", and "+ 1,200 unpriced tokens" when some calls
    were of a model without a price; None when none was priced (tokens say it all: a cost
    is never made up)."""
    if usage.cost_usd is None:
        return None
    text = f"${usage.cost_usd:,.4f}"
    if usage.unpriced_tokens:
        text += f" + {usage.unpriced_tokens:,} unpriced tokens"
    return text


def spent_text(usage: Usage) -> str:
    """What a task spent, as `ws list` shows it: its cost, else its tokens."""
    return cost_text(usage) or f"{usage.total:,} tokens"


def cache_hit_text(usage: Usage) -> str | None:
    """The share of input read from the prompt cache, as a percentage; None when the
    provider reported no caching at all (an endpoint without a cache is not a 0% hit)."""
    ratio = usage.cache_hit_ratio
    if ratio is None or not (usage.cache_read_tokens or usage.cache_write_tokens):
        return None
    return f"{ratio:.0%}"


def recalled_text(event: MemoryRecalled) -> str:
    """A memory_recalled event on one line."""
    if event.problem is not None:
        return f"memory {event.namespace} not loaded: {event.problem}"
    keys = ", ".join(item.key for item in event.items) or "none matched"
    return f"memory {event.namespace} for {event.query!r}: {keys}"


def switch_text(event: ModelSwitched) -> str:
    """A model_switched event on one line."""
    text = f"model {event.from_model} failed ({event.reason}): going on with {event.to_model}"
    if event.reasoning_dropped:
        items = "item" if event.reasoning_dropped == 1 else "items"
        text += f"; {event.reasoning_dropped} reasoning {items} could not carry over"
    return text


def quota_wait_text(quota: str, limit: str | None, expected_seconds: float | None) -> str:
    """What a call waits for, e.g. "for its turn under the quota of openai (requests per
    minute), about 12 s"."""
    text = f"for its turn under the quota of {quota}"
    if limit == "paused":
        text += " (paused by the provider)"
    elif limit is not None:
        text += f" ({limit.replace('_', ' ')})"
    if expected_seconds is not None:
        text += f", about {max(1, round(expected_seconds))} s"
    return text


def quota_line(event: WaitingQuota | QuotaGranted) -> tuple[str, str]:
    """The live view's line of a model call's wait under a quota, and its colour."""
    if isinstance(event, WaitingQuota):
        text = quota_wait_text(event.quota, event.limit, event.expected_seconds)
        return f"… step {event.step} waits {text}", "33"
    return f"  the call has its turn under {event.quota} after {event.waited_seconds:.1f} s", "2"


def model_in_use(state: AgentState, first_events: Sequence[AgentEvent]) -> str | None:
    """The model the task's steps call: the one a fallback took over with (the state's, from
    model_switched), else the task's own, named by its task_started among `first_events`."""
    if state.model is not None:
        return state.model
    started = next((e for e in first_events if isinstance(e, TaskStarted)), None)
    return started.task.model.name if started is not None else None


def format_call(tool: str, arguments: dict[str, Any] | None) -> str:
    """The call on one line, each argument shortened to ARGUMENT_CHARS (see `call_lines`)."""
    args = ", ".join(f"{k}={_short(v, ARGUMENT_CHARS)}" for k, v in (arguments or {}).items())
    return f"{visible(tool)}({args})"


def _summary_is_whole(arguments: dict[str, Any]) -> bool:
    """Whether the one-line summary shows every argument as it is (nothing cut, no newline
    or escape standing in for a character)."""
    for value in arguments.values():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) > ARGUMENT_CHARS or _short(text, ARGUMENT_CHARS) != text:
            return False
    return True


def call_lines(tool: str, arguments: dict[str, Any] | None, indent: str = "  ") -> list[str]:
    """A call to decide on: its one-line summary, then, when the summary cut or escaped
    anything, every argument in full (as JSON, escapes visible), so a person sees all of
    what would run before deciding."""
    lines = [format_call(tool, arguments)]
    if arguments and not _summary_is_whole(arguments):
        whole = json.dumps(arguments, ensure_ascii=False, indent=2)
        lines.append(f"{indent}in full:")
        lines += [indent + "  " + visible(line) for line in whole.splitlines()]
    return lines


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
    return "  " * len(path) + " > ".join(visible(p) for p in path) + " │ " if path else ""


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

    def _line(self, text: str, code: str | None = None) -> None:
        """One line of the view: everything in it from the task made `visible` (a newline in
        a task's text goes on indented), then painted with `code`."""
        self._end_tokens()
        prefix = self._paint(self._track.prefix, "2") if self._track.prefix else ""
        body = visible(text, indent="    ")
        print(prefix + (self._paint(body, code) if code else body), file=self.out, flush=True)

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
                self._tokens(key, track, data)
            case LlmAttemptStarted():
                self._attempt_started(track, data)
            case StreamGap():
                self._line(f"… offsets {data.start}-{data.end - 1} were lost", "31")
            case TaskStarted():
                track.max_attempts = data.task.model.max_attempts
                track.model_step = 1
                self._line(f"▶ {data.task_id}: {_short(data.task.task, 200)}", "1")
                self._line(f"  model: {data.task.model.name}", "2")
            case MemoryRecalled():
                self._line(f"  ⟲ {recalled_text(data)}", "33" if data.problem else "2")
            case Thought():
                track.model_step = data.step + 1
                if self._streaming != (key, data.step, data.attempt) and data.content:
                    self._line(f"[step {data.step}] {data.content}")
                self._end_tokens()
                if spent := usage_text(data.usage):
                    self._line(f"  tokens {spent}", "2")
            case ModelSwitched():
                self._line(f"⇄ {switch_text(data)}", "33")
            case Action():
                self._line(f"  → {format_call(data.tool, data.arguments)}", "36")
            case AgentStarted():
                self._line(f"  ⤷ sub-agent {data.agent}: {data.child_id}", "36")
            case Observation():
                code = "31" if data.is_error else "32"
                self._line(f"  ← {_short(data.output, 300)}", code)
            case ApprovalRequested() | QuestionAsked() | QuestionAnswered() | ApprovalResolved():
                self._person_request(data)
            case Resumed():
                self._line(
                    f"↺ resumed after: {data.failure} (max_steps {data.max_steps}, "
                    f"token_budget {data.token_budget})",
                    "1;33",
                )
            case Interrupted():
                void = any(
                    step == data.interrupted_step and attempt <= data.attempt
                    for step, attempt in track.text_shown
                )
                track.interrupted[data.interrupted_step] = data.attempt
                note = " (the text above is void)" if void else ""
                self._line(f"✂ step {data.interrupted_step}: interrupted by a message{note}", "33")
            case UserMessage():
                who = data.sender or "user"
                self._line(f"▶ {who}: {_short(data.content, 200)}", "1")
            case ErrorEvent():
                self._line(f"! {data.kind}: {data.message}", "33")
            case WaitingWorker():
                self._line(f"… waiting for a worker that offers {', '.join(data.missing)}", "33")
            case WaitingQuota() | QuotaGranted():
                self._line(*quota_line(data))
            case WorkerFound():
                self._line(
                    f"  a worker that offers it took the step: {data.worker or 'another'}", "2"
                )
            case Done():
                self._line(f"✔ done after {data.step} step(s): {data.result}", "1;32")
            case Failed():
                self._line(f"✘ failed ({data.kind}): {data.reason}", "1;31")
            case Cancelled():
                self._line(f"✘ cancelled: {data.reason}", "1;31")

    def _tokens(self, key: str | None, track: _Track, data: TokenDelta) -> None:
        streaming = (key, data.step, data.attempt)
        track.model_step = data.step
        track.text_shown.add((data.step, data.attempt))
        if self._streaming != streaming:
            self._end_tokens()
            if track.prefix:
                self.out.write(self._paint(track.prefix, "2"))
            self.out.write(self._paint(f"[step {data.step}] ", "2"))
            self._streaming = streaming
        self.out.write(visible(data.text, indent=""))
        self.out.flush()

    def _attempt_started(self, track: _Track, data: LlmAttemptStarted) -> None:
        track.model_step = data.step
        if data.attempt > track.interrupted.get(data.step, data.attempt):
            return  # the step starts again after an interrupt, which said so
        void = any(
            step == data.step and attempt < data.attempt for step, attempt in track.text_shown
        )
        if not void and (data.step, data.attempt - 1) in track.failures_shown:
            return  # the failure's own line said a next try comes
        note = " (the text above is void)" if void else ""
        self._line(f"↻ step {data.step}: {self._attempt(data.attempt)}{note}", "33")

    def _person_request(
        self, data: ApprovalRequested | QuestionAsked | QuestionAnswered | ApprovalResolved
    ) -> None:
        """A request put to a person, and how it was answered."""
        match data:
            case ApprovalRequested():
                summary, *whole = call_lines(data.tool, data.arguments)
                asked = f"⏸ approval needed [{data.request_id}]: {summary} ({data.reason})"
                self._line(asked, "1;33")
                for line in whole:  # what was cut above: all of it before anyone decides
                    self._line(line, "33")
            case QuestionAsked():
                choices = f" [{' / '.join(data.choices)}]" if data.choices else ""
                self._line(
                    f"? question [{data.request_id}]: {_short(data.question, 300)}{choices}", "1;35"
                )
            case QuestionAnswered():
                if data.timed_out:
                    self._line(f"  nobody answered [{data.request_id}] in time", "31")
                else:
                    who = f"{data.answerer} answered" if data.answerer else "answered"
                    self._line(f"  {who} [{data.request_id}]: {_short(data.answer)}", "32")
            case ApprovalResolved():
                who = f" by {data.approver}" if data.approver else ""
                note = f": {data.message}" if data.message else ""
                code = "32" if data.decision == "approve" else "31"
                decided = PAST_TENSE.get(data.decision, data.decision)
                self._line(f"  {decided}{who} [{data.request_id}]{note}", code)

    def _key(self, item: StreamItem) -> str | None:
        return item.task_id if isinstance(item, TreeItem) and item.path else None

    def _attempt(self, attempt: int) -> str:
        most = self._track.max_attempts
        of = f" of {most}" if most else ""
        return f"attempt {attempt}{of}"

    def attempt_failed(self, failure: AttemptFailure) -> bool:
        """One line for a failed attempt the hosted worker ran (see waystation.worker.log), in
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
        self._line(f"✗ {where}{what} {failure.describe()}", "33")
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


_CONTINUED = " " * 10  # where a value of `ws status` goes on


def _tokens_line(usage: Usage) -> str:
    """The task's tokens: "tokens    12,000 in (9,000 cached) / 300 out (40 reasoning) ·
    cache hit 75%", the parts in brackets and the ratio only when not zero."""
    line = f"tokens    {usage.input_tokens:,} in{_cached(usage)}"
    line += f" / {usage.output_tokens:,} out"
    if usage.reasoning_tokens:
        line += f" ({usage.reasoning_tokens:,} reasoning)"
    if (hit := cache_hit_text(usage)) is not None:
        line += f" · cache hit {hit}"
    return line


def render_state(
    state: AgentState, task_id: str, tree: TaskTree | None = None, model: str | None = None
) -> str:
    """`ws status`: `model` is the one the current turn calls (see `model_in_use`)."""
    lines = [
        f"task      {task_id}",
        f"status    {state.status}",
        f"step      {state.step}" + (f" (turn {state.turn})" if state.turn else ""),
        _tokens_line(state.usage),
    ]
    if (cost := cost_text(state.usage)) is not None:
        lines.append(f"cost      {cost}")
    if model is not None:
        lines.insert(2, f"model     {model}")
    if state.output is not None:
        first, *rest = _data(state.output).splitlines() or [""]
        lines += ["output    " + first, *(_CONTINUED + line for line in rest)]
    elif state.result is not None:
        lines.append(f"result    {state.result}")
    if state.failure is not None:
        lines.append(f"failure   {state.failure}")
    if state.status == "waiting_worker":
        lines.append(f"waiting   for a worker that offers {', '.join(state.missing)}")
    if (wait := state.quota_wait) is not None:
        lines.append(f"waiting   {quota_wait_text(wait.quota, wait.limit, wait.expected_seconds)}")
    for question in state.pending_questions.values():
        choices = f" [{' / '.join(question.choices)}]" if question.choices else ""
        lines.append(f"question  [{question.request_id}] {question.question}{choices}")
        lines.append(f"          answer: {command('answer', task_id, question.request_id)} '...'")
    for pending in state.pending_approvals.values():
        summary, *whole = call_lines(pending.tool, pending.arguments, indent=_CONTINUED)
        lines.append(f"pending   [{pending.request_id}] {summary} — {pending.reason}")
        lines += whole
        lines.append(
            f"          approve: {command('approve', task_id, pending.request_id)}"
            f"   reject: ... --reject --message 'why'"
        )
    if tree is not None:
        lines.extend(render_tree(tree))
    # Every line made visible at once: a newline in a task's text goes on indented.
    return "\n".join(visible(line, indent=_CONTINUED) for line in lines)
