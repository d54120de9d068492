"""`ws worker` serving another build of the workflow code, with the build's own activities;
it joins its deployment as `ws worker` does (WAYSTATION_DEPLOYMENT, WAYSTATION_BUILD_ID)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.rollout.code import audit, warm_up
from waystation import worker
from waystation.workflows.agent import AgentWorkflow


def serve(workflow_class: type[AgentWorkflow]) -> None:
    """Run the worker (`waystation.worker.run`) with `workflow_class` for AgentWorkflow."""
    extra: list[Callable[..., Any]] = [warm_up, audit]

    class BuildWorker(worker.AgentWorker):
        def __init__(self, client: Any, **options: Any) -> None:
            options["workflows"] = [
                workflow_class if w is AgentWorkflow else w for w in options["workflows"]
            ]
            options["activities"] = [*options["activities"], *extra]
            super().__init__(client, **options)

    worker.AgentWorker = BuildWorker  # type: ignore[misc]
    worker.run()
