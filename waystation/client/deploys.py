"""A Worker Deployment's versions as an operator rolls them out: what each one serves
(`deployment_status`), which one new tasks start on (`promote`, `rollback`) and removing a
version nothing needs any more (`retire`).

The Python SDK has no high-level API for deployments: these call Temporal's
WorkflowService directly (DescribeWorkerDeployment, SetWorkerDeploymentCurrentVersion,
SetWorkerDeploymentRampingVersion, DeleteWorkerDeploymentVersion).

Temporal counts no task pinned to a version; visibility does, on its own search attributes
(`TemporalWorkerDeploymentVersion`, whose value is `deployment:build_id`), split here by
waystation's `AgentStatus`. A version's live workers are its pollers as Temporal lists them
on the version's task queues, which is also what Temporal refuses a deletion on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as VersionRef
from temporalio.api.enums.v1 import TaskQueueType, WorkerDeploymentVersionStatus
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DeleteWorkerDeploymentVersionRequest,
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentRampingVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.storage.deployment import OFFER_TAG, STORAGE_TAG
from waystation.client.pollers import RECENT_POLL, serving
from waystation.client.worker_versions import code_build_id, make_current
from waystation.workflows import search
from waystation.workflows.run import WORKFLOW_TYPE

VersionState = Literal["current", "ramping", "draining", "drained", "inactive"]
_STATES: dict[int, VersionState] = {
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_CURRENT: "current",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_RAMPING: "ramping",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINING: "draining",
    WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_DRAINED: "drained",
}
# The AgentStatus values of a run that waits for a person, and of one whose turn has ended
# (its answer given or its failure recorded) while the run is still open: parked between turns.
WAITING_FOR_A_PERSON = ("waiting_approval", "waiting_input")
PARKED_BETWEEN_TURNS = ("done", "failed", "cancelled")
_QUEUE_TYPES = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)


class DeployRefusedError(Exception):
    """A deploy command that would leave tasks stuck or lost, or names no version: one
    sentence, nothing changed."""


class PinnedTasks(BaseModel):
    """Open runs pinned to a version (a notification's run counts as running)."""

    waiting: int = 0
    running: int = 0
    parked: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.waiting + self.running + self.parked

    def described(self) -> str:
        return (
            f"{self.waiting} waiting for a person, {self.running} running, "
            f"{self.parked} parked between turns"
        )


class VersionStatus(BaseModel):
    """One version of the deployment, as `ws deploy status` shows it."""

    build_id: str
    state: VersionState
    ramp_percentage: float | None = None
    workers: list[str]
    pinned: PinnedTasks
    this_code: bool
    answered_runs: int = Field(
        description="Closed agent runs that answered on this version: a follow-up to one asks "
        "the closed run for its state, a query Temporal sends to this version's workers only."
    )
    retirable: bool
    why_not_retirable: str | None = None


class DeploymentStatus(BaseModel):
    deployment: str
    code_build_id: str
    current: str | None
    ramping: str | None
    ramp_percentage: float | None
    versions: list[VersionStatus]


def version_value(deployment: str, build_id: str) -> str:
    """A version as its search attribute holds it (a colon, where the SDK's string has a dot)."""
    return f"{deployment}:{build_id}"


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def pinned_query(deployment: str, build_id: str) -> str:
    """Visibility's filter for the open runs pinned to a version."""
    return (
        f"TemporalWorkerDeploymentVersion = {_quoted(version_value(deployment, build_id))}"
        " AND TemporalWorkflowVersioningBehavior = 'Pinned' AND ExecutionStatus = 'Running'"
    )


def _status_in(statuses: tuple[str, ...]) -> str:
    return f"{search.AGENT_STATUS.name} IN ({', '.join(_quoted(s) for s in statuses)})"


async def pinned_tasks(client: Client, deployment: str, build_id: str) -> PinnedTasks:
    pinned = pinned_query(deployment, build_id)
    total, waiting, parked = await asyncio.gather(
        client.count_workflows(pinned),
        client.count_workflows(f"{pinned} AND {_status_in(WAITING_FOR_A_PERSON)}"),
        client.count_workflows(f"{pinned} AND {_status_in(PARKED_BETWEEN_TURNS)}"),
    )
    return PinnedTasks(
        waiting=waiting.count,
        parked=parked.count,
        running=max(total.count - waiting.count - parked.count, 0),
    )


async def answered_runs(client: Client, deployment: str, build_id: str) -> int:
    """Agent runs that completed on a version (a follow-up's `continuation` query goes there)."""
    value = _quoted(version_value(deployment, build_id))
    counted = await client.count_workflows(
        f"TemporalWorkerDeploymentVersion = {value} AND ExecutionStatus = 'Completed'"
        f" AND WorkflowType = {_quoted(WORKFLOW_TYPE)}"
    )
    return counted.count


async def _version_queues(client: Client, deployment: str, build_id: str) -> list[str] | None:
    """The task queues a version's workers poll; None when Temporal knows no such version."""
    try:
        described = await client.workflow_service.describe_worker_deployment_version(
            DescribeWorkerDeploymentVersionRequest(
                namespace=client.namespace,
                deployment_version=VersionRef(deployment_name=deployment, build_id=build_id),
            )
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    queues = described.worker_deployment_version_info.task_queue_infos
    return sorted({queue.name for queue in queues})


async def live_workers(client: Client, deployment: str, build_id: str) -> list[str]:
    """Identities of the workers of a version that Temporal lists as polling lately."""
    found: set[str] = set()
    now = datetime.now(UTC)
    for queue in await _version_queues(client, deployment, build_id) or []:
        for kind in _QUEUE_TYPES:
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=queue),
                    task_queue_type=kind,
                )
            )
            for poller in described.pollers:
                options = poller.deployment_options
                if (options.deployment_name, options.build_id) != (deployment, build_id):
                    continue
                recent = (
                    not poller.HasField("last_access_time")
                    or now - poller.last_access_time.ToDatetime(tzinfo=UTC) < RECENT_POLL
                )
                if recent and serving(poller.identity, this_process=True):
                    # The tags a worker adds for other workers (its storage, its offer).
                    found.add(poller.identity.partition(STORAGE_TAG)[0].partition(OFFER_TAG)[0])
    return sorted(found)


