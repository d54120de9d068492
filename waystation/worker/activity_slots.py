"""A worker's activity slots, model calls apart from the other activities.

A model call may wait minutes for its quota's turn (activities/quotas.py), holding its
activity all along. Counted among the same slots as everything else (the SDK's 100), a
tenant's backlog of waiting calls took every slot of the worker: another tenant's call, a
tool call and a notification waited in the task queue behind them, whatever their turn.
Model calls therefore have slots of their own, and the other activities keep theirs.

A slot is reserved before the worker polls, not knowing what it will carry: a reserved
slot counts against both kinds until its task arrives and says which it is.
"""

from __future__ import annotations

import asyncio
import threading

from temporalio.worker import (
    ActivitySlotInfo,
    CustomSlotSupplier,
    FixedSizeSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkerTuner,
)

# The activities that wait at the quota gate before they send (activities/llm.py).
MODEL_CALL_ACTIVITIES = frozenset({"call_llm", "summarize_context"})
# The SDK's own sizes for what this tuner does not change.
_WORKFLOW_SLOTS = 100
_LOCAL_ACTIVITY_SLOTS = 100
_NEXUS_SLOTS = 100


class _Slot(SlotPermit):
    def __init__(self) -> None:
        self.model_call: bool | None = None
        """None until its task arrives."""


class ActivitySlots(CustomSlotSupplier):
    """At most `other` activities that are not model calls and `model_calls` model calls at
    once. Thread-safe: the SDK's core marks and releases slots from its own threads."""

    def __init__(self, *, other: int, model_calls: int) -> None:
        self.other = other
        self.model_calls = model_calls
        self._lock = threading.Lock()
        self._unassigned = 0
        self._running_other = 0
        self._running_model_calls = 0
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def counts(self) -> tuple[int, int, int]:
        """(reserved without a task yet, other activities running, model calls running)."""
        with self._lock:
            return self._unassigned, self._running_other, self._running_model_calls

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        freed = asyncio.Event()
        waiter = (asyncio.get_running_loop(), freed)
        while True:
            with self._lock:
                permit = self._take()
                if permit is not None:
                    return permit
                freed.clear()
                self._waiting.append(waiter)
            try:
                await freed.wait()
            finally:
                with self._lock:
                    if waiter in self._waiting:
                        self._waiting.remove(waiter)

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        with self._lock:
            return self._take()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        slot = ctx.permit
        if not isinstance(slot, _Slot) or slot.model_call is not None:
            return
        info = ctx.slot_info
        model_call = isinstance(info, ActivitySlotInfo) and (
            info.activity_type in MODEL_CALL_ACTIVITIES
        )
        with self._lock:
            slot.model_call = model_call
            self._unassigned -= 1
            if model_call:
                self._running_model_calls += 1
            else:
                self._running_other += 1
            self._wake()  # the kind it did not take is free again

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        slot = ctx.permit
        if not isinstance(slot, _Slot):
            return
        with self._lock:
            if slot.model_call is None:
                self._unassigned -= 1
            elif slot.model_call:
                self._running_model_calls -= 1
            else:
                self._running_other -= 1
            self._wake()

    def _take(self) -> _Slot | None:
        """A slot if either kind of task could use it now (called under the lock)."""
        if self._unassigned + self._running_other >= self.other:
            return None
        if self._unassigned + self._running_model_calls >= self.model_calls:
            return None
        self._unassigned += 1
        return _Slot()

    def _wake(self) -> None:
        """Wake the reservations waiting for a slot (called under the lock)."""
        for loop, freed in self._waiting:
            if not loop.is_closed():
                loop.call_soon_threadsafe(freed.set)
        self._waiting.clear()


def worker_tuner(slots: ActivitySlots) -> WorkerTuner:
    return WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(_WORKFLOW_SLOTS),
        activity_supplier=slots,
        local_activity_supplier=FixedSizeSlotSupplier(_LOCAL_ACTIVITY_SLOTS),
        nexus_supplier=FixedSizeSlotSupplier(_NEXUS_SLOTS),
    )
