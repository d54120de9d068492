"""The `claim_turn` activity: a follow-up run takes the turn after an answer, once.

A run that answers closes; a message sent to it afterwards starts a new run of the same
workflow id that continues from that answer (its outcome carries what to continue from).
Two senders that both saw the same answer could each start a run from it, one after the
other: the second would lose the first one's turn. So the first thing a follow-up run does
is claim "the turn after run R" in the ledger every worker shares; a run that finds the
claim taken follows the claimant's answer instead, and so on to the latest answer. Claims
are never contended for long: Temporal runs one run of a workflow id at a time, so a claim
taken by another chain was taken by a run that has closed.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from waystation.activities.event_archive import EventArchive
from waystation.activities.run_history import close_event_of, read_continuation, sealed_run
from waystation.activities.storage import Ledger
from waystation.workflows import errors
from waystation.workflows.run import AgentRun, ClaimedTurn, RunRef, TurnClaim

CLAIM_TOOL = "follow_up"
# Attempts (~3 s with the claim's backoff) before a start with nothing in it is told that
# visibility lists no run of its id to follow.
NOTHING_TO_FOLLOW_ATTEMPTS = 5
# Runs of a chain followed from one answer to the next before giving up (a corrupt chain).
MOST_RUNS_WALKED = 10_000

# How long the claim asks a closed run for what a follow-up continues from (a worker
# replays the run to answer: seconds for the largest).
CONTINUATION_QUERY_BOUND = timedelta(seconds=60)


def claim_key(task_id: str, run_id: str) -> str:
    """The ledger key of the turn after run `run_id` of the task."""
    return f"turn-after/{task_id}/{run_id}"


class TurnActivities:
    """`claim_turn` over the deployment's ledger. Built once per worker (worker.py)."""

    def __init__(self, ledger: Ledger, archive: EventArchive) -> None:
        self._ledger = ledger
        self._archive = archive

    @activity.defn(name="claim_turn")
    async def claim_turn(self, claim: TurnClaim) -> ClaimedTurn:
        """Claim the turn after `claim.after_run_id` (or the task's latest closed run) for
        the chain `claim.chain_id`, walking past turns other chains claimed first."""
        client = activity.client()
        run_id = claim.after_run_id or await _latest_closed_run(client, claim.task_id)
        for _ in range(MOST_RUNS_WALKED):
            last_run, continuation = await self._answer_of_chain(client, claim.task_id, run_id)
            holder = await self._ledger.claim_once(
                claim_key(claim.task_id, last_run), CLAIM_TOOL, claim.chain_id
            )
            if holder == claim.chain_id:
                carry = continuation.carry
                last_seq = carry.state.last_seq if carry is not None else -1
                follows = RunRef(workflow_id=claim.task_id, run_id=last_run, last_seq=last_seq)
                # The claiming run started from this very answer: nothing to start from.
                fresh = claim.has_carry and last_run == claim.after_run_id
                return ClaimedTurn(follows=follows, continuation=None if fresh else continuation)
            activity.heartbeat()
            run_id = holder  # another chain followed that answer: follow its answer
        raise ApplicationError(
            f"task {claim.task_id}: more than {MOST_RUNS_WALKED} answers to walk past",
            type=errors.NOTHING_TO_FOLLOW,
            non_retryable=True,
        )

    async def _answer_of_chain(
        self, client: Client, task_id: str, run_id: str
    ) -> tuple[str, AgentRun]:
        """(the last run of the chain that begins with `run_id`, what a follow-up continues
        from), following continue-as-new; refused when the chain did not end with an answer a
        message can continue (a failed task's continues it as a resumption would)."""
        for _ in range(MOST_RUNS_WALKED):
            close = await close_event(client, task_id, run_id)
            if close.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                run_id = (
                    close.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                )
                continue
            continuation = await self._continuation(client, task_id, run_id, close)
            if continuation is None or continuation.carry is None:
                ended = EventType.Name(close.event_type).removeprefix(
                    "EVENT_TYPE_WORKFLOW_EXECUTION_"
                )
                raise ApplicationError(
                    f"task {task_id} ended {ended.lower()} with nothing a message can continue; "
                    "fork it to go on",
                    type=errors.TASK_NOT_TAKING_MESSAGES,
                    non_retryable=True,
                )
            return run_id, continuation
        raise ApplicationError(
            f"task {task_id}: a chain of more than {MOST_RUNS_WALKED} runs",
            type=errors.NOTHING_TO_FOLLOW,
            non_retryable=True,
        )

    async def _continuation(
        self, client: Client, task_id: str, run_id: str, close: HistoryEvent
    ) -> AgentRun | None:
        """What a follow-up continues from (activities/run_history.py); None for a run that
        did not end with an answer or a failure."""
        answered = close.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        )
        if not answered:
            return None
        # What the run sealed as it closed, from the shared storage: with Worker Versioning
        # only a worker of the run's own version answers a query on it, and none may be left.
        # The query, for a run that left no seal, is bounded: the claim is then tried again.
        sealed = await sealed_run(client, task_id, run_id, self._archive.sealed, close)
        return await read_continuation(
            client, task_id, run_id, sealed=sealed, within=CONTINUATION_QUERY_BOUND
        )


async def _latest_closed_run(client: Client, task_id: str) -> str:
    """The task's latest closed run, from Temporal's visibility (a start with nothing in
    it). Visibility may lag a moment behind a run that just closed: the claims walk from an
    older answer to the latest."""
    closed = [
        e
        async for e in client.list_workflows(
            f'WorkflowId="{task_id}" AND ExecutionStatus!="Running"', limit=50
        )
    ]
    if not closed:
        # Visibility may not list a run that closed a moment ago yet: ask a few more times
        # before saying there is nothing to follow.
        patient = activity.info().attempt < NOTHING_TO_FOLLOW_ATTEMPTS
        raise ApplicationError(
            f"there is no task {task_id!r} to follow up (no closed run of it): start one with "
            "a task, not with an empty input",
            type=None if patient else errors.NOTHING_TO_FOLLOW,
            non_retryable=not patient,
        )
    latest = max(closed, key=lambda e: (e.close_time or e.start_time, e.start_time))
    return latest.run_id


async def close_event(client: Client, task_id: str, run_id: str) -> HistoryEvent:
    if (event := await close_event_of(client, task_id, run_id)) is not None:
        return event
    # A run that has not closed yet: Temporal runs one run at a time, so it is this one's
    # predecessor closing right now; the activity's retry reads it again.
    raise ApplicationError(f"run {run_id} of task {task_id} has not closed yet")
