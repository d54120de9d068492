"""The memory tools: `remember`, `recall` and `forget`, in the task's memory namespace
(workflows/memory.py), on the deployment's memory store (activities/storage/memory.py).

A deployment offers them by naming this module in WAYSTATION_TOOLS. A write goes through
the ledger under the call's idempotency key, and the item records that key: a retry of a
call whose worker died after the write finds it there and does not write again."""

from __future__ import annotations

from pydantic import BaseModel, Field

from waystation.activities.storage.memory import MemoryRequestError, MemoryStore
from waystation.activities.tools import Tool, ToolContext, ToolError
from waystation.workflows.memory import (
    FORGET_TOOL,
    MOST_RECALLED,
    RECALL_LIMIT,
    RECALL_TOOL,
    REMEMBER_TOOL,
)


def _memory(context: ToolContext) -> tuple[MemoryStore, str]:
    if context.memory is None:
        raise ToolError("this worker has no memory store: the memory tools cannot run here")
    if context.memory_namespace is None:
        raise ToolError(
            "this task has no memory namespace (it was started before tasks carried one): "
            "start a new task to use memory"
        )
    return context.memory, context.memory_namespace


class RememberArgs(BaseModel):
    key: str = Field(
        min_length=1,
        max_length=200,
        description="A short name for the fact, e.g. 'customer_timezone'; remembering under a "
        "key already used replaces what it held.",
    )
    text: str = Field(min_length=1, description="What to remember, in plain words.")


async def remember(args: RememberArgs, context: ToolContext) -> str:
    memory, namespace = _memory(context)
    try:
        memory.check_item(namespace, args.key, args.text)  # refused before anything is held
    except MemoryRequestError as err:
        raise ToolError(str(err)) from None
    ledger, call = context.ledger, context.idempotency_key
    result = f"remembered {args.key!r}"
    earlier = await ledger.claim(call, REMEMBER_TOOL)  # waits while a live attempt holds it
    if earlier is not None and earlier.state == "done" and earlier.result is not None:
        return earlier.result
    if earlier is not None and await memory.written_by(namespace, args.key) == call:
        await ledger.finish(call, result)  # the lost attempt wrote: not twice
        return result
    await ledger.start(call, {"namespace": namespace, "key": args.key})
    await memory.put(namespace, args.key, args.text, written_by=call)
    await ledger.finish(call, result)
    return result


class RecallArgs(BaseModel):
    query: str = Field(
        default="",
        max_length=1_000,
        description="Words to look for in what was remembered; empty: the latest items.",
    )
    limit: int = Field(default=RECALL_LIMIT, ge=1, le=MOST_RECALLED)


async def recall(args: RecallArgs, context: ToolContext) -> str:
    memory, namespace = _memory(context)
    items = await memory.search(namespace, args.query, args.limit)
    if not items:
        return f"nothing remembered matches {args.query!r}" if args.query else "nothing remembered"
    return "\n".join(f"{item.key}: {item.value}" for item in items)


class ForgetArgs(BaseModel):
    key: str = Field(min_length=1, max_length=200, description="The key of the item to forget.")


async def forget(args: ForgetArgs, context: ToolContext) -> str:
    memory, namespace = _memory(context)
    ledger, call = context.ledger, context.idempotency_key
    earlier = await ledger.claim(call, FORGET_TOOL)
    if earlier is not None and earlier.state == "done" and earlier.result is not None:
        return earlier.result
    await ledger.start(call, {"namespace": namespace, "key": args.key})
    # A lost attempt that recorded its start may have deleted it already: it is forgotten.
    deleted = await memory.delete(namespace, args.key) or earlier is not None
    result = f"forgot {args.key!r}" if deleted else f"nothing was remembered under {args.key!r}"
    await ledger.finish(call, result)
    return result


REMEMBER = Tool(
    name=REMEMBER_TOOL,
    description="Remember a fact for later tasks (yours and other tasks of the same agent): "
    "it outlives this task.",
    arguments=RememberArgs,
    function=remember,
    retry_safe=True,  # through the ledger and the item's record of the write
    timeout_seconds=30,
)
RECALL = Tool(
    name=RECALL_TOOL,
    description="Search what you remembered in earlier tasks (full-text, best matches first).",
    arguments=RecallArgs,
    function=recall,
    retry_safe=True,  # reads only
    timeout_seconds=30,
)
FORGET = Tool(
    name=FORGET_TOOL,
    description="Forget a fact you remembered, by its key.",
    arguments=ForgetArgs,
    function=forget,
    retry_safe=True,  # deleting twice is deleting once
    timeout_seconds=30,
)
