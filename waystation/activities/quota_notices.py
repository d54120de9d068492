"""Telling a task that its model call waits for its turn under a quota, and that it got it:
signal `quota_notice` to the call's own workflow, which records each as an event (the task
shows `waiting_quota`). Best effort: a notice that cannot be sent is logged, never a reason
for the call to fail."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WorkflowHandle

from waystation.vocabulary import QuotaLimitKind
from waystation.workflows.models import QuotaNotice


class QuotaNoticeSender:
    """The notices of one model call (a step's attempt)."""

    def __init__(self, step: int, attempt: int, *, retried: bool = False) -> None:
        """`retried`: an earlier attempt of the call may have told a wait it never ended
        (its worker died while it waited), so this one tells its turn whether it waited."""
        self._step = step
        self._attempt = attempt
        self._told_waiting = retried

    async def waiting(self, quota: str, limit: QuotaLimitKind, expected_seconds: float) -> None:
        """The call waits for `limit` of `quota`, about `expected_seconds` from now."""
        notice = QuotaNotice(
            state="waiting",
            step=self._step,
            attempt=self._attempt,
            quota=quota,
            limit=limit,
            expected_seconds=round(max(0.0, expected_seconds), 3),
        )
        self._told_waiting = await _send(notice) or self._told_waiting

    async def granted(self, quota: str, waited_seconds: float) -> None:
        """The call has its turn; told only when its wait was."""
        if not self._told_waiting:
            return
        notice = QuotaNotice(
            state="granted",
            step=self._step,
            attempt=self._attempt,
            quota=quota,
            waited_seconds=round(max(0.0, waited_seconds), 3),
        )
        await _send(notice)
        self._told_waiting = False


async def _send(notice: QuotaNotice) -> bool:
    from waystation.workflows.agent import AgentWorkflow  # the workflow module imports this one
    from waystation.workflows.run import AgentOutcome

    info = activity.info()
    handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = activity.client().get_workflow_handle_for(
        AgentWorkflow.run, info.workflow_id or "", run_id=info.workflow_run_id
    )
    try:
        await handle.signal(AgentWorkflow.quota_notice, notice)
    except Exception as err:  # the task closed, or Temporal is briefly away: the wait goes on
        activity.logger.warning("could not tell the task of its quota wait: %s", err)
        return False
    return True