async def _describe(client: Client, deployment: str) -> DescribeWorkerDeploymentResponse | None:
    try:
        return await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


def _why_not_retirable(
    state: VersionState, pinned: PinnedTasks, workers: list[str], build_id: str
) -> str | None:
    if state in ("current", "ramping"):
        verb = "is current" if state == "current" else "is ramping"
        return f"version {build_id} {verb}: promote another version first"
    if pinned.total:
        return (
            f"{pinned.total} tasks are still pinned to version {build_id} "
            f"({pinned.described()}): retire it once they have ended"
        )
    if workers:
        return f"{len(workers)} workers of version {build_id} still poll: stop them first"
    if state == "draining":
        return (
            f"Temporal still counts version {build_id} draining (it re-checks now and then, "
            "and keeps a closed task's version a while for queries): try again later"
        )
    return None


async def deployment_status(client: Client, deployment: str) -> DeploymentStatus:
    """Every version of `deployment`, newest first, with its workers and pinned tasks."""
    described = await _describe(client, deployment)
    routing = described.worker_deployment_info.routing_config if described else None
    current = routing.current_deployment_version.build_id or None if routing else None
    ramping = routing.ramping_deployment_version.build_id or None if routing else None
    ramp = routing.ramping_version_percentage if routing and ramping else None
    summaries = sorted(
        described.worker_deployment_info.version_summaries if described else [],
        key=lambda summary: summary.create_time.ToNanoseconds(),
        reverse=True,
    )

    async def version(build_id: str, status: int) -> VersionStatus:
        state = _STATES.get(status, "inactive")
        pinned, workers, answered = await asyncio.gather(
            pinned_tasks(client, deployment, build_id),
            live_workers(client, deployment, build_id),
            answered_runs(client, deployment, build_id),
        )
        why_not = _why_not_retirable(state, pinned, workers, build_id)
        return VersionStatus(
            answered_runs=answered,
            build_id=build_id,
            state=state,
            ramp_percentage=ramp if state == "ramping" else None,
            workers=workers,
            pinned=pinned,
            this_code=build_id == code_build_id(),
            retirable=why_not is None,
            why_not_retirable=why_not,
        )

    versions = await asyncio.gather(
        *(version(s.deployment_version.build_id, s.status) for s in summaries)
    )
    return DeploymentStatus(
        deployment=deployment,
        code_build_id=code_build_id(),
        current=current,
        ramping=ramping,
        ramp_percentage=ramp,
        versions=list(versions),
    )


async def _require_live_workers(client: Client, deployment: str, build_id: str) -> None:
    if await _version_queues(client, deployment, build_id) is None:
        raise DeployRefusedError(
            f"deployment {deployment} has no version {build_id} (a version appears once one of "
            "its workers polls: `ws deploy status` lists them)"
        )
    if not await live_workers(client, deployment, build_id):
        raise DeployRefusedError(
            f"no live worker of version {build_id} polls: start its workers first (Temporal "
            "would accept it, and new tasks would wait for one)"
        )


# How long a routing change is tried again while the server is busy with the deployment
# (it refuses requests for a moment after a version registers) or another change came
# between our description and our change (a stale conflict token).
BUSY_SECONDS = 15.0


async def _again_while_busy(change: Callable[[], Awaitable[str]]) -> str:
    deadline = asyncio.get_running_loop().time() + BUSY_SECONDS
    while True:
        try:
            return await change()
        except RPCError as err:
            busy = err.status == RPCStatusCode.RESOURCE_EXHAUSTED or (
                err.status == RPCStatusCode.FAILED_PRECONDITION and "conflict token" in err.message
            )
            if not busy or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.5)


async def promote(client: Client, deployment: str, build_id: str, ramp: float | None) -> str:
    """Make `build_id` current, or ramp it at `ramp` percent of new tasks; what was done."""
    return await _again_while_busy(lambda: _promote(client, deployment, build_id, ramp))


