"""The floor for the step-overhead bench: a bare workflow running N no-op activities."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
async def noop(index: int) -> int:
    return index


@workflow.defn(name="BareLoop")
class BareLoop:
    """What Temporal costs with nothing of ours: activities one after another."""

    @workflow.run
    async def run(self, activities: int) -> int:
        for index in range(activities):
            await workflow.execute_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
        return activities
