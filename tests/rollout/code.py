"""The workflow code of the roll-out's versions: version 2 runs an activity before its first
model call (so version 1's histories do not replay on it); version 1.1 runs one before the
tool calls of a step, behind `workflow.patched` (so they do)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import ToolCall
from waystation.workflows.run import WORKFLOW_TYPE, AgentOutcome, AgentRun

WARM_UP_ACTIVITY = "rollout_warm_up"
AUDIT_ACTIVITY = "rollout_audit"
# Its first answer holds for the whole run (the SDK memoises it), so it sits where a run in
# flight first gets to after the deploy: the calls after an approval, not the model call
# it replayed before.
AUDIT_PATCH = "rollout-audit-before-calls"
QUICK = timedelta(seconds=30)


@activity.defn(name=WARM_UP_ACTIVITY)
async def warm_up(task_id: str) -> str:
    return f"warmed {task_id}"


@activity.defn(name=AUDIT_ACTIVITY)
async def audit(task_id: str, step: int) -> str:
    return f"audited {task_id} step {step}"


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflowV2(AgentWorkflow):
    """Version 2: the same workflow type, with an activity before the first model call."""

    @workflow.init
    def __init__(self, run: AgentRun) -> None:
        super().__init__(run)
        self._warmed = False

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        return await super().run(run)

    async def _call_model(self, step: int) -> None:
        if not self._warmed:
            await workflow.execute_activity(
                warm_up, workflow.info().workflow_id, start_to_close_timeout=QUICK
            )
            self._warmed = True
        await super()._call_model(step)


@workflow.defn(name=WORKFLOW_TYPE)
class AgentWorkflowV1_1(AgentWorkflow):
    """Version 1.1: version 1 plus an audit activity before a step's tool calls, patched."""

    @workflow.init
    def __init__(self, run: AgentRun) -> None:
        super().__init__(run)

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        return await super().run(run)

    async def _run_calls(self, step: int, calls: list[ToolCall]) -> None:
        if workflow.patched(AUDIT_PATCH):
            await workflow.execute_activity(
                audit, args=[workflow.info().workflow_id, step], start_to_close_timeout=QUICK
            )
        await super()._run_calls(step, calls)
