"""Notices: what a task tells the people it needs, and the contracts of their delivery.

A notice is one event an endpoint of WAYSTATION_WEBHOOKS wants (a request for approval, a
question, an answer, a failure) or a task found stuck. The agent workflow makes a notice
for each such event it appends and starts a notification workflow for it; that workflow
runs one delivery activity per endpoint. Endpoints travel by name only: their URLs and
secrets stay on the workers (activities/notify/), never in history.

Pure models and functions, no I/O.
"""

from __future__ import annotations

from pydantic import Field

from waystation.vocabulary import NotifiableKind
from waystation.workflows.events import (
    AgentEvent,
    ApprovalRequested,
    Done,
    ErrorEvent,
    Failed,
    QuestionAsked,
    draft,
)
from waystation.workflows.models import Contract

NOTIFICATION_WORKFLOW_TYPE = "NotificationWorkflow"
# The task's text in a notice, and in what people see of it.
NOTICE_TASK_CHARS = 500
# The kind of the `error` event a delivery that failed for good becomes.
NOTIFICATION_ERROR_KIND = "notification_failed"


class DeliveryRetry(Contract):
    """How each delivery is tried: the worker's settings, recorded with the notice."""

    initial_seconds: float = Field(gt=0)
    max_interval_seconds: float = Field(gt=0)
    hours: float = Field(gt=0, description="How long a delivery is retried in all.")
    timeout_seconds: float = Field(gt=0, description="How long one attempt waits for an answer.")
    heartbeat_seconds: float = Field(
        gt=0, description="How soon an attempt of a worker that died is made again."
    )


class NotificationTargets(Contract):
    """Which endpoints want which kinds (by name: no URL, no secret), as the worker that
    began a run had them, and how deliveries are retried."""

    endpoints: dict[str, list[NotifiableKind]] = Field(default_factory=dict)
    retry: DeliveryRetry | None = None
    settled: bool = Field(
        default=True,
        description="False from a worker that serves no activities: it has no say, and a "
        "worker that does is asked instead.",
    )

    def wanting(self, kind: str) -> list[str]:
        """The endpoints that want `kind`, in the order the setting lists them."""
        return [name for name, kinds in self.endpoints.items() if kind in kinds]


class StuckNote(Contract):
    """A task whose workflow task keeps failing: where, and with what."""

    run_id: str
    problem: str
    attempts: int
    reset_to_event: int | None = Field(
        description="The failure point: where a repair resets it to; None when its first "
        "workflow task fails (nothing to reset to: a repair cannot help)."
    )

    @property
    def point(self) -> str:
        """The failure point in keys and ids: the event id, or `start`."""
        return "start" if self.reset_to_event is None else str(self.reset_to_event)


class Notice(Contract):
    """Input of the notification workflow: one thing to tell the endpoints that want it."""

    key: str = Field(description="The idempotency key: the same on every retry of a delivery.")
    kind: NotifiableKind
    task_id: str
    task: str = Field(description="The task's text, shortened.")
    schedule: str | None = Field(
        default=None, description="The schedule that started the task, if one did."
    )
    event: AgentEvent | None = Field(default=None, description="The event (none for `stuck`).")
    stuck: StuckNote | None = None
    endpoints: list[str] = Field(min_length=1)
    retry: DeliveryRetry


class Delivery(Contract):
    """Input of the delivery activity: a notice for one endpoint."""

    notice: Notice
    endpoint: str


class Delivered(Contract):
    """What the delivery activity returns: the endpoint's status and the attempt it took."""

    endpoint: str
    status: int
    attempt: int


class DeliveryFailure(Contract):
    """Signal `notification_failed`: a delivery that failed for good (refused, or still
    failing when its retries ran out). The task logs it as an `error` event."""

    endpoint: str
    kind: NotifiableKind
    key: str
    seq: int | None = None
    reason: str = Field(max_length=2_000)


class DeliveryReport(Contract):
    """The notification workflow's result."""

    delivered: list[Delivered] = Field(default_factory=list)
    failed: list[DeliveryFailure] = Field(default_factory=list)


def shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def notice_key(task_id: str, event: AgentEvent) -> str:
    """A request's key is its request id (a person acts on it by that id), the others' their
    seq: unique in the task, and the same whatever replays or repairs the workflow."""
    if isinstance(event, ApprovalRequested | QuestionAsked):
        return f"{task_id}:{event.request_id}"
    return f"{task_id}:{event.seq}"


def notice_of(
    event: AgentEvent,
    task_id: str,
    task: str,
    targets: NotificationTargets,
    schedule: str | None = None,
) -> Notice | None:
    """The notice an appended event makes, or None when no endpoint wants its kind."""
    if not isinstance(event, ApprovalRequested | QuestionAsked | Done | Failed):
        return None
    endpoints = targets.wanting(event.type)
    if not endpoints or targets.retry is None:
        return None
    return Notice(
        key=notice_key(task_id, event),
        kind=event.type,
        task_id=task_id,
        task=shortened(task, NOTICE_TASK_CHARS),
        schedule=schedule,
        event=event,
        endpoints=endpoints,
        retry=targets.retry,
    )


def stuck_notice(
    task_id: str, task: str, stuck: StuckNote, targets: NotificationTargets
) -> Notice | None:
    endpoints = targets.wanting("stuck")
    if not endpoints or targets.retry is None:
        return None
    return Notice(
        key=f"{task_id}:stuck:{stuck.run_id}:{stuck.point}",
        kind="stuck",
        task_id=task_id,
        task=shortened(task, NOTICE_TASK_CHARS),
        stuck=stuck,
        endpoints=endpoints,
        retry=targets.retry,
    )


def notification_workflow_id(notice: Notice) -> str:
    """The notification workflow's id: from the task id and the event's seq (a stuck task's
    from its run and failure point), so a parent that replays, is repaired, or several
    workers watching one stuck task, start it once."""
    if notice.stuck is not None:
        point = f"stuck-{notice.stuck.run_id}-{notice.stuck.point}"
    else:
        point = str(notice.event.seq if notice.event is not None else notice.key)
    return f"{notice.task_id}/notify/{point}"


def failure_event(step: int, failure: DeliveryFailure) -> ErrorEvent:
    """The `error` event a failed delivery becomes in the task's log."""
    of = f" (seq {failure.seq})" if failure.seq is not None else ""
    return draft(
        ErrorEvent,
        step,
        kind=NOTIFICATION_ERROR_KIND,
        message=f"the {failure.kind} notification{of} to webhook endpoint "
        f"{failure.endpoint!r} was not delivered: {failure.reason}",
    )
