"""Handing over: a run continues as new with a bounded carry (the conversation by
reference, the stream's latest items, responses not yet in the log), archiving its events
first so readers of a closed run need no replay.

Under Worker Versioning a run is pinned to the version of the code it started on; a new
run is where a task moves to the deployment's current version: every continue-as-new asks
for it (upgrade on continue-as-new), and a sub-agent whose caller's version is no longer
current moves at its first workflow task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.contrib.workflow_streams import WorkflowStreamState

from waystation.workflows import (
    activity_calls,
    request_kinds,
)
from waystation.workflows.models import (
    ConversationSnapshot,
)
from waystation.workflows.plan import due_for_hand_over
from waystation.workflows.run import (
    AgentRun,
    ArchiveRequest,
    RunCarry,
    RunRef,
)
from waystation.workflows.run_core import RunCore, sample_clock
from waystation.workflows.stream import carried_from

ARCHIVE_PATCH = "archive-events"
# Before it, signalled messages were kept beyond the queue's bounds, and a run took waiting
# messages before it handed over, however long its history had grown.
MESSAGE_BOUND_PATCH = "bounded-message-queue"
# Before it, a sub-agent ran on its caller's version even when another was current.
CHILD_ON_CURRENT_PATCH = "sub-agent-on-current-version"
# The next run starts on the current version, then is pinned to it (the worker's default);
# on an unversioned worker it changes nothing.
ON_CURRENT_VERSION = workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE


class HandOver(RunCore):
    """Continuing as new, and keeping a run's events for after it closes."""

    def _hand_over_first(self) -> bool:
        """A run whose history is due to be handed over does so before it takes waiting
        messages, so a flood of them never grows one run (and what it holds) without end."""
        due = due_for_hand_over(self._state, self._task, self._progress())
        return due and workflow.patched(MESSAGE_BOUND_PATCH)

    async def _save_conversation(self, source: RunRef | None = None) -> None:
        """Put the conversation's messages this run (or a fork's origin) holds in the store."""
        snapshot = ConversationSnapshot(
            step=self._state.step,
            message_count=len(self._state.conversation),
            conversation_digest=self._conversation_digest(),
            source_workflow_id=source.workflow_id if source else None,
            source_run_id=source.run_id if source else None,
        )
        await activity_calls.save_conversation(self._task, snapshot)
        self._clock = sample_clock()

    async def _hand_over(self) -> None:
        """Continue as new with a bounded carry: the conversation by reference, the stream's
        latest items, and decisions not yet in the log."""
        await self._notifier.send()
        if self._messages.added_to(self._state.conversation):
            await self._save_conversation()
        await self._archive_events()
        self._stream.truncate(carried_from(self._stream.get_state()))
        info = workflow.info()
        earlier = RunRef(
            workflow_id=info.workflow_id, run_id=info.run_id, last_seq=self._state.last_seq
        )

        def next_run(stream: WorkflowStreamState) -> list[Any]:
            responses: dict[str, Any] = {
                field: self._inbox.carried(kind) for field, kind in request_kinds.CARRIED.items()
            }
            carry = RunCarry(
                state=self._state,
                stream=stream,
                messages=self._incoming,
                earlier=earlier,
                **responses,
            )
            return [AgentRun(task=self._task, carry=carry)]

        await self._continue_as_new(next_run)

    async def _continue_as_new(
        self, build_args: Callable[[WorkflowStreamState], Sequence[Any]]
    ) -> NoReturn:
        """WorkflowStream.continue_as_new's recipe, the next run on the current version."""
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            args=build_args(self._stream.get_state()),
            initial_versioning_behavior=ON_CURRENT_VERSION,
        )

    def _move_to_current_version(self, run: AgentRun) -> None:
        """A sub-agent starts pinned to its caller's version; when that is no longer the
        deployment's current one, its first run hands over at once (nothing done yet) to a
        run on the current version. Whether it changed is recorded in the workflow task's
        event, so a replay decides the same."""
        first_of_child = run.task is not None and run.task.parent is not None and run.carry is None
        if (
            first_of_child
            and workflow.info().is_target_worker_deployment_version_changed()
            and workflow.patched(CHILD_ON_CURRENT_PATCH)
        ):
            workflow.continue_as_new(run, initial_versioning_behavior=ON_CURRENT_VERSION)

    async def _archive_events(self) -> None:
        """Keep this run's events where readers find them once it is closed (no replay).
        Behind a patch: runs recorded before it hand over and end without the activity."""
        if self._log and workflow.patched(ARCHIVE_PATCH):
            request = ArchiveRequest(first_seq=self._first_seq, last_seq=self._state.last_seq)
            await activity_calls.archive_events(request)
            self._clock = sample_clock()
