"""Tool calls a model wrote into its text instead of sending them as structured tool calls.

Small models, or a server whose chat template it cannot parse tool calls from, put the call
in the message: a bare JSON object (`{"name": "calculator", "arguments": {...}}`, sometimes
with doubled braces), a fenced ```json block, or Qwen/Hermes-style `<tool_call>` tags.
`recover_tool_calls` finds such calls for the tools the model was offered. Prose is left
alone: a JSON object inside a sentence or an inline code span is a mention, not a call, and
an object that names no offered tool, or carries keys a call does not have, is not a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from waystation.activities import bounded_json

RecoveredForm = Literal["tagged", "fenced", "bare"]


@dataclass(frozen=True)
class RecoveredToolCall:
    """One tool call found in a model's text."""

    name: str
    arguments: str
    """The call's arguments: a JSON object, as text."""
    form: RecoveredForm
    """How it was written: inside <tool_call> tags, in a fenced block, or as bare JSON."""


_NAME_KEYS = ("name", "tool", "tool_name", "function")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")
# Keys a call may carry besides its name and arguments (OpenAI and Llama shapes).
_INCIDENTAL_KEYS = frozenset({"type", "id"})

_TAGGED = re.compile(r"<(tool_call|function_call)>(.*?)(?:</\1>|\Z)", re.DOTALL)
_FENCED = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_FENCE_LANGUAGES = frozenset({"", "json", "tool_call", "tool_code", "tool", "function_call"})
# Reasoning is not acting: calls a model considers while thinking are not calls.
_THINKING = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
# What may stand before a bare call on its line: indentation, a label saying it is a call,
# and the extra opening braces of a doubled-brace object.
_BARE_PREFIX = re.compile(
    r"[ \t]*(?:(?:action|tool call|tool|function call|call|\[TOOL_CALLS\])[ \t]*:?[ \t]*)?"
    r"\{*[ \t]*",
    re.IGNORECASE,
)
# What may follow it on its line: the extra closing braces, a full stop.
_BARE_SUFFIX = re.compile(r"[ \t]*\}*[ \t]*[.;]?[ \t]*")

_CALL_START = re.compile(r'\{\s*"|\[\s*\{\s*"')


def recover_tool_calls(text: str, tool_names: Collection[str]) -> list[RecoveredToolCall]:
    """The tool calls written in `text` that name one of `tool_names`, in text order.

    Recognised: `<tool_call>…</tool_call>` (or `<function_call>`) tags holding one or more
    JSON calls; a fenced block (```json or plain) holding exactly a call or a list of calls;
    a call as bare JSON standing on its own line(s). A call is an object naming the tool
    under `name` (or `tool`, `tool_name`, `function`) with its arguments under `arguments`
    (or `parameters`, `args`, `input`) as a JSON object or a string holding one; the OpenAI
    shapes `{"type": "function", "function": {...}}` and `{"tool_calls": [...]}` count too.
    Doubled braces (`{{"name": ...}}`) are undone when nothing parses otherwise. A call
    written more than once (same tool, same arguments) is one call, where it first stands.
    """
    names = set(tool_names)
    if not any(name in text for name in names):
        return []
    found: list[tuple[int, RecoveredToolCall]] = []
    rest = _blank(text, _THINKING)
    for match in _TAGGED.finditer(rest):
        found += [(match.start(), c) for c in _calls_in_tag(match.group(2), names)]
    rest = _blank(rest, _TAGGED)
    for match in _FENCED.finditer(rest):
        if match.group(1).lower() in _FENCE_LANGUAGES:
            found += [(match.start(), c) for c in _calls_in_fence(match.group(2), names)]
    rest = _blank(rest, _FENCED)
    bare = list(_bare_calls(rest, names))
    if not bare and "{{" in rest:
        bare = list(_bare_calls(_undouble(rest), names))
    found += bare
    found.sort(key=lambda item: item[0])
    return _distinct([call for _, call in found])


