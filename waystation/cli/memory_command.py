"""`ws memory`: the deployment's memory outside a task, read and written straight in its
storage (WAYSTATION_DATABASE_URL, else SQLite in the data directory). The command line
holds the deployment's credentials, so it reaches every namespace, as an approver."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from waystation.cli.terminal import UsageError
from waystation.client.memory_access import MemoryAccess
from waystation.settings import Settings
from waystation.workflows.memory import MemoryItem


async def cmd_memory(args: argparse.Namespace, settings: Settings) -> int:
    memory = MemoryAccess(settings)
    try:
        await _act(memory, args)
    finally:
        await memory.close()
    return 0


async def _act(memory: MemoryAccess, args: argparse.Namespace) -> None:
    namespace = getattr(args, "namespace", "main")
    match args.action:
        case "namespaces":
            for name, count in await memory.namespaces(args.tenant):
                print(f"{name}\t{count} item{'s' if count != 1 else ''}")
        case "list":
            _print(await memory.items(namespace), args.json, short=True)
        case "search":
            _print(await memory.search(namespace, args.query, limit=args.limit), args.json)
        case "show":
            _print([await memory.get(namespace, args.key)], args.json)
        case "put":
            key, value = args.key, args.value
            if value == "-":
                value = sys.stdin.read()
            metadata = _metadata(args.metadata)
            item = await memory.put(namespace, key, value, metadata=metadata, ttl_seconds=args.ttl)
            print(f"{item.namespace} {item.key}: revision {item.revision}")
        case "delete":
            await memory.delete(namespace, args.key)
            print(f"deleted {args.key} from {namespace}")


def _metadata(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        metadata = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--metadata is not JSON ({err.msg})") from None
    if not isinstance(metadata, dict):
        raise UsageError("--metadata must be a JSON object")
    return metadata


def _print(items: list[MemoryItem], as_json: bool, *, short: bool = False) -> None:
    for item in items:
        if as_json:
            print(item.model_dump_json())
        elif short:
            print(f"{item.key}\t{_one_line(item.value, 80)}")
        else:
            print(f"{item.key}: {item.value}")
            when = datetime.fromtimestamp(item.updated_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            expiry = ""
            if item.expires_at is not None:
                until = datetime.fromtimestamp(item.expires_at, UTC)
                expiry = f", expires {until:%Y-%m-%d %H:%M:%S} UTC"
            print(f"  revision {item.revision}, written {when}{expiry}")


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
