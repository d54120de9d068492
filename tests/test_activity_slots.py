"""A worker's activity slots: model calls waiting for their quota's turn hold slots of their
own, never those of tool calls and the other activities (and the reverse)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio.worker import SlotPermit

from waystation.worker.activity_slots import ActivitySlots


@dataclass
class Reserving:
    slot_type: str = "activity"
    task_queue: str = "q"
    worker_identity: str = "w"
    worker_build_id: str = ""
    worker_deployment_version: None = None
    is_sticky: bool = False


@dataclass
class Activity:
    activity_type: str


@dataclass
class Used:
    slot_info: Activity | None
    permit: SlotPermit


def use(slots: ActivitySlots, permit: SlotPermit, activity_type: str) -> None:
    slots.mark_slot_used(Used(Activity(activity_type), permit))  # type: ignore[arg-type]


def release(slots: ActivitySlots, permit: SlotPermit, activity_type: str | None) -> None:
    info = Activity(activity_type) if activity_type else None
    slots.release_slot(Used(info, permit))  # type: ignore[arg-type]


async def test_model_calls_and_other_activities_each_have_their_own_slots() -> None:
    slots = ActivitySlots(other=2, model_calls=3)
    calls = []
    for _ in range(3):  # three model calls waiting for their turn
        permit = await slots.reserve_slot(Reserving())  # type: ignore[arg-type]
        use(slots, permit, "call_llm")
        calls.append(permit)
    assert slots.counts() == (0, 0, 3)
    # Every model slot is taken: a reserved slot might carry one more, so none is given...
    assert slots.try_reserve_slot(Reserving()) is None  # type: ignore[arg-type]
    blocked = asyncio.create_task(slots.reserve_slot(Reserving()))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not blocked.done()
    # ... until one ends; then two tool calls run beside the model calls.
    release(slots, calls.pop(), "call_llm")
    async with asyncio.timeout(5):
        tool = await blocked
    use(slots, tool, "run_tool")
    other = slots.try_reserve_slot(Reserving())  # type: ignore[arg-type]
    assert other is not None
    use(slots, other, "deliver_notification")
    assert slots.counts() == (0, 2, 2)
    assert slots.try_reserve_slot(Reserving()) is None  # type: ignore[arg-type]
    release(slots, tool, "run_tool")
    unused = slots.try_reserve_slot(Reserving())  # type: ignore[arg-type]
    assert unused is not None and slots.counts() == (1, 1, 2)
    release(slots, unused, None)  # reserved, never used: the poll ended
    assert slots.counts() == (0, 1, 2)
