"""A conversation's turns: a waiting message taken into the conversation, a run that
closes with its turn's answer, and a follow-up run that claims the turn after an answer
(docs/architecture.md, "Conversations").
"""

from __future__ import annotations

from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
)

from waystation.workflows import (
    activity_calls,
    errors,
    messages,
)
from waystation.workflows.events import (
    AgentState,
)
from waystation.workflows.hand_over import HandOver
from waystation.workflows.messages import QueuedMessage
from waystation.workflows.run import (
    AgentOutcome,
    AgentRun,
    RunCarry,
    TurnClaim,
)
from waystation.workflows.run_core import sample_clock

# A last run this large archives its events as it ends: a replay to read them takes seconds.
ARCHIVE_LAST_RUN_BYTES = 256 * 1024


class Turns(HandOver):
    """Taking messages, ending a turn, and following up a closed run."""

    def _take(self, queued: QueuedMessage) -> None:
        """Take the first waiting message into the conversation (a new turn after an answer)."""
        self._incoming.remove(queued)
        message = queued.message
        if message.max_steps is not None:
            self._task = self._task.model_copy(update={"max_steps": message.max_steps})
        interrupted = message.message_id in self._interrupters
        self._interrupters.discard(message.message_id or "")
        event = messages.taken(self._state, queued, interrupted=interrupted)
        if event.turn != self._state.turn:
            self._turn_messages = []
        if message.message_id is not None:
            self._turn_messages.append(message.message_id)
        self._append(event)

    async def _close_turn(self) -> AgentOutcome | None:
        """End the run with the turn's answer, unless a message came meanwhile: then the
        conversation goes on in this run."""
        if self._incoming:
            return None
        await self._notifier.send()
        archived = self._clock.history_bytes >= ARCHIVE_LAST_RUN_BYTES
        if archived:
            await self._archive_events()
        await self._seal(archived=archived)
        await self._close_stream()
        if self._incoming:  # landed while the run was closing
            return None
        state = self._state
        return AgentOutcome(
            result=state.result or "",
            steps=state.step,
            usage=state.usage,
            last_seq=state.last_seq,
            turn=state.turn,
            output=state.output,
            message_ids=self._turn_messages,
            next_offset=self._stream_end(),
        )

    def _stream_end(self) -> int:
        stream = self._stream.get_state(publisher_ttl=timedelta(0))
        return stream.base_offset + len(stream.log)

    async def _claim_turn(self, run: AgentRun) -> None:
        """A follow-up run first claims the turn after the answer it follows, then goes on
        from it: a run started with only the run it follows (`follows`, our clients) or
        nothing at all (the Temporal CLI) continues as new from that answer's state, read
        from the closed run, keeping the messages it received; so does one that another
        run got ahead of."""
        info = workflow.info()
        carry = run.carry
        after = carry.earlier.run_id if carry is not None and carry.earlier else run.follows
        claim = TurnClaim(
            task_id=info.workflow_id,
            after_run_id=after,
            chain_id=info.first_execution_run_id,
            has_carry=carry is not None,
        )
        try:
            claimed = await activity_calls.claim_turn(self._task, claim)
        except ActivityError as err:
            await self._refuse(activity_calls.detail(err), err)
        self._clock = sample_clock()
        if claimed.continuation is not None:
            await self._start_from(claimed.continuation)
        self._claiming = False
        await self._save_conversation(source=claimed.follows)

    async def _refuse(self, reason: str, err: ActivityError) -> NoReturn:
        """The run has nothing to follow: the messages sent to it are refused, and it ends."""
        cause = err.cause
        kind = (
            cause.type
            if isinstance(cause, ApplicationError) and cause.type
            else errors.NOTHING_TO_FOLLOW
        )
        self._refusal = ApplicationError(reason, type=kind, non_retryable=True)
        self._claiming = False
        await workflow.wait_condition(workflow.all_handlers_finished)
        raise self._refusal

    async def _start_from(self, continuation: AgentRun) -> NoReturn:
        """Continue as new from another run's answer, with the messages this run received."""
        carry = continuation.carry or RunCarry(state=AgentState())
        mine = [
            q
            for q in self._incoming
            if not messages.known(carry.state, carry.messages, q.message.message_id or "")
        ]
        carry = carry.model_copy(update={"messages": [*carry.messages, *mine], "follow_up": True})
        self._claiming = False
        await self._continue_as_new(lambda _: [AgentRun(task=continuation.task, carry=carry)])
