"""How deep JSON from outside may nest before it enters a task.

Pydantic, the payload converter and Python's own parser recurse once per level: a value
nested a few hundred levels deep fails to serialize (inside an event, a state, a carry),
and one nested 100,000 deep fails to parse at all. Tool arguments, answers and edited
arguments are refused past this depth, with a sentence, long before either limit.
"""

from __future__ import annotations

from typing import Any

MAX_JSON_DEPTH = 64
"""Levels of objects and lists a JSON value from a model or a person may nest."""


def too_deep(value: Any) -> bool:
    """Whether `value` nests objects and lists past MAX_JSON_DEPTH; walked level by level,
    without recursing."""
    level = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        containers = [item for item in level if isinstance(item, dict | list)]
        if not containers:
            return False
        level = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]
    return True
