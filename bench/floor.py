"""The floor for the benchmarks: bare workflows running no-op activities, nothing of ours."""

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


@workflow.defn(name="BareLocalLoop")
class BareLocalLoop:
    """The shape of an agent step with a pure tool: an activity, then a local activity."""

    @workflow.run
    async def run(self, steps: int) -> int:
        for index in range(steps):
            await workflow.execute_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
            await workflow.execute_local_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
        return steps
