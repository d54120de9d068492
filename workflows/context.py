"""The context window: estimate a conversation's size and choose what to summarize.

Pure functions, used by the workflow (deterministic) and tested on their own. The strategy:
keep the system prompt and the task, keep the most recent turns within half the limit, and
replace everything between with a summary written by the model.
"""

from __future__ import annotations

import hashlib

from workflows.models import ChatMessage

SUMMARY_PREFIX = "[summary of the earlier conversation] "
_KEEP = 2  # the system prompt and the task


def estimate_tokens(messages: list[ChatMessage]) -> int:
    """A model-independent estimate: about four characters a token, plus framing."""
    chars = 0
    for m in messages:
        chars += len(m.content or "")
        chars += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return chars // 4 + 4 * len(messages)


def compaction_range(messages: list[ChatMessage], limit: int) -> tuple[int, int] | None:
    """Messages [start, end) to replace by a summary, or None when the window fits.

    `end` starts a turn (an assistant or user message), so a tool result is never split
    from the call it answers. None too when there is not enough old history to summarize.
    """
    if estimate_tokens(messages) <= limit:
        return None
    budget = limit // 2
    end = len(messages)
    tail = 0
    for index in range(len(messages) - 1, _KEEP - 1, -1):
        tail += estimate_tokens([messages[index]])
        if tail > budget:
            break
        if messages[index].role in ("assistant", "user"):
            end = index
    if end - _KEEP < 2:
        return None
    return _KEEP, end


class ConversationDigest:
    """A fingerprint of exactly these messages, in order: what an LLM call will send.

    The workflow puts it in the LLM activity's input; a worker that can rebuild the
    conversation from what it saw itself proves the rebuild right against it. It is kept
    up to date incrementally: a conversation that grew by appending (the same message
    objects first) encodes only its new messages; any other change starts over.
    """

    def __init__(self) -> None:
        self._messages: list[ChatMessage] = []
        self._hash = hashlib.sha256()

    def of(self, messages: list[ChatMessage]) -> str:
        known = len(self._messages)
        if len(messages) < known or any(
            a is not b for a, b in zip(self._messages, messages, strict=False)
        ):
            known, self._hash = 0, hashlib.sha256()  # older turns were replaced (a summary)
        for message in messages[known:]:
            encoded = message.model_dump_json().encode()
            self._hash.update(len(encoded).to_bytes(8, "big"))
            self._hash.update(encoded)
        self._messages = list(messages)
        return self._hash.copy().hexdigest()


def conversation_digest(messages: list[ChatMessage]) -> str:
    """The fingerprint of a conversation, computed from scratch."""
    return ConversationDigest().of(messages)
