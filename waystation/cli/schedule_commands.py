"""`ws schedule`: create a schedule whose firings each run a task, and list, show, pause,
resume, trigger or delete one (waystation/client/schedules.py; docs/schedules.md)."""

from __future__ import annotations

import argparse

from waystation.cli.render import visible
from waystation.cli.task_commands import _task_from_args
from waystation.cli.terminal import say
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.pollers import no_worker_note
from waystation.client.schedules import ScheduleInfo, ScheduleSpec
from waystation.client.temporal import connect
from waystation.settings import Settings

TIME = "%Y-%m-%d %H:%M:%S"


def when(info: ScheduleInfo) -> str:
    """When it fires, in a few words."""
    timing = [f"cron {c}" for c in info.cron]
    timing += [f"every {_seconds(s)}" for s in info.every_seconds]
    zone = f" ({info.timezone})" if info.timezone else ""
    return ", ".join(timing) + zone


def _seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def show_lines(info: ScheduleInfo) -> list[str]:
    """`ws schedule show`: the schedule, its next runs and the tasks of its recent ones."""
    state = f"paused ({info.note})" if info.paused else "active"
    lines = [
        f"schedule {info.name}: {state}, {when(info)}, overlap {info.overlap}",
        f"  task: {visible(info.text)}",
    ]
    if info.tenant:
        lines.append(f"  tenant: {info.tenant}")
    if info.conversation:
        lines.append(f"  conversation: every firing continues task {info.task_id}")
    if info.end_at:
        lines.append(f"  ends at: {info.end_at.strftime(TIME)}")
    lines.append(f"  fired {info.fired}, skipped {info.skipped}, missed {info.missed}")
    lines += [f"  next: {run.strftime(TIME)}" for run in info.next_runs[:3]]
    for run in info.recent_runs:
        lines.append(f"  ran:  {run.scheduled_at.strftime(TIME)}  task {run.task_id}")
    lines += [f"  running: task {task_id}" for task_id in info.running]
    return lines


def list_line(info: ScheduleInfo) -> str:
    state = "paused" if info.paused else "active"
    upcoming = info.next_runs[0].strftime(TIME) if info.next_runs and not info.paused else "-"
    last = info.recent_runs[0].task_id if info.recent_runs else "-"
    return f"{info.name:<24} {state:<7} next {upcoming:<19}  last {last}  ({when(info)})"


async def cmd_schedule(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_server=args.schedule_command == "create")
    runtime = AgentRuntime(client, settings)
    verb = args.schedule_command
    if verb == "create":
        return await _create(runtime, args, settings)
    if verb == "list":
        infos = await runtime.schedules.list(tenant=args.tenant)
        for info in infos:
            print(info.model_dump_json() if args.json else list_line(info))
        if not infos:
            say("no schedules" + (f" of tenant {args.tenant}" if args.tenant else ""))
        return 0
    if verb == "show":
        info = await runtime.schedules.describe(args.name)
        print(info.model_dump_json(indent=2) if args.json else "\n".join(show_lines(info)))
        return 0
    if verb == "pause":
        await runtime.schedules.pause(args.name, note=args.note)
    elif verb == "resume":
        await runtime.schedules.resume(args.name)
    elif verb == "trigger":
        await runtime.schedules.trigger(args.name)
    elif verb == "delete":
        await runtime.schedules.delete(args.name)
    said = {"pause": "paused", "resume": "resumed", "trigger": "triggered", "delete": "deleted"}
    say(f"schedule {args.name} {said[verb]}")
    if verb == "trigger" and (note := await no_worker_note(client, settings.task_queue)):
        say(note)
    return 0


async def _create(runtime: AgentRuntime, args: argparse.Namespace, settings: Settings) -> int:
    spec = ScheduleSpec(
        name=args.name,
        task=_task_from_args(args, settings),
        cron=args.cron,
        every_seconds=args.every,
        timezone=args.timezone,
        end_at=args.end_at,
        conversation=args.conversation,
        overlap=args.overlap,
        catchup_window_seconds=args.catchup_window,
        paused=args.paused,
    )
    info = await runtime.create_schedule(spec)
    say(f"schedule {info.name} created ({when(info)}); `temporal schedule list` shows it too")
    print("\n".join(show_lines(info)))
    if note := await no_worker_note(runtime.client, settings.task_queue):
        say(note)
    return 0
