"""Arguments against a tool's JSON schema, checked before anything is sent."""

from __future__ import annotations

from typing import Any

import jsonschema

from activities.mcp.catalog import McpToolSpec

MAX_PROBLEMS = 5


def argument_problem(spec: McpToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool's input schema, or None when they do."""
    try:
        validator_class = jsonschema.validators.validator_for(spec.input_schema)
        validator_class.check_schema(spec.input_schema)
    except jsonschema.SchemaError:
        return None  # the server's schema is broken: let the server judge the arguments
    errors = sorted(
        validator_class(spec.input_schema).iter_errors(arguments), key=lambda e: list(e.path)
    )
    if not errors:
        return None
    described = []
    for error in errors[:MAX_PROBLEMS]:
        where = ".".join(str(p) for p in error.path) or "arguments"
        described.append(f"{where}: {error.message}")
    return f"invalid arguments for {spec.name}: " + "; ".join(described)
