"""The client's start gate: at most so many starts in flight; the waiting ones go by their
Temporal task priority, then in the order they came, so a quiet tenant's start does not
queue behind another tenant's burst. A cancelled waiter leaves its place to the next."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from temporalio.common import Priority

from waystation.client.start_gate import StartGate


async def hold(
    gate: StartGate, priority: Priority, went: list[str], name: str, release: asyncio.Event
) -> None:
    async with gate.turn(priority):
        went.append(name)
        await release.wait()


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


async def test_a_quiet_tenants_start_goes_before_a_burst_that_waits() -> None:
    gate, went = StartGate(limit=2), list[str]()
    releases = {name: asyncio.Event() for name in ["a0", "a1", "a2", "a3", "a4", "b", "c"]}
    busy = Priority(priority_key=3, fairness_key="a")
    holders = [
        asyncio.create_task(hold(gate, busy, went, f"a{n}", releases[f"a{n}"])) for n in range(5)
    ]
    await until(lambda: went == ["a0", "a1"])  # two in flight, three wait
    quiet = Priority(priority_key=2, fairness_key="b")
    holders.append(asyncio.create_task(hold(gate, quiet, went, "b", releases["b"])))
    unset = Priority(fairness_key="c")  # Temporal's default, 3: after a2, which came first
    holders.append(asyncio.create_task(hold(gate, unset, went, "c", releases["c"])))
    await until(lambda: len(gate._waiting) == 5)
    for name in ["a0", "a1", "b", "a2", "a3", "a4", "c"]:
        releases[name].set()
        await asyncio.sleep(0)
    await asyncio.gather(*holders)
    assert went == ["a0", "a1", "b", "a2", "a3", "a4", "c"]
    assert gate.in_flight == 0


async def test_a_cancelled_waiter_leaves_its_place_to_the_next() -> None:
    gate, went = StartGate(limit=1), list[str]()
    first, second, third = asyncio.Event(), asyncio.Event(), asyncio.Event()
    priority = Priority(priority_key=3)
    holding = asyncio.create_task(hold(gate, priority, went, "first", first))
    await until(lambda: went == ["first"])
    cancelled = asyncio.create_task(hold(gate, priority, went, "second", second))
    waiting = asyncio.create_task(hold(gate, priority, went, "third", third))
    await until(lambda: len(gate._waiting) == 2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    first.set()
    third.set()
    await asyncio.gather(holding, waiting)
    assert went == ["first", "third"]
    assert gate.in_flight == 0


async def test_a_waiter_cancelled_as_its_place_is_handed_over_passes_it_on() -> None:
    gate, went = StartGate(limit=1), list[str]()
    third = asyncio.Event()
    priority = Priority(priority_key=3)
    async with gate.turn(priority):
        handed = asyncio.create_task(hold(gate, priority, went, "second", asyncio.Event()))
        waiting = asyncio.create_task(hold(gate, priority, went, "third", third))
        await until(lambda: len(gate._waiting) == 2)
    # The place is handed to "second", which has not run since: cancelled now, it passes it on.
    handed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await handed
    third.set()
    await waiting
    assert went == ["third"]
    assert gate.in_flight == 0
