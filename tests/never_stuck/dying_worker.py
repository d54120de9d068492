"""`python -m tests.never_stuck.dying_worker`: the real worker build, taking workflow tasks
only, that dies (SIGKILL, from inside) the moment a `state` query reaches it (tests only).

It makes the cold-worker scenario of issue 12 deterministic: the test knows the query was
sent to this worker's sticky queue because the process is gone, and this worker's longer
sticky timeout (STICKY_SECONDS) keeps both that query and the next workflow task parked on
its dead sticky queue while the test arranges what a cold worker will find.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

from waystation import worker
from waystation.client.temporal import connect
from waystation.settings import Settings

# Below the clients' 10 s query timeout, so the parked query still reaches the cold worker.
STICKY_SECONDS = 5.0


class _DiesOnStateQuery(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        if any(job.query_workflow.query_type == "state" for job in act.jobs):
            os.kill(os.getpid(), signal.SIGKILL)
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class DiesOnStateQueryRunner(WorkflowRunner):
    """The worker's runner, killing its process when a `state` query arrives."""

    def __init__(self) -> None:
        self._inner = UnsandboxedWorkflowRunner()

    def prepare_workflow(self, defn: workflow._Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _DiesOnStateQuery(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


async def main() -> None:
    settings = Settings()
    client = await connect(settings)
    worker.WORKFLOW_RUNNER = DiesOnStateQueryRunner()  # type: ignore[assignment]
    worker.STICKY_SCHEDULE_TO_START = timedelta(seconds=STICKY_SECONDS)
    dying = worker.build_worker(client, settings, activities=False)
    async with dying:
        print("worker polling (dies on a state query)", file=sys.stderr, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
