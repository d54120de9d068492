"""Observing a task's stream: typed items with global offsets, one reader per task per process.

Readers follow a task by Query only: a Query adds nothing to history and, unlike a
long-poll Update, cannot land in a task's workflow task at a moment that breaks its replay
(docs/never-stuck.md). While items flow the reader asks every 100 ms; when the task is
quiet it asks less often, up to every QUIET_INTERVAL. One reader per task is shared by all
the subscribers of a process; a subscriber asking for offsets older than the reader holds
reads them with the same Query.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.contrib.workflow_streams import PollResult, WorkflowStreamState
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.run_history import SealedReader
from waystation.client import stream_wire
from waystation.client.health import cannot_run, overview, unanswered, worker_hint
from waystation.client.task_errors import TaskNotFoundError, unreadable
from waystation.workflows.events import TERMINAL_EVENT_TYPES, AgentEvent
from waystation.workflows.stream import EVENTS_TOPIC, LlmAttemptStarted, TokenDelta

# The pace at which the LLM activity publishes token batches.
FOLLOW_INTERVAL = timedelta(milliseconds=100)
# A quiet task is asked this often at most; the first item after a quiet spell waits at
# most this long.
QUIET_INTERVAL = timedelta(milliseconds=300)
# How often a quiet reader checks whether the task closed without a terminal event.
CLOSED_CHECK = timedelta(seconds=2)
# A reader following a conversation past an answer asks Temporal this often at most
# whether the next turn has begun (a message starts it).
NEXT_TURN_INTERVAL = timedelta(seconds=1)
# A poll's deadline. A query can be lost (the SDK drops the queries buffered for a run it
# evicts) or come too late (a worker paused or starved); its items are still in the task,
# so past the deadline the reader asks again, with twice the deadline each time (up to
# LONGEST_POLL): a closed run is replayed for every query, and a long one takes a while.
POLL_TIMEOUT = timedelta(seconds=10)
LONGEST_POLL = timedelta(minutes=2)
# How the SDK and the server report a query that got no answer before its deadline.
UNANSWERED = frozenset({RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED})
# How a worker says it could not run the task's code in time to answer (the SDK's deadlock
# detector: a workflow activation that did not yield within 2 s, as on a starved machine).
WORKER_TOO_BUSY = "[TMPRL1101]"


def worker_too_busy(err: WorkflowQueryFailedError) -> bool:
    """Whether a failed query failed because its worker was too slow, not the query."""
    return WORKER_TOO_BUSY in str(err)


class StreamGap(BaseModel):
    """Offsets [start, end) were truncated away before this subscriber could read them."""

    type: Literal["gap"] = "gap"
    start: int
    end: int


StreamData = Annotated[
    AgentEvent | TokenDelta | LlmAttemptStarted | StreamGap, Field(discriminator="type")
]
_data_adapter: TypeAdapter[StreamData] = TypeAdapter(StreamData)


class StreamItem(BaseModel):
    """One item of a task's stream: an event, a token delta, a retry marker or a gap."""

    offset: int
    topic: str
    data: StreamData

    @property
    def terminal(self) -> bool:
        return self.topic == EVENTS_TOPIC and self.data.type in TERMINAL_EVENT_TYPES

    def ends(self, follow: bool) -> bool:
        """Whether a subscriber's stream ends here: after each answer, or, following the
        conversation across its turns, only when the task fails or is cancelled."""
        return self.terminal and not (follow and self.data.type == "done")


def in_sequence(
    expected: int, items: Iterable[StreamItem], follow: bool = False
) -> tuple[list[StreamItem], int]:
    """Items from offset `expected` on, in order: a gap item first where offsets jump (they
    were truncated away), repeats dropped, nothing after an item the stream ends with. Also
    returns the next offset expected."""
    batch: list[StreamItem] = []
    for item in items:
        if item.offset < expected:
            continue
        if item.offset > expected:
            gap = StreamGap(start=expected, end=item.offset)
            batch.append(StreamItem(offset=expected, topic="gap", data=gap))
        batch.append(item)
        expected = item.offset + 1
        if item.ends(follow):
            break
    return batch, expected


@dataclass
class _TaskReader:
    """The one upstream reader of a task in this process, and what it has read."""

    task_id: str
    start: int
    follow: bool = False
    items: list[StreamItem] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    finished: bool = False
    error: BaseException | None = None
    subscribers: int = 0
    task: asyncio.Task[None] | None = None
    poll_within: timedelta = POLL_TIMEOUT
    """The deadline of the last poll answered: a long closed run needs a long one each time."""
    sealed: WorkflowStreamState | None = None
    """The stream of the task's closed run `sealed_run` as it sealed it, read instead of
    asking the run."""
    sealed_run: str | None = None
    sealed_checked: bool = False

    @property
    def next_offset(self) -> int:
        return self.items[-1].offset + 1 if self.items else self.start


