"""Telling people: the notification workflow, and how the agent workflow starts it.

Deliveries outlive the run that asks for them (a run closes at its answer or failure, and
a delivery may be retried for a day), so each notice is its own small workflow, a child
of the agent workflow that it abandons: its id comes from the task id and the event's seq,
and a closed one keeps its id, so a parent that replays or is repaired never notifies
twice. It runs one delivery activity per endpoint, so a failing endpoint never repeats
another's delivery; a delivery that fails for good is signalled to the task, which logs
it as an `error` event, or logged by the worker when the task has closed.

Which kinds the endpoints want comes from the settings of the worker that begins a run,
through a local activity (behind a patch: runs recorded before it never asked); a worker
that serves no activities has no say, and one that does is asked by an activity.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    RetryState,
    WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from waystation.vocabulary import NOTIFIABLE_KINDS
    from waystation.workflows import activity_contracts as contracts
    from waystation.workflows import options
    from waystation.workflows.events import AgentEvent, ErrorEvent
    from waystation.workflows.notice import (
        NOTIFICATION_WORKFLOW_TYPE,
        Delivered,
        Delivery,
        DeliveryFailure,
        DeliveryReport,
        Notice,
        NotificationTargets,
        failure_event,
        notice_of,
        notification_workflow_id,
    )
    from waystation.workflows.run import NOTIFICATION_FAILED_SIGNAL

NOTIFY_PATCH = "webhook-notifications"


@workflow.defn(name=NOTIFICATION_WORKFLOW_TYPE)
class NotificationWorkflow:
    """One notice, delivered to each endpoint that wants it."""

    @workflow.run
    async def run(self, notice: Notice) -> DeliveryReport:
        outcomes = await asyncio.gather(*(self._deliver(notice, e) for e in notice.endpoints))
        report = DeliveryReport()
        for outcome in outcomes:
            if isinstance(outcome, Delivered):
                report.delivered.append(outcome)
            else:
                report.failed.append(outcome)
                await self._tell_task(notice, outcome)
        return report

    async def _deliver(self, notice: Notice, endpoint: str) -> Delivered | DeliveryFailure:
        delivery = options.notification_delivery(notice.retry)
        try:
            return await workflow.execute_activity(
                contracts.deliver_notification,
                Delivery(notice=notice, endpoint=endpoint),
                **delivery,
            )
        except ActivityError as err:
            reason = last_reason(err)
            # Out of time either way: the deadline passed during an attempt or a backoff
            # (the cause is a timeout), or the server saw the next attempt would start past
            # it and gave up at once (the cause is the last failure).
            if err.retry_state == RetryState.TIMEOUT:
                reason = f"still failing after {notice.retry.hours:g} h of retries: {reason}"
            return DeliveryFailure(
                endpoint=endpoint,
                kind=notice.kind,
                key=notice.key,
                seq=notice.event.seq if notice.event is not None else None,
                reason=reason[:2_000],
            )

    async def _tell_task(self, notice: Notice, failure: DeliveryFailure) -> None:
        task = workflow.get_external_workflow_handle(notice.task_id)
        try:
            await task.signal(NOTIFICATION_FAILED_SIGNAL, failure)
        except FailureError:
            workflow.logger.warning(
                "task %s has closed; its %s notification to webhook endpoint %r was not "
                "delivered: %s",
                notice.task_id,
                notice.kind,
                failure.endpoint,
                failure.reason,
            )


def last_reason(err: BaseException) -> str:
    """What the last attempt failed with (a timeout's cause is the attempt before it)."""
    reason = str(err)
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.message:
            return cause.message
        if isinstance(cause, FailureError) and cause.message:
            reason = cause.message
        cause = cause.__cause__
    return reason


class Notifier:
    """What the agent workflow tells people: the kinds the endpoints want (asked once per
    run), the events of its log not told yet, and deliveries that failed."""

    def __init__(self, task_id: str, schedule: str | None = None) -> None:
        self._task_id = task_id
        self._schedule = schedule  # the schedule that started the task: its notices name it
        self._asked = False  # of the worker that began the run
        self._targets: NotificationTargets | None = None
        self._events: list[tuple[AgentEvent, str]] = []
        self._failures: list[DeliveryFailure] = []

    async def ask_targets(self) -> None:
        """Ask the worker running this workflow task which kinds its endpoints want (a local
        activity: no round trip). A worker that serves no activities (one the command line
        hosts to answer a query) has no say: a worker that does is asked instead, by an
        activity, once the run has something to tell."""
        if not workflow.patched(NOTIFY_PATCH):
            return
        self._asked = True
        try:
            here = await workflow.execute_local_activity(
                contracts.notification_targets, **options.local_notification_targets()
            )
        except ActivityError as err:
            workflow.logger.warning("asking a worker that serves activities: %s", last_reason(err))
            return
        if here.settled:
            self._targets = here

    def note(self, event: AgentEvent, task: str) -> None:
        """Keep an event some endpoint may want told (synchronous: no command)."""
        if not self._asked or event.type not in NOTIFIABLE_KINDS:
            return
        if self._targets is None or self._targets.wanting(event.type):
            self._events.append((event, task))

    async def send(self) -> None:
        """Start the notification workflow of each event an endpoint wants, in order."""
        if not self._events:
            return
        targets = self._targets or await self._ask_elsewhere()
        events, self._events = self._events, []
        for event, task in events:
            notice = notice_of(event, self._task_id, task, targets, self._schedule)
            if notice is None:
                continue
            try:
                await workflow.start_child_workflow(
                    NotificationWorkflow.run,
                    notice,
                    id=notification_workflow_id(notice),
                    parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )
            except WorkflowAlreadyStartedError:
                pass  # started before this run was reset or repaired: sent already

    async def _ask_elsewhere(self) -> NotificationTargets:
        targets = NotificationTargets()
        try:
            targets = await workflow.execute_activity(
                contracts.notification_targets, **options.notification_targets()
            )
        except ActivityError as err:  # notify nobody, and go on
            workflow.logger.warning("no notifications for this run: %s", last_reason(err))
        self._targets = targets
        return targets

    def failed(self, failure: DeliveryFailure) -> None:
        self._failures.append(failure)

    @property
    def failures_recorded(self) -> bool:
        return bool(self._failures)

    def failure_events(self, step: int) -> list[ErrorEvent]:
        """The `error` events of the failures recorded since the last call, in order."""
        failures, self._failures = self._failures, []
        return [failure_event(step, f) for f in failures]
