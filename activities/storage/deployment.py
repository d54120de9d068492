"""Start checks that keep exactly-once true across machines.

A deployment is one storage (its random id is created with the schema) and one workspace.
Workers on several machines must share both: the storage on PostgreSQL, the workspace on
shared storage. A worker refuses to start when
- its workspace holds another deployment's marker (`.waystation-deployment`),
- on PostgreSQL, its workspace is not the one the deployment's other workers registered
  (a per-machine folder instead of the shared volume),
- on SQLite (one machine's file), workers on another host poll its task queue.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.storage.errors import DeploymentMismatchError
from activities.storage.storage import Storage
from runtime.commands import command

logger = logging.getLogger("waystation.storage")
MARKER = ".waystation-deployment"
# A live poller polls again within a minute (the server ends a long poll after one); one
# not seen for this long is gone, though the server lists it for a few minutes more.
LIVE_POLLER_SECONDS = 120.0


@dataclass(frozen=True)
class WorkspaceMarker:
    deployment: str
    workspace: str
    """A random id of this workspace folder: the same on every machine that shares it."""


def _read_marker(path: Path) -> WorkspaceMarker:
    try:
        data = json.loads(path.read_text())
        return WorkspaceMarker(deployment=str(data["deployment"]), workspace=str(data["workspace"]))
    except (ValueError, KeyError, TypeError) as err:
        raise DeploymentMismatchError(
            f"the workspace marker {path} is unreadable ({err}); delete it if this workspace "
            "belongs to no other deployment"
        ) from None


def workspace_marker(workspace: Path, deployment_id: str) -> WorkspaceMarker:
    """The workspace's marker, created for `deployment_id` if it has none."""
    workspace.mkdir(parents=True, exist_ok=True)
    path = workspace / MARKER
    if path.exists():
        return _read_marker(path)
    marker = WorkspaceMarker(deployment=deployment_id, workspace=uuid.uuid4().hex)
    draft = workspace / f"{MARKER}.{uuid.uuid4().hex[:8]}.tmp"
    draft.write_text(json.dumps({"deployment": marker.deployment, "workspace": marker.workspace}))
    try:
        os.link(draft, path)  # atomic, and fails if a worker starting with us made it first
    except FileExistsError:
        return _read_marker(path)
    finally:
        draft.unlink()
    return marker


async def check_workspace(storage: Storage, workspace: Path) -> WorkspaceMarker:
    """Refuse a workspace that is not this deployment's (see the module's docstring)."""
    marker = workspace_marker(workspace, storage.deployment_id)
    if marker.deployment != storage.deployment_id:
        raise DeploymentMismatchError(
            f"the workspace {workspace} belongs to another deployment ({marker.deployment}) "
            f"than this worker's storage ({storage.location}, deployment "
            f"{storage.deployment_id}): workers that share a workspace must share the storage "
            "(the same WAYSTATION_DATABASE_URL, or on one machine the same WAYSTATION_DATA_DIR)"
        )
    if storage.kind == "postgresql":
        registered = await storage.backend.register_workspace(marker.workspace)
        if registered != marker.workspace:
            raise DeploymentMismatchError(
                f"the workspace {workspace} is not the one the other workers of deployment "
                f"{storage.deployment_id} use: workers on several machines must share one "
                "workspace (mount the same shared volume at WAYSTATION_WORKSPACE); if it "
                f"replaces the old one on purpose, run `{command('storage', 'forget-workspace')}` "
                "first"
            )
    return marker


def host_of(identity: str) -> str | None:
    """The host of a Temporal identity `pid@host` (None when it does not say)."""
    pid, at, host = identity.rpartition("@")
    return host if at and pid and host else None


async def hosts_polling(client: Client, task_queue: str) -> set[str]:
    """The hosts of the workers that polled `task_queue` lately, as their identities say."""
    hosts: set[str] = set()
    now = time.time()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        response = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                task_queue_type=kind,
            )
        )
        for poller in response.pollers:
            seen = now
            if poller.HasField("last_access_time"):
                seen = poller.last_access_time.ToSeconds()
            host = host_of(poller.identity)
            if host is not None and now - seen < LIVE_POLLER_SECONDS:
                hosts.add(host)
    return hosts


async def check_single_machine(storage: Storage, client: Client, task_queue: str) -> None:
    """On SQLite, refuse to join a task queue that workers on another host serve."""
    if storage.kind != "sqlite":
        return
    here = host_of(client.identity) or socket.gethostname()
    try:
        others = sorted((await hosts_polling(client, task_queue)) - {here})
    except RPCError as err:  # e.g. a key without the right to describe task queues
        logger.warning("could not list the pollers of %r: %s", task_queue, err)
        return
    if others:
        raise DeploymentMismatchError(
            f"workers on another machine ({', '.join(others)}) serve task queue "
            f"{task_queue!r}, and this worker's storage is {storage.location}, which only "
            "this machine sees: set WAYSTATION_DATABASE_URL to one PostgreSQL database on "
            "every worker (and share the workspace) so tool calls stay exactly-once"
        )
