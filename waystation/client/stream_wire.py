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
from temporalio.contrib.workflow_streams import PollInput, PollResult

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
