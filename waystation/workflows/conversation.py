"""The conversation the model reads, as references: which messages, in which order.

The workflow state holds a `MessageRef` per message (a digest of its content, its role and
a size estimate), never the content: a reference is ~60 bytes whatever the message, so
the state a run hands the next stays bounded however long the task. The content is in
the events of the run that made it and, once a run hands over, in the conversation store
(`save_conversation`). Pure functions only: used by the fold, the workflow and the
activities alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

from waystation.workflows.models import (
    ChatMessage,
    Contract,
    ModelSettings,
    ReasoningItem,
    ToolCall,
    ToolCallRequest,
)

SUMMARY_PREFIX = "[summary of the earlier conversation] "
KEPT_AT_START = 2  # the system prompt and the task are never summarized
# More messages than this are compacted even within the token limit: the references are
# carried from run to run, and their number bounds what a run hands the next.
MAX_MESSAGES = 300
DIGEST_CHARS = 32
# The context windows a task without context_window_tokens had before the client resolved
# them (settings/model_facts.py): never change, recorded tasks replay with them.
LEGACY_DEFAULT_CONTEXT_WINDOW = 16_000
LEGACY_CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_000_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude", 200_000),
    ("gemini", 1_000_000),
    ("llama-3", 8_192),
    ("llama3", 8_192),
    ("qwen2.5", 32_768),
    ("qwen3", 32_768),
    ("mistral", 32_768),
)
# Room left for the answer when the task sets no max_tokens.
ANSWER_RESERVE = 4_096
# However big the window, a conversation beyond this is compacted: the part a run holds
# travels in one query answer, which must stay far below gRPC's 4 MB.
MAX_CONTEXT_LIMIT = 200_000

Role = Literal["system", "user", "assistant", "tool"]


class MessageRef(Contract):
    """One message of the conversation: the digest of its content, its role, its size."""

    digest: str
    role: Role
    tokens: int


def message_digest(message: ChatMessage) -> str:
    """The content address of a message: the same content, the same digest, anywhere. A
    message without reasoning is addressed as before reasoning was kept, so the messages
    of tasks already running keep their digests."""
    left_out = None if message.reasoning else {"reasoning"}
    encoded = message.model_dump_json(exclude=left_out).encode()
    return hashlib.sha256(encoded).hexdigest()[:DIGEST_CHARS]


def estimate_tokens(message: ChatMessage) -> int:
    """A model-independent estimate: about four characters a token, plus framing."""
    chars = len(message.content or "")
    chars += sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
    return chars // 4 + 4


def ref_of(message: ChatMessage) -> MessageRef:
    return MessageRef(
        digest=message_digest(message), role=message.role, tokens=estimate_tokens(message)
    )


def task_messages(system_prompt: str, task: str) -> list[ChatMessage]:
    return [
        ChatMessage(role="system", content=system_prompt),
        ChatMessage(role="user", content=task),
    ]


def assistant_message(
    content: str, calls: list[ToolCall], reasoning: Sequence[ReasoningItem] = ()
) -> ChatMessage:
    """The assistant's message as the model is sent it back: the one home of this shape
    (the workflow's digest and a worker's rebuilt conversation must agree on it)."""
    return ChatMessage(
        role="assistant",
        content=content or None,
        tool_calls=[
            ToolCallRequest(id=c.call_id, name=c.tool, arguments=c.raw_arguments) for c in calls
        ],
        reasoning=list(reasoning),
    )


def tool_message(call_id: str, output: str) -> ChatMessage:
    return ChatMessage(role="tool", content=output, tool_call_id=call_id)


def summary_message(summary: str) -> ChatMessage:
    return ChatMessage(role="user", content=SUMMARY_PREFIX + summary)


def total_tokens(refs: list[MessageRef]) -> int:
    return sum(r.tokens for r in refs)


def context_limit(task_limit: int | None, model: ModelSettings) -> int:
    """Tokens the conversation may take: the task's limit, else the model's window less
    room for the answer, never more than MAX_CONTEXT_LIMIT."""
    if task_limit is not None:
        return min(task_limit, MAX_CONTEXT_LIMIT)
    window = model.context_window_tokens or legacy_context_window(model.name)
    reserve = model.max_tokens or ANSWER_RESERVE
    return max(1_000, min(window - min(reserve, window // 2), MAX_CONTEXT_LIMIT))


def legacy_context_window(model_name: str) -> int:
    """The window of a task created before the client resolved it: a well-known model by
    name prefix (provider prefixes ignored)."""
    name = model_name.lower().rsplit("/", 1)[-1]
    for prefix, window in LEGACY_CONTEXT_WINDOWS:
        if name.startswith(prefix):
            return window
    return LEGACY_DEFAULT_CONTEXT_WINDOW


def compaction_range(refs: list[MessageRef], limit: int) -> tuple[int, int] | None:
    """Messages [start, end) to replace by a summary, or None when the conversation fits.

    Keeps the system prompt and the task, and the latest turns within half the limit.
    `end` starts a turn (an assistant or user message), so a tool result is never split
    from the call it answers. None too when there is not enough old history to summarize.
    """
    if total_tokens(refs) <= limit and len(refs) <= MAX_MESSAGES:
        return None
    budget = limit // 2
    end = len(refs)
    tail = 0
    for index in range(len(refs) - 1, KEPT_AT_START - 1, -1):
        tail += refs[index].tokens
        if tail > budget or len(refs) - index > MAX_MESSAGES // 2:
            break
        if refs[index].role in ("assistant", "user"):
            end = index
    if end - KEPT_AT_START < 2:
        return None
    return KEPT_AT_START, end


# What one answer of a conversation query carries at most (a message may exceed it alone).
CONTENT_PAGE_BYTES = 1_000_000


class RunMessages:
    """The message content one run answers for: the task's, and every message the run adds.

    The rest of a conversation (older runs' messages) workers read from earlier runs or the
    conversation store; this run's additions must be saved before it hands over.
    """

    def __init__(self, task_text: list[ChatMessage]) -> None:
        self._task_digests = {message_digest(m) for m in task_text}
        self._content = {message_digest(m): m for m in task_text}

    def add(self, messages: list[ChatMessage]) -> None:
        for message in messages:
            self._content[message_digest(message)] = message

    def get(self, digest: str) -> ChatMessage | None:
        return self._content.get(digest)

    def of(self, digests: list[str]) -> dict[str, ChatMessage]:
        return {d: self._content[d] for d in digests if d in self._content}

    def page(self, digests: list[str], budget: int = CONTENT_PAGE_BYTES) -> dict[str, ChatMessage]:
        """The messages with these digests that the run holds, in order, as many as fit in
        `budget` bytes (at least one): one query's answer stays far below Temporal's 2 MB
        per payload, however much the run holds; the asker asks again for the rest."""
        found: dict[str, ChatMessage] = {}
        size = 0
        for digest in digests:
            message = self._content.get(digest)
            if message is None or digest in found:
                continue
            size += len(message.model_dump_json().encode())
            if found and size > budget:
                break
            found[digest] = message
        return found

    def added_to(self, refs: list[MessageRef]) -> bool:
        """Whether `refs` reference any message this run added (content only it holds)."""
        added = set(self._content) - self._task_digests
        return any(r.digest in added for r in refs)


class ConversationDigest:
    """A fingerprint of exactly these messages, in order: what an LLM call will send.

    Computed over the messages' digests, so the workflow (which holds references) and a
    worker (which holds content) compute the same value. Kept up to date incrementally:
    a conversation that grew by appending encodes only its new references.
    """

    def __init__(self) -> None:
        self._digests: list[str] = []
        self._hash = hashlib.sha256()

    def of(self, digests: list[str]) -> str:
        known = len(self._digests)
        if len(digests) < known or digests[:known] != self._digests:
            known, self._hash = 0, hashlib.sha256()  # older turns were replaced (a summary)
        for digest in digests[known:]:
            self._hash.update(digest.encode())
        self._digests = list(digests)
        return self._hash.copy().hexdigest()


def conversation_digest(digests: list[str]) -> str:
    """The fingerprint of a conversation, computed from scratch."""
    return ConversationDigest().of(digests)
