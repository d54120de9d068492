"""Observing a task's stream: typed items with global offsets, one upstream poll per task.

A long-poll Update parked by a subscriber cannot be cancelled when the subscriber
leaves, so a process fans one upstream subscription per task out to all its local
subscribers. A subscriber asking for offsets the shared reader has not buffered reads
them with the stream's poll Query, which adds nothing to history.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.contrib.workflow_streams import (
    PollInput,
    PollResult,
    WorkflowStreamClient,
)
from temporalio.contrib.workflow_streams._types import (
    STREAM_DRAINING_ERROR_TYPE,
    TRUNCATED_OFFSET_ERROR_TYPE,
    _decode_payload,
)
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode

from workflows.events import (
    TERMINAL_EVENT_TYPES,
    Action,
    ApprovalRequested,
    ApprovalResolved,
    Cancelled,
    ContextCompacted,
    Done,
    ErrorEvent,
    Failed,
    Observation,
    Resumed,
    TaskStarted,
    Thought,
    UserMessage,
)
from workflows.stream import EVENTS_TOPIC, LlmAttemptStarted, TokenDelta

POLL_COOLDOWN = timedelta(milliseconds=20)
# While items keep coming, the stream is followed by Query this often (the pace at which
# the LLM activity publishes token batches).
FOLLOW_INTERVAL = timedelta(milliseconds=100)
_POLL = "__temporal_workflow_stream_poll"  # the stream's poll Update and Query


class StreamGap(BaseModel):
    """Offsets [start, end) were truncated away before this subscriber could read them."""

    type: Literal["gap"] = "gap"
    start: int
    end: int


StreamData = Annotated[
    TaskStarted
    | Thought
    | Action
    | Observation
    | ApprovalRequested
    | ApprovalResolved
    | ErrorEvent
    | Resumed
    | UserMessage
    | ContextCompacted
    | Done
    | Failed
    | Cancelled
    | TokenDelta
    | LlmAttemptStarted
    | StreamGap,
    Field(discriminator="type"),
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


def decode_item(topic: str, offset: int, value: Any) -> StreamItem:
    return StreamItem(offset=offset, topic=topic, data=_data_adapter.validate_python(value))


def in_sequence(expected: int, items: Iterable[StreamItem]) -> tuple[list[StreamItem], int]:
    """Items from offset `expected` on, in order: a gap item first where offsets jump (they
    were truncated away), repeats dropped, nothing after a terminal item. Also returns the
    next offset expected."""
    batch: list[StreamItem] = []
    for item in items:
        if item.offset < expected:
            continue
        if item.offset > expected:
            gap = StreamGap(start=expected, end=item.offset)
            batch.append(StreamItem(offset=expected, topic="gap", data=gap))
        batch.append(item)
        expected = item.offset + 1
        if item.terminal:
            break
    return batch, expected


@dataclass
class _TaskReader:
    """The one upstream subscription of a task in this process, and what it has read."""

    task_id: str
    start: int
    items: list[StreamItem] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    finished: bool = False
    error: BaseException | None = None
    subscribers: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def next_offset(self) -> int:
        return self.items[-1].offset + 1 if self.items else self.start


class StreamHub:
    """Per-process fan-out of task streams."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._readers: dict[str, _TaskReader] = {}
        self._converter: DataConverter = client.data_converter

    async def subscribe(
        self,
        task_id: str,
        since: int = 0,
        topics: list[str] | None = None,
        *,
        wait_for_start: timedelta | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Items with offset >= since, in order, each once; ends after the terminal event.

        A task that does not exist raises TaskNotFoundError at once, or after
        `wait_for_start` if it has not started by then.
        """
        await self._await_task(task_id, wait_for_start)
        reader = self._reader(task_id, since)
        wanted = set(topics) if topics else None
        offset = since
        try:
            if offset < reader.start:
                # Older than what the shared reader holds: read them without a long poll.
                async for item in self._read_closed_range(task_id, offset, reader.start):
                    offset = item.offset + 1
                    if wanted is None or item.topic in wanted or item.topic == "gap":
                        yield item
                    if item.terminal:
                        return
                offset = max(offset, reader.start)
            while True:
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
                    if item.terminal:
                        return
                if done and not batch:
                    if reader.error is not None:
                        raise reader.error
                    return
        finally:
            self._release(reader)

    async def head(self, task_id: str) -> int:
        """The stream's next offset (a Query: adds nothing to history)."""
        return await WorkflowStreamClient.create(self._client, task_id).get_offset()

    async def _await_task(self, task_id: str, wait_for_start: timedelta | None) -> None:
        from runtime.agent_runtime import TaskNotFoundError

        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait_for_start.total_seconds() if wait_for_start else 0)
        while True:
            try:
                await self._client.get_workflow_handle(task_id).describe()
                return
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
            if loop.time() >= deadline:
                waited = f" within {wait_for_start.total_seconds():g} s" if wait_for_start else ""
                raise TaskNotFoundError(task_id, f"no task with id {task_id!r}{waited}")
            await asyncio.sleep(0.2)

    def _reader(self, task_id: str, since: int) -> _TaskReader:
        reader = self._readers.get(task_id)
        # A finished reader has seen a terminal event; a task resumed since has more to say.
        if reader is None or reader.finished:
            reader = _TaskReader(task_id=task_id, start=since)
            self._readers[task_id] = reader
            reader.task = asyncio.create_task(self._pump(reader))
        reader.subscribers += 1
        return reader

    def _release(self, reader: _TaskReader) -> None:
        reader.subscribers -= 1
        if reader.subscribers > 0:
            return
        if self._readers.get(reader.task_id) is reader:
            del self._readers[reader.task_id]
        if reader.task is not None and not reader.task.done():
            reader.task.cancel()

    async def _pump(self, reader: _TaskReader) -> None:
        """Read the task's stream for every local subscriber, costing history only when idle.

        Each long-poll Update adds events to the task's history, and a subscriber that
        re-polls after every batch would double what streaming tokens cost. So a parked
        Update waits out quiet periods (it returns the moment something is published), and
        while items keep coming they are followed with the poll Query every
        FOLLOW_INTERVAL, which adds nothing to history.
        """
        offset = reader.start
        try:
            while True:
                result = await self._long_poll(reader.task_id, offset)
                while True:
                    offset, ended = await self._deliver(reader, offset, result)
                    if ended:
                        return
                    if not result.more_ready:
                        await asyncio.sleep(FOLLOW_INTERVAL.total_seconds())
                    result = await self._query_batch(reader.task_id, offset)
                    if not result.items:
                        break  # quiet: park a long poll again
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            reader.error = err
        finally:
            reader.finished = True
            with contextlib.suppress(RuntimeError):
                async with reader.changed:
                    reader.changed.notify_all()

    async def _long_poll(self, task_id: str, offset: int) -> PollResult:
        """Park a poll Update on the task's current run until it has items from `offset`."""
        handle = self._client.get_workflow_handle(task_id)
        while True:
            try:
                update = await handle.start_update(
                    _POLL,
                    PollInput(topics=[], from_offset=offset),
                    wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                    result_type=PollResult,
                )
                result: PollResult = await update.result()
                if result.items or result.more_ready:
                    return result
                # Released empty-handed: the run is closing or continuing as new.
            except WorkflowUpdateFailedError as err:
                kind = getattr(err.cause, "type", None)
                if kind == TRUNCATED_OFFSET_ERROR_TYPE:
                    return await self._query_batch(task_id, offset)  # reads on from the base
                # Draining: the run is handing over. Otherwise the run may have closed
                # under the parked poll (terminated, say), which the check below sees.
                if kind != STREAM_DRAINING_ERROR_TYPE and not await self._closed(task_id):
                    raise
            except (WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as err:
                if isinstance(err.__cause__, asyncio.CancelledError):
                    raise err.__cause__ from None
                if isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND:
                    if not await self._closed(task_id):
                        raise
            if await self._closed(task_id):
                # A closed run takes no Updates: whatever is left is read by Query.
                return await self._query_batch(task_id, offset)
            await asyncio.sleep(POLL_COOLDOWN.total_seconds())

    async def _closed(self, task_id: str) -> bool:
        """Whether the task's latest run has closed (a run continued as new has not)."""
        description = await self._client.get_workflow_handle(task_id).describe()
        return description.status not in (None, WorkflowExecutionStatus.RUNNING)

    async def _query_batch(self, task_id: str, offset: int) -> PollResult:
        handle = self._client.get_workflow_handle(task_id)
        result: PollResult = await handle.query(
            _POLL, PollInput(topics=[], from_offset=offset), result_type=PollResult
        )
        return result

    async def _deliver(
        self, reader: _TaskReader, offset: int, result: PollResult
    ) -> tuple[int, bool]:
        """Publish a poll's items to the subscribers; (next offset, whether the stream ended)."""
        decode = self._converter.payload_converter.from_payload
        items = (
            decode_item(wire.topic, wire.offset, decode(_decode_payload(wire.data)))
            for wire in result.items
            if wire.offset >= offset
        )
        batch, offset = in_sequence(offset, items)
        if batch:
            await self._publish(reader, batch)
        if batch and batch[-1].terminal:
            return offset, True
        # A run closed without a terminal event (terminated) has nothing more to say.
        return offset, not result.items and await self._closed(reader.task_id)

    async def _publish(self, reader: _TaskReader, batch: list[StreamItem]) -> None:
        async with reader.changed:
            reader.items.extend(batch)
            reader.changed.notify_all()

    async def _read_closed_range(
        self, task_id: str, start: int, end: int
    ) -> AsyncGenerator[StreamItem, None]:
        """Items in [start, end) through the poll Query, which adds nothing to history."""
        handle = self._client.get_workflow_handle(task_id)
        offset = start
        while offset < end:
            result: PollResult = await handle.query(
                _POLL, PollInput(topics=[], from_offset=offset), result_type=PollResult
            )
            if not result.items:
                return
            for wire in result.items:
                if wire.offset >= end:
                    return
                if wire.offset > offset:
                    yield StreamItem(
                        offset=offset, topic="gap", data=StreamGap(start=offset, end=wire.offset)
                    )
                payload = _decode_payload(wire.data)
                value = self._converter.payload_converter.from_payload(payload)
                yield decode_item(wire.topic, wire.offset, value)
                offset = wire.offset + 1
