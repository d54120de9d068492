"""A value that fits a JSON schema, made up the same way every time: what TestModel passes as
a tool's arguments (or gives as a typed answer). Types, `enum` and `const`, minimum and
maximum (exclusive too) and `multipleOf`, string lengths, formats and simple patterns, item
counts, every property of an object (required or not), `$ref`, `anyOf`, `oneOf` and
`allOf`. The result is checked against the schema by the caller (`fitting_value`)."""

from __future__ import annotations

import math
import re
from typing import Any

from jsonschema.validators import validator_for

# Strings for the common formats: each valid for its format.
_FORMATS = {
    "date": "2024-01-01",
    "date-time": "2024-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "duration": "P1D",
    "email": "a@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
# Tried in turn against a `pattern`: letters, digits, then mixed.
_PATTERN_CANDIDATES = ("a", "0", "A", "a0", "aa", "00", "AA", "a-0", "a_0", "0.0", "a a")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class UnfittableSchemaError(ValueError):
    """No value this module makes fits the schema (the message says where it fails)."""


def fitting_value(schema: dict[str, Any]) -> Any:
    """A value that fits `schema`, or UnfittableSchemaError with the first problem."""
    value = value_for(schema, schema)
    validator = validator_for(schema)(schema)
    problem = next(iter(validator.iter_errors(value)), None)
    if problem is not None:
        where = "/".join(str(p) for p in problem.absolute_path) or "the value"
        raise UnfittableSchemaError(f"{where}: {problem.message}")
    return value


def value_for(schema: dict[str, Any] | bool, root: dict[str, Any], seed: int = 0) -> Any:
    """A value for `schema` (`root` resolves its `$ref`s); `seed` varies it (the items of
    an array whose items must differ)."""
    if isinstance(schema, bool):
        return "a"
    if "$ref" in schema:
        return value_for(_resolve(schema["$ref"], root), root, seed)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        options = schema["enum"]
        return options[seed % len(options)]
    if "allOf" in schema:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            resolved = _resolve(part["$ref"], root) if "$ref" in part else part
            merged = _merge(merged, resolved)
        return value_for(merged, root, seed)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return value_for(options[0], root, seed)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = _implied_type(schema)
    make = _MAKERS.get(kind)
    return make(schema, root, seed) if make is not None else "a"


def _resolve(reference: str, root: dict[str, Any]) -> dict[str, Any]:
    target: Any = root
    for part in reference.removeprefix("#/").split("/"):
        target = target[part.replace("~1", "/").replace("~0", "~")]
    return dict(target)


def _merge(into: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    merged = {**into, **part}
    if "properties" in into and "properties" in part:
        merged["properties"] = {**into["properties"], **part["properties"]}
    if "required" in into and "required" in part:
        merged["required"] = [*into["required"], *part["required"]]
    return merged


def _implied_type(schema: dict[str, Any]) -> str:
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"


def _object(schema: dict[str, Any], root: dict[str, Any], seed: int) -> dict[str, Any]:
    properties = schema.get("properties", {})
    return {name: value_for(sub, root, seed) for name, sub in properties.items()}


def _array(schema: dict[str, Any], root: dict[str, Any], seed: int) -> list[Any]:
    prefix = schema.get("prefixItems", [])
    count = max(schema.get("minItems", 1), len(prefix))
    if "maxItems" in schema:
        count = min(count, schema["maxItems"])
    items = schema.get("items", {})
    values = []
    for index in range(count):
        sub = prefix[index] if index < len(prefix) else items
        values.append(value_for(sub, root, seed + index))
    return values


def _string(schema: dict[str, Any], root: dict[str, Any], seed: int) -> str:
    if schema.get("format") in _FORMATS:
        return _FORMATS[str(schema["format"])]
    shortest = int(schema.get("minLength", 0))
    longest = int(schema.get("maxLength", max(shortest, 1)))
    length = min(max(shortest, 1), longest)
    plain = _LETTERS[seed % len(_LETTERS)] * length
    if "pattern" not in schema:
        return plain
    pattern = re.compile(schema["pattern"])
    candidates = [plain, "0" * length, "A" * length, *_PATTERN_CANDIDATES]
    fits = (c for c in candidates if shortest <= len(c) <= longest and pattern.search(c))
    return next(fits, plain)


def _bounds(schema: dict[str, Any], step: float) -> tuple[float | None, float | None]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"] + step
    if "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"] - step
    return low, high


def _integer(schema: dict[str, Any], root: dict[str, Any], seed: int) -> int:
    low, high = _bounds(schema, 1)
    value = _within(
        None if low is None else math.ceil(low), None if high is None else math.floor(high), seed
    )
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step) * step
    return int(value)


def _number(schema: dict[str, Any], root: dict[str, Any], seed: int) -> float:
    exclusive_low = "exclusiveMinimum" in schema
    exclusive_high = "exclusiveMaximum" in schema
    low, high = (
        schema.get("exclusiveMinimum", schema.get("minimum")),
        schema.get("exclusiveMaximum", schema.get("maximum")),
    )
    if low is not None and high is not None and (exclusive_low or exclusive_high):
        value = (low + high) / 2
    else:
        value = _within(
            None if low is None else low + (1 if exclusive_low else 0),
            None if high is None else high - (1 if exclusive_high else 0),
            seed,
        )
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step) * step
    return float(value)


def _within(low: float | None, high: float | None, seed: int) -> float:
    """The lowest allowed value (from 0 when unbounded below), moved up by `seed` where
    the range allows."""
    start = low if low is not None else min(0, high) if high is not None else 0
    value = start + seed
    return value if high is None or value <= high else start


_MAKERS: dict[str, Any] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _integer,
    "number": _number,
    "boolean": lambda schema, root, seed: seed % 2 == 0,
    "null": lambda schema, root, seed: None,
}
