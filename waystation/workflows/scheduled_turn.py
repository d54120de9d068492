"""The workflow a `conversation` schedule starts at each firing (workflows/scheduled.py says
why): the delivery, then watching the turn until it ends; the same commands on every
replay."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from waystation.workflows import activity_contracts as contracts
    from waystation.workflows.scheduled import (
        SCHEDULED_TURN_WORKFLOW_TYPE,
        TURN_DELIVERY_DEADLINE,
        TURN_DELIVERY_RETRY,
        TURN_DELIVERY_TIMEOUT,
        TURN_WATCH,
        TURN_WATCH_FIRST_PAUSE,
        TURN_WATCH_HEARTBEAT,
        TURN_WATCH_LONGEST_PAUSE,
        TURN_WATCH_PATCH,
        ScheduledTurn,
        TurnDelivered,
        TurnDelivery,
    )


@workflow.defn(name=SCHEDULED_TURN_WORKFLOW_TYPE)
class ScheduledTurnWorkflow:
    """One firing of a conversation schedule: start the task, or send it its next turn;
    done when that turn is."""

    @workflow.run
    async def run(self, turn: ScheduledTurn) -> TurnDelivered:
        delivered = await workflow.execute_activity(
            contracts.deliver_scheduled_turn,
            TurnDelivery(turn=turn, firing=workflow.info().workflow_id),
            start_to_close_timeout=TURN_DELIVERY_TIMEOUT,
            schedule_to_close_timeout=TURN_DELIVERY_DEADLINE,
            retry_policy=TURN_DELIVERY_RETRY,
        )
        if workflow.patched(TURN_WATCH_PATCH):
            await self._until_the_turn_ends(delivered)
        return delivered

    async def _until_the_turn_ends(self, delivered: TurnDelivered) -> None:
        """Watch the task until its turn ends: an activity watches a while, then the
        workflow sleeps (holding no worker) and watches again."""
        pause = TURN_WATCH_FIRST_PAUSE
        while not await workflow.execute_activity(
            contracts.watch_scheduled_turn,
            delivered,
            start_to_close_timeout=TURN_WATCH + TURN_WATCH_HEARTBEAT,
            heartbeat_timeout=TURN_WATCH_HEARTBEAT,
        ):
            await workflow.sleep(pause)
            pause = min(pause * 2, TURN_WATCH_LONGEST_PAUSE)
