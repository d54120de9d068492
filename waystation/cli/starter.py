"""The command line: run, approve/reject, stream, status, events, list, resume, fork, cancel,
tools, and `mcp` (waystation's tools for an MCP client, over stdio).

    ws run "What is 12 * 7? Write it to scratch/answer.txt"
    ws approve TASK_ID [REQUEST_ID] [--reject --message "why"]
    ws status TASK_ID

`ws` is this module's `cli` (pyproject's [project.scripts]); `python starter.py` is the same
from a source tree.

Commands that make a task progress (run, approve, resume, stream, mcp) host a worker in this
process unless --no-worker is given, so a fresh machine needs nothing else running.
Exit codes: 0 done, 1 failed or error, 2 usage, 3 waiting for approval, 4 nothing to do
(the task has already ended: cancel), 130 cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from waystation.activities.storage.errors import StorageError
from waystation.activities.tools import ToolDefinitionError
from waystation.cli.render import LiveView, render_state, visible, visible_json
from waystation.client.agent_runtime import (
    AgentRuntime,
    DecisionError,
    TaskEndedError,
    TaskError,
    TaskHandle,
    TaskNotFoundError,
    UnknownToolsError,
)
from waystation.client.hidden_environment import hide_starting_environment
from waystation.client.pollers import cli_worker_identity, no_worker_note
from waystation.client.starting import default_model, new_task
from waystation.client.streaming import StreamItem
from waystation.client.task_rights import TaskRefusedError
from waystation.client.temporal import DevServer, TemporalUnavailableError, connect
from waystation.client.tree_stream import TreeItem
from waystation.settings import Settings
from waystation.settings import commands as hints
from waystation.settings.errors import SettingsProblem, load_settings
from waystation.settings.validation import validation_sentence
from waystation.settings.webhooks import WebhookConfigError
from waystation.worker import log as worker_log
from waystation.workflows import errors
from waystation.workflows.events import (
    ApprovalRequested,
    QuestionAsked,
    UserMessage,
    request_digest,
)
from waystation.workflows.models import AgentTask, ApprovalSettings


class UsageError(Exception):
    """A command given wrongly: one sentence, exit code 2, nothing sent."""


EXIT_FAILED = 1
EXIT_WAITING = 3
EXIT_ENDED = 4  # nothing done: the task has already ended (cancel)
EXIT_CANCELLED = 130
# `status` answers with the code a command following the task would end with.
STATUS_EXIT_CODES = {
    "waiting_approval": EXIT_WAITING,
    "waiting_input": EXIT_WAITING,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}
TASK_STATUSES = [
    "running",
    "waiting_approval",
    "waiting_input",
    "done",
    "failed",
    "cancelled",
    "stuck",
]


def _say(message: str) -> None:
    """A line for the person at the terminal; what it quotes of a task is made `visible`."""
    print(visible(message, indent=""), file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def hosted_worker(
    client: Client, settings: Settings, enabled: bool, *, activities: bool = True
) -> AsyncIterator[None]:
    if not enabled:
        yield
        return
    from waystation.worker import build_worker

    identity = cli_worker_identity()  # it serves only while this command runs
    async with build_worker(client, settings, activities=activities, identity=identity):
        yield


@contextlib.asynccontextmanager
async def session(
    settings: Settings, worker: bool, *, activities: bool = True
) -> AsyncIterator[AgentRuntime]:
    """A runtime on the configured Temporal, with a worker in this process if asked."""
    client = await connect(settings)
    async with hosted_worker(client, settings, worker, activities=activities):
        yield AgentRuntime(client, settings)


async def follow_from(runtime: AgentRuntime, handle: TaskHandle, since: int) -> int:
    """The live view of what a command set going, until the task ends or waits."""
    return await follow(
        runtime, handle, since=since, as_json=False, interactive=False, on_approval="exit"
    )


async def follow(
    runtime: AgentRuntime,
    handle: TaskHandle,
    *,
    since: int,
    as_json: bool,
    interactive: bool,
    on_approval: str,
    answer_to: str | None = None,
    tree: bool | None = None,
) -> int:
    """Show the task's stream until it ends (or waits, as `on_approval` says); with
    `answer_to`, until the answer to that message (earlier answers are shown and passed).
    The live view shows the sub-agents' items too (`tree`: by default for people, not for
    --json), and their approvals and questions are asked or named like the task's own."""
    view = LiveView()
    taken = answer_to is None
    following = answer_to is not None
    whole = not as_json if tree is None else tree
    with shows_failed_attempts(view, handle.id, enabled=not as_json, tree=whole):
        async for item in runtime.stream(handle.id, since=since, follow=following, tree=whole):
            if as_json:
                print(visible_json(item.model_dump_json()), flush=True)
            else:
                view.show(item)
            below = item if isinstance(item, TreeItem) and item.path else None
            owner = handle if below is None else runtime.get(below.task_id)
            if isinstance(item.data, UserMessage) and item.data.message_id == answer_to:
                taken = taken or below is None
            if item.terminal and (taken or item.data.type != "done"):
                break
            waiting = f"task {handle.id}" if below is None else _whose(handle, below)
            if isinstance(item.data, ApprovalRequested):
                request = item.data
                if not await _still_pending(owner, request.request_id):
                    continue  # decided since (a replayed stream of an older task)
                if interactive:
                    await _ask(owner, request)
                elif on_approval == "exit":
                    _say(
                        f"{waiting} waits for approval of [{request.request_id}]; it holds "
                        "no process while it waits. Decide with:\n"
                        f"  {hints.command('approve', owner.id, request.request_id)}\n"
                        f"  {hints.command('approve', owner.id, request.request_id, '--reject')} "
                        "--message 'why'"
                    )
                    return EXIT_WAITING
            if isinstance(item.data, QuestionAsked):
                question = item.data
                if not await _still_asked(owner, question.request_id):
                    continue  # answered since
                if interactive:
                    await _ask_question(owner, question)
                elif on_approval == "exit":
                    _say(
                        f"{waiting} waits for an answer to [{question.request_id}]; it "
                        "holds no process while it waits. Answer with:\n"
                        f"  {hints.command('answer', owner.id, question.request_id)} 'the answer'"
                    )
                    return EXIT_WAITING
    return await _final_status(handle)


