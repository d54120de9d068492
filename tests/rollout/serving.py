"""`ws worker` serving another build of the workflow code, in its deployment's version
(WAYSTATION_DEPLOYMENT, WAYSTATION_BUILD_ID), with the build's own activities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.common import VersioningBehavior
from temporalio.worker import WorkerDeploymentConfig

from tests.rollout.code import audit, warm_up
from waystation import worker
from waystation.client.worker_versions import worker_version
from waystation.settings import Settings
from waystation.workflows.agent import AgentWorkflow


def serve(workflow_class: type[AgentWorkflow]) -> None:
    """Run the worker (`waystation.worker.run`) with `workflow_class` for AgentWorkflow."""
    built = worker.AgentWorker
    extra: list[Callable[..., Any]] = [warm_up, audit]

    class BuildWorker(built):  # type: ignore[misc, valid-type]  # a subclass of a variable
        def __init__(self, client: Any, **options: Any) -> None:
            options["workflows"] = [
                workflow_class if w is AgentWorkflow else w for w in options["workflows"]
            ]
            options["activities"] = [*options["activities"], *extra]
            settings: Settings = options["settings"]
            # The worker joins the deployment itself once it knows how (h-core); until then, here.
            options.setdefault(
                "deployment_config",
                WorkerDeploymentConfig(
                    version=worker_version(settings),
                    use_worker_versioning=True,
                    default_versioning_behavior=VersioningBehavior.PINNED,
                ),
            )
            super().__init__(client, **options)

    worker.AgentWorker = BuildWorker  # type: ignore[misc]
    worker.run()
