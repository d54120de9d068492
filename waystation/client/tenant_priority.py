"""A tenant's task's place in the queue: Temporal task priority by how many tasks the
tenant has running, and the tenant as the fairness key.

A tenant with fewer than FEW_RUNNING tasks running starts its next at PRIORITY_FEW, a busier
one at PRIORITY_MANY (the task's activities and sub-agents inherit it), so under contention
one tenant's backlog never holds back another tenant's few tasks.

Counting is a visibility query, and tasks started at once would each count the same few
(none of them visible yet): starts that ask within a moment share one count, and each
adds the starts this process gave out since, so the 11th of a burst is known as such.
"""

from __future__ import annotations

import asyncio
import time

from temporalio.client import Client
from temporalio.common import Priority
from temporalio.service import RPCError

from waystation.workflows.search import AGENT_TENANT

# Temporal task priority keys (1 first, 5 last; 3 when unset).
PRIORITY_FEW, PRIORITY_MANY = 2, 3
FEW_RUNNING = 10
# How long one count serves the starts that come after it: longer than visibility takes to
# show a started task on the dev server and SQL stores, short beside a task's life.
COUNT_SERVES_SECONDS = 1.0


class _Tally:
    """One count of a tenant's running tasks, and how many starts were placed after it."""

    def __init__(self, key: tuple[int, str], counting: asyncio.Future[int | None]) -> None:
        self.key = key
        self.counting = counting
        self.placed = 0
        self.counted_at: float | None = None
        counting.add_done_callback(self._counted)

    def _counted(self, counting: asyncio.Future[int | None]) -> None:
        self.counted_at = time.monotonic()
        failed = counting.cancelled() or counting.exception() is not None
        if (failed or counting.result() is None) and _tallies.get(self.key) is self:
            del _tallies[self.key]  # no count to serve: the next start asks afresh

    def fresh(self) -> bool:
        if self.counted_at is None:
            return True  # still counting: join it
        return time.monotonic() - self.counted_at < COUNT_SERVES_SECONDS


_tallies: dict[tuple[int, str], _Tally] = {}


async def tenant_priority(client: Client, tenant: str | None) -> Priority:
    """The priority of a task of `tenant` about to start (Priority.default without one).
    A visibility store that cannot count: the tenant is still the fairness key."""
    if tenant is None:
        return Priority.default
    key = (id(client), tenant)
    tally = _tallies.get(key)
    if tally is None or not tally.fresh():
        tally = _tallies[key] = _Tally(key, asyncio.ensure_future(_count_running(client, tenant)))
    # One caller cancelled leaves the count to the others.
    running = await asyncio.shield(tally.counting)
    if running is None:
        return Priority(fairness_key=tenant)
    place = running + tally.placed
    tally.placed += 1
    level = PRIORITY_FEW if place < FEW_RUNNING else PRIORITY_MANY
    return Priority(priority_key=level, fairness_key=tenant)


async def _count_running(client: Client, tenant: str) -> int | None:
    query = f'{AGENT_TENANT.name} = "{tenant}" AND ExecutionStatus = "Running"'
    try:
        return (await client.count_workflows(query)).count
    except RPCError:
        return None