def _whose(handle: TaskHandle, item: TreeItem) -> str:
    """Who waits, for a request of a sub-agent: the task followed, through its sub-agent."""
    return f"task {handle.id}: its sub-agent {' > '.join(item.path)} ({item.task_id})"


async def _still_asked(handle: TaskHandle, request_id: str) -> bool:
    try:
        return request_id in (await handle.state()).pending_questions
    except (TaskError, RPCError):
        return True


async def _ask_question(handle: TaskHandle, question: QuestionAsked) -> None:
    """Ask the person at the terminal; a wrong choice is asked again."""
    if question.details:
        _say(f"  {question.details}")
    choices = f" [{' / '.join(question.choices)}]" if question.choices else ""
    while True:
        text = await asyncio.to_thread(input, visible(f"answer{choices}> "))
        if not text.strip():
            continue
        try:
            outcome = await handle.answer(text, question.request_id, answerer=_approver())
        except DecisionError as err:
            if err.kind == errors.INVALID_CHOICE:
                _say(str(err))
                continue
            raise
        if outcome.duplicate:
            _say(f"question {outcome.request_id} was already answered: {outcome.answer}")
        return


async def _exists(runtime: AgentRuntime, task_id: str) -> bool:
    try:
        await runtime.find(task_id)
    except TaskNotFoundError:
        return False
    return True


async def _still_pending(handle: TaskHandle, request_id: str) -> bool:
    """A decision sent early (or re-applied by a repair) resolves a request at once; when
    the state cannot be read, the request counts as pending."""
    try:
        return request_id in (await handle.state()).pending_approvals
    except (TaskError, RPCError):
        return True


