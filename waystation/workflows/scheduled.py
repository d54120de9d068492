"""A `conversation` schedule's firing, the next turn of one long-lived task: its contracts.

A Temporal schedule can only start workflows, so a conversation schedule starts this small
one at each firing, under an id Temporal derives from the schedule and the firing's
scheduled time. It runs one activity (worker/scheduled_turns.py) that starts the task at
the first firing, and at each later one delivers the schedule's text to it through the one
path every message takes (client/messaging.py), with the firing's id as the message id: a
retried activity, or a firing Temporal retries, delivers once. The workflow ends when the
message is delivered (kept durably by the task), not when the turn answers.

The workflow: workflows/scheduled_turn.py. Pure models, no I/O.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field
from temporalio.common import RetryPolicy

from waystation.workflows import errors
from waystation.workflows.models import AgentTask, Contract

SCHEDULED_TURN_WORKFLOW_TYPE = "ScheduledTurnWorkflow"
# Delivery waits for Temporal and, for a closed turn, a worker's replay: a minute an
# attempt, retried for as long as the schedule's next firing is far (a day at most).
TURN_DELIVERY_TIMEOUT = timedelta(minutes=1)
TURN_DELIVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=[errors.SCHEDULED_TURN_REFUSED],
)
TURN_DELIVERY_DEADLINE = timedelta(days=1)


class ScheduledTurn(Contract):
    """Input of a conversation schedule's firing: the task every firing continues, and
    the task as it starts at the first firing (its text is each later firing's message)."""

    schedule: str
    task_id: str = Field(description="The conversation's task id, the same at every firing.")
    task: AgentTask


class TurnDelivery(Contract):
    """Input of the `deliver_scheduled_turn` activity: one firing's turn."""

    turn: ScheduledTurn
    firing: str = Field(description="The firing's workflow id: the message id of its turn.")


class TurnDelivered(Contract):
    """What a firing did: started the task, delivered the next turn, or found it done."""

    task_id: str
    started: bool = False
    message_id: str | None = None
    duplicate: bool = Field(default=False, description="A retry found it already delivered.")
