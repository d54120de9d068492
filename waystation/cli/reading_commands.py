"""The commands that read tasks (and cancel one): stream, status, events, list, cancel."""

from __future__ import annotations

import argparse
from datetime import timedelta

from waystation.cli.following import final_status, shows_failed_attempts
from waystation.cli.render import (
    LiveView,
    model_in_use,
    render_state,
    spent_text,
    visible,
    visible_json,
)
from waystation.cli.terminal import (
    EXIT_ENDED,
    EXIT_FAILED,
    STATUS_EXIT_CODES,
    hosted_worker,
    say,
)
from waystation.client.agent_runtime import (
    AgentRuntime,
    TaskEndedError,
)
from waystation.client.pollers import no_worker_note
from waystation.client.streaming import StreamItem
from waystation.client.task_list import task_tenant
from waystation.client.temporal import connect
from waystation.settings import Settings
from waystation.settings import commands as hints


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
                emit(item, view, args.json)
        return await final_status(handle)


def emit(item: StreamItem, view: LiveView, as_json: bool) -> None:
    if as_json:
        print(visible_json(item.model_dump_json()), flush=True)
    else:
        view.show(item)


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    if args.id is None:
        from waystation.cli.project_commands import cmd_where

        return await cmd_where(args, settings)
    client = await connect(settings, start_server=False)
    runtime = AgentRuntime(client, settings)
    handle = await runtime.find(args.id)
    if (stuck := await handle.stuck()) is not None:
        say(
            f"task {args.id} is stuck: its workflow task failed {stuck.attempts} times in a row: "
            f"{stuck.problem}\nrepair it with: {hints.command('repair', args.id)}"
        )
        return EXIT_FAILED
    async with hosted_worker(client, settings, args.worker, activities=False):
        state = await handle.state(within=timedelta(seconds=args.timeout))
        running = not state.finished
        queued = await handle.queued_messages(timedelta(seconds=args.timeout)) if running else []
        # The task's own model, for when no fallback has taken over (state.model is None).
        first = [] if args.json else await handle.events(0, 1, timedelta(seconds=args.timeout))
    if args.json:
        print(visible_json(state.model_dump_json(indent=2)))
    else:
        tree = await handle.tree(state)
        print(render_state(state, args.id, tree, model_in_use(state, first)))
        if (tenant := await task_tenant(client, args.id)) is not None:
            print(f"tenant    {visible(tenant)}")
        for message in queued:
            who = f" from {message.sender}" if message.sender else ""
            said = visible(f"[{message.message_id}]{who}: {message.content}")
            print(f"queued    {said[:200]}")
    if state.status == "running" and (note := await no_worker_note(client, settings.task_queue)):
        say(note)
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
    runtime = AgentRuntime(client, settings)
    tasks, _ = await runtime.list_tasks(args.status, page_size=args.limit, tenant=args.tenant)
    for task in tasks:
        step = task.step if task.step is not None else "?"
        started = task.started_at.strftime("%Y-%m-%d %H:%M:%S")
        spent = f"  {spent_text(task.usage)}" if task.usage is not None else ""
        print(f"{visible(task.id):<28} {task.status:<17} step {step:<4} {started}{spent}")
    if not tasks:
        tenant = f" of tenant {args.tenant}" if args.tenant else ""
        say("no tasks" + tenant + (f" with status {args.status}" if args.status else ""))
    return 0


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings)
    try:
        await AgentRuntime(client, settings).get(args.id).cancel()
    except TaskEndedError as err:
        say(str(err))
        return EXIT_ENDED
    say(f"cancellation of {args.id} requested")
    return 0