MODEL_ACTIVITIES = frozenset({"call_llm", "summarize_context"})


@contextlib.contextmanager
def shows_failed_attempts(
    view: LiveView, task_id: str, *, enabled: bool, tree: bool = False
) -> Iterator[None]:
    """While following a task, its failed model attempts are one line in the live view (with
    `tree`, its sub-agents' too)."""
    if not enabled:
        yield
        return

    def show(failure: worker_log.AttemptFailure) -> bool:
        ours = failure.workflow_id == task_id or (
            tree and failure.workflow_id.startswith(task_id + "/")
        )
        mine = ours and failure.activity in MODEL_ACTIVITIES
        return mine and view.attempt_failed(failure)

    worker_log.listen(show)
    try:
        yield
    finally:
        worker_log.listen(None)


async def _ask(handle: TaskHandle, request: ApprovalRequested) -> None:
    # The live view has shown the call, with every argument in full when its summary cut one.
    prompt = f"approve {visible(request.tool)}? [y/N/message to reject] "
    answer = await asyncio.to_thread(input, prompt)
    answer = answer.strip()
    approve = answer.lower() in {"y", "yes"}
    message = None if approve or answer.lower() in {"", "n", "no"} else answer
    # Bound to the call this prompt showed: a decision for any other call is refused.
    outcome = await handle.approve(
        request.request_id,
        reject=not approve,
        message=message,
        approver=_approver(),
        shown=request_digest(request.tool, request.arguments),
    )
    if outcome.duplicate:
        _say(f"request {outcome.request_id} was already decided: {outcome.decision}")


async def _final_status(handle: TaskHandle) -> int:
    from waystation.client.agent_runtime import TaskCancelledError, TaskFailedError

    try:
        outcome = await handle.result()
    except TaskFailedError as err:
        _say(f"task {handle.id} failed: {err}")
        return EXIT_FAILED
    except TaskCancelledError:
        return EXIT_CANCELLED
    _say(f"task {handle.id} done in {outcome.steps} step(s), {outcome.usage.total} tokens")
    return 0


def _event_seq(text: str) -> int:
    try:
        seq = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an event seq (a whole number)") from None
    if seq < 0:
        raise argparse.ArgumentTypeError(f"{seq} is not an event seq: seqs start at 0")
    return seq


def _approver() -> str:
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "cli"


