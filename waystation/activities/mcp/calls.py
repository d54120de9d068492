"""Arguments against a tool's JSON schema, checked before anything is sent."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
from jsonschema.protocols import Validator

from waystation.workflows.tool_catalog import McpToolSpec

MAX_PROBLEMS = 5
VALIDATORS_KEPT = 1_024


@functools.lru_cache(maxsize=VALIDATORS_KEPT)
def _validator(schema_json: str) -> Validator | None:
    """A validator for the schema, or None when the schema itself is broken.

    Kept per schema: checking a schema against its metaschema costs milliseconds, more
    than the call itself to a local server.
    """
    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return validator_class(schema)


def argument_problem(spec: McpToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's input schema, or None when they do."""
    validator = _validator(json.dumps(spec.input_schema, sort_keys=True))
    if validator is None:
        return None  # the server's schema is broken: let the server judge the arguments
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    if not errors:
        return None
    described = []
    for error in errors[:MAX_PROBLEMS]:
        where = ".".join(str(p) for p in error.path) or "arguments"
        described.append(f"{where}: {error.message}")
    return f"invalid arguments for {spec.name}: " + "; ".join(described)