async def _promote(client: Client, deployment: str, build_id: str, ramp: float | None) -> str:
    described = await _describe(client, deployment)
    routing = described.worker_deployment_info.routing_config if described else None
    current = routing.current_deployment_version.build_id or None if routing else None
    ramping = routing.ramping_deployment_version.build_id or None if routing else None
    if ramp is None and build_id == current and ramping is None:
        return f"version {build_id} is current already; nothing changed"
    if ramp is not None and build_id == current:
        raise DeployRefusedError(
            f"version {build_id} is current already: a ramp is for a version that is not"
        )
    await _require_live_workers(client, deployment, build_id)
    token = described.conflict_token if described else b""
    before = f"before: {current}" if current else "before: none"
    if ramp is None:
        await make_current(client, deployment, build_id, token)
        return f"version {build_id} is current now: new tasks start on it ({before})"
    previous = await client.workflow_service.set_worker_deployment_ramping_version(
        SetWorkerDeploymentRampingVersionRequest(
            namespace=client.namespace,
            deployment_name=deployment,
            build_id=build_id,
            percentage=ramp,
            conflict_token=token,
            identity=client.identity,
        )
    )
    ramped_before = previous.previous_deployment_version.build_id
    earlier = f"; ramping before: {ramped_before}" if ramped_before else ""
    return (
        f"version {build_id} ramps now: {ramp:g}% of new tasks start on it, the rest on "
        f"{current or 'unversioned workers'} ({before}{earlier})"
    )


def previous_current(described: DescribeWorkerDeploymentResponse) -> str | None:
    """The version that was current before the current one: of the other versions, the one
    Temporal saw current last (each version summary's `last_current_time`)."""
    info = described.worker_deployment_info
    current = info.routing_config.current_deployment_version.build_id
    earlier = [
        summary
        for summary in info.version_summaries
        if summary.deployment_version.build_id != current and summary.HasField("last_current_time")
    ]
    if not earlier:
        return None
    latest = max(earlier, key=lambda summary: summary.last_current_time.ToNanoseconds())
    return latest.deployment_version.build_id


async def rollback(client: Client, deployment: str) -> str:
    """Stop a ramp in progress, or else make the version that was current before the
    current one current again."""
    return await _again_while_busy(lambda: _rollback(client, deployment))


async def _rollback(client: Client, deployment: str) -> str:
    described = await _describe(client, deployment)
    routing = described.worker_deployment_info.routing_config if described else None
    if (
        described is not None
        and routing is not None
        and routing.ramping_deployment_version.build_id
    ):
        # An empty version at 0% ends the ramp; the current version's workers serve anyway.
        await client.workflow_service.set_worker_deployment_ramping_version(
            SetWorkerDeploymentRampingVersionRequest(
                namespace=client.namespace,
                deployment_name=deployment,
                build_id="",
                percentage=0,
                conflict_token=described.conflict_token,
                identity=client.identity,
            )
        )
        return (
            f"rolled back the ramp: version {routing.ramping_deployment_version.build_id} no "
            f"longer takes new tasks (it took {routing.ramping_version_percentage:g}%); "
            f"{routing.current_deployment_version.build_id or 'the unversioned workers'} "
            "takes them all again"
        )
    previous = previous_current(described) if described else None
    if described is None or previous is None:
        raise DeployRefusedError(
            f"no version of deployment {deployment} was current before this one: nothing to "
            "roll back to"
        )
    current = described.worker_deployment_info.routing_config.current_deployment_version.build_id
    await _require_live_workers(client, deployment, previous)
    await make_current(client, deployment, previous, described.conflict_token)
    return (
        f"rolled back: version {previous} is current again, new tasks start on it (before: "
        f"{current}; its tasks stay on it until they end)"
    )


async def retire(client: Client, deployment: str, build_id: str) -> str:
    """Delete a version from the deployment, once nothing runs on it or may come back to it."""
    described = await _describe(client, deployment)
    summary = next(
        (
            s
            for s in (described.worker_deployment_info.version_summaries if described else [])
            if s.deployment_version.build_id == build_id
        ),
        None,
    )
    if summary is None:
        raise DeployRefusedError(
            f"deployment {deployment} has no version {build_id} (`ws deploy status` lists them)"
        )
    state = _STATES.get(summary.status, "inactive")
    pinned, workers = await asyncio.gather(
        pinned_tasks(client, deployment, build_id), live_workers(client, deployment, build_id)
    )
    why_not = _why_not_retirable(state, pinned, workers, build_id)
    if why_not is not None:
        raise DeployRefusedError(why_not)
    try:
        await client.workflow_service.delete_worker_deployment_version(
            DeleteWorkerDeploymentVersionRequest(
                namespace=client.namespace,
                deployment_version=VersionRef(deployment_name=deployment, build_id=build_id),
                identity=client.identity,
            )
        )
    except RPCError as err:
        if err.status != RPCStatusCode.FAILED_PRECONDITION:
            raise
        # What Temporal saw before this side did: a state changed since, or its own view.
        raise DeployRefusedError(
            f"Temporal refused to retire version {build_id}: {err.message}"
        ) from None
    return f"version {build_id} of deployment {deployment} is retired (deleted from Temporal)"
