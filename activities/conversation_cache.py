"""What this worker saw of each task's conversation, so an LLM call can skip the query.

A step's conversation is the previous call's conversation, the assistant message that call
produced, and the tool results since. When this worker made that call and ran those tools
(the usual case: the workflow task, its local tools and the eagerly dispatched LLM call all
land on one worker), it can rebuild the conversation itself. Every rebuild is checked
against the digest the workflow computed; anything else (another worker made the call, a
summary, a rejected call, a fork, a message from a person) misses, and the activity asks
the workflow by query as before.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from workflows.context import conversation_digest
from workflows.models import ChatMessage, LlmContext

TASKS_KEPT = 128
OUTPUTS_KEPT = 2048


@dataclass(frozen=True)
class _LastCall:
    step: int
    context: LlmContext  # the tools and approval policy are the task's: fixed for its id
    reply: ChatMessage


class ConversationCache:
    """Per worker process: the latest LLM call of each task and recent tool outputs (LRU)."""

    def __init__(self, tasks: int = TASKS_KEPT, outputs: int = OUTPUTS_KEPT) -> None:
        self._tasks_kept = tasks
        self._outputs_kept = outputs
        self._calls: OrderedDict[str, _LastCall] = OrderedDict()
        self._outputs: OrderedDict[str, str] = OrderedDict()

    def remember_call(
        self, workflow_id: str, step: int, context: LlmContext, reply: ChatMessage
    ) -> None:
        self._calls[workflow_id] = _LastCall(step, context, reply)
        self._calls.move_to_end(workflow_id)
        while len(self._calls) > self._tasks_kept:
            self._calls.popitem(last=False)

    def remember_tool_output(self, idempotency_key: str, output: str) -> None:
        self._outputs[idempotency_key] = output
        self._outputs.move_to_end(idempotency_key)
        while len(self._outputs) > self._outputs_kept:
            self._outputs.popitem(last=False)

    def rebuild(self, workflow_id: str, message_count: int, digest: str) -> LlmContext | None:
        """The conversation with this digest, if what this worker saw makes it; else None."""
        last = self._calls.get(workflow_id)
        if last is None:
            return None
        messages = [*last.context.messages, last.reply]
        for call in last.reply.tool_calls:
            output = self._outputs.get(f"{workflow_id}/{last.step}/{call.id}")
            if output is None:
                return None
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=call.id))
        if len(messages) != message_count or conversation_digest(messages) != digest:
            return None
        return last.context.model_copy(update={"messages": messages})
