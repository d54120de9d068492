"""Typed results: a task with an `output_schema` answers with data that fits it.

Two ways to ask the model, chosen by `ModelSettings.structured_output`:
- `tool` (any tool-calling endpoint): the model is offered a `final_answer` tool whose
  parameters are the schema, and answers by calling it. The workflow, not a worker,
  handles the call: valid arguments are the answer; invalid ones come back to the model as
  the call's observation, with the validation errors, and it tries again.
- `native`: the endpoint's own structured output (`response_format` with the JSON schema);
  the answer is the message's text, which must parse and validate.
`auto` is resolved when a task is created (settings/model_facts.py): `native` for OpenAI's
models known to honour it on an OpenAI protocol, else `tool`.

A schema that is not an object (the tool's parameters must be) is wrapped as the one
property `value` of an object, and unwrapped in the answer. Pure code: the validation
itself runs in the LLM activity, where the model's answer arrives.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from waystation.workflows.models import FINAL_ANSWER_TOOL, ModelSettings

WRAPPED = "value"
# The models `auto` took `native` for before the client resolved it (settings/model_facts.py)
# for a task still saying `auto`: never change, recorded tasks replay with them.
LEGACY_NATIVE_STRUCTURED_OUTPUT = ("gpt-4o", "gpt-4.1", "gpt-5", "o3", "o4-mini", "o1")
ERRORS_SHOWN = 10


def wraps(schema: dict[str, Any]) -> bool:
    """Whether the schema needs an object around it to be a tool's parameters."""
    return schema.get("type") != "object"


def parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as a tool's (or a response format's) parameters: always an object."""
    if not wraps(schema):
        return schema
    return {"type": "object", "properties": {WRAPPED: schema}, "required": [WRAPPED]}


def unwrap(schema: dict[str, Any], value: dict[str, Any]) -> Any:
    """The answer itself, from what validated against `parameters(schema)`."""
    return value[WRAPPED] if wraps(schema) else value


def mode(model: ModelSettings) -> Literal["tool", "native"]:
    """How this model is asked for structured output: as the task says (resolved when it
    was created), or for a task created before that, as `auto` was then."""
    if model.structured_output != "auto":
        return model.structured_output
    name = model.name.lower().rsplit("/", 1)[-1]
    return "native" if name.startswith(LEGACY_NATIVE_STRUCTURED_OUTPUT) else "tool"


def final_answer_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI `tools` entry of the final answer."""
    return {
        "type": "function",
        "function": {
            "name": FINAL_ANSWER_TOOL,
            "description": "Give your final answer as data that fits these parameters. Call it "
            "alone, once you have everything, instead of answering in text.",
            "parameters": parameters(schema),
        },
    }


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The `response_format` of native structured output."""
    return {
        "type": "json_schema",
        "json_schema": {"name": "final_answer", "schema": parameters(schema), "strict": False},
    }


def as_text(output: Any) -> str:
    """The answer's text form: its JSON, as the `done` event's `result`."""
    return json.dumps(output, ensure_ascii=False, indent=2)


def rejection(problem: str, way: Literal["tool", "native"]) -> str:
    """What the model is told when its final answer does not fit the schema."""
    how = (
        f"Call {FINAL_ANSWER_TOOL} with arguments that fit its parameters"
        if way == "tool"
        else "Answer with JSON only, fitting the schema you were given"
    )
    return f"Your final answer does not fit the required schema: {problem}. {how}."
