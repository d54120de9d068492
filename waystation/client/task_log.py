"""Reading a task's event log across its runs, a page at a time.

A task is a chain of runs (continue-as-new), and a fork continues its origin's chain; each
run holds the events it wrote. Where each run starts is in its own start input (the carry
names the run before it and the state's last seq), read from the run's first history event
without any worker. So a page asks only the runs it needs, and a page's cost follows the
page, not the task's length. Closed runs never change, so what is learnt of them is kept.

A closed run answers a query only after a worker replays it, which takes seconds for a
large run; so a closed run's events are read from the event archive when they are kept
there (`activities/event_archive.py`), and by query otherwise.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from waystation.activities.run_history import read_run_input
from waystation.client.health import overview
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentEvent
from waystation.workflows.run import AgentOutcome, ArchivedRun, EventsRequest, RunRef

# A closed run's events, read from the archive: (workflow id, run id) -> None if not kept.
ArchiveReader = Callable[[str, str], Awaitable[ArchivedRun | None]]
# Closed runs whose archived events a TaskLog keeps in memory (each up to a few MB).
ARCHIVED_RUNS_KEPT = 8


@dataclass(frozen=True)
class RunSpan:
    """One run of a task's chain: it holds events `first_seq`..`last_seq` (None: still open)."""

    workflow_id: str
    run_id: str
    first_seq: int
    last_seq: int | None
    earlier: RunRef | None = None
    closed: bool = False


class TaskLog:
    """Event pages of tasks over one client; remembers the shape of closed runs."""

    def __init__(self, client: Client, archive: ArchiveReader | None = None) -> None:
        self._client = client
        self._archive = archive
        # Spans of closed runs, by (run id, last seq): a fork's origin is a prefix of a run.
        self._closed: dict[tuple[str, int], RunSpan] = {}
        # Archived events of closed runs by run id (None: not archived, ask by query).
        self._archived: OrderedDict[str, list[AgentEvent] | None] = OrderedDict()

    async def latest(self, task_id: str) -> RunSpan:
        """The task's current run (the latest of its chain)."""
        seen = await overview(self._client, task_id)
        closed = seen.status not in (None, WorkflowExecutionStatus.RUNNING)
        return await self._span(task_id, seen.run_id, last_seq=None, closed=closed)

    async def _span(
        self, workflow_id: str, run_id: str, *, last_seq: int | None, closed: bool
    ) -> RunSpan:
        if last_seq is not None and (known := self._closed.get((run_id, last_seq))) is not None:
            return known
        run = await read_run_input(self._client, workflow_id, run_id)
        if run is None:
            raise LookupError(f"run {run_id} of {workflow_id} has no history")
        carry = run.carry
        first_seq = carry.state.last_seq + 1 if carry else 0
        earlier = carry.earlier if carry else None
        span = RunSpan(workflow_id, run_id, first_seq, last_seq, earlier, closed)
        if closed and last_seq is not None:
            self._closed[(run_id, last_seq)] = span
        return span

    async def span(self, ref: RunRef) -> RunSpan:
        """The span of an earlier run a carry names."""
        return await self._span(ref.workflow_id, ref.run_id, last_seq=ref.last_seq, closed=True)

    async def page(self, task_id: str, since: int, limit: int) -> list[AgentEvent]:
        """Events with seq >= since, at most `limit`, in order, from whichever runs hold them."""
        span = await self.latest(task_id)
        chain = [span]
        while span.first_seq > since and span.earlier is not None:
            span = await self.span(span.earlier)
            chain.append(span)
        events: list[AgentEvent] = []
        for run in reversed(chain):  # oldest first
            start = max(since, run.first_seq, events[-1].seq + 1 if events else 0)
            if (kept := await self._archived_events(run)) is not None:
                last = run.last_seq if run.last_seq is not None else kept[-1].seq
                wanted = [e for e in kept if start <= e.seq <= last]
                events += wanted[: limit - len(events)]
                if len(events) >= limit:
                    break
                continue
            while len(events) < limit and (run.last_seq is None or start <= run.last_seq):
                handle: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
                    self._client.get_workflow_handle_for(
                        AgentWorkflow.run, run.workflow_id, run_id=run.run_id
                    )
                )
                found = await handle.query(
                    AgentWorkflow.events, EventsRequest(since=start, limit=limit - len(events))
                )
                fresh = [e for e in found.events if run.last_seq is None or e.seq <= run.last_seq]
                if not fresh:
                    break
                events += fresh
                start = fresh[-1].seq + 1
            if len(events) >= limit:
                break
        return events

    async def _archived_events(self, run: RunSpan) -> list[AgentEvent] | None:
        """A closed run's events from the archive (kept in memory a while), or None."""
        if not run.closed or self._archive is None:
            return None
        if run.run_id in self._archived:
            self._archived.move_to_end(run.run_id)
            return self._archived[run.run_id]
        archived = await self._archive(run.workflow_id, run.run_id)
        kept = archived.events if archived is not None and archived.events else None
        self._archived[run.run_id] = kept
        while len(self._archived) > ARCHIVED_RUNS_KEPT:
            self._archived.popitem(last=False)
        return kept
