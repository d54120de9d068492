"""A `conversation` schedule's firing, the next turn of one long-lived task: its contracts.

A Temporal schedule can only start workflows, so a conversation schedule starts this small
one at each firing, under an id Temporal derives from the schedule and the firing's
scheduled time. It runs one activity (worker/scheduled_turns.py) that starts the task at
the first firing, and at each later one delivers the schedule's text to it through the one
path every message takes (client/messaging.py), with the firing's id as the message id: a
retried activity, or a firing Temporal retries, delivers once. The workflow then lasts
until the task's turn ends (it answers, fails or is cancelled), so that the schedule's
overlap policy sees a firing whose turn still runs.

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
# Once delivered, the firing lasts until the task's turn ends, so that the schedule's overlap
# policy (skip, by default) sees it running meanwhile: an activity watches the task for up to
# TURN_WATCH, then the workflow sleeps a while (doubling up to TURN_WATCH_LONGEST_PAUSE)
# and watches again, holding no worker while a turn waits for days on a person.
TURN_WATCH = timedelta(minutes=5)
TURN_WATCH_HEARTBEAT = timedelta(seconds=30)
TURN_WATCH_FIRST_PAUSE = timedelta(minutes=1)
TURN_WATCH_LONGEST_PAUSE = timedelta(hours=1)
# Firings recorded before it ended once the message was delivered.
TURN_WATCH_PATCH = "scheduled-turn-lasts-its-turn"


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
