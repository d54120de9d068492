"""The built-in offline model: deterministic, rule-based, and says so in every answer.

It exists so the whole flow (tool calls, approval, questions, sub-agents, streaming)
runs on a machine with no model endpoint. It reads the task for arithmetic, a file to
write, a command in backticks, a request to list files, a question for the person ("ask
me ...") or a task for a sub-agent ("have the math agent ..."); calls the matching tools;
then answers from their results. It is not a language model and never pretends to be one.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from waystation.activities.chat import ChatDelta
from waystation.vocabulary import AGENT_TOOL_PREFIX
from waystation.workflows.conversation import SUMMARY_PREFIX
from waystation.workflows.models import (
    ASK_PERSON_TOOL,
    FINAL_ANSWER_TOOL,
    ChatMessage,
    ModelSettings,
    Usage,
)

LABEL = "[offline model]"

_EXPRESSION = re.compile(r"[-(]*\d[\d.\s]*(?:[-+*/^%]\s*[-(\s]*\d[\d.\s]*\)*\s*)+")
_FILE = re.compile(
    r"\b(?:write|save|store|put|record)\b.*?\b(?:to|into|in|as)\s+(?:a\s+|the\s+)?(?:file\s+)?"
    r"[`'\"]?(?P<path>[\w./-]+\.\w+)",
    re.IGNORECASE,
)
_SHELL = re.compile(r"\brun\b[^`]*`(?P<command>[^`]+)`", re.IGNORECASE)
_LIST = re.compile(r"\blist\b.*\bfiles?\b", re.IGNORECASE)
# "Ask me which colour to use: red, green or blue." (the choices after a colon, if any)
_ASK = re.compile(r"\bask me\b\s*(?P<question>[^:.?!\n]+)(?::\s*(?P<choices>[^.?!\n]+))?", re.I)
# "Have the math agent work out 6 * 7." (the rest of the sentence is the sub-agent's task)
_DELEGATE = re.compile(
    r"\b(?:have|ask|let|get) the (?P<agent>[a-z0-9][a-z0-9_-]*) agent (?:to )?(?P<task>[^\n]+)",
    re.IGNORECASE,
)


@dataclass
class _Plan:
    expressions: list[str] = field(default_factory=list)
    file_path: str | None = None
    shell_command: str | None = None
    list_files: bool = False
    question: str | None = None
    choices: list[str] | None = None
    agent: str | None = None
    agent_task: str | None = None

    @property
    def empty(self) -> bool:
        return not (
            self.expressions
            or self.file_path
            or self.shell_command
            or self.list_files
            or self.question
            or self.agent
        )


def _plan(task: str) -> _Plan:
    plan = _Plan()
    for match in _EXPRESSION.finditer(task):
        expression = match.group(0).strip().rstrip(".")
        if sum(c.isdigit() for c in expression) and re.search(r"\d\s*[-+*/^%]", expression):
            plan.expressions.append(expression)
    if (m := _FILE.search(task)) is not None:
        plan.file_path = m.group("path")
    if (m := _SHELL.search(task)) is not None:
        plan.shell_command = m.group("command").strip()
    plan.list_files = bool(_LIST.search(task))
    if (m := _ASK.search(task)) is not None:
        question = m.group("question").strip()
        if question.lower().startswith("for "):  # "ask me for the account id"
            question = "what is " + question[4:]
        plan.question = question[:1].upper() + question[1:] + "?"
        if m.group("choices"):
            plan.choices = [c.strip() for c in re.split(r",|\bor\b", m.group("choices"))]
            plan.choices = [c for c in plan.choices if c] or None
    if (m := _DELEGATE.search(task)) is not None:
        plan.agent = m.group("agent").lower()
        text = m.group("task").strip()
        plan.agent_task = text[:1].upper() + text[1:]
    return plan


@dataclass
class _Outcome:
    tool: str
    arguments: dict[str, Any]
    output: str


def _outcomes(messages: list[ChatMessage]) -> list[_Outcome]:
    """Tool calls made since the task was given, each with what came back."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    outcomes: list[_Outcome] = []
    for message in messages:
        if message.role == "assistant":
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.arguments or "{}")
                except json.JSONDecodeError:
                    arguments = {}
                calls[call.id] = (call.name, arguments if isinstance(arguments, dict) else {})
        elif message.role == "tool" and message.tool_call_id in calls:
            name, arguments = calls[message.tool_call_id]
            outcomes.append(_Outcome(name, arguments, message.content or ""))
    return outcomes


