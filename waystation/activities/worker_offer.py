"""What a worker offers the tasks of its queue: its project, tools (sub-agents among them)
and models, published so clients can tell which workers can serve a task.

A worker names its offer in its Temporal identity (` offer=<digest>`, which Temporal lists
with its pollers) and keeps the offer itself in the deployment's storage under that digest,
so a client that shares the storage reads what every live worker of a queue offers. A task
names what it needs (`AgentTask.requires`, its model); `missing` says what a worker lacks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError
from temporalio.converter import PayloadCodec

from waystation.activities.redaction import Redactor, url_without_credentials
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import Storage, StorageError
from waystation.activities.storage.deployment import OFFER_TAG
from waystation.activities.tools import ToolRegistry
from waystation.settings import Settings
from waystation.settings.model_endpoints import (
    DEFAULT_ENDPOINTS,
    ModelEndpoint,
    how_to_configure,
    split_model_name,
)
from waystation.vocabulary import OFFLINE_MODEL

_BLOB_PREFIX = "worker-offer:"
DIGEST_CHARS = 16


class WorkerOffer(BaseModel):
    """A worker's offer; compared between workers and clients to say what differs."""

    project: str
    task_queue: str
    tools: list[str] = Field(description="Its tools and agent__<name> sub-agents, sorted.")
    models: list[str] = Field(
        default_factory=list, description="Models it serves by name, besides its endpoint's."
    )
    endpoint: str | None = Field(
        default=None,
        description="Where its model calls go (scheme, host and path, never credentials); "
        "None: only the offline model and `models`.",
    )
    mcp_servers: list[str] = Field(default_factory=list)
    endpoints: list[str] = Field(
        default_factory=list,
        description="The model endpoints it can call (`ENDPOINT:MODEL`), sorted; never a key.",
    )

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]

    def serves_model(
        self, model: str, endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS
    ) -> bool:
        """Whether it calls `model`: by name, at the endpoint the name selects (among
        `endpoints` and its own), or a bare name at its OpenAI-compatible endpoint."""
        if model == OFFLINE_MODEL or model in self.models:
            return True
        endpoint, _ = split_model_name(model, {*endpoints, *self.endpoints})
        return self.endpoint is not None if endpoint is None else endpoint in self.endpoints

    def missing(
        self,
        requires: list[str] | None,
        model: str,
        endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS,
    ) -> list[str]:
        """What a task that needs the tools `requires` and calls `model` lacks here
        (`endpoints`: those the asking side knows, to read the model's name with)."""
        lacking = [name for name in requires or [] if name not in self.tools]
        if not self.serves_model(model, endpoints):
            lacking.append(model_need(model, endpoints))
        return lacking

    def differences(self, other: WorkerOffer) -> list[str]:
        """What `other` offers otherwise than this one, one phrase a setting."""
        said: list[str] = []
        if self.project != other.project:
            said.append(f"project {other.project!r} instead of {self.project!r}")
        for field, what in (
            ("tools", "tools"),
            ("mcp_servers", "MCP servers"),
            ("endpoints", "model endpoints"),
        ):
            mine, theirs = set(getattr(self, field)), set(getattr(other, field))
            if mine != theirs:
                said.append(f"{what}: {_delta(theirs - mine, mine - theirs)}")
        if self.endpoint != other.endpoint:
            said.append(
                f"model endpoint {other.endpoint or 'none'} instead of {self.endpoint or 'none'}"
            )
        return said


def _delta(added: set[str], lacking: set[str]) -> str:
    parts = [f"also {', '.join(sorted(added))}"] if added else []
    parts += [f"without {', '.join(sorted(lacking))}"] if lacking else []
    return "; ".join(parts)


def model_need(model: str, endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS) -> str:
    """How a task's need of a model endpoint is named among its missing names: the endpoint
    its name selects and how a worker gets it, or (a bare name) an endpoint for the model."""
    endpoint, _ = split_model_name(model, endpoints)
    if endpoint is None:
        return f"a model endpoint for {model!r}"
    return how_to_configure(endpoint, endpoints[endpoint])


def shown_endpoint(url: str | None, configured: bool) -> str | None:
    """An endpoint URL as an offer shows it (redaction.url_without_credentials: no user,
    password or query)."""
    if not configured:
        return None
    return url_without_credentials(url.rstrip("/")) if url else "https://api.openai.com/v1"


def offer_of(
    settings: Settings,
    registry: ToolRegistry,
    models: list[str],
    task_queue: str,
    environ: Mapping[str, str] | None = None,
) -> WorkerOffer:
    """What a worker with these settings (and `environ`, default this process's) offers."""
    return WorkerOffer(
        project=settings.project,
        task_queue=task_queue,
        tools=sorted(registry.names()),
        models=sorted(models),
        endpoint=Redactor([settings.api_key or ""]).redact(
            shown_endpoint(settings.openai_base_url, settings.endpoint_configured) or ""
        )
        or None,  # a key some proxies put in the path goes too
        mcp_servers=sorted(settings.mcp_server_configs()),
        endpoints=settings.configured_endpoints(environ),
    )


def with_offer(identity: str, offer: WorkerOffer) -> str:
    return f"{identity}{OFFER_TAG}{offer.digest}"


def offer_digest_in(identity: str) -> str | None:
    _, tag, digest = identity.partition(OFFER_TAG)
    digest = digest.split(" ", 1)[0]
    return digest if tag and len(digest) == DIGEST_CHARS else None


def without_offer(identity: str) -> str:
    """The identity as it was before the offer was named in it."""
    return identity.partition(OFFER_TAG)[0]


async def publish(storage: Storage, offer: WorkerOffer, codec: PayloadCodec | None) -> None:
    """Keep the offer under its digest, encrypted like every blob when encryption is on."""
    sealed = SealedBlobs(storage.blobs, codec)
    await sealed.put({_BLOB_PREFIX + offer.digest: offer.model_dump_json().encode()})


async def read_offers(
    storage: Storage, digests: list[str], codec: PayloadCodec | None
) -> dict[str, WorkerOffer]:
    """The offers found under `digests` (an unreadable storage or offer: left out)."""
    try:
        found = await SealedBlobs(storage.blobs, codec).get([_BLOB_PREFIX + d for d in digests])
    except StorageError:
        return {}
    except Exception:  # sealed with a key this side lacks, or not a payload: not known here
        return {}
    offers: dict[str, WorkerOffer] = {}
    for key, content in found.items():
        try:
            offers[key.removeprefix(_BLOB_PREFIX)] = WorkerOffer.model_validate_json(content)
        except ValidationError:
            continue  # an offer of another version: as if unknown
    return offers
