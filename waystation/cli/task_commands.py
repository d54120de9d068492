"""The commands that start a task, talk with it, respond to it or move it on: run, say,
chat, approve, answer, resume, repair, fork."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from waystation.cli.following import final_status, follow, follow_from
from waystation.cli.render import visible
from waystation.cli.terminal import (
    EXIT_WAITING,
    UsageError,
    approver,
    exists,
    hosted_worker,
    say,
    session,
)
from waystation.client.agent_runtime import (
    AgentRuntime,
    TaskHandle,
)
from waystation.client.pollers import no_worker_note
from waystation.client.starting import default_model, new_task
from waystation.client.temporal import connect
from waystation.settings import Settings
from waystation.settings import commands as hints
from waystation.workflows.models import AgentTask, ApprovalSettings


def _task_from_args(args: argparse.Namespace, settings: Settings) -> AgentTask:
    options = (
        "temperature",
        "max_tokens",
        "tool_choice",
        "first_chunk_timeout_seconds",
        "fallback_models",
        "fallback_after_seconds",
        "reasoning_effort",
        "thinking_budget_tokens",
    )
    model = {
        option: getattr(args, option) for option in options if getattr(args, option) is not None
    }
    fields: dict[str, Any] = {
        "model": default_model(settings, args.model, **model),
        "max_steps": args.max_steps,
    }
    if args.token_budget is not None:
        fields["token_budget"] = args.token_budget
    if args.cost_budget is not None:
        fields["cost_budget"] = args.cost_budget
    if args.tenant is not None:
        fields["tenant"] = args.tenant
    if args.tools is not None:
        fields["tools"] = [t for t in args.tools.split(",") if t]
    if args.recall is not None:
        fields["recall"] = args.recall
    if args.memory_namespace is not None:
        fields["memory_namespace"] = args.memory_namespace
    if args.approval_timeout is not None:
        fields["approval"] = ApprovalSettings(timeout_seconds=args.approval_timeout)
    if args.output_schema is not None:
        fields["output_schema"] = _schema_file(args.output_schema)
    return new_task(settings, args.task, **fields)


def _schema_file(path: str) -> dict[str, Any]:
    """The JSON Schema in `path` (its checks as a schema come with the task's)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UsageError(f"cannot read the output schema {path}: {err.strerror}") from err
    except json.JSONDecodeError as err:
        raise UsageError(
            f"the output schema {path} is not JSON: {err.msg} (line {err.lineno})"
        ) from None
    if not isinstance(schema, dict):
        raise UsageError(f"the output schema {path} must be a JSON object (a JSON Schema)")
    return schema


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    task = _task_from_args(args, settings)
    client = await connect(settings)
    runtime = AgentRuntime(client, settings)
    # Refused before a hosted worker starts for it (a bad tool, an id of a sub-agent's form).
    runtime.admit(runtime.with_defaults(task), task_id=args.id)
    # A worker hosted by a command that returns at once would only abandon what it took.
    async with hosted_worker(client, settings, args.worker and not args.no_wait):
        existed = bool(args.id) and await exists(runtime, args.id)
        handle = await runtime.run(task, task_id=args.id)
        if existed:
            say(
                f"task {handle.id} already exists: showing it (an id names one task; the text "
                "given here is not used)"
            )
        else:
            say(f"task {handle.id} started (model: {task.model.name})")
        if args.no_wait:
            print(handle.id)
            if note := await no_worker_note(client, settings.task_queue):
                say(note)
            return 0
        if args.quiet:
            code = await final_status(handle)
            if code == 0:
                print(visible((await handle.result()).result, indent=""))
            return code
        interactive = sys.stdin.isatty() and not args.json and args.on_approval == "ask"
        return await follow(
            runtime,
            handle,
            since=0,
            as_json=args.json,
            interactive=interactive,
            on_approval="wait" if args.on_approval == "wait" else "exit",
            tree=args.tree or not args.json,
        )


def _message_text(args: argparse.Namespace) -> str:
    """The message of `say`: the argument, `-` for standard input, or --file PATH."""
    if args.file is not None:
        if args.message is not None:
            raise UsageError("give the message as an argument or with --file, not both")
        try:
            return Path(args.file).read_text(encoding="utf-8")
        except OSError as err:
            raise UsageError(f"cannot read {args.file}: {err.strerror}") from err
    if args.message is None:
        raise UsageError("give the message as an argument, - for standard input, or --file")
    return sys.stdin.read() if args.message == "-" else str(args.message)


async def _send_and_follow(
    runtime: AgentRuntime,
    handle: TaskHandle,
    content: str,
    args: argparse.Namespace,
    *,
    interactive: bool,
) -> int:
    """Send a message, then show the task live until the answer to it."""
    running = (await handle.overview()).status == WorkflowExecutionStatus.RUNNING
    head = await runtime.stream_head(handle.id) if running and args.follow else None
    await handle.send(
        content,
        interrupt=args.interrupt,
        max_steps=args.max_steps,
        sender=approver(),
    )
    turn = " (it had answered: a new turn)" if handle.began_turn else ""
    say(f"message {handle.awaited_message} sent to task {handle.id}{turn}")
    if not args.follow:
        return 0
    since = head if head is not None else handle.stream_from or 0
    return await follow(
        runtime,
        handle,
        since=since,
        as_json=args.json,
        interactive=interactive,
        on_approval="ask" if interactive else "exit",
        answer_to=handle.awaited_message,
        tree=args.tree or not args.json,
    )


async def cmd_say(args: argparse.Namespace, settings: Settings) -> int:
    content = _message_text(args)
    async with session(settings, args.worker) as runtime:
        handle = await runtime.find(args.id)
        interactive = sys.stdin.isatty() and not args.json and args.message != "-"
        return await _send_and_follow(runtime, handle, content, args, interactive=interactive)


async def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    if not sys.stdin.isatty():
        raise UsageError("ws chat needs a terminal; from a script, use: ws say TASK_ID MESSAGE")
    args.follow, args.json, args.interrupt, args.tree = True, False, False, False
    async with session(settings, args.worker) as runtime:
        handle = await runtime.find(args.id) if args.id else None
        if handle is not None:
            state = await handle.state()
            say(f"task {handle.id}: {state.status}, turn {state.turn}, step {state.step}")
            if state.result:
                say(f"its last answer: {state.result}")
        say("type a message and Enter; Ctrl-D leaves (the task stays)")
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                print(file=sys.stderr)
                again = hints.command("chat", handle.id) if handle is not None else ""
                where = f": continue with  {again}" if handle is not None else ""
                say(f"left the conversation; the task stays{where}")
                return 0
            if not line.strip():
                continue
            if handle is None:
                model = default_model(settings, args.model)
                task = runtime.new_task(line, max_steps=args.max_steps or 20, model=model)
                handle = await runtime.run(task)
                say(f"task {handle.id} started (model: {task.model.name})")
                code = await follow(
                    runtime, handle, since=0, as_json=False, interactive=True, on_approval="ask"
                )
            else:
                code = await _send_and_follow(runtime, handle, line, args, interactive=True)
            if code not in (0, EXIT_WAITING):
                return code


async def cmd_approve(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        handle = await runtime.find(args.id)
        arguments = json.loads(args.arguments) if args.arguments else None
        # Where to follow from; without --follow, one query less that needs a worker.
        head = await runtime.stream_head(args.id) if args.follow else 0
        outcome = await handle.approve(
            args.request,
            reject=args.reject,
            message=args.message,
            arguments=arguments,
            approver=args.approver or approver(),
        )
        note = " (already decided earlier)" if outcome.duplicate else ""
        say(f"request {outcome.request_id}: {outcome.decision}{note}")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_answer(args: argparse.Namespace, settings: Settings) -> int:
    request, text = (args.request, args.text) if args.text is not None else (None, args.request)
    if text is None:
        raise UsageError("give the answer: ws answer TASK_ID [REQUEST_ID] 'the answer'")
    async with session(settings, args.worker) as runtime:
        handle = await runtime.find(args.id)
        head = await runtime.stream_head(args.id) if args.follow else 0
        outcome = await handle.answer(text, request, answerer=args.answerer or approver())
        if outcome.duplicate:
            say(
                f"question {outcome.request_id} was already answered"
                + (f" by {outcome.answerer}" if outcome.answerer else "")
                + f": {outcome.answer}"
            )
        else:
            say(f"question {outcome.request_id}: answered {outcome.answer!r}")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        head = await runtime.stream_head(args.id)
        handle = await runtime.resume(
            args.id,
            max_steps=args.max_steps,
            token_budget=args.token_budget,
            cost_budget=args.cost_budget,
            message=args.message,
        )
        say(f"task {handle.id} resumed")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_repair(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        handle = await runtime.repair(args.id, by=approver())
        say(f"task {handle.id} repaired: reset to its last good workflow task")
        if not args.follow:
            return 0
        # A stuck task answers no query: the stream's head is asked of the repaired run.
        return await follow_from(runtime, handle, await runtime.stream_head(args.id))


async def cmd_fork(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        handle = await runtime.fork(
            args.id,
            args.at,
            message=args.message,
            new_task_id=args.new_id,
            max_steps=args.max_steps,
            token_budget=args.token_budget,
            cost_budget=args.cost_budget,
        )
        say(f"task {handle.id} forked from {args.id} after event {args.at}")
        if not args.follow:
            print(handle.id)
            return 0
        return await follow_from(runtime, handle, 0)
