"""The first version of a Worker Deployment becomes current by itself.

Until a deployment has a current version, Temporal gives new runs to no versioned worker:
they wait. So a worker that starts when its deployment has none makes its own version
current, once the server knows the version (about a second after the worker's first
poll). So does a worker whose task queue no worker of the current version polls any more
(all stopped: a deploy that replaced them, or a new build of the code on a laptop), since
new runs would wait for them forever. A worker whose deployment has another current
version, still served, serves only the runs pinned to its own version; `ws deploy promote`
moves new runs to it. Either way the worker says in one sentence where its version stands
(`ws worker` prints it).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio.api.deployment.v1 import RoutingConfig
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeWorkerDeploymentRequest,
)
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode

from waystation.client.worker_versions import make_current

# How often to ask whether the server knows the version yet (it does ~1.2 s after the first
# poll), and for how long before giving up: a worker whose version never appears says so.
RETRY_SECONDS = 0.5
GIVE_UP_SECONDS = 60.0
# The server's answers to try again on: the version or deployment is not recorded yet,
# another worker changed the routing between our describe and our set (a stale conflict
# token), or the deployment takes too many requests at once (several workers starting).
_TRY_AGAIN = {
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.RESOURCE_EXHAUSTED,
}
# A live worker renews its poll at least every ~70 s: one not seen for longer is gone
# (the server forgets it after its poller history's TTL anyway: 5 min, 10 s on dev servers).
RECENT_POLL = timedelta(seconds=90)


def current_build_id(routing: RoutingConfig) -> str | None:
    """The build id of the deployment's current version; None while it has none."""
    if routing.HasField("current_deployment_version"):
        return routing.current_deployment_version.build_id or None
    return None


async def become_current_if_none(
    client: Client, version: WorkerDeploymentVersion, task_queue: str, identity: str
) -> str | None:
    """Make `version` its deployment's current version if the deployment has none, or if
    no worker of the current one polls `task_queue` and `version` was never current (a new
    build, not an old one coming back). One sentence saying where the version
    stands; None when it was current already or on a server without Worker Versioning
    (Temporal's time-skipping test server)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GIVE_UP_SECONDS
    ours = version.build_id
    while True:
        try:
            return await _settle_current(client, version, task_queue, identity)
        except RPCError as err:
            # Temporal's time-skipping test server (the testing kit's) has no deployment
            # API, but takes versioned workers' polls and completions like unversioned
            # ones: every run there goes to any worker, so there is nothing to make current.
            if err.status == RPCStatusCode.UNIMPLEMENTED:
                return None
            if err.status not in _TRY_AGAIN or loop.time() > deadline:
                return (
                    f"could not make version {ours} of deployment "
                    f"{version.deployment_name!r} current: {err.message}"
                )
        await asyncio.sleep(RETRY_SECONDS)


async def _settle_current(
    client: Client, version: WorkerDeploymentVersion, task_queue: str, identity: str
) -> str | None:
    """One attempt: raises RPCError NOT_FOUND while the server does not know the version,
    FAILED_PRECONDITION when another worker changed the routing meanwhile."""
    deployment, ours = version.deployment_name, version.build_id
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    current = current_build_id(described.worker_deployment_info.routing_config)
    if current == ours:
        return None
    if current is not None and await _polled_by(client, task_queue, deployment, current):
        return (
            f"version {ours} is not current (current: {current}): serving the tasks "
            f"pinned to it; `ws deploy promote {ours}` to make it current"
        )
    summaries = {
        summary.deployment_version.build_id: summary
        for summary in described.worker_deployment_info.version_summaries
    }
    if ours not in summaries:
        raise RPCError("the version is not recorded yet", RPCStatusCode.NOT_FOUND, b"")
    if current is not None and summaries[ours].HasField("last_current_time"):
        # It was current once and someone moved on from it (a promote, a rollback): an old
        # build's worker coming back must not undo that, however long the new one's workers
        # are away.
        return (
            f"version {ours} is not current (current: {current}, whose workers do not poll "
            f"task queue {task_queue!r} now): serving the tasks pinned to it; "
            f"`ws deploy promote {ours}` to make it current again"
        )
    await make_current(client, deployment, ours, described.conflict_token, identity)
    became = f"version {ours} is now the current version of deployment {deployment!r}"
    if current is None:
        return f"{became} (it had none)"
    return (
        f"{became}: no worker "
        f"of version {current} polls task queue {task_queue!r} (its pinned tasks wait for one)"
    )


async def _polled_by(client: Client, task_queue: str, deployment: str, build_id: str) -> bool:
    """Whether a worker of that version polled the task queue lately."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    now = datetime.now(UTC)
    return any(
        poller.deployment_options.deployment_name == deployment
        and poller.deployment_options.build_id == build_id
        and (
            not poller.HasField("last_access_time")  # a server that does not say: recent
            or now - poller.last_access_time.ToDatetime(tzinfo=UTC) < RECENT_POLL
        )
        for poller in response.pollers
    )
