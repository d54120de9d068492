"""Assertions on a task's events (`await handle.events()`, or the HTTP API's JSON events):
which tools were called, with what, and what they gave; and a wait for a task's status."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from waystation.client.handle import TaskHandle
from waystation.client.task_errors import NoWorkerError
from waystation.workflows.events import AgentState


@dataclass(frozen=True)
class ToolCallSeen:
    """A call the model made, as the events tell it."""

    tool: str
    arguments: dict[str, Any] | None
    """As validated (None: the arguments were not valid, see `output`)."""
    call_id: str
    output: str | None = None
    """What the call gave (None: no observation yet, e.g. waiting for approval)."""
    is_error: bool = False


def _fields(event: BaseModel | Mapping[str, Any]) -> Mapping[str, Any]:
    return event if isinstance(event, Mapping) else vars(event)


def tool_calls(
    events: Iterable[BaseModel | Mapping[str, Any]], tool: str | None = None
) -> list[ToolCallSeen]:
    """The tool calls the events record (of `tool` only, if given), in order, each with
    its observation."""
    seen = [_fields(e) for e in events]
    observed = {e["call_id"]: e for e in seen if e.get("type") == "observation"}
    found = []
    for event in seen:
        if event.get("type") != "action" or (tool is not None and event["tool"] != tool):
            continue
        observation = observed.get(event["call_id"])
        found.append(
            ToolCallSeen(
                tool=event["tool"],
                arguments=event.get("arguments"),
                call_id=event["call_id"],
                output=None if observation is None else observation["output"],
                is_error=False if observation is None else bool(observation["is_error"]),
            )
        )
    return found


def assert_called(
    events: Iterable[BaseModel | Mapping[str, Any]],
    tool: str,
    arguments: Mapping[str, Any] | None = None,
) -> ToolCallSeen:
    """The first call of `tool` (with `arguments` among its arguments, if given); an
    AssertionError listing the calls made if there is none."""
    made = tool_calls(events)
    for seen in made:
        if seen.tool == tool and (
            arguments is None
            or all((seen.arguments or {}).get(k, _ABSENT) == v for k, v in arguments.items())
        ):
            return seen
    wanted = tool if arguments is None else f"{tool} with {dict(arguments)}"
    listed = "; ".join(f"{c.tool}({c.arguments})" for c in made) or "none"
    raise AssertionError(f"no call of {wanted}; the calls made: {listed}")


def assert_not_called(events: Iterable[BaseModel | Mapping[str, Any]], tool: str) -> None:
    """An AssertionError if the model called `tool`."""
    made = tool_calls(events, tool)
    if made:
        raise AssertionError(f"{tool} was called {len(made)} times: {made[0].arguments} first")


_ABSENT = object()


async def until_status(
    handle: TaskHandle[Any], *statuses: str, within: timedelta = timedelta(seconds=60)
) -> AgentState:
    """The task's state once its status is one of `statuses` (e.g. "waiting_approval"),
    asked again until then; TimeoutError after `within`."""
    async with asyncio.timeout(within.total_seconds()):
        while True:
            try:
                state = await handle.state()
            except NoWorkerError:  # a worker busy or starting: ask again
                continue
            if state.status in statuses:
                return state
            await asyncio.sleep(0.05)
