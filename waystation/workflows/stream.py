"""What travels on a task's stream besides events: token deltas and retry markers.

Token deltas are not events: they are too many for the durable log. They carry the
step and the attempt, so a viewer can tell the partial text of a failed attempt is
void; the step's `thought` event is the final word.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from waystation.workflows.models import Contract

EVENTS_TOPIC = "events"
TOKENS_TOPIC = "tokens"


class TokenDelta(Contract):
    type: Literal["token"] = "token"
    step: int
    attempt: int
    index: int = Field(description="Position of this delta within its attempt: 0, 1, 2, ...")
    text: str


class LlmAttemptStarted(Contract):
    """Published at the start of an LLM attempt after the first: earlier partial text is void."""

    type: Literal["llm_retry"] = "llm_retry"
    step: int
    attempt: int


# Stream items a run hands to the next at continue-as-new (token deltas dominate them).
STREAM_ITEMS_KEPT = 200
STREAM_BYTES_KEPT = 16_000


def carried_from(state: WorkflowStreamState) -> int:
    """The first offset a run hands the next: the latest items within a bound (a
    subscriber asking for older offsets gets an explicit gap)."""
    end = state.base_offset + len(state.log)
    kept, size = 0, 0
    for item in reversed(state.log):
        size += len(item.data) + len(item.topic)
        if kept >= STREAM_ITEMS_KEPT or size > STREAM_BYTES_KEPT:
            break
        kept += 1
    return end - kept
