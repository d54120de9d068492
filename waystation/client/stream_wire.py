"""The one place that knows `temporalio.contrib.workflow_streams`' private wire details.

The contrib module's public `subscribe()` parks long-poll Updates on the task, and an
Update that lands right after a cold worker answered a query can break the task's replay
(docs/never-stuck.md); waystation reads streams through the module's poll Query instead,
which adds nothing to history. Its name and item encoding are private to the module, so
they live here, pinned by tests/test_streaming.py::test_the_stream_wire_adapter_matches_the_sdk.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.workflow_streams import PollInput, PollResult, WorkflowStreamState
from temporalio.contrib.workflow_streams._types import _WorkflowStreamWireItem

POLL_QUERY = "__temporal_workflow_stream_poll"
OFFSET_QUERY = "__temporal_workflow_stream_offset"


def decode_data(wire: str) -> Payload:
    """An item's payload: base64 of the serialized Payload, as the module writes it."""
    payload = Payload()
    payload.ParseFromString(base64.b64decode(wire))
    return payload


async def poll(
    client: Client, task_id: str, offset: int, within: timedelta | None = None
) -> PollResult:
    """The items from `offset` that the task's current run holds (clamped to its base);
    `within` is the query's RPC deadline."""
    handle = client.get_workflow_handle(task_id)
    result: PollResult = await handle.query(
        POLL_QUERY,
        PollInput(topics=[], from_offset=offset),
        result_type=PollResult,
        rpc_timeout=within,
    )
    return result


async def head(client: Client, task_id: str) -> int:
    """The offset the next item will get."""
    handle = client.get_workflow_handle(task_id)
    value: Any = await handle.query(OFFSET_QUERY, result_type=int)
    return int(value)


# One answer's items stay below this many bytes, as the module's own poll keeps them.
SEALED_POLL_BYTES = 1_000_000


def poll_sealed(stream: WorkflowStreamState, offset: int) -> PollResult:
    """The items from `offset` of a closed run's stream as it sealed it, as the run's poll
    Query would answer (clamped to its base; about SEALED_POLL_BYTES at a time). A state's
    items carry no offset of their own: an item's is the base plus its place."""
    start = max(0, offset - stream.base_offset)
    items: list[_WorkflowStreamWireItem] = []
    size = 0
    for place, item in enumerate(stream.log[start:], start=stream.base_offset + start):
        size += len(item.data) + len(item.topic)
        if items and size > SEALED_POLL_BYTES:
            return PollResult(items=items, next_offset=place, more_ready=True)
        items.append(_WorkflowStreamWireItem(topic=item.topic, data=item.data, offset=place))
    return PollResult(items=items, next_offset=stream.base_offset + len(stream.log))
