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

from waystation.activities.conversation_store import ConversationStore
from waystation.activities.payload_codec import codec_for
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import Storage
from waystation.activities.storage.storage import SQLITE_FILE
from waystation.settings import Settings
from waystation.workflows import errors
from waystation.workflows.events import AgentEvent
from waystation.workflows.run import (
    AgentOutcome,
    ArchivedRun,
    ArchiveRequest,
    EventsRequest,
    SealedRun,
    SealRequest,
)

# Events asked per query while archiving (each answer is also capped by EVENT_PAGE_BYTES).
EVENTS_PER_QUERY = 2_000


def archive_key(workflow_id: str, run_id: str) -> str:
    """Where a run's events are kept (64 hex digits: never a 32-digit message digest)."""
    return hashlib.sha256(f"events\0{workflow_id}\0{run_id}".encode()).hexdigest()


def sealed_key(workflow_id: str, run_id: str) -> str:
    """Where a closed run's seal is kept."""
    return hashlib.sha256(f"sealed\0{workflow_id}\0{run_id}".encode()).hexdigest()


class EventArchive:
    """Closed runs' events, and what each closed run left for readers (its seal), by run,
    over sealed blobs."""

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

    async def seal(self, sealed: SealedRun, events: ArchivedRun | None) -> None:
        """Keep a closing run's seal (and its events), in one write."""
        blobs = {sealed_key(sealed.workflow_id, sealed.run_id): sealed.model_dump_json().encode()}
        if events is not None:
            key = archive_key(events.workflow_id, events.run_id)
            blobs[key] = events.model_dump_json().encode()
        await self._blobs.put(blobs)

    async def sealed(self, workflow_id: str, run_id: str) -> SealedRun | None:
        """What closed run `run_id` left for readers, or None if it left nothing (a run
        recorded before seals, a seal that failed, pruned storage)."""
        key = sealed_key(workflow_id, run_id)
        found = (await self._blobs.get([key])).get(key)
        if found is None:
            return None
        sealed = SealedRun.model_validate_json(found)
        return sealed if (sealed.workflow_id, sealed.run_id) == (workflow_id, run_id) else None


class ArchiveActivities:
    def __init__(self, archive: EventArchive, conversations: ConversationStore) -> None:
        self._archive = archive
        self._conversations = conversations

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

    @activity.defn(name="seal_run")
    async def seal_run(self, request: SealRequest) -> None:
        """Keep what the closing run (a local activity of it) leaves for readers."""
        info = activity.info()
        workflow_id, run_id = info.workflow_id or "", info.workflow_run_id or ""
        sealed = SealedRun(
            workflow_id=workflow_id,
            run_id=run_id,
            continuation=request.continuation,
            result=request.result,
            stream=request.stream,
        )
        events = None
        if request.events:
            events = ArchivedRun(
                workflow_id=workflow_id,
                run_id=run_id,
                first_seq=request.first_seq,
                last_seq=request.events[-1].seq,
                events=request.events,
            )
        # Its messages first: a follow-up reads the conversation from the store once it
        # finds the seal.
        await self._conversations.put(request.messages)
        await self._archive.seal(sealed, events if events and events.complete() else None)


async def read_archived(settings: Settings, workflow_id: str, run_id: str) -> ArchivedRun | None:
    """A closed run's events from the settings' storage, for a reader outside the worker:
    None if they are not kept there, or this machine has no storage of the workers'."""
    storage = Storage.from_settings(settings)
    if storage.kind == "sqlite" and not (settings.data_dir / SQLITE_FILE).exists():
        return None  # no worker stores here: never create an empty storage just to read
    async with storage:
        archive = EventArchive(SealedBlobs(storage.blobs, codec_for(settings, "client")))
        return await archive.get(workflow_id, run_id)


async def read_sealed(settings: Settings, workflow_id: str, run_id: str) -> SealedRun | None:
    """What a closed run sealed as it closed, from the settings' storage, for a reader
    outside the worker: None if it is not kept there, or this machine has no storage of the
    workers'."""
    storage = Storage.from_settings(settings)
    if storage.kind == "sqlite" and not (settings.data_dir / SQLITE_FILE).exists():
        return None  # no worker stores here: never create an empty storage just to read
    async with storage:
        archive = EventArchive(SealedBlobs(storage.blobs, codec_for(settings, "client")))
        return await archive.sealed(workflow_id, run_id)