def _task_from_args(args: argparse.Namespace, settings: Settings) -> AgentTask:
    options = ("temperature", "max_tokens", "tool_choice", "first_chunk_timeout_seconds")
    model = {
        option: getattr(args, option) for option in options if getattr(args, option) is not None
    }
    fields: dict[str, Any] = {
        "model": default_model(settings, args.model, **model),
        "max_steps": args.max_steps,
    }
    if args.token_budget is not None:
        fields["token_budget"] = args.token_budget
    if args.tools is not None:
        fields["tools"] = [t for t in args.tools.split(",") if t]
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
        existed = bool(args.id) and await _exists(runtime, args.id)
        handle = await runtime.run(task, task_id=args.id)
        if existed:
            _say(
                f"task {handle.id} already exists: showing it (an id names one task; the text "
                "given here is not used)"
            )
        else:
            _say(f"task {handle.id} started (model: {task.model.name})")
        if args.no_wait:
            print(handle.id)
            if note := await no_worker_note(client, settings.task_queue):
                _say(note)
            return 0
        if args.quiet:
            code = await _final_status(handle)
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
        sender=_approver(),
    )
    turn = " (it had answered: a new turn)" if handle.began_turn else ""
    _say(f"message {handle.awaited_message} sent to task {handle.id}{turn}")
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
            _say(f"task {handle.id}: {state.status}, turn {state.turn}, step {state.step}")
            if state.result:
                _say(f"its last answer: {state.result}")
        _say("type a message and Enter; Ctrl-D leaves (the task stays)")
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                print(file=sys.stderr)
                again = hints.command("chat", handle.id) if handle is not None else ""
                where = f": continue with  {again}" if handle is not None else ""
                _say(f"left the conversation; the task stays{where}")
                return 0
            if not line.strip():
                continue
            if handle is None:
                model = default_model(settings, args.model)
                task = runtime.new_task(line, max_steps=args.max_steps or 20, model=model)
                handle = await runtime.run(task)
                _say(f"task {handle.id} started (model: {task.model.name})")
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
            approver=args.approver or _approver(),
        )
        note = " (already decided earlier)" if outcome.duplicate else ""
        _say(f"request {outcome.request_id}: {outcome.decision}{note}")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_answer(args: argparse.Namespace, settings: Settings) -> int:
    request, text = (args.request, args.text) if args.text is not None else (None, args.request)
    if text is None:
        raise UsageError("give the answer: ws answer TASK_ID [REQUEST_ID] 'the answer'")
    async with session(settings, args.worker) as runtime:
        handle = await runtime.find(args.id)
        head = await runtime.stream_head(args.id) if args.follow else 0
        outcome = await handle.answer(text, request, answerer=args.answerer or _approver())
        if outcome.duplicate:
            _say(
                f"question {outcome.request_id} was already answered"
                + (f" by {outcome.answerer}" if outcome.answerer else "")
                + f": {outcome.answer}"
            )
        else:
            _say(f"question {outcome.request_id}: answered {outcome.answer!r}")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        head = await runtime.stream_head(args.id)
        handle = await runtime.resume(
            args.id, max_steps=args.max_steps, token_budget=args.token_budget, message=args.message
        )
        _say(f"task {handle.id} resumed")
        return await follow_from(runtime, handle, head) if args.follow else 0


async def cmd_repair(args: argparse.Namespace, settings: Settings) -> int:
    async with session(settings, args.worker) as runtime:
        handle = await runtime.repair(args.id, by=_approver())
        _say(f"task {handle.id} repaired: reset to its last good workflow task")
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
        )
        _say(f"task {handle.id} forked from {args.id} after event {args.at}")
        if not args.follow:
            print(handle.id)
            return 0
        return await follow_from(runtime, handle, 0)


async def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_server=False)
    runtime = AgentRuntime(client, settings)
    async with hosted_worker(client, settings, args.worker):
        handle = runtime.get(args.id)
        view = LiveView()
        tree = args.tree or not args.json
        with shows_failed_attempts(view, args.id, enabled=not args.json, tree=tree):
            async for item in runtime.stream(
                args.id,
                since=args.since,
                topics=args.topics.split(",") if args.topics else None,
                wait_for_start=timedelta(seconds=args.wait) if args.wait else None,
                tree=tree,
            ):
                _emit(item, view, args.json)
        return await _final_status(handle)


def _emit(item: StreamItem, view: LiveView, as_json: bool) -> None:
    if as_json:
        print(visible_json(item.model_dump_json()), flush=True)
    else:
        view.show(item)


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_server=False)
    runtime = AgentRuntime(client, settings)
    handle = await runtime.find(args.id)
    if (stuck := await handle.stuck()) is not None:
        _say(
            f"task {args.id} is stuck: its workflow task failed {stuck.attempts} times in a row: "
            f"{stuck.problem}\nrepair it with: {hints.command('repair', args.id)}"
        )
        return EXIT_FAILED
    async with hosted_worker(client, settings, args.worker, activities=False):
        state = await handle.state(within=timedelta(seconds=args.timeout))
        running = not state.finished
        queued = await handle.queued_messages(timedelta(seconds=args.timeout)) if running else []
    if args.json:
        print(visible_json(state.model_dump_json(indent=2)))
    else:
        print(render_state(state, args.id, await handle.tree(state)))
        for message in queued:
            who = f" from {message.sender}" if message.sender else ""
            said = visible(f"[{message.message_id}]{who}: {message.content}")
            print(f"queued    {said[:200]}")
    if state.status == "running" and (note := await no_worker_note(client, settings.task_queue)):
        _say(note)
    return STATUS_EXIT_CODES.get(state.status, 0)


