"""The commands for the deployment: mcp, tools, worker, storage, setup, config, server."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from waystation.cli.terminal import EXIT_FAILED, say, session

# Each command imports what it uses (`ws config` reaches no Temporal server).
if TYPE_CHECKING:
    from waystation.settings import Settings


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
    from waystation.client.task_rights import deployment_rule

    registry = load_tools(settings.tools, settings.agents)
    for name in registry.names():
        tool = registry.get(name)
        assert tool is not None
        retry = "retried" if tool.retry_safe else "at most once"
        # The deployment's rule (WAYSTATION_MEMORY_APPROVAL for the memory tools that write).
        rule = deployment_rule(name, registry, {}, settings.memory_approval)
        print(f"{name:40} approval: {rule:15} {retry}")
    manager = McpClientManager(settings.mcp_server_configs())
    try:
        catalog = await manager.list_tools()
    finally:
        await manager.close()
    for server in catalog.servers:
        if server.error is not None:
            say(f"MCP server {server.server}: {server.error}")
        for note in server.notes:
            say(f"MCP server {server.server}: {note}")
        for spec in server.tools:
            retry = "retried" if spec.retry_safe else "at most once"
            print(f"{spec.name:40} approval: {spec.approval:15} {retry}")
    return EXIT_FAILED if any(s.error for s in catalog.servers) else 0


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from waystation import worker

    return await worker.main()


async def cmd_storage(args: argparse.Namespace, settings: Settings) -> int:

    from waystation.activities.storage import open_storage

    storage = await open_storage(settings)
    try:
        if args.action == "prune":
            days = settings.retention_days if args.older_than is None else args.older_than
            kept = settings.conversation_retention_days
            report = await storage.prune(timedelta(days=days), timedelta(days=kept))
            say(
                f"pruned {report.ledger_entries} finished ledger entries older than {days:g} "
                f"days, {report.blobs} conversation messages unused for {kept:g} days and "
                f"{report.memory_items} expired memory items from {storage.location}"
            )
        elif args.action == "forget-workspace":
            await storage.backend.forget_workspace()
            say(
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
    from waystation.client.temporal import connect, ensure_search_attributes

    client = await connect(settings)
    await ensure_search_attributes(client)
    say(f"search attributes registered on namespace {client.namespace!r}")
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
    shown["model_endpoints"] = {
        name: endpoint.shown() for name, endpoint in settings.model_endpoints.items()
    }
    shown["webhooks"] = [endpoint.shown() for endpoint in settings.webhook_endpoints()]
    temporal = {k: v for k, v in connect_config(settings).items() if k != "tls"}
    if "api_key" in temporal:
        temporal["api_key"] = _masked(temporal["api_key"])
    temporal["tls"] = bool(connect_config(settings).get("tls"))
    shown["temporal"] = temporal
    shown["default_model"] = settings.default_model
    shown["workspace_dir"] = str(settings.workspace_dir)
    if args.name is not None:
        if args.name not in shown:
            say(f"error: no setting named {args.name!r}; `ws config` lists them")
            return 2
        value = shown[args.name]
        print(value if isinstance(value, str) else json.dumps(value, default=str))
        return 0
    print(json.dumps(shown, indent=2, default=str))
    return 0


async def cmd_server(args: argparse.Namespace, settings: Settings) -> int:
    from waystation.client.temporal import DevServer

    server = DevServer(settings)
    if args.action == "stop":
        say("stopped the embedded Temporal dev server" if server.stop() else "no server to stop")
    elif args.action == "start":
        if await asyncio.to_thread(server.start):
            say(
                f"embedded Temporal dev server on {server.address}, Web UI "
                f"http://localhost:{settings.dev_server_ui_port}, database {server.database}"
            )
        else:
            say(f"a Temporal server already listens on {server.address}")
    else:
        say("running" if server.running() else "not running")
    return 0
