"""JSON from a model, taken only when it nests no deeper than any real call needs.

Python's parser recurses once per level: arguments nested 100,000 deep raise RecursionError
(not a JSONDecodeError), and a value a few hundred levels deep that does parse would recurse
again at every later step (pydantic, the payload converter, events, the stream). Both are
refused here like any malformed JSON, with TooDeepError, a ValueError.
"""

from __future__ import annotations

import json
from typing import Any

from waystation.workflows.nesting import MAX_JSON_DEPTH, too_deep

_decoder = json.JSONDecoder()


class TooDeepError(ValueError):
    """JSON nested past MAX_JSON_DEPTH."""

    def __init__(self) -> None:
        super().__init__(f"nested more than {MAX_JSON_DEPTH} levels deep")


def loads(text: str) -> Any:
    """`json.loads`, refusing a value nested past MAX_JSON_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeepError() from None
    _check_depth(value)
    return value


def raw_decode(text: str, start: int) -> tuple[Any, int]:
    """The JSON value at `start` and where it ends (`JSONDecoder.raw_decode`), refusing one
    nested past MAX_JSON_DEPTH."""
    try:
        value, end = _decoder.raw_decode(text, start)
    except RecursionError:
        raise TooDeepError() from None
    _check_depth(value)
    return value, end


def _check_depth(value: Any) -> None:
    if too_deep(value):
        raise TooDeepError()
