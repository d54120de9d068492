"""`ws deploy status | promote | rollback | retire | check`: the versions of the workers'
code in Temporal's Worker Deployment (WAYSTATION_DEPLOYMENT), how new tasks move to one,
when an old one can go, and whether the code here would replay the histories in flight.

Exit codes: 0 done, 1 refused (one sentence: nothing changed) or a history that would not
replay, 2 usage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from waystation.cli.terminal import EXIT_FAILED, say

# This module is imported for `ws --help`: argparse only, the rest where it is used.
if TYPE_CHECKING:
    from temporalio.client import Client

    from waystation.client.deploys import DeploymentStatus
    from waystation.settings import Settings

RECORDED_HISTORIES = Path("tests/histories")
CHECK_HELP = (
    "replay the task queue's runs in flight and the recorded histories against the code here; "
    "1 naming each that would not replay. It cannot see a change that comes after the last "
    "workflow task a history recorded (a run waiting since its first step)"
)


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value:g} is not a percentage between 0 and 100")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    deploy = commands.add_parser(
        "deploy",
        help="the workers' versions (WAYSTATION_DEPLOYMENT): status, promote, rollback, "
        "retire, check",
    )
    actions = deploy.add_subparsers(dest="action", required=True)
    status = actions.add_parser(
        "status", help="each version: current/ramping/draining, workers, pinned tasks"
    )
    status.add_argument("--json", action="store_true")
    promote = actions.add_parser(
        "promote", help="make a version current (new tasks start on it), or --ramp it"
    )
    promote.add_argument("build_id", metavar="BUILD_ID")
    promote.add_argument(
        "--ramp", type=_percent, metavar="PERCENT", help="only this percentage of new tasks"
    )
    actions.add_parser("rollback", help="make the version that was current before current again")
    retire = actions.add_parser(
        "retire", help="delete a version no task is pinned to and no worker serves"
    )
    retire.add_argument("build_id", metavar="BUILD_ID")
    check = actions.add_parser("check", help=CHECK_HELP)
    check.add_argument(
        "--sample", type=_positive, metavar="N", help="N runs per status instead of all"
    )
    check.add_argument(
        "--histories",
        type=Path,
        metavar="DIR",
        help=f"recorded histories to replay too (default: {RECORDED_HISTORIES} when it exists)",
    )
    for action in actions.choices.values():
        # `ws deploy status -v` as well as `ws deploy -v status` (the flag every command has).
        action.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="the full log on stderr",
        )


async def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    from waystation.client.deploys import DeployRefusedError
    from waystation.client.temporal import connect

    # Deploying is for a server that runs: a stopped embedded one is left stopped.
    client = await connect(settings, start_server=False)
    deployment = settings.worker_deployment
    try:
        if args.action == "status":
            from waystation.client.deploys import deployment_status

            shown = await deployment_status(client, deployment)
            print(shown.model_dump_json(indent=2) if args.json else render_status(shown))
            return 0
        if args.action == "check":
            return await _check(args, client, settings.task_queue)
        say(await _change(args, client, deployment))
        return 0
    except DeployRefusedError as err:
        say(f"refused: {err}")
        return EXIT_FAILED


async def _change(args: argparse.Namespace, client: Client, deployment: str) -> str:
    from waystation.client import deploys

    if args.action == "promote":
        return await deploys.promote(client, deployment, args.build_id, args.ramp)
    if args.action == "rollback":
        return await deploys.rollback(client, deployment)
    return await deploys.retire(client, deployment, args.build_id)


async def _check(args: argparse.Namespace, client: Client, task_queue: str) -> int:
    from waystation.client.deploy_check import check

    histories = args.histories or recorded_histories_here()
    report = await check(client, task_queue, sample=args.sample, recorded=histories, progress=say)
    for failure in report.failures:
        print(f"would not replay: {failure.described()}")
    print(report.summary())
    return EXIT_FAILED if report.failures else 0


def recorded_histories_here() -> Path | None:
    """The project's recorded histories, when it keeps them where waystation does."""
    return RECORDED_HISTORIES if RECORDED_HISTORIES.is_dir() else None


def render_status(status: DeploymentStatus) -> str:
    lines = [f"deployment {status.deployment}; the code here is build {status.code_build_id}"]
    if not status.versions:
        lines.append("no version yet: one appears when a worker of it polls (ws worker)")
    for version in status.versions:
        state: str = version.state
        if version.ramp_percentage is not None:
            state = f"{state} {version.ramp_percentage:g}%"
        here = "  (the code here)" if version.this_code else ""
        workers = ", ".join(version.workers) if version.workers else "none"
        pinned = version.pinned
        lines += [
            f"{version.build_id}  {state}{here}",
            f"  workers  {len(version.workers)} live: {workers}",
            f"  pinned   {pinned.total} tasks: {pinned.described()}",
            f"  answered {version.answered_runs} closed runs: a follow-up to one asks this "
            "version's workers for its state",
            "  retire   "
            + (
                "can be retired: ws deploy retire " + version.build_id
                if version.retirable
                else f"not yet: {version.why_not_retirable}"
            ),
        ]
    return "\n".join(lines)
