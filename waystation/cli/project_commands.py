"""What this side uses and who serves it: `ws status` without a task id, and `ws doctor`,
which also says how the live workers' settings differ from this side's."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from waystation.cli.terminal import EXIT_FAILED, say
from waystation.settings import Settings

if TYPE_CHECKING:
    from temporalio.client import Client


async def cmd_where(args: argparse.Namespace, settings: Settings) -> int:
    """The project, server and task queue, and the workers that serve it."""
    return await _report(settings, diagnose=False)


async def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """`ws status` without an id, and each live worker whose settings differ from this
    side's (the tools and sub-agents it offers, its MCP servers, its model endpoint);
    1 when Temporal cannot be reached, no worker serves the queue, or one differs."""
    return await _report(settings, diagnose=True)


async def _report(settings: Settings, *, diagnose: bool) -> int:
    from waystation.activities.tool_modules import load_tools
    from waystation.activities.worker_offer import offer_of, without_offer
    from waystation.client.serving_workers import differences_from, offers_of
    from waystation.client.temporal import TemporalUnavailableError, connect, connect_config

    target = str(connect_config(settings)["target_host"])
    print(f"project     {settings.project}")
    print(f"task queue  {settings.task_queue}")
    print(f"data        {settings.data_dir.absolute()}")
    try:
        client = await connect(settings, start_server=False, log=False)
    except TemporalUnavailableError as err:
        print(f"server      {target}: not reachable")
        say(str(err))
        return EXIT_FAILED
    print(f"server      {target} (namespace {client.namespace})")
    offers = await offers_of(client, settings)
    if not offers:
        print("workers     none polls the task queue: start one with `ws worker`")
        if await _legacy_queue_served(client, settings):
            say(
                f"workers poll the task queue {LEGACY_QUEUE!r}, every project's before "
                "WAYSTATION_PROJECT: set WAYSTATION_TASK_QUEUE=waystation to serve the tasks "
                "started there, or restart those workers in their project"
            )
        return EXIT_FAILED if diagnose else 0
    for identity, offer in offers:
        shown = without_offer(identity)
        if offer is None:
            print(f"worker      {shown} (offers not known here)")
        else:
            endpoint = offer.endpoint or "offline model only"
            names = f" (ENDPOINT:MODEL: {', '.join(offer.endpoints)})" if offer.endpoints else ""
            print(
                f"worker      {shown}: {len(offer.tools)} tools, model endpoint {endpoint}{names}"
            )
    if not diagnose:
        return 0
    mine = offer_of(settings, load_tools(settings.tools, settings.agents), [], settings.task_queue)
    differing = differences_from(mine, offers)
    for line in differing:
        print(f"differs     {line}")
    if differing:
        say(
            "workers whose settings differ from this side's serve this task queue: restart "
            "them with the project's settings (a worker reads them as it starts)"
        )
        return EXIT_FAILED
    print("settings    every live worker offers what this side does")
    return 0


# The default task queue of every project before projects had their own.
LEGACY_QUEUE = "waystation"


async def _legacy_queue_served(client: Client, settings: Settings) -> bool:
    from temporalio.service import RPCError

    from waystation.client.pollers import polling_workers

    if settings.task_queue == LEGACY_QUEUE:
        return False
    try:
        return bool(await polling_workers(client, LEGACY_QUEUE, "activity"))
    except RPCError:
        return False
