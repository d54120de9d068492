"""Checking a model's final answer against a task's output schema (workflows/outputs.py):
the `final_answer` call's arguments, or a native structured answer's text."""

from __future__ import annotations

import json
from typing import Any

from jsonschema.validators import validator_for

from waystation.activities import bounded_json
from waystation.workflows.models import FINAL_ANSWER_TOOL, ToolCall
from waystation.workflows.outputs import ERRORS_SHOWN, parameters, unwrap


def problems(value: Any, schema: dict[str, Any]) -> str | None:
    """Why `value` does not fit `schema` (the first errors, each with where), or None."""
    validator = validator_for(schema)(schema)
    found = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if not found:
        return None
    lines = []
    for error in found[:ERRORS_SHOWN]:
        where = "/".join(str(p) for p in error.absolute_path) or "the answer"
        lines.append(f"{where}: {error.message}")
    more = f" (and {len(found) - ERRORS_SHOWN} more)" if len(found) > ERRORS_SHOWN else ""
    return "; ".join(lines) + more


def final_answer_call(
    call_id: str, raw_arguments: str, schema: dict[str, Any], alone: bool
) -> ToolCall:
    """The `final_answer` call as the workflow takes it: runnable when its arguments fit
    the schema, else with the validation errors as its problem (the model's observation)."""
    call = ToolCall(
        call_id=call_id, tool=FINAL_ANSWER_TOOL, raw_arguments=raw_arguments, retry_safe=True
    )
    try:
        arguments = bounded_json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as err:
        call.problem = f"the arguments of {FINAL_ANSWER_TOOL} are not JSON ({err.msg})"
        return call
    except bounded_json.TooDeepError as err:
        call.problem = f"the arguments of {FINAL_ANSWER_TOOL} are {err}"
        return call
    if not isinstance(arguments, dict):
        call.problem = f"the arguments of {FINAL_ANSWER_TOOL} must be a JSON object"
        return call
    if not alone:
        call.problem = (
            f"call {FINAL_ANSWER_TOOL} on its own, once the other calls have given you what "
            "you need: it ends the task"
        )
        return call
    if (why := problems(arguments, parameters(schema))) is not None:
        call.problem = (
            f"the final answer does not fit the required schema: {why}. Call "
            f"{FINAL_ANSWER_TOOL} again with arguments that fit its parameters"
        )
        return call
    call.arguments = arguments
    return call


def native_answer(content: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(the answer, None), or (None, why not) for a native structured answer's text."""
    text = content.strip()
    if text.startswith("```"):  # a model that fences its JSON anyway
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = bounded_json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"the answer is not JSON ({err.msg} at {err.pos})"
    except bounded_json.TooDeepError as err:
        return None, f"the answer is {err}"
    if (why := problems(value, parameters(schema))) is not None:
        return None, why
    return unwrap(schema, value), None
