"""pydantic's ValidationError as one sentence for people: each problem's place and rule,
never the value (it may be a secret). Every layer that turns one into a message uses this."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import ValidationError


def validation_sentence(
    err: ValidationError,
    whole: str = "",
    place: Callable[[Sequence[str | int]], str] | None = None,
) -> str:
    """`place: rule; place: rule`, a place being the dotted path to the value (`whole` for
    the value itself: a rule said alone when that is empty), or what `place` makes of it."""
    problems = []
    for error in err.errors(include_input=False, include_url=False):
        if error["type"] == "default_factory_not_called":
            continue  # a default made from a value that failed: that failure says it
        loc = error["loc"]
        where = place(loc) if place is not None else ".".join(str(p) for p in loc) or whole
        problems.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(problems)
