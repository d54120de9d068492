"""`python -m tests.never_stuck.drifted_worker`: the worker, serving a deliberately different
build of the agent workflow under the same name (tests only).

The drifted build records one more memo change each time it asks for an approval, so a
history it wrote does not replay on the real build: the first workflow task a real worker
takes for it fails with a nondeterminism error, as after a bad deploy or the cold-query
race of issue 12. Nothing outside tests imports this.
"""

from __future__ import annotations

import asyncio
import sys

from temporalio import workflow

from waystation import worker
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentEvent
from waystation.workflows.run import WORKFLOW_TYPE, AgentOutcome, AgentRun

DRIFT_MEMO = "drifted_build"


@workflow.defn(name=WORKFLOW_TYPE)
class DriftedAgentWorkflow(AgentWorkflow):
    """AgentWorkflow plus a memo command after every approval request."""

    @workflow.run
    async def run(self, run: AgentRun) -> AgentOutcome:
        return await super().run(run)

    def _append(self, event: AgentEvent) -> None:
        super()._append(event)
        if event.type == "approval_requested":
            workflow.upsert_memo({DRIFT_MEMO: event.seq})


if __name__ == "__main__":
    setattr(worker, "AgentWorkflow", DriftedAgentWorkflow)  # noqa: B010 (replaces the build)
    sys.exit(asyncio.run(worker.main()))
