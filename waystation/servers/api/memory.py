"""The memory routes: namespaces, their items, search, and an item by key.

    GET    /memory                          the namespaces the caller reaches, with counts
    GET    /memory/{namespace}?q=&limit=    its items by key (paged with `after`), or a search
    GET    /memory/{namespace}/{key}        one item
    PUT    /memory/{namespace}/{key}        write it (an approver)
    DELETE /memory/{namespace}/{key}        delete it (an approver)

Every route goes through MemoryAccess (waystation/client/memory_access.py): a token bound to
a tenant reaches only its tenant's namespaces (403 for another's), a reader reads only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, Field, field_validator

from waystation.activities.storage.memory import LISTED
from waystation.servers.api.auth import Reader, Runtime
from waystation.workflows.memory import (
    KEY_PATTERN,
    MOST_RECALLED,
    NAMESPACE_PATTERN,
    RECALL_LIMIT,
    MemoryItem,
)
from waystation.workflows.models import not_too_deep

router = APIRouter(tags=["memory"])

NamespacePath = Annotated[str, Path(pattern=NAMESPACE_PATTERN)]
KeyPath = Annotated[str, Path(pattern=KEY_PATTERN)]


class NamespaceView(BaseModel):
    namespace: str
    items: int


class NamespaceList(BaseModel):
    namespaces: list[NamespaceView]


class ItemPage(BaseModel):
    items: list[MemoryItem]
    next_after: str | None = Field(
        default=None, description="Pass as `after` for the next page (none: the last page)."
    )


class ItemBody(BaseModel):
    """What PUT writes: the value replaces the item's (its metadata and TTL too)."""

    value: str = Field(description="The text; at most WAYSTATION_MEMORY_MAX_VALUE_CHARS.")
    metadata: dict[str, Any] | None = None
    ttl_seconds: float | None = Field(
        default=None, gt=0, description="Gone after this long (never returned, then purged)."
    )

    _metadata_flat = field_validator("metadata")(not_too_deep)


@router.get("/memory")
async def memory_namespaces(who: Reader, runtime: Runtime) -> NamespaceList:
    """The namespaces holding items that the caller reaches (a bound token: its tenant's)."""
    found = await runtime.memory.namespaces(who.tenant)
    return NamespaceList(namespaces=[NamespaceView(namespace=n, items=c) for n, c in found])


@router.get("/memory/{namespace}")
async def memory_items(
    namespace: NamespacePath,
    who: Reader,
    runtime: Runtime,
    q: Annotated[str | None, Query(max_length=1_000)] = None,
    limit: Annotated[int | None, Query(ge=1, le=LISTED)] = None,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> ItemPage:
    """The namespace's items in key order (`limit` a page, 100 by default), or with `q` the
    best matches of a full-text search (`limit` of them, 5 by default, at most 50)."""
    if q is not None:
        wanted = min(limit or RECALL_LIMIT, MOST_RECALLED)
        found = await runtime.memory.search(namespace, q, tenant=who.tenant, limit=wanted)
        return ItemPage(items=found)
    page = limit or LISTED
    items = await runtime.memory.items(namespace, tenant=who.tenant, limit=page, after=after)
    return ItemPage(items=items, next_after=items[-1].key if len(items) == page else None)


@router.get("/memory/{namespace}/{key:path}")
async def memory_item(
    namespace: NamespacePath, key: KeyPath, who: Reader, runtime: Runtime
) -> MemoryItem:
    return await runtime.memory.get(namespace, key, tenant=who.tenant)


@router.put("/memory/{namespace}/{key:path}")
async def put_memory_item(
    namespace: NamespacePath, key: KeyPath, body: ItemBody, who: Reader, runtime: Runtime
) -> MemoryItem:
    """Write an item (an approver); a value over the limit is refused (413), nothing written."""
    return await runtime.memory.put(
        namespace,
        key,
        body.value,
        metadata=body.metadata,
        ttl_seconds=body.ttl_seconds,
        tenant=who.tenant,
        role=who.role,
    )


@router.delete("/memory/{namespace}/{key:path}", status_code=204)
async def delete_memory_item(
    namespace: NamespacePath, key: KeyPath, who: Reader, runtime: Runtime
) -> Response:
    await runtime.memory.delete(namespace, key, tenant=who.tenant, role=who.role)
    return Response(status_code=204)
