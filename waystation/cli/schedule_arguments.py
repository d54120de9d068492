"""The arguments of `ws schedule`: create, list, show, pause, resume, trigger, delete."""

from __future__ import annotations

import argparse
import re
from datetime import datetime

from waystation.cli.arguments import task_options

OVERLAP_POLICIES = (
    "skip",
    "buffer_one",
    "buffer_all",
    "cancel_other",
    "terminate_other",
    "allow_all",
)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def duration_seconds(text: str) -> float:
    """`90s`, `15m`, `1h`, `1d`, `1h30m` as seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number and a unit, s m h or d (90s, 15m, 1h, 1h30m)"
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)


def moment(text: str) -> datetime:
    """An ISO time with its zone: 2026-12-31T18:00:00Z or 2026-12-31T19:00:00+01:00."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO time (2026-12-31T18:00Z)"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a zone: end it with Z or +hh:mm")
    return when


def schedule_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`ws schedule ...`: tasks that start on a cron expression or an interval."""
    schedule = commands.add_parser(
        "schedule", help="run a task on a schedule (Temporal Schedules): create, list, show, ..."
    )
    verbs = schedule.add_subparsers(dest="schedule_command", required=True)
    create = verbs.add_parser("create", help="create a schedule whose firings each run the task")
    create.add_argument("name", help="the schedule's name (its id in Temporal)")
    create.add_argument("task", help="what the agent should do at each firing")
    timing = create.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", help='a cron expression: "0 9 * * 1-5" (9:00 on weekdays)')
    timing.add_argument(
        "--every", type=duration_seconds, metavar="DURATION", help="an interval: 90s, 15m, 1h, 1d"
    )
    create.add_argument("--timezone", help="the cron's IANA time zone (default UTC)")
    create.add_argument("--end-at", type=moment, help="no firing after this ISO time")
    create.add_argument(
        "--conversation",
        action="store_true",
        help="each firing is the next turn of one task (its id: the schedule's name)",
    )
    create.add_argument(
        "--overlap",
        choices=OVERLAP_POLICIES,
        default="skip",
        help="a firing while the previous one still runs (default: skip it)",
    )
    create.add_argument(
        "--catchup-window",
        type=duration_seconds,
        metavar="DURATION",
        help="how late a firing missed while Temporal was down still runs (default 365d)",
    )
    create.add_argument("--paused", action="store_true", help="create it paused")
    task_options(create)
    listing = verbs.add_parser("list", help="the schedules, with their next and last runs")
    listing.add_argument("--tenant", help="only this tenant's schedules")
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    show = verbs.add_parser("show", help="a schedule: when it fires, its recent runs' tasks")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="as JSON")
    pause = verbs.add_parser("pause", help="stop its firings until resumed")
    pause.add_argument("name")
    pause.add_argument("--note", help="why (shown with it)")
    for verb, text in (
        ("resume", "let its firings start again"),
        ("trigger", "fire it now, once (even while paused)"),
        ("delete", "delete it (tasks it started go on)"),
    ):
        verbs.add_parser(verb, help=text).add_argument("name")
