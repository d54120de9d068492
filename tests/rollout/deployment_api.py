"""The Temporal API of a Worker Deployment where the roll-out tests need more than `ws
deploy` (waystation.client.deploys) says: when the server knows a version, when it says
drained, when a version's last run closed, and which version ran each workflow task of a
history."""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionProto
from temporalio.api.enums.v1 import EventType, VersionDrainageStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

IDENTITY = "waystation-tests"


class Deployment:
    """One Worker Deployment of the test's own, by name, on `client`'s namespace."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    @property
    def namespace(self) -> str:
        return self.client.namespace

    def _version(self, build_id: str) -> VersionProto:
        return VersionProto(deployment_name=self.name, build_id=build_id)

    def attribute(self, build_id: str) -> str:
        """The version as TemporalWorkerDeploymentVersion holds it (`deployment:build_id`)."""
        return f"{self.name}:{build_id}"

    async def current(self) -> str | None:
        """The current version's build id; None before any is set."""
        try:
            described = await self.client.workflow_service.describe_worker_deployment(
                DescribeWorkerDeploymentRequest(namespace=self.namespace, deployment_name=self.name)
            )
        except RPCError:  # no worker of it has polled yet
            return None
        routing = described.worker_deployment_info.routing_config
        return routing.current_deployment_version.build_id or None

    async def until_known(self, build_id: str, within: float = 30.0) -> None:
        """Until the server knows the version (its first poller registers it, ~1 s)."""
        async with asyncio.timeout(within):
            while True:
                try:
                    await self.describe_version(build_id)
                    return
                except RPCError:
                    await asyncio.sleep(0.1)

    async def describe_version(self, build_id: str) -> object:
        return await self.client.workflow_service.describe_worker_deployment_version(
            DescribeWorkerDeploymentVersionRequest(
                namespace=self.namespace, deployment_version=self._version(build_id)
            )
        )

    async def promote(self, build_id: str) -> None:
        """Make the version current once the server knows it, whether or not its first
        worker did (`temporal worker deployment set-current-version`)."""
        await self.until_known(build_id)
        request = SetWorkerDeploymentCurrentVersionRequest(
            namespace=self.namespace,
            deployment_name=self.name,
            build_id=build_id,
            identity=IDENTITY,
        )
        async with asyncio.timeout(30):
            while await self.current() != build_id:
                try:
                    await self.client.workflow_service.set_worker_deployment_current_version(
                        request
                    )
                except RPCError as err:
                    # "too many requests issued to Worker Deployment": it settles a moment
                    # after a version registers.
                    if err.status != RPCStatusCode.RESOURCE_EXHAUSTED:
                        raise
                    await asyncio.sleep(0.2)

    async def last_close(self, build_id: str) -> datetime:
        """When the version's last run closed."""
        query = f"TemporalWorkerDeploymentVersion = '{self.attribute(build_id)}'"
        closes = [w.close_time async for w in self.client.list_workflows(query) if w.close_time]
        return max(closes)

    async def drained(self, build_id: str) -> bool:
        described = await self.describe_version(build_id)
        drainage = described.worker_deployment_version_info.drainage_info  # type: ignore[attr-defined]
        return bool(drainage.status == VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED)


def task_builds(history: WorkflowHistory) -> list[str]:
    """The build id of each workflow task the history's run completed, in order."""
    builds = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            attributes = event.workflow_task_completed_event_attributes
            builds.append(attributes.deployment_version.build_id)
    return builds


def failed_tasks(history: WorkflowHistory) -> int:
    """How many of the run's workflow tasks failed (a non-determinism error is one)."""
    failed = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    return sum(1 for event in history.events if event.event_type == failed)