def _answer_schema(
    tools: list[dict[str, Any]], response_format: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The parameters a typed answer must fit: the final_answer tool's, or the native
    response format's schema; None when the answer is plain text."""
    if response_format is not None:
        schema = response_format.get("json_schema", {}).get("schema")
        return schema if isinstance(schema, dict) else None
    for tool in tools:
        if tool["function"]["name"] == FINAL_ANSWER_TOOL:
            parameters = tool["function"].get("parameters")
            return parameters if isinstance(parameters, dict) else None
    return None


def _shaped(schema: dict[str, Any], answer: str) -> Any:
    """A value of `schema`'s shape built from the plain answer: text where a string goes,
    the answer's first number where a number goes (a stand-in's best, not understanding)."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        wanted = schema.get("required") or list(properties)
        return {name: _shaped(properties.get(name, {}), answer) for name in wanted}
    if kind == "array":
        return [_shaped(schema.get("items", {}), answer)]
    if kind in ("number", "integer"):
        found = re.findall(r"-?\d+(?:\.\d+)?", answer.removeprefix(LABEL))
        number = float(found[-1]) if found else 0.0
        return int(number) if kind == "integer" else number
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return answer.removeprefix(LABEL).strip()


def _summary(message: ChatMessage) -> bool:
    return (message.content or "").startswith(SUMMARY_PREFIX)


def _looks_failed(output: str) -> bool:
    lowered = output.lower()
    return any(w in lowered for w in ("rejected", "error", "refused", "failed", "invalid"))


class OfflineModel:
    """Deterministic stand-in for a chat model, with the same streaming interface."""

    async def stream(
        self,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]],
        model: ModelSettings,
        *,
        response_format: dict[str, Any] | None = None,
    ) -> AsyncIterator[ChatDelta]:
        offered = {t["function"]["name"] for t in tools}
        text, calls = self.respond(messages, offered)
        schema = _answer_schema(tools, response_format)
        if not calls and schema is not None:
            # A typed answer: the plain one, put into the schema's shape as a rule would.
            data = _shaped(schema, text)
            if response_format is not None:
                text = json.dumps(data)
            else:
                text, calls = (
                    f"{LABEL} Answering with {FINAL_ANSWER_TOOL}.",
                    [(FINAL_ANSWER_TOOL, data)],
                )
        step = sum(1 for m in messages if m.role == "assistant") + 1
        words = re.findall(r"\S+\s*", text)
        for word in words:
            yield ChatDelta(text=word, model=LABEL)
        for index, (name, arguments) in enumerate(calls):
            yield ChatDelta(
                tool_call_index=index,
                tool_call_id=f"call_{step}_{index}",
                tool_name=name,
                tool_arguments=json.dumps(arguments),
                model=LABEL,
            )
        prompt_chars = sum(len(m.content or "") for m in messages)
        usage = Usage(input_tokens=prompt_chars // 4 + 1, output_tokens=len(words) + len(calls))
        yield ChatDelta(finish_reason="tool_calls" if calls else "stop", usage=usage, model=LABEL)

    def respond(
        self, messages: list[ChatMessage], offered: set[str]
    ) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        # The latest message a person wrote is the task at hand (a follow-up's, a steer's):
        # what came before it was answered already.
        latest = max(
            (i for i, m in enumerate(messages) if m.role == "user" and not _summary(m)),
            default=0,
        )
        task = messages[latest].content or "" if messages else ""
        plan = _plan(task)
        done = _outcomes(messages[latest:])
        used = {o.tool for o in done}

        delegate = f"{AGENT_TOOL_PREFIX}{plan.agent}"
        if plan.agent and delegate in offered:
            # The sub-agent does the whole of it; its answer is the answer.
            if delegate not in used:
                return (
                    f"{LABEL} Asking the {plan.agent} agent.",
                    [(delegate, {"task": plan.agent_task})],
                )
            return f"{LABEL} {self._answer(done)}", []
        if plan.question and ASK_PERSON_TOOL in offered and ASK_PERSON_TOOL not in used:
            arguments: dict[str, Any] = {"question": plan.question}
            if plan.choices:
                arguments["choices"] = plan.choices
            return f"{LABEL} Asking you.", [(ASK_PERSON_TOOL, arguments)]
        if plan.expressions and "calculator" in offered and "calculator" not in used:
            return (
                f"{LABEL} Computing {len(plan.expressions)} expression(s) with the calculator.",
                [("calculator", {"expression": e}) for e in plan.expressions],
            )
        if plan.list_files and "list_files" in offered and "list_files" not in used:
            return f"{LABEL} Listing the workspace.", [("list_files", {"path": "."})]
        if plan.shell_command and "run_shell" in offered and "run_shell" not in used:
            return (
                f"{LABEL} Running `{plan.shell_command}`.",
                [("run_shell", {"command": plan.shell_command})],
            )
        if plan.file_path and "write_file" in offered and "write_file" not in used:
            content = self._report(done) or task
            return (
                f"{LABEL} Writing the result to {plan.file_path}.",
                [("write_file", {"path": plan.file_path, "content": content + "\n"})],
            )
        if plan.empty:
            return (
                f"{LABEL} I am waystation's built-in offline model, not a language model. "
                "I can do arithmetic with the calculator, list files, run a command given in "
                'backticks, write results to a file, ask you ("ask me which ...") and hand '
                'a task to a sub-agent ("have the math agent ..."). Set OPENAI_API_KEY (and '
                "OPENAI_BASE_URL for other endpoints) to use a real model.",
                [],
            )
        if plan.question and not done and ASK_PERSON_TOOL not in offered:
            return (
                f"{LABEL} I would ask you: {plan.question} But this task may not ask "
                f"({ASK_PERSON_TOOL} is not among its tools).",
                [],
            )
        return f"{LABEL} {self._answer(done)}", []

    @staticmethod
    def _report(done: list[_Outcome]) -> str:
        lines = [
            f"{o.arguments.get('expression', '?')} = {o.output}"
            for o in done
            if o.tool == "calculator" and not _looks_failed(o.output)
        ]
        return "\n".join(lines)

    def _answer(self, done: list[_Outcome]) -> str:
        parts: list[str] = []
        for o in done:
            if _looks_failed(o.output):
                parts.append(f"The {o.tool} call did not go through: {o.output.strip()}")
            elif o.tool == "calculator":
                parts.append(f"{o.arguments.get('expression', '?')} = {o.output}")
            elif o.tool == "write_file":
                parts.append(o.output[:1].upper() + o.output[1:])
            elif o.tool == "run_shell":
                parts.append(f"`{o.arguments.get('command', '')}` gave: {o.output.strip()[:400]}")
            elif o.tool == "list_files":
                parts.append(f"The workspace holds: {', '.join(o.output.splitlines()[:20])}")
            elif o.tool == ASK_PERSON_TOOL:
                parts.append(o.output.strip())
            elif o.tool.startswith(AGENT_TOOL_PREFIX):
                name = o.tool.removeprefix(AGENT_TOOL_PREFIX)
                parts.append(f"The {name} agent answered: {o.output.removeprefix(LABEL).strip()}")
        return ". ".join(p.rstrip(".") for p in parts) + "." if parts else "Nothing to report."

    def summarize(self, messages: list[ChatMessage]) -> str:
        """A deterministic digest: each message's role and opening words."""
        lines = []
        for m in messages:
            text = " ".join((m.content or "").split())
            if m.tool_calls:
                text += " calls " + ", ".join(f"{c.name}({c.arguments[:60]})" for c in m.tool_calls)
            lines.append(f"{m.role}: {text[:80]}")
        return f"{LABEL} {len(messages)} earlier messages: " + " | ".join(lines)
