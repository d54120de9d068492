"""Tools of a user's own, each a plain function under `@tool`, imported only from the public
root. Tests name this module in WAYSTATION_TOOLS (beside the built-ins) for workers, the
command line and the API alike."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Annotated

from pydantic import BaseModel, Field

from waystation import ToolContext, tool


class Item(BaseModel):
    name: str
    price_cents: int = Field(ge=0)


@tool
def basket_total(
    items: list[Item],
    discount_percent: Annotated[float, Field(ge=0, le=100, description="Off the total.")] = 0,
) -> str:
    """Add up the prices of a basket's items, less a discount."""
    cents = sum(item.price_cents for item in items) * (1 - discount_percent / 100)
    return f"{len(items)} items: {cents / 100:.2f}"


@tool(retry_safe=True)
async def keep_note(
    text: Annotated[str, Field(min_length=1)], context: ToolContext
) -> dict[str, object]:
    """Keep a note in the workspace's scratch folder (one file per call: a retry rewrites it)."""
    name = hashlib.sha256(context.idempotency_key.encode()).hexdigest()[:12]
    path = context.workspace / "scratch" / "notes" / f"{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, text)
    return {"kept": path.relative_to(context.workspace).as_posix(), "chars": len(text)}


@tool(timeout=0.5)
async def slow_lookup(query: str) -> str:
    """Look a word up in a slow dictionary."""
    await asyncio.sleep(60)  # the workload: always longer than its timeout
    return query
