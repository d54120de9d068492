"""The run every part of AgentWorkflow works on: its state, its clock and the one `_append`
that stamps every event.

AgentWorkflow (workflows/agent.py: the loop, the handlers, the queries) is this core plus
its parts, a module each: hand_over.py (continue as new with a bounded carry) and turns.py
on it (a conversation's turns: taking messages, closing, following up); model_calls.py
(the model, compaction and MCP listings) and step_calls.py on it (a step's tools and
sub-agents). The handlers' requests go to requests.Inbox. Deterministic code only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import (
    ApplicationError,
)

from waystation.vocabulary import FailureKind
from waystation.workflows import (
    activity_calls,
    errors,
    messages,
    request_kinds,
    requests,
    search,
)
from waystation.workflows.conversation import ConversationDigest, RunMessages, task_messages
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    Done,
    Failed,
    apply,
    draft,
    messages_of,
)
from waystation.workflows.messages import QueuedMessage
from waystation.workflows.models import (
    AgentTask,
    FailureDetail,
    Message,
    QuotaNotice,
    RepairNote,
    Resumption,
)
from waystation.workflows.notifications import Notifier
from waystation.workflows.plan import RunProgress
from waystation.workflows.recovery import resumed
from waystation.workflows.run import (
    AgentRun,
    RunCarry,
    RunRef,
    SealRequest,
)
from waystation.workflows.stream import EVENTS_TOPIC, carried_from
from waystation.workflows.tool_catalog import ToolCatalog

# Runs recorded before it close without sealing (activities/event_archive.py).
SEAL_PATCH = "sealed-close"
# A failed task's run stays open this long for a resumption (waystation/client/reset.py).
RESUME_GRACE = timedelta(seconds=3)
# The task of a run started with nothing in it (a follow-up from the Temporal CLI): the run
# only finds the answer it follows and continues as new from it, never reading this.
_FOLLOW_UP_PLACEHOLDER = AgentTask(task="(a follow-up: the task is the one it follows)")


@dataclass(frozen=True)
class Clock:
    """When the workflow last looked at the time and its history, at a point every replay
    sees alike: after an activity, a timer or a decision, never after a local activity
    (whose result a live run and a replay deliver in different workflow tasks)."""

    now: datetime
    history_length: int
    history_bytes: int
    suggested: bool


def sample_clock() -> Clock:
    info = workflow.info()
    return Clock(
        now=workflow.now(),
        history_length=info.get_current_history_length(),
        history_bytes=info.get_current_history_size(),
        suggested=info.is_continue_as_new_suggested(),
    )


class RunCore:
    """What one run holds, and the one `_append` that stamps, folds and publishes every
    event."""

    def __init__(self, run: AgentRun) -> None:
        carry = run.carry or RunCarry(state=AgentState())
        self._task = run.task or _FOLLOW_UP_PLACEHOLDER
        self._state = carry.state
        self._log: list[AgentEvent] = []
        self._first_seq = self._state.last_seq + 1
        self._earlier = carry.earlier
        self._stream = WorkflowStream(prior_state=carry.stream)
        self._events_topic = self._stream.topic(EVENTS_TOPIC)
        # Every kind of request's responses, recorded by the handlers (workflows/requests.py).
        carried = {kind: getattr(carry, field) for field, kind in request_kinds.CARRIED.items()}
        self._inbox = requests.Inbox(carried)
        self._resumptions: list[Resumption] = []
        self._repairs: list[RepairNote] = []
        # What model calls told of their waits under a quota, not yet in the log.
        self._quota_notices: list[QuotaNotice] = []
        self._incoming: list[QueuedMessage] = list(carry.messages)
        if carry.message is not None:  # a fork's or a resume's, told to the model first
            via = "fork" if carry.forked else "resume"
            self._incoming.insert(0, QueuedMessage(message=Message(content=carry.message), via=via))
        self._message_signals = 0
        self._refused_messages = messages.Refusals()
        # Messages whose model call was cancelled for them (their user_message says so).
        self._interrupters: set[str] = set()
        self._turn_messages: list[str] = []
        # A follow-up run waits for its claim on the turn before it answers a send_message.
        self._claiming = run.task is None or carry.follow_up
        self._refusal: ApplicationError | None = None
        self._messages = RunMessages(task_messages(self._task.system_prompt, self._task.task))
        self._digest = ConversationDigest()
        self._visibility = search.Visibility(self._task.parent)
        self._clock = sample_clock()
        self._first_step = self._state.step
        # The MCP tools this run saw (listed again by every run: a catalog is not carried).
        self._catalog: ToolCatalog | None = None
        self._unlisted: list[str] = list(self._task.mcp_servers or [])
        schedule = self._task.schedule.name if self._task.schedule is not None else None
        self._notifier = Notifier(workflow.info().workflow_id, schedule)

    def _append(self, event: AgentEvent) -> None:
        """Stamp the event with its place and time, fold it, publish it, keep its content."""
        clock = self._clock
        stamp = {
            "seq": self._state.last_seq + 1,
            "at": clock.now,
            "history_length": clock.history_length,
        }
        event = event.model_copy(update=stamp)
        self._state = apply(self._state, event)
        self._log.append(event)
        self._messages.add(messages_of(event))
        self._events_topic.publish(event)
        self._visibility.publish(self._state, self._task.model.name, event.at)
        self._notifier.note(event, self._task.task)

    def _continuation(self) -> RunCarry:
        """What a follow-up continues from: this run's state (its answer is in the log
        already), the latest stream items (so offsets go on), and this run as the one before
        it. The task is this run's input's. A run has no activity in flight when it ends, so
        no publisher's dedup entry need go on with it."""
        stream = self._stream.get_state(publisher_ttl=timedelta(0))
        kept = carried_from(stream) - stream.base_offset
        tail = dataclasses.replace(
            stream, log=stream.log[kept:], base_offset=stream.base_offset + kept
        )
        info = workflow.info()
        earlier = RunRef(
            workflow_id=info.workflow_id, run_id=info.run_id, last_seq=self._state.last_seq
        )
        state = self._state.model_copy(update={"result": None})
        return RunCarry(state=state, stream=tail, earlier=earlier, follow_up=True)

    async def _seal(self, *, archived: bool = False) -> None:
        """Leave what readers of this run need once it has closed where they find it without
        a replay (activities/event_archive.py): with Worker Versioning only a worker of the
        run's own version answers a query on it. Behind a patch: runs recorded before it
        close without."""
        if not workflow.patched(SEAL_PATCH):
            return
        request = SealRequest(
            continuation=self._continuation(),
            result=self._state.result,
            first_seq=self._first_seq,
            events=[] if archived else self._log,
            messages=self._messages.of([ref.digest for ref in self._state.conversation]),
            stream=self._stream.get_state(publisher_ttl=timedelta(0)),
        )
        # No clock sample after it: a live run and a replay see a local activity's result in
        # different workflow tasks.
        await activity_calls.seal_run(request)

    async def _close_stream(self) -> None:
        # Release long-poll subscribers and let every handler finish before the run ends.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _fail(self, kind: FailureKind, reason: str) -> None:
        """End the task as failed, unless a resumption comes within RESUME_GRACE: a resume
        sends one to a run still waiting, or resets a closed run to this very wait."""
        self._append(draft(Failed, self._state.step, kind=kind, reason=reason))
        await self._notifier.send()
        try:
            await workflow.wait_condition(lambda: bool(self._resumptions), timeout=RESUME_GRACE)
        except TimeoutError:
            await self._seal()
            await self._close_stream()
            # The usage comes along: a sub-agent's caller counts what its failure cost.
            detail = FailureDetail(
                kind=kind, usage=self._state.usage, last_seq=self._state.last_seq
            )
            raise ApplicationError(
                reason, *detail.as_details(), type=errors.AGENT_FAILED, non_retryable=True
            ) from None
        self._clock = sample_clock()
        resumption = self._resumptions.pop(0)
        self._task, event = resumed(self._task, resumption, self._state.step)
        if resumption.message is not None:
            told = QueuedMessage(message=Message(content=resumption.message), via="resume")
            self._incoming.insert(0, told)
        self._append(event)

    def _answer(self, step: int, text: str, output: Any | None = None) -> None:
        """The turn's answer (with an output schema, its data, validated)."""
        state = self._state
        done = {"result": text, "turn": state.turn, "usage": state.usage, "output": output}
        self._append(draft(Done, step, **done))

    def _progress(self, clock: Clock | None = None) -> RunProgress:
        clock = clock or self._clock
        return RunProgress(self._first_step, clock.history_bytes, clock.suggested)

    def _conversation_digest(self) -> str:
        return self._digest.of([r.digest for r in self._state.conversation])
