"""What travels on a task's stream besides events: token deltas and retry markers.

Token deltas are not events: they are too many for the durable log. They carry the
step and the attempt, so a viewer can tell the partial text of a failed attempt is
void; the step's `thought` event is the final word.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from workflows.models import Contract

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
