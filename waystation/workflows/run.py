"""The workflow's input and query contracts, and the names the Temporal CLI uses.

A task is a chain of runs (continue-as-new) and, for a fork, the origin's runs before
it: each run holds the events it wrote and names the run before it (`earlier`). A
conversation goes on across answers: a run that answered closes, and a follow-up message
starts a new chain whose first run names the answer's run as `earlier`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from waystation.vocabulary import ApprovalRule
from waystation.workflows.approval import RecordedDecision
from waystation.workflows.events import AgentEvent, AgentState
from waystation.workflows.messages import QueuedMessage
from waystation.workflows.models import AgentSpec, AgentTask, ChatMessage, Contract, Usage
from waystation.workflows.questions import RecordedAnswer
from waystation.workflows.tool_catalog import ToolCatalog

# Names the Temporal CLI and Web UI use (`temporal workflow signal --name approve`).
WORKFLOW_TYPE = "AgentWorkflow"
DECIDE_UPDATE = "decide"
APPROVE_SIGNAL = "approve"
REJECT_SIGNAL = "reject"
RESUME_SIGNAL = "resume_after_failure"
REPAIRED_SIGNAL = "repaired"
SEND_MESSAGE_UPDATE = "send_message"
QUEUED_MESSAGES_QUERY = "queued_messages"
CONTINUATION_QUERY = "continuation"
MESSAGE_SIGNAL = "message"
MESSAGE_ROOM_QUERY = "message_room"
ANSWER_UPDATE = "answer"
ANSWER_SIGNAL = "answer"
# Sent by a notification workflow whose delivery failed for good (workflows/notifications.py).
NOTIFICATION_FAILED_SIGNAL = "notification_failed"
# Sent by a model call waiting for its turn under a quota (activities/quota_notices.py).
QUOTA_NOTICE_SIGNAL = "quota_notice"
# One `events` answer stays far below gRPC's 4 MB message limit.
EVENT_PAGE_BYTES = 1_000_000


class RunRef(Contract):
    """A run of a task that holds events of its log: seq up to `last_seq`."""

    workflow_id: str
    run_id: str
    last_seq: int


class RunCarry(Contract):
    """What one run hands the next (or a fork its origin): bounded whatever the task's
    length. The events stay with the run that wrote them; `earlier` names it."""

    state: AgentState
    stream: WorkflowStreamState | None = None
    decisions: list[RecordedDecision] = []
    """Decisions recorded and not yet in the log, and early ones awaiting their request."""
    answers: list[RecordedAnswer] = []
    """Answers recorded and not yet in the log, and early ones awaiting their question."""
    message: str | None = None
    """A user message to add once no step is open (a fork's or a resume's)."""
    earlier: RunRef | None = None
    forked: bool = False
    messages: list[QueuedMessage] = []
    """Messages received and not yet taken into the conversation, in arrival order."""
    follow_up: bool = False
    """This run begins the turn after `earlier`, a run that answered and closed: it claims
    that turn (so no two runs ever follow one answer) before it goes on."""


class AgentRun(Contract):
    """The workflow's one input: the task, and what an earlier run (or a fork) carries.

    With neither, the run is a follow-up of a task whose run has closed: started by our
    clients with `follows` (the closed run), or from the Temporal CLI with `{}`
    (update-with-start or signal-with-start), when it finds the task's latest answer
    itself. Either way it continues as new from that answer's state."""

    task: AgentTask | None = None
    carry: RunCarry | None = None
    follows: str | None = Field(
        default=None,
        description="A follow-up started with nothing else: the run whose answer it follows.",
    )


class AgentOutcome(Contract):
    """The workflow's result when a run ends with an answer: the answer of its last turn,
    and what a follow-up continues from."""

    status: Literal["done"] = "done"
    result: str
    steps: int
    usage: Usage
    last_seq: int
    turn: int = 0
    output: Any | None = Field(
        default=None, description="With an output_schema: the answer as data, validated."
    )
    message_ids: list[str] = Field(
        default_factory=list, description="The messages this turn took (a follow-up's, steers)."
    )
    continuation: RunCarry | None = Field(
        default=None,
        description="Only in runs before follow-ups read it by query: what a follow-up "
        "continued from.",
    )
    next_offset: int | None = Field(
        default=None, description="The stream offset a follow-up's items start at."
    )


