"""Start checks that keep exactly-once true across machines.

A deployment is one storage (its random id is created with the schema) and one workspace.
Workers on several machines must share both: the storage on PostgreSQL, the workspace on
shared storage. A worker refuses to start when
- its workspace holds another deployment's marker (`.waystation-deployment`),
- on PostgreSQL, its workspace is not the one the deployment's other workers registered
  (a per-machine folder instead of the shared volume),
- its task queue is served by workers that keep their ledger elsewhere: on SQLite (one
  machine's file), workers on another host or on PostgreSQL; on PostgreSQL, workers on
  SQLite. A worker's Temporal identity names its storage (`pid@host storage=sqlite`), and
  a worker on SQLite checks again while it runs, so a worker that joined in the same
  moment, or one too old to check, stops it instead of sharing the queue.
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
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.storage.errors import DeploymentMismatchError
from waystation.activities.storage.storage import Storage
from waystation.settings.commands import command

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


STORAGE_TAG = " storage="
# After the storage tag: the digest of what the worker offers (activities/worker_offer.py).
OFFER_TAG = " offer="
# How often a worker on SQLite looks again at who serves its task queue: tool calls run on
# a worker that shares the queue with another ledger at most this long before it stops.
QUEUE_CHECK_SECONDS = 10.0


def worker_identity(identity: str, kind: str) -> str:
    """A worker's Temporal identity naming its storage, so other workers can tell theirs."""
    return f"{identity}{STORAGE_TAG}{kind}"


@dataclass(frozen=True)
class Poller:
    """A worker that took (or waits for) tool calls of a task queue lately."""

    identity: str
    host: str | None
    storage: str | None
    """The storage its identity names; None from a worker that does not say (another
    version, another program)."""


def host_of(identity: str) -> str | None:
    """The host of a Temporal identity `pid@host` (None when it does not say)."""
    pid, at, host = identity.rpartition("@")
    return host if at and pid and host else None


def poller_of(identity: str) -> Poller:
    base, tag, kind = identity.partition(OFFER_TAG)[0].rpartition(STORAGE_TAG)
    if not tag or not kind:
        return Poller(identity, host_of(identity), None)
    return Poller(identity, host_of(base), kind)


async def pollers_of(client: Client, task_queue: str) -> list[Poller]:
    """The workers that polled `task_queue` for activities (tool and model calls) lately. A
    worker that only takes workflow tasks (a command's own) touches no ledger."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    now = time.time()
    found = []
    for poller in response.pollers:
        seen = now
        if poller.HasField("last_access_time"):
            seen = poller.last_access_time.ToSeconds()
        if now - seen < LIVE_POLLER_SECONDS:
            found.append(poller_of(poller.identity))
    return found


async def hosts_polling(client: Client, task_queue: str) -> set[str]:
    """The hosts of the workers that polled `task_queue` for activities lately."""
    return {p.host for p in await pollers_of(client, task_queue) if p.host is not None}


def _elsewhere(storage: Storage, here: str, pollers: list[Poller], queue: str) -> str | None:
    """Why the workers in `pollers` cannot share this worker's ledger, or None if they can."""
    mine = f"this worker's storage is {storage.location}"
    if storage.kind == "sqlite":
        hosts = sorted({p.host for p in pollers if p.host is not None and p.host != here})
        if hosts:
            return (
                f"workers on another machine ({', '.join(hosts)}) serve task queue {queue!r}, "
                f"and {mine}, which only this machine sees"
            )
        shared = sorted(p.identity for p in pollers if p.storage == "postgresql")
        if shared:
            return (
                f"workers on PostgreSQL ({', '.join(shared)}) serve task queue {queue!r}, "
                f"and {mine}, which they do not see"
            )
        return None
    local = sorted(p.identity for p in pollers if p.storage == "sqlite")
    if local:
        return (
            f"workers on SQLite, their own machine's file ({', '.join(local)}), serve task "
            f"queue {queue!r}, and {mine}, which they do not see (Temporal lists a worker "
            f"that stopped for {LIVE_POLLER_SECONDS / 60:g} minutes more)"
        )
    return None


async def check_task_queue(storage: Storage, client: Client, task_queue: str) -> bool:
    """Refuse a task queue whose workers keep their ledger elsewhere (DeploymentMismatchError);
    False when Temporal does not say who polls it (the check could not be made)."""
    here = host_of(client.identity) or socket.gethostname()
    try:
        pollers = await pollers_of(client, task_queue)
    except RPCError as err:  # e.g. a key without the right to describe task queues
        # The time-skipping test server has no such method: nothing a user should fix.
        unanswerable = err.status == RPCStatusCode.UNIMPLEMENTED
        logger.log(
            logging.DEBUG if unanswerable else logging.WARNING,
            "could not list the pollers of %r: %s",
            task_queue,
            err,
        )
        return False
    reason = _elsewhere(storage, here, pollers, task_queue)
    if reason is not None:
        raise DeploymentMismatchError(
            f"{reason}: set WAYSTATION_DATABASE_URL to one PostgreSQL database on every "
            "worker (and share the workspace) so tool calls stay exactly-once"
        )
    return True
