"""`ws deploy check`: would the code of this checkout replay the histories it would meet?

It replays, with a Replayer of this checkout's workflows, the histories of the task queue's
runs in flight (all, or a sample per status) and the project's recorded histories, and
names each that would not replay: its task, its run and the first event the code disagrees
with. It reads histories and changes nothing.

Its blind spot: a replay compares the code's commands with the events already recorded. A
run whose history ends at a workflow task the change comes after (a task waiting since its
first step, when the change adds an activity before the first model call) replays cleanly,
since no event exists yet to disagree with. A recorded history that goes past that point
catches it; a pinned run never meets the new code anyway (it stays on its own version).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from waystation.vocabulary import TASK_STATUSES
from waystation.workflows import search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.notice import NOTIFICATION_WORKFLOW_TYPE
from waystation.workflows.notifications import NotificationWorkflow
from waystation.workflows.scheduled_turn import ScheduledTurnWorkflow

# The code here: what a worker of this checkout registers.
THIS_CODE: tuple[type, ...] = (AgentWorkflow, NotificationWorkflow, ScheduledTurnWorkflow)
# Temporal core names the event it could not match in its nondeterminism message.
_EVENT_ID = re.compile(r"HistoryEvent\(id: (\d+)")
# A progress line after this many histories of one source.
PROGRESS_EVERY = 20


@dataclass(frozen=True)
class ReplayFailure:
    """A history the code here would not replay."""

    task_id: str
    run_id: str
    source: str
    event_id: int | None
    event_type: str | None
    message: str

    def described(self) -> str:
        event = (
            f"first differing event {self.event_id} ({self.event_type})"
            if self.event_id is not None
            else "no event found to blame"
        )
        first_line = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"task {self.task_id} run {self.run_id} ({self.source}): {event}: {first_line}"


@dataclass
class CheckReport:
    replayed: int = 0
    in_flight: int = 0
    recorded: int = 0
    failures: list[ReplayFailure] = field(default_factory=list)

    def summary(self) -> str:
        failed = len(self.failures)
        verdict = "all replay" if not failed else f"{failed} would not replay"
        return (
            f"{self.replayed} histories replayed against this code ({self.in_flight} in flight, "
            f"{self.recorded} recorded): {verdict}"
        )


def _event_type(event: HistoryEvent) -> str:
    name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
    return "".join(word.capitalize() for word in name.split("_"))


def in_flight_query(task_queue: str) -> str:
    return f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Running'"


def sample_queries(task_queue: str) -> list[str]:
    """One query per status (a notification's run has none: its own query)."""
    base = in_flight_query(task_queue)
    queries = [f"{base} AND {search.AGENT_STATUS.name} = '{status}'" for status in TASK_STATUSES]
    return [*queries, f"{base} AND WorkflowType = '{NOTIFICATION_WORKFLOW_TYPE}'"]


async def in_flight_histories(
    client: Client, task_queue: str, sample: int | None
) -> AsyncIterator[WorkflowHistory]:
    """The histories of the runs open on `task_queue`: all, or `sample` per status."""
    queries = [in_flight_query(task_queue)] if sample is None else sample_queries(task_queue)
    for query in queries:
        async for execution in client.list_workflows(query, limit=sample):
            handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
            yield await handle.fetch_history()


def recorded_histories(folder: Path) -> list[WorkflowHistory]:
    """The project's recorded histories: each `*.json` file, its name the workflow id."""
    return [
        WorkflowHistory.from_json(path.stem, path.read_text())
        for path in sorted(folder.glob("*.json"))
    ]


class ReplayCheck:
    """Replays histories against `workflows` (default: the code here), as a worker would."""

    def __init__(
        self,
        client: Client,
        *,
        workflows: Sequence[type] = THIS_CODE,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._replayer = Replayer(
            workflows=list(workflows),
            data_converter=client.data_converter,
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        self._progress = progress

    async def _replays(self, history: WorkflowHistory) -> Exception | None:
        result = await self._replayer.replay_workflow(history, raise_on_replay_failure=False)
        return result.replay_failure

    async def first_differing_event(
        self, history: WorkflowHistory, failure: Exception
    ) -> HistoryEvent | None:
        """The event the code first disagrees with: named in core's message, or else the
        last event of the shortest beginning of the history that fails to replay."""
        named = _EVENT_ID.search(str(failure))
        by_id = {event.event_id: event for event in history.events}
        if named and int(named.group(1)) in by_id:
            return by_id[int(named.group(1))]
        low, high = 1, len(history.events)  # history.events[:high] fails
        while low < high:
            middle = (low + high) // 2
            shorter = WorkflowHistory(history.workflow_id, list(history.events[:middle]))
            if await self._replays(shorter) is None:
                low = middle + 1
            else:
                high = middle
        return history.events[high - 1] if history.events else None

    async def replay(
        self, histories: AsyncIterator[WorkflowHistory], source: str
    ) -> tuple[int, list[ReplayFailure]]:
        """How many histories of `source` were replayed, and those that would not replay."""
        count = 0
        failures: list[ReplayFailure] = []
        async for history in histories:
            count += 1
            failure = await self._replays(history)
            if failure is not None:
                event = await self.first_differing_event(history, failure)
                found = ReplayFailure(
                    task_id=history.workflow_id,
                    run_id=history.run_id,
                    source=source,
                    event_id=event.event_id if event else None,
                    event_type=_event_type(event) if event else None,
                    message=str(failure),
                )
                failures.append(found)
                self._progress(f"would not replay: {found.described()}")
            if count % PROGRESS_EVERY == 0:
                self._progress(f"{source}: {count} replayed, {len(failures)} would not")
        self._progress(f"{source}: {count} replayed, {len(failures)} would not replay")
        return count, failures


async def _listed(histories: list[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


async def check(
    client: Client,
    task_queue: str,
    *,
    sample: int | None = None,
    recorded: Path | None = None,
    workflows: Sequence[type] = THIS_CODE,
    progress: Callable[[str], None] = lambda _: None,
) -> CheckReport:
    """Replay the runs in flight on `task_queue` and the histories recorded in `recorded`."""
    replay = ReplayCheck(client, workflows=workflows, progress=progress)
    report = CheckReport()
    progress(
        f"replaying the runs in flight on task queue {task_queue!r}"
        + (f" ({sample} per status)" if sample is not None else "")
    )
    report.in_flight, failures = await replay.replay(
        in_flight_histories(client, task_queue, sample), "in flight"
    )
    report.failures.extend(failures)
    if recorded is not None:
        progress(f"replaying the recorded histories in {recorded}")
        report.recorded, failures = await replay.replay(
            _listed(recorded_histories(recorded)), f"recorded in {recorded}"
        )
        report.failures.extend(failures)
    report.replayed = report.in_flight + report.recorded
    return report
