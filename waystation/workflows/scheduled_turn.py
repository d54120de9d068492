"""The workflow a `conversation` schedule starts at each firing (workflows/scheduled.py says
why): one activity, the same commands on every replay."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from waystation.workflows import activity_contracts as contracts
    from waystation.workflows.scheduled import (
        SCHEDULED_TURN_WORKFLOW_TYPE,
        TURN_DELIVERY_DEADLINE,
        TURN_DELIVERY_RETRY,
        TURN_DELIVERY_TIMEOUT,
        ScheduledTurn,
        TurnDelivered,
        TurnDelivery,
    )


@workflow.defn(name=SCHEDULED_TURN_WORKFLOW_TYPE)
class ScheduledTurnWorkflow:
    """One firing of a conversation schedule: start the task, or send it its next turn."""

    @workflow.run
    async def run(self, turn: ScheduledTurn) -> TurnDelivered:
        return await workflow.execute_activity(
            contracts.deliver_scheduled_turn,
            TurnDelivery(turn=turn, firing=workflow.info().workflow_id),
            start_to_close_timeout=TURN_DELIVERY_TIMEOUT,
            schedule_to_close_timeout=TURN_DELIVERY_DEADLINE,
            retry_policy=TURN_DELIVERY_RETRY,
        )
