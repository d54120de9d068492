"""Closed runs' events, kept so reading a long task's log needs no replay.

A run's events live in its workflow's memory; a closed run answers the `events` query only
after a worker replays its whole history (seconds for a run near the hand-over size).
So a run stores its events here as it hands over (and a large last run as it ends), and
readers take a closed run's events from here, falling back to the query when they are
absent (pruned, older runs, a reader without access to the storage). The events are read
from the run itself by query, never passed as activity input: they are not written to
history twice.
"""

from __future__ import annotations

import hashlib

from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError

from waystation.activities.payload_codec import codec_for
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import Storage
from waystation.activities.storage.storage import SQLITE_FILE
from waystation.settings import Settings
from waystation.workflows import errors
from waystation.workflows.events import AgentEvent
from waystation.workflows.run import AgentOutcome, ArchivedRun, ArchiveRequest, EventsRequest

# Events asked per query while archiving (each answer is also capped by EVENT_PAGE_BYTES).
EVENTS_PER_QUERY = 2_000


def archive_key(workflow_id: str, run_id: str) -> str:
    """Where a run's events are kept (64 hex digits: never a 32-digit message digest)."""
    return hashlib.sha256(f"events\0{workflow_id}\0{run_id}".encode()).hexdigest()


class EventArchive:
    """Closed runs' events by run, over sealed blobs."""

    def __init__(self, blobs: SealedBlobs) -> None:
        self._blobs = blobs

    async def put(self, run: ArchivedRun) -> None:
        key = archive_key(run.workflow_id, run.run_id)
        await self._blobs.put({key: run.model_dump_json().encode()})

    async def get(self, workflow_id: str, run_id: str) -> ArchivedRun | None:
        """The run's events, or None if they are not kept (or what is kept is not whole)."""
        key = archive_key(workflow_id, run_id)
        found = (await self._blobs.get([key])).get(key)
        if found is None:
            return None
        run = ArchivedRun.model_validate_json(found)
        if (run.workflow_id, run.run_id) != (workflow_id, run_id) or not run.complete():
            return None
        return run


class ArchiveActivities:
    def __init__(self, archive: EventArchive) -> None:
        self._archive = archive

    @activity.defn(name="archive_events")
    async def archive_events(self, request: ArchiveRequest) -> None:
        """Store the calling run's events first_seq..last_seq, read from the run by query."""
        from waystation.workflows.agent import AgentWorkflow  # the workflow module imports this one

        info = activity.info()
        workflow_id, run_id = info.workflow_id or "", info.workflow_run_id or ""
        handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            activity.client().get_workflow_handle_for(AgentWorkflow.run, workflow_id, run_id=run_id)
        )
        events: list[AgentEvent] = []
        since = request.first_seq
        while since <= request.last_seq:
            page = await handle.query(
                AgentWorkflow.events, EventsRequest(since=since, limit=EVENTS_PER_QUERY)
            )
            fresh = [e for e in page.events if e.seq <= request.last_seq]
            if not fresh:
                raise ApplicationError(
                    f"the run's events end before seq {since} (expected up to {request.last_seq})",
                    type=errors.ARCHIVE_INCOMPLETE,
                    non_retryable=True,
                )
            events += fresh
            since = fresh[-1].seq + 1
        run = ArchivedRun(
            workflow_id=workflow_id,
            run_id=run_id,
            first_seq=request.first_seq,
            last_seq=request.last_seq,
            events=events,
        )
        await self._archive.put(run)


async def read_archived(settings: Settings, workflow_id: str, run_id: str) -> ArchivedRun | None:
    """A closed run's events from the settings' storage, for a reader outside the worker:
    None if they are not kept there, or this machine has no storage of the workers'."""
    storage = Storage.from_settings(settings)
    if storage.kind == "sqlite" and not (settings.data_dir / SQLITE_FILE).exists():
        return None  # no worker stores here: never create an empty storage just to read
    async with storage:
        archive = EventArchive(SealedBlobs(storage.blobs, codec_for(settings, "client")))
        return await archive.get(workflow_id, run_id)