async def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_server=False)
    handle = AgentRuntime(client, settings).get(args.id)
    async with hosted_worker(client, settings, args.worker, activities=False):
        events = await handle.events(args.since, within=timedelta(seconds=args.timeout))
    for event in events:
        print(visible_json(event.model_dump_json()))
    return 0


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_server=False)
    tasks, _ = await AgentRuntime(client, settings).list_tasks(args.status, page_size=args.limit)
    for task in tasks:
        step = task.step if task.step is not None else "?"
        started = task.started_at.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{visible(task.id):<28} {task.status:<17} step {step:<4} {started}")
    if not tasks:
        _say("no tasks" + (f" with status {args.status}" if args.status else ""))
    return 0


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    try:
        await AgentRuntime(client, settings).get(args.id).cancel()
    except TaskEndedError as err:
        _say(str(err))
        return EXIT_ENDED
    _say(f"cancellation of {args.id} requested")
    return 0


async def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    from waystation.servers.mcp_server import serve_stdio

    # stdout is the MCP channel from here on: everything else this process says goes to stderr.
    async with session(settings, args.worker) as runtime:
        await serve_stdio(runtime)
    return 0


async def cmd_tools(args: argparse.Namespace, settings: Settings) -> int:
    """The tools a task can be offered: the deployment's (WAYSTATION_TOOLS), then each MCP
    server's (started here)."""
    from waystation.activities.mcp.manager import McpClientManager
    from waystation.activities.tool_modules import load_tools

    registry = load_tools(settings.tools, settings.agents)
    for name in registry.names():
        tool = registry.get(name)
        assert tool is not None
        retry = "retried" if tool.retry_safe else "at most once"
        print(f"{name:40} approval: {tool.approval:15} {retry}")
    manager = McpClientManager(settings.mcp_server_configs())
    try:
        catalog = await manager.list_tools()
    finally:
        await manager.close()
    for server in catalog.servers:
        if server.error is not None:
            _say(f"MCP server {server.server}: {server.error}")
        for note in server.notes:
            _say(f"MCP server {server.server}: {note}")
        for spec in server.tools:
            retry = "retried" if spec.retry_safe else "at most once"
            print(f"{spec.name:40} approval: {spec.approval:15} {retry}")
    return EXIT_FAILED if any(s.error for s in catalog.servers) else 0


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from waystation import worker

    return await worker.main()