class StreamHub:
    """Per-process fan-out of task streams."""

    def __init__(self, client: Client, task_queue: str, sealed: SealedReader | None = None) -> None:
        """`sealed` reads what closed runs sealed as they closed (activities/run_history.py):
        a closed run's stream reads from there without a worker replaying the run."""
        self._client = client
        self._task_queue = task_queue
        self._sealed = sealed
        self._readers: dict[tuple[str, bool], _TaskReader] = {}
        self._converter: DataConverter = client.data_converter

    async def subscribe(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
        follow: bool = False,
    ) -> AsyncGenerator[StreamItem, None]:
        """Items with offset >= since, in order, each once; ends after the terminal event
        (with `follow`, only after `failed` or `cancelled`: it goes on across the
        conversation's turns, waiting for the next message after each answer).

        A task that does not exist raises TaskNotFoundError at once, or after
        `wait_for_start` if it has not started by then.
        """
        await self._await_task(task_id, wait_for_start)
        reader = self._reader(task_id, since, follow)
        wanted = set(topics) if topics else None
        offset = since
        try:
            while True:
                if offset < reader.start:
                    # Older than what the shared reader holds: read them directly.
                    read, _, _ = await self._read_through(reader, offset)
                    batch = [i for i in read if i.offset < reader.start]
                    offset = batch[-1].offset + 1 if batch else reader.start
                    done = False
                else:
                    async with reader.changed:
                        await reader.changed.wait_for(
                            lambda start=offset: reader.next_offset > start or reader.finished  # type: ignore[misc]
                        )
                        batch = [i for i in reader.items if i.offset >= offset]
                        done = reader.finished
                for item in batch:
                    offset = item.offset + 1
                    if wanted is None or item.topic in wanted or item.topic == "gap":
                        yield item
                    if item.ends(follow):
                        return
                if done and not batch:
                    if reader.error is not None:
                        raise reader.error
                    return
        finally:
            self._release(reader)

    async def head(self, task_id: str) -> int:
        """The stream's next offset (a Query: adds nothing to history)."""
        return await stream_wire.head(self._client, task_id)

    async def _await_task(self, task_id: str, wait_for_start: timedelta | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait_for_start.total_seconds() if wait_for_start else 0)
        while True:
            try:
                await overview(self._client, task_id)
                return
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
            except ValueError as err:  # its memo, encrypted with a key this side lacks
                if (problem := unreadable(task_id, err)) is not None:
                    raise problem from err
                raise
            if loop.time() >= deadline:
                waited = f" within {wait_for_start.total_seconds():g} s" if wait_for_start else ""
                raise TaskNotFoundError(task_id, f"no task with id {task_id!r}{waited}")
            await asyncio.sleep(0.2)

    def _reader(self, task_id: str, since: int, follow: bool) -> _TaskReader:
        key = (task_id, follow)
        reader = self._readers.get(key)
        # A finished reader has seen a terminal event; a task resumed since has more to say.
        if reader is None or reader.finished:
            reader = _TaskReader(task_id=task_id, start=since, follow=follow)
            self._readers[key] = reader
            reader.task = asyncio.create_task(self._pump(reader))
        reader.subscribers += 1
        return reader

    def _release(self, reader: _TaskReader) -> None:
        reader.subscribers -= 1
        if reader.subscribers > 0:
            return
        key = (reader.task_id, reader.follow)
        if self._readers.get(key) is reader:
            del self._readers[key]
        if reader.task is not None and not reader.task.done():
            reader.task.cancel()

    async def _pump(self, reader: _TaskReader) -> None:
        """Follow the task for every local subscriber until its terminal event (or its end)."""
        offset = reader.start
        loop = asyncio.get_running_loop()
        pause = FOLLOW_INTERVAL.total_seconds()
        last_check = loop.time()
        try:
            while True:
                batch, offset, more = await self._read_through(reader, offset)
                if batch:
                    async with reader.changed:
                        reader.items.extend(batch)
                        reader.changed.notify_all()
                    if batch[-1].ends(reader.follow):
                        return
                    if batch[-1].terminal:
                        # An answer, followed across turns: once its run has closed, the
                        # next turn is a new run, which only a message starts.
                        await self._next_turn(reader.task_id)
                        reader.sealed_checked = False
                        last_check = loop.time()
                        continue
                    pause = 0.0 if more else FOLLOW_INTERVAL.total_seconds()
                else:
                    pause = min(
                        pause + FOLLOW_INTERVAL.total_seconds(), QUIET_INTERVAL.total_seconds()
                    )
                    if loop.time() - last_check > CLOSED_CHECK.total_seconds():
                        last_check = loop.time()
                        status = await self._status(reader.task_id)
                        if status not in (None, WorkflowExecutionStatus.RUNNING):
                            # Read once more: the end may have been published meanwhile.
                            batch, offset, _ = await self._read_through(reader, offset)
                            async with reader.changed:
                                reader.items.extend(batch)
                                reader.changed.notify_all()
                            ended = bool(batch) and batch[-1].ends(reader.follow)
                            if ended or not reader.follow:
                                return
                            if status != WorkflowExecutionStatus.COMPLETED:
                                return  # closed without an answer a message may follow
                            await self._next_turn(reader.task_id)
                            reader.sealed_checked = False
                            last_check = loop.time()
                            continue
                await asyncio.sleep(pause)
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            reader.error = err
        finally:
            reader.finished = True
            with contextlib.suppress(RuntimeError):
                async with reader.changed:
                    reader.changed.notify_all()

    async def _next_turn(self, task_id: str) -> None:
        """After an answer: return once the task has a run that may say more, that is the
        answer's run still open (a message came as it answered) or the next turn's run.
        Asks Temporal, not a worker: a closed run answers a query only by a replay."""
        answered: str | None = None
        pause = FOLLOW_INTERVAL.total_seconds()
        while True:
            seen = await overview(self._client, task_id)
            if seen.status == WorkflowExecutionStatus.RUNNING or (
                answered is not None and seen.run_id != answered
            ):
                return
            if seen.status != WorkflowExecutionStatus.COMPLETED:
                return  # failed or cancelled since (a reset, a resume): read on
            answered = answered or seen.run_id
            await asyncio.sleep(pause)
            pause = min(pause * 2, NEXT_TURN_INTERVAL.total_seconds())

    async def _sealed_stream(self, reader: _TaskReader) -> WorkflowStreamState | None:
        """The stream the task's latest run sealed, if that run has closed and sealed it."""
        if self._sealed is None:
            return None
        seen = await overview(self._client, reader.task_id)
        if seen.status in (None, WorkflowExecutionStatus.RUNNING):
            reader.sealed_run, reader.sealed = None, None
            return None
        if seen.run_id != reader.sealed_run:
            found = await self._sealed(reader.task_id, seen.run_id)
            reader.sealed_run = seen.run_id
            reader.sealed = found.stream if found is not None else None
        return reader.sealed

    async def _status(self, task_id: str) -> WorkflowExecutionStatus | None:
        """The status of the task's latest run (a run continued as new is not the latest)."""
        return (await overview(self._client, task_id)).status

    async def _read_through(
        self, reader: _TaskReader, offset: int
    ) -> tuple[list[StreamItem], int, bool]:
        """`_read`, asked again while its query goes unanswered in time: a lost or late
        answer loses no item, and must not end a live stream. When no worker polls the task
        queue at all, NoWorkerError says so; a server that cannot be reached ends the stream
        with its error."""
        # A closed task reads its latest run's seal, asking which run that is at each read
        # (a message may have started the next); a running one is asked by query.
        if self._sealed is not None and (reader.sealed_run or not reader.sealed_checked):
            reader.sealed_checked = True
            if (stream := await self._sealed_stream(reader)) is not None:
                sealed = stream_wire.poll_sealed(stream, offset)
                return self._decoded(sealed, offset, reader.follow)
        pause = FOLLOW_INTERVAL.total_seconds()
        within = reader.poll_within
        while True:
            try:
                read = await self._read(reader.task_id, offset, within, reader.follow)
                reader.poll_within = within
                return read
            except RPCError as err:
                if err.status not in UNANSWERED:
                    raise
            if (hint := await worker_hint(self._client, self._task_queue)) is not None:
                what = "the stream's poll"
                raise unanswered(reader.task_id, what, within, self._task_queue, hint)
            await asyncio.sleep(pause)
            pause = min(pause * 2, QUIET_INTERVAL.total_seconds())
            within = min(within * 2, LONGEST_POLL)

    async def _read(
        self, task_id: str, offset: int, within: timedelta, follow: bool = False
    ) -> tuple[list[StreamItem], int, bool]:
        """One Query's worth of items from `offset`, in sequence (gaps explicit); the next
        offset; whether more are ready at once."""
        try:
            result: PollResult = await stream_wire.poll(
                self._client, task_id, offset, within=within
            )
        except (ValueError, WorkflowQueryFailedError) as err:
            if (problem := unreadable(task_id, err)) is not None:
                raise problem from err
            raise
        except RPCError as err:  # refused while the workflow task keeps failing
            if (problem := await cannot_run(self._client, task_id, err)) is not None:
                raise problem from err
            raise
        return self._decoded(result, offset, follow)

    def _decoded(
        self, result: PollResult, offset: int, follow: bool
    ) -> tuple[list[StreamItem], int, bool]:
        decode = self._converter.payload_converter.from_payload
        items = (
            StreamItem(
                offset=wire.offset,
                topic=wire.topic,
                data=_data_adapter.validate_python(decode(stream_wire.decode_data(wire.data))),
            )
            for wire in result.items
        )
        batch, offset = in_sequence(offset, items, follow)
        return batch, offset, result.more_ready
