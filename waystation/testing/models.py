"""Model doubles for a user's tests: they answer the worker's real `openai` client over the
OpenAI protocol (served by waystation.testing.fake_openai), so a worker in the test's
process and a worker in another process take the same path as with a real model.

- `TestModel`: on a turn's first request, calls each tool the task offers (or those named)
  once, with arguments made up to fit each tool's JSON schema; then answers with a text, or
  with a typed output when the task asks for one.
- `ScriptedModel`: the replies of a list, one per request: text, tool calls, HTTP errors,
  delays.
- `ServedModel`: a model name on a model server (FakeOpenAI) whose double can be swapped:
  the pytest fixture `waystation_model`.

A double is a function of the request's body to a Reply, and keeps the bodies it was sent
(`requests`).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from jsonschema.validators import validator_for
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from waystation.testing import fake_openai
from waystation.testing.fake_openai import FakeOpenAI, Reply
from waystation.testing.schema_values import UnfittableSchemaError, fitting_value

FINAL_ANSWER_TOOL = "final_answer"  # the tool a typed answer is given through (outputs.py)
WRAPPED = "value"  # the property a schema that is not an object is wrapped in (outputs.py)
# A model double's own mistake (a tool it was told to call is not offered): an HTTP status
# the worker does not retry, so the task fails at once with the sentence.
DOUBLE_ERROR_STATUS = 400


class ModelDouble(abc.ABC):
    """What the doubles share: the bodies they were sent, in order."""

    __test__ = False  # a `Test...` class pytest must not collect

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            return self.reply(body)

    @abc.abstractmethod
    def reply(self, body: dict[str, Any]) -> Reply:
        """The reply to a request's body (called with the double's lock held)."""


class TestModel(ModelDouble):
    """Calls each of the task's tools once (or only `call_tools`, in that order), with
    arguments that fit their schemas, then answers `text` (default: the calls' results as
    JSON, by tool). A task with an output type gets `output` (a value, a pydantic model, or
    by default one made up to fit the schema)."""

    def __init__(
        self,
        *,
        call_tools: Iterable[str] | None = None,
        text: str | None = None,
        output: Any = None,
    ) -> None:
        super().__init__()
        self.call_tools = list(call_tools) if call_tools is not None else None
        self.text = text
        self.output = output

    def reply(self, body: dict[str, Any]) -> Reply:
        offered = {
            t["function"]["name"]: t["function"].get("parameters", {})
            for t in body.get("tools") or []
        }
        answer_schema = offered.pop(FINAL_ANSWER_TOOL, None)
        messages = body.get("messages", [])
        if not _called_this_turn(messages):
            wanted = self.call_tools if self.call_tools is not None else list(offered)
            missing = [name for name in wanted if name not in offered]
            if missing:
                return fake_openai.error(
                    DOUBLE_ERROR_STATUS,
                    f"TestModel: {', '.join(missing)} not offered to this task (offered: "
                    f"{', '.join(offered) or 'none'})",
                )
            if wanted:
                try:
                    calls = [(name, fitting_value(offered[name])) for name in wanted]
                except UnfittableSchemaError as err:
                    return fake_openai.error(DOUBLE_ERROR_STATUS, f"TestModel: {err}")
                return fake_openai.tools(*calls)
        native = (body.get("response_format") or {}).get("json_schema", {}).get("schema")
        if answer_schema is not None:
            return fake_openai.tools((FINAL_ANSWER_TOOL, self._answer(answer_schema)))
        if native is not None:
            return fake_openai.text(json.dumps(self._answer(native)))
        return fake_openai.text(self.text if self.text is not None else _results(messages))

    def _answer(self, parameters: dict[str, Any]) -> Any:
        """The typed answer as the task's parameters take it (wrapped if they wrap it)."""
        if self.output is None:
            return fitting_value(parameters)
        output = self.output
        given = to_jsonable_python(
            output.model_dump(mode="json") if isinstance(output, BaseModel) else output
        )
        fits = not any(validator_for(parameters)(parameters).iter_errors(given))
        return given if fits else {WRAPPED: given}


def _this_turn(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return messages[last_user + 1 :]


def _called_this_turn(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "assistant" and m.get("tool_calls") for m in _this_turn(messages))


def _results(messages: list[dict[str, Any]]) -> str:
    """The turn's tool results as JSON by tool name, or that none was called."""
    names = {
        call["id"]: call["function"]["name"]
        for m in _this_turn(messages)
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = {
        names.get(m.get("tool_call_id", ""), "?"): m.get("content")
        for m in _this_turn(messages)
        if m.get("role") == "tool"
    }
    return json.dumps(results) if results else "success (no tool calls)"


class ScriptedModel(ModelDouble):
    """Answers each request with the next of `replies`: a text (a str, or `text(...)`),
    tool calls (`call(...)`, `calls(...)`), an HTTP error (`error(...)`), any of them late
    (`delay(...)`). A request after the last reply fails the task with a sentence."""

    def __init__(self, replies: Iterable[str | Reply]) -> None:
        super().__init__()
        self.replies = [fake_openai.text(r) if isinstance(r, str) else r for r in replies]

    def reply(self, body: dict[str, Any]) -> Reply:
        index = len(self.requests) - 1
        if index >= len(self.replies):
            return fake_openai.error(
                DOUBLE_ERROR_STATUS,
                f"ScriptedModel: request {index + 1} came, but the script has "
                f"{len(self.replies)} replies",
            )
        return self.replies[index]


def text(content: str) -> Reply:
    """A reply that says `content`."""
    return fake_openai.text(content)


def call(
    tool: str, arguments: Mapping[str, Any] | str | None = None, *, content: str = ""
) -> Reply:
    """A reply that calls `tool` with `arguments` (a mapping, or raw text as a model may
    send), saying `content` with it."""
    return calls((tool, arguments or {}), content=content)


def calls(*tool_calls: tuple[str, Mapping[str, Any] | str], content: str = "") -> Reply:
    """A reply that calls several tools at once: `(tool, arguments)` each."""
    return fake_openai.tools(
        *((name, args if isinstance(args, str) else dict(args)) for name, args in tool_calls),
        content=content,
    )


def error(status: int, message: str = "", *, retry_after: float | None = None) -> Reply:
    """A reply that fails with HTTP `status` (a 429 or 5xx is retried by the worker, with
    `retry_after` seconds as the endpoint's Retry-After)."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return fake_openai.error(status, message or f"HTTP {status}", headers)


def delay(seconds: float, reply: str | Reply) -> Reply:
    """`reply`, sent `seconds` late (a slow model; past the task's model timeouts, the
    worker gives up on it and tries again)."""
    late = fake_openai.text(reply) if isinstance(reply, str) else reply
    return dataclasses.replace(late, delay_seconds=seconds)


DoubleT = TypeVar("DoubleT", bound=ModelDouble)


class ServedModel:
    """This test's model on the model server: `name` is what a task names; the double
    (`use`) answers its requests."""

    def __init__(self, server: FakeOpenAI) -> None:
        self.double: ModelDouble = TestModel()
        self.name = server.serve(self._answer, f"test-model-{uuid.uuid4().hex[:10]}")

    def use(self, double: DoubleT) -> DoubleT:
        """Answer from now on with `double` (returned, to keep a handle on it)."""
        self.double = double
        return double

    def _answer(self, body: dict[str, Any]) -> Reply:
        return self.double(body)