async def cmd_storage(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import timedelta

    from waystation.activities.storage import open_storage

    storage = await open_storage(settings)
    try:
        if args.action == "prune":
            days = settings.retention_days if args.older_than is None else args.older_than
            kept = settings.conversation_retention_days
            report = await storage.prune(timedelta(days=days), timedelta(days=kept))
            _say(
                f"pruned {report.ledger_entries} finished ledger entries older than {days:g} "
                f"days and {report.blobs} conversation messages unused for {kept:g} days from "
                f"{storage.location}"
            )
        elif args.action == "forget-workspace":
            await storage.backend.forget_workspace()
            _say(
                f"deployment {storage.deployment_id} has no registered workspace now; the next "
                "worker to start registers its own"
            )
        else:
            shown = {
                "location": storage.location,
                "deployment_id": storage.deployment_id,
                **await storage.backend.stats(),
            }
            print(json.dumps(shown, indent=2))
    finally:
        await storage.close()
    return 0


def _masked(value: Any) -> Any:
    text = str(value)
    return "****" if len(text) <= 8 else text[:3] + "****" + text[-2:]


def _masked_url(settings: Settings) -> str | None:
    if settings.database_url is None:
        return None
    from waystation.activities.storage.postgres import describe_url

    return "postgresql://" + describe_url(settings.database_url.get_secret_value())


async def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    from waystation.client.temporal import ensure_search_attributes

    client = await connect(settings)
    await ensure_search_attributes(client)
    _say(f"search attributes registered on namespace {client.namespace!r}")
    return 0


async def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    from waystation.client.temporal import connect_config

    shown: dict[str, Any] = json.loads(settings.model_dump_json())
    shown["openai_api_key"] = _masked(settings.api_key) if settings.api_key else None
    shown["encryption_keys"] = {k: "****" for k in settings.encryption_keys}
    shown["database_url"] = _masked_url(settings)
    shown["api_tokens"] = {
        _masked(token): value.model_dump() for token, value in settings.api_tokens.items()
    }
    shown["mcp_servers"] = {
        name: server.shown() for name, server in settings.mcp_server_configs().items()
    }
    shown["webhooks"] = [endpoint.shown() for endpoint in settings.webhook_endpoints()]
    temporal = {k: v for k, v in connect_config(settings).items() if k != "tls"}
    if "api_key" in temporal:
        temporal["api_key"] = _masked(temporal["api_key"])
    temporal["tls"] = bool(connect_config(settings).get("tls"))
    shown["temporal"] = temporal
    shown["default_model"] = settings.default_model
    shown["workspace_dir"] = str(settings.workspace_dir)
    print(json.dumps(shown, indent=2, default=str))
    return 0


async def cmd_server(args: argparse.Namespace, settings: Settings) -> int:
    server = DevServer(settings)
    if args.action == "stop":
        _say("stopped the embedded Temporal dev server" if server.stop() else "no server to stop")
    elif args.action == "start":
        if await asyncio.to_thread(server.start):
            _say(
                f"embedded Temporal dev server on {server.address}, Web UI "
                f"http://localhost:{settings.dev_server_ui_port}, database {server.database}"
            )
        else:
            _say(f"a Temporal server already listens on {server.address}")
    else:
        _say("running" if server.running() else "not running")
    return 0


def _add_worker_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-worker",
        dest="worker",
        action="store_false",
        help="do not host a worker in this process (one runs elsewhere: ws worker)",
    )


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="ws", description=__doc__.split("\n\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    _task_commands(commands)
    _conversation_commands(commands)
    _reading_commands(commands)
    _admin_commands(commands)
    for command in commands.choices.values():
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="the hosted worker's full log (tracebacks of failed attempts) on stderr",
        )
    return root