def _distinct(calls: list[RecoveredToolCall]) -> list[RecoveredToolCall]:
    """The calls without repeats: a model that writes one call twice in a message (a fenced
    block, then the same JSON bare) means it once."""
    seen: set[tuple[str, str]] = set()
    distinct: list[RecoveredToolCall] = []
    for call in calls:
        key = (call.name, json.dumps(bounded_json.loads(call.arguments), sort_keys=True))
        if key not in seen:
            seen.add(key)
            distinct.append(call)
    return distinct


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    """`text` with the matches of `pattern` blanked out, keeping positions and lines."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _undouble(text: str) -> str:
    return text.replace("{{", "{").replace("}}", "}")


def _json_values(text: str) -> tuple[list[Any], bool]:
    """The JSON values written one after another in `text` (whitespace or commas between),
    and whether that is all the text holds."""
    values: list[Any] = []
    position = 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] == ","):
            position += 1
        if position == len(text):
            return values, True
        try:
            value, position = bounded_json.raw_decode(text, position)
        except ValueError:  # not JSON, or nested past any real call
            return values, False
        values.append(value)


def _calls_in_tag(content: str, names: set[str]) -> list[RecoveredToolCall]:
    """Calls inside explicit tags: the tags say a call is meant, so any JSON in them counts."""
    inner = content.strip()
    fenced = _FENCED.fullmatch(inner)
    if fenced is not None:
        inner = fenced.group(2)
    for candidate in (inner, _undouble(inner)):
        values, _ = _json_values(candidate)
        calls = [c for value in values for c in _interpret(value, names) or []]
        if calls:
            return [RecoveredToolCall(name, arguments, "tagged") for name, arguments in calls]
        if "{{" not in inner:
            break
    return []


def _calls_in_fence(content: str, names: set[str]) -> list[RecoveredToolCall]:
    """Calls in a fenced block: it must hold calls and nothing else."""
    for candidate in (content, _undouble(content)):
        values, whole = _json_values(candidate)
        if whole and values:
            interpreted = [_interpret(value, names) for value in values]
            if all(calls for calls in interpreted):
                return [
                    RecoveredToolCall(name, arguments, "fenced")
                    for calls in interpreted
                    for name, arguments in calls or []
                ]
        if "{{" not in content:
            break
    return []


def _bare_calls(text: str, names: set[str]) -> Iterator[tuple[int, RecoveredToolCall]]:
    """Calls written as JSON standing on their own line(s), outside tags and fences."""
    position = 0
    while (start := _next_json_start(text, position)) >= 0:
        try:
            value, end = bounded_json.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        position = end  # what is nested in a value is never a call of its own
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        if not _BARE_PREFIX.fullmatch(text, line_start, start):
            continue
        if not _BARE_SUFFIX.fullmatch(text, end, line_end):
            continue
        for name, arguments in _interpret(value, names) or []:
            yield start, RecoveredToolCall(name, arguments, "bare")


def _next_json_start(text: str, position: int) -> int:
    """Where the next object (or list of objects) may start: only where one could hold a
    call, so brackets in prose or code cost a regex step, not a parse each."""
    match = _CALL_START.search(text, position)
    return -1 if match is None else match.start()


def _interpret(value: Any, names: set[str]) -> list[tuple[str, str]] | None:
    """The calls `value` stands for, or None if it is not (only) calls."""
    if isinstance(value, list):
        calls = [_interpret(item, names) for item in value]
        if not value or not all(calls):
            return None
        return [call for found in calls for call in found or []]
    if not isinstance(value, dict):
        return None
    if set(value) == {"tool_calls"} and isinstance(value["tool_calls"], list):
        return _interpret(value["tool_calls"], names)
    if isinstance(value.get("function"), dict) and set(value) <= {"function"} | _INCIDENTAL_KEYS:
        return _interpret(value["function"], names)
    call = _single_call(value, names)
    return None if call is None else [call]


def _single_call(value: dict[str, Any], names: set[str]) -> tuple[str, str] | None:
    name_key = next((k for k in _NAME_KEYS if isinstance(value.get(k), str)), None)
    if name_key is None or value[name_key] not in names:
        return None
    argument_keys = [k for k in _ARGUMENT_KEYS if k in value]
    if len(argument_keys) > 1:
        return None
    others = set(value) - {name_key, *argument_keys} - _INCIDENTAL_KEYS
    if others:
        return None  # e.g. a call narrated with its "result": an account, not a request
    arguments = _arguments(value[argument_keys[0]]) if argument_keys else {}
    if arguments is None:
        return None
    return value[name_key], json.dumps(arguments, ensure_ascii=False)


def _arguments(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        for candidate in (raw, _undouble(raw)):
            try:
                parsed = bounded_json.loads(candidate)
            except ValueError:  # not JSON, or nested past any real call
                continue
            return parsed if isinstance(parsed, dict) else None
    return None