class ChildOutcome(Contract):
    """Input-free answer of `child_outcome`: how a sub-agent's task stands, read from
    Temporal (for a parent that meets an existing child, after a repair or reset)."""

    closed: bool
    outcome: AgentOutcome | None = None
    ended: Literal["failed", "cancelled"] | None = None
    reason: str = ""
    usage: Usage | None = None
    foreign: bool = Field(
        default=False,
        description="The task under the child's id was not started by the asking task (one "
        "created under that predictable id first): it is never adopted.",
    )


class TurnClaim(Contract):
    """Input of `claim_turn`: the run whose chain begins at `chain_id` takes the turn after
    the run `after_run_id` (None: after the task's latest closed run)."""

    task_id: str
    after_run_id: str | None = None
    chain_id: str
    has_carry: bool = Field(
        default=True, description="The claiming run started from that answer's state already."
    )


class ClaimedTurn(Contract):
    """The run a follow-up turn follows, and, when the claiming run did not start from that
    run's answer (a stale start, or one with nothing in it), the input to start from."""

    follows: RunRef
    continuation: AgentRun | None = None


class LlmContext(Contract):
    """What the `llm_context` query answers: the conversation's messages this run holds
    (None where a message is in the conversation store), their digests, and the tools."""

    messages: list[ChatMessage | None]
    digests: list[str]
    tools: list[str] | None
    approval_policy: dict[str, ApprovalRule]
    catalog: ToolCatalog | None = None
    output_schema: dict[str, Any] | None = None
    agents: list[AgentSpec] | None = None


class EventsRequest(Contract):
    since: int = 0
    limit: int = 1000


class ArchiveRequest(Contract):
    """Input of `archive_events`: store this run's events `first_seq`..`last_seq`, so its
    log reads without a replay once it is closed."""

    first_seq: int
    last_seq: int


class ArchivedRun(Contract):
    """A closed run's events as the event archive keeps them."""

    workflow_id: str
    run_id: str
    first_seq: int
    last_seq: int
    events: list[AgentEvent]

    def complete(self) -> bool:
        """Every event first_seq..last_seq, in order: what a reader may trust."""
        return [e.seq for e in self.events] == list(range(self.first_seq, self.last_seq + 1))


class SealRequest(Contract):
    """Input of `seal_run`, a local activity (its input never enters history): what a run
    leaves as it closes for readers that cannot replay it, since with Worker Versioning only
    a worker of its own version answers a query on it, and none may be left."""

    continuation: RunCarry
    result: str | None = None
    first_seq: int
    events: list[AgentEvent] = []
    """This run's events, unless a large run's were archived already."""
    messages: dict[str, ChatMessage] = {}
    """The conversation's messages this run holds, by digest, for the conversation store."""
    stream: WorkflowStreamState | None = None
    """Every stream item this run holds: a closed run's stream reads from here."""


class SealedRun(Contract):
    """A closed run as `seal_run` keeps it: what a follow-up continues from, and the state
    it closed with (the continuation's, with the answer)."""

    workflow_id: str
    run_id: str
    continuation: RunCarry
    result: str | None = None
    stream: WorkflowStreamState | None = None

    def state(self) -> AgentState:
        return self.continuation.state.model_copy(update={"result": self.result})


class EventPage(Contract):
    """Answer of the `events` query: events with seq >= since that this run holds.

    A run holds the events from `first_seq` on; older ones are in `earlier` (and the runs
    before it), which still answer this query.
    """

    events: list[AgentEvent]
    next_seq: int
    first_seq: int = 0
    earlier: RunRef | None = None


def event_page(
    log: list[AgentEvent], first_seq: int, earlier: RunRef | None, request: EventsRequest
) -> EventPage:
    """At most `limit` events from `since` (and about EVENT_PAGE_BYTES of them)."""
    start = max(0, request.since - first_seq)
    page: list[AgentEvent] = []
    size = 0
    for event in log[start : start + request.limit]:
        size += len(event.model_dump_json())
        if page and size > EVENT_PAGE_BYTES:
            break
        page.append(event)
    return EventPage(
        events=page,
        next_seq=page[-1].seq + 1 if page else max(request.since, first_seq),
        first_seq=first_seq,
        earlier=earlier,
    )