def _task_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that start, decide or move a task."""
    run = commands.add_parser("run", help="start a task and follow it live")
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--id", help="task id (default: generated); reusing one returns that task")
    run.add_argument("--model", help="model name, or 'offline'")
    run.add_argument("--max-steps", type=int, default=20)
    run.add_argument("--token-budget", type=int)
    run.add_argument("--tools", help="comma-separated tool names the model may call")
    run.add_argument("--temperature", type=float, help="sampling temperature (0-2)")
    run.add_argument("--max-tokens", type=int, help="most tokens the model writes per step")
    run.add_argument(
        "--tool-choice",
        help="auto, none, required, or the name of the one tool the model must call",
    )
    run.add_argument(
        "--first-chunk-timeout",
        dest="first_chunk_timeout_seconds",
        type=float,
        help="seconds to wait for a model's first chunk (default 300: CPU-served models)",
    )
    run.add_argument("--approval-timeout", type=float, help="seconds a request may wait")
    run.add_argument(
        "--output-schema",
        metavar="FILE",
        help="a JSON Schema file: the task answers with data that fits it (validated)",
    )
    run.add_argument("--no-wait", action="store_true", help="print the task id and exit")
    run.add_argument("--quiet", action="store_true", help="no live view: print only the result")
    run.add_argument("--json", action="store_true", help="stream items as JSON lines")
    run.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    run.add_argument(
        "--on-approval",
        choices=["ask", "exit", "wait"],
        default="ask",
        help="ask y/n on a terminal (default; without one: exit), exit with code 3, or wait",
    )
    _add_worker_flag(run)

    approve = commands.add_parser("approve", help="approve (or --reject) a pending tool call")
    approve.add_argument("id")
    approve.add_argument("request", nargs="?", help="request id (default: the only pending one)")
    approve.add_argument("--reject", action="store_true")
    approve.add_argument("--message", help="told to the model with the decision")
    approve.add_argument("--arguments", help="edited arguments as a JSON object")
    approve.add_argument("--approver", help="who decides (default: user@cli)")
    approve.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(approve)

    answer = commands.add_parser("answer", help="answer a question the agent asked")
    answer.add_argument("id")
    answer.add_argument(
        "request", nargs="?", help="the question's request id (default: the only pending one)"
    )
    answer.add_argument("text", nargs="?", help="the answer (one of the choices, if it has some)")
    answer.add_argument("--answerer", help="who answers (default: user@cli)")
    answer.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(answer)

    resume = commands.add_parser("resume", help="resume a failed task from its last good point")
    resume.add_argument("id")
    resume.add_argument("--max-steps", type=int, help="raise the step limit")
    resume.add_argument("--token-budget", type=int, help="raise the token budget")
    resume.add_argument("--message", help="a user message for the model, e.g. what to do instead")
    resume.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(resume)

    repair = commands.add_parser(
        "repair", help="reset a stuck task to its last good workflow task (decisions kept)"
    )
    repair.add_argument("id")
    repair.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(repair)

    fork = commands.add_parser("fork", help="start a new task from the state after an event")
    fork.add_argument("id")
    fork.add_argument(
        "--at", type=_event_seq, required=True, help="event seq to fork after (0 or more)"
    )
    fork.add_argument("--message", help="a user message to add first (an edited turn)")
    fork.add_argument("--new-id", help="id of the new task (default: ID-fork-xxxxxx)")
    fork.add_argument("--max-steps", type=int, help="the fork's step limit")
    fork.add_argument("--token-budget", type=int, help="the fork's token budget")
    fork.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(fork)


def _conversation_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that talk with a task: a follow-up after its answer, or a steer while it works."""
    say = commands.add_parser("say", help="send a task a message and follow it live to the answer")
    say.add_argument("id")
    say.add_argument("message", nargs="?", help="the message; - reads it from standard input")
    say.add_argument("--file", help="read the message from this file")
    say.add_argument(
        "--interrupt",
        action="store_true",
        help="cancel the model call in flight and start the step again with the message",
    )
    say.add_argument("--max-steps", type=int, help="the turn's step limit from now on")
    say.add_argument("--json", action="store_true", help="stream items as JSON lines")
    say.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    say.add_argument("--no-follow", dest="follow", action="store_false")
    _add_worker_flag(say)

    chat = commands.add_parser(
        "chat", help="a conversation in the terminal: prompt, live view, answer (Ctrl-D leaves)"
    )
    chat.add_argument("id", nargs="?", help="the task to talk with (default: a new one)")
    chat.add_argument("--model", help="model of a new task, or 'offline'")
    chat.add_argument("--max-steps", type=int, help="step limit of each turn")
    _add_worker_flag(chat)


