"""What this worker saw of each task's conversation, so an LLM call can skip the query.

A step's conversation is the previous call's conversation, the assistant message that call
produced, and the tool results since; or, right after a compaction, the summarized
conversation with the summary in place of the messages it replaced. When this worker made
that call and ran those tools, or wrote that summary (the usual case: the workflow task,
its local tools and the eagerly dispatched activity all land on one worker), it can rebuild
the conversation itself. Every rebuild is checked against the digest the workflow computed;
anything else (another worker made the call, a rejected call, a fork, a message from a
person) misses, and the activity asks the workflow by query and the conversation store.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from waystation.vocabulary import ApprovalRule
from waystation.workflows.conversation import (
    ConversationDigest,
    message_digest,
    summary_message,
    tool_message,
)
from waystation.workflows.models import AgentSpec, ChatMessage
from waystation.workflows.tool_catalog import ToolCatalog, catalog_digest

TASKS_KEPT = 128  # at least; a worker keeps as many as it caches workflows (worker.py)
OUTPUTS_KEPT = 2048
BYTES_KEPT = 32_000_000  # conversations and outputs together, roughly: a worker's budget


def _size(messages: list[ChatMessage]) -> int:
    return sum(
        len(m.content or "") + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
        for m in messages
    )


@dataclass(frozen=True)
class Conversation:
    """The messages an LLM step sends, their digests, and the task's tool setup."""

    messages: list[ChatMessage]
    digests: list[str]
    tools: list[str] | None
    approval_policy: dict[str, ApprovalRule]
    catalog: ToolCatalog | None = None
    output_schema: dict[str, Any] | None = None
    size: int | None = None
    """The messages' size, when known (a rebuilt conversation knows it without a count)."""
    agents: list[AgentSpec] | None = None
    """The sub-agents the task holds (None: it holds none, its worker's are offered)."""

    @property
    def catalog_digest(self) -> str | None:
        return catalog_digest(self.catalog) if self.catalog is not None else None

    def content(self) -> dict[str, ChatMessage]:
        return dict(zip(self.digests, self.messages, strict=True))


@dataclass(frozen=True)
class _LastCall:
    step: int
    conversation: Conversation
    reply: ChatMessage | None  # None after a compaction: the conversation is the summarized one
    size: int
    digest: ConversationDigest  # follows the task's conversation, encoding only what is new


class ConversationCache:
    """Per worker process: the latest LLM call of each task and recent tool outputs, least
    recently used first out, within a count and a byte budget."""

    def __init__(
        self, tasks: int = TASKS_KEPT, outputs: int = OUTPUTS_KEPT, budget: int = BYTES_KEPT
    ) -> None:
        self._tasks_kept = tasks
        self._outputs_kept = outputs
        self._budget = budget
        self._calls: OrderedDict[str, _LastCall] = OrderedDict()
        self._outputs: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    @property
    def tasks_kept(self) -> int:
        return self._tasks_kept

    def remember_call(
        self, workflow_id: str, step: int, conversation: Conversation, reply: ChatMessage
    ) -> None:
        self._remember(workflow_id, step, conversation, reply)

    def remember_compaction(
        self,
        workflow_id: str,
        step: int,
        conversation: Conversation,
        start: int,
        end: int,
        summary: str,
    ) -> None:
        """The conversation once messages [start, end) are replaced by `summary`, as the
        workflow will fold it: the next call of the task starts from it."""
        kept = [*conversation.messages[:start], summary_message(summary)]
        messages = [*kept, *conversation.messages[end:]]
        digests = [*conversation.digests[:start], message_digest(kept[-1])]
        digests += conversation.digests[end:]
        summarized = replace(conversation, messages=messages, digests=digests, size=None)
        self._remember(workflow_id, step, summarized, None)

    def _remember(
        self, workflow_id: str, step: int, conversation: Conversation, reply: ChatMessage | None
    ) -> None:
        previous = self._calls.get(workflow_id)
        digest = previous.digest if previous is not None else ConversationDigest()
        self._forget_call(workflow_id)
        size = conversation.size if conversation.size is not None else _size(conversation.messages)
        size += _size([reply]) if reply is not None else 0
        entry = _LastCall(step, conversation, reply, size, digest)
        if entry.size > self._budget // 8:
            return  # one huge conversation must not push out everyone else's
        self._calls[workflow_id] = entry
        self._bytes += entry.size
        self._trim()

    def remember_tool_output(self, idempotency_key: str, output: str) -> None:
        self._forget_output(idempotency_key)
        if len(output) > self._budget // 8:
            return
        self._outputs[idempotency_key] = output
        self._bytes += len(output)
        self._trim()

    def known(self, workflow_id: str) -> dict[str, ChatMessage]:
        """Messages of the task's latest conversation this worker holds, by digest."""
        last = self._calls.get(workflow_id)
        return last.conversation.content() if last is not None else {}

    def rebuild(self, workflow_id: str, message_count: int, digest: str) -> Conversation | None:
        """The conversation with this digest, if what this worker saw makes it; else None."""
        last = self._calls.get(workflow_id)
        if last is None:
            return None
        messages = list(last.conversation.messages)
        size = last.size  # of the conversation and the reply: the outputs are added below
        if last.reply is not None:
            messages.append(last.reply)
            for call in last.reply.tool_calls:
                output = self._outputs.get(f"{workflow_id}/{last.step}/{call.id}")
                if output is None:
                    return None
                messages.append(tool_message(call.id, output))
                size += len(output)
        if len(messages) != message_count:
            return None
        digests = [*last.conversation.digests]
        digests += [message_digest(m) for m in messages[len(digests) :]]
        if last.digest.of(digests) != digest:
            return None
        self._calls.move_to_end(workflow_id)
        return replace(last.conversation, messages=messages, digests=digests, size=size)

    def _forget_call(self, workflow_id: str) -> None:
        if (old := self._calls.pop(workflow_id, None)) is not None:
            self._bytes -= old.size

    def _forget_output(self, key: str) -> None:
        if (old := self._outputs.pop(key, None)) is not None:
            self._bytes -= len(old)

    def _trim(self) -> None:
        while self._calls and (len(self._calls) > self._tasks_kept or self._bytes > self._budget):
            self._forget_call(next(iter(self._calls)))
        while self._outputs and (
            len(self._outputs) > self._outputs_kept or self._bytes > self._budget
        ):
            self._forget_output(next(iter(self._outputs)))