def _reading_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that read tasks (and cancel one)."""
    stream = commands.add_parser("stream", help="follow a task's events and tokens")
    stream.add_argument("id")
    stream.add_argument("--since", type=int, default=0, help="stream offset to start from")
    stream.add_argument("--topics", help="events,tokens (default: both)")
    stream.add_argument("--json", action="store_true", help="JSON lines for programs")
    stream.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    stream.add_argument("--wait", type=float, help="seconds to wait for the task to start")
    _add_worker_flag(stream)

    status = commands.add_parser("status", help="folded state and pending approvals")
    status.add_argument("id")
    status.add_argument("--json", action="store_true")
    status.add_argument("--timeout", type=float, default=10)
    _add_worker_flag(status)

    events = commands.add_parser("events", help="the event log as JSON lines")
    events.add_argument("id")
    events.add_argument("--since", type=int, default=0)
    events.add_argument("--timeout", type=float, default=10)
    _add_worker_flag(events)

    listing = commands.add_parser("list", help="tasks, newest first")
    listing.add_argument("--status", choices=TASK_STATUSES, help="only tasks with this status")
    listing.add_argument("--limit", type=int, default=50)

    cancel = commands.add_parser("cancel", help="cancel a task")
    cancel.add_argument("id")


def _admin_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands for the deployment: tools, workers, settings, storage, the dev server."""
    mcp = commands.add_parser("mcp", help="serve waystation's tools to an MCP client over stdio")
    _add_worker_flag(mcp)

    commands.add_parser(
        "tools", help="the deployment's tools and MCP tools, with approval and retry defaults"
    )
    commands.add_parser("worker", help="run a worker in the foreground")
    commands.add_parser("config", help="the effective settings, secrets masked")
    commands.add_parser("setup", help="register the search attributes on the namespace")
    commands.add_parser("api", help="serve the HTTP API (WAYSTATION_API_HOST/PORT/TOKENS)")

    storage = commands.add_parser(
        "storage", help="the ledger and blob storage: info, prune, forget-workspace"
    )
    storage.add_argument("action", choices=["info", "prune", "forget-workspace"])
    storage.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="prune: finished ledger entries older than this (default: "
        "WAYSTATION_RETENTION_DAYS); saved conversations go after "
        "WAYSTATION_CONVERSATION_RETENTION_DAYS",
    )

    server = commands.add_parser("server", help="the embedded Temporal dev server")
    server.add_argument("action", choices=["start", "stop", "status"])


COMMANDS = {
    "run": cmd_run,
    "approve": cmd_approve,
    "say": cmd_say,
    "answer": cmd_answer,
    "chat": cmd_chat,
    "stream": cmd_stream,
    "resume": cmd_resume,
    "repair": cmd_repair,
    "fork": cmd_fork,
    "status": cmd_status,
    "events": cmd_events,
    "list": cmd_list,
    "cancel": cmd_cancel,
    "mcp": cmd_mcp,
    "tools": cmd_tools,
    "worker": cmd_worker,
    "config": cmd_config,
    "setup": cmd_setup,
    "server": cmd_server,
    "storage": cmd_storage,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    worker_log.configure(args.verbose)
    try:
        settings = load_settings()
    except SettingsProblem as err:
        _say(f"error: {err}")
        return 2
    hide_starting_environment()  # a command may host a worker: its secrets stay off /proc
    if args.command == "api":
        from waystation.servers.http_api import main as serve

        return serve(settings)  # uvicorn runs its own event loop
    try:
        return asyncio.run(COMMANDS[args.command](args, settings))
    except (TaskError, DecisionError, TemporalUnavailableError, StorageError) as err:
        _say(f"error: {err}")
        return EXIT_FAILED
    except RPCError as err:
        _say(f"error from Temporal: {err}")
        return EXIT_FAILED
    except TimeoutError:
        _say(
            "error: no answer in time from Temporal or a worker (is a worker running? "
            f"{hints.command('worker')})"
        )
        return EXIT_FAILED
    except ValidationError as err:
        _say(f"error: {validation_sentence(err)}")
        return 2
    except (
        UnknownToolsError,
        ToolDefinitionError,
        UsageError,
        WebhookConfigError,
        TaskRefusedError,
    ) as err:
        _say(f"error: {err}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted; the task goes on in Temporal")
        return EXIT_CANCELLED
    except BrokenPipeError:
        # The reader left (`ws events ID | head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cli() -> None:
    """The `ws` command: main(), then leave at once."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Temporal's core threads may still call back after a cancelled long poll; letting the
    # interpreter finalize under them can abort the process. Everything is flushed: leave.
    os._exit(code)


if __name__ == "__main__":
    cli()
