"""Which live workers can serve a task, from what each offers (activities/worker_offer.py):
a task none of them can serve is refused before it starts, and a client says how its own
settings differ from the workers'.

Temporal lists the workers polling a queue with their identities, which name their offers;
the offers themselves are in the deployment's storage. A worker that names no offer (another
program, another version) or whose offer this side cannot read may serve anything: a task
is refused only when every live worker's offer is known and none serves it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping

from temporalio.client import Client
from temporalio.converter import PayloadCodec
from temporalio.service import RPCError

from waystation.activities.payload_codec import codec_for
from waystation.activities.storage import Storage, StorageError
from waystation.activities.worker_offer import (
    WorkerOffer,
    model_need,
    offer_digest_in,
    read_offers,
    without_offer,
)
from waystation.client.pollers import polling_workers
from waystation.client.task_rights import TaskRefusedError
from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.settings.model_endpoints import DEFAULT_ENDPOINTS, ModelEndpoint
from waystation.workflows.models import AgentSpec, AgentTask

# Offers by digest: content-addressed, so one read serves this process for good.
_known: dict[str, WorkerOffer] = {}


async def live_offers(
    client: Client, task_queue: str, storage: Storage | None, codec: PayloadCodec | None
) -> list[tuple[str, WorkerOffer | None]]:
    """Each worker polling `task_queue` for model and tool calls lately, with its offer
    (None: it names none, or it cannot be read here). `storage` (opened) is read for the
    offers this process has not seen; None: only those it has."""
    identities = await polling_workers(client, task_queue, "activity", this_process=True)
    return await _with_offers(identities, storage, codec)


async def _with_offers(
    identities: list[str], storage: Storage | None, codec: PayloadCodec | None
) -> list[tuple[str, WorkerOffer | None]]:
    unseen = [d for i in identities if (d := offer_digest_in(i)) and d not in _known]
    if unseen and storage is not None:
        _known.update(await read_offers(storage, unseen, codec))
    return [(i, _known.get(offer_digest_in(i) or "")) for i in identities]


Offers = list[tuple[str, WorkerOffer | None]]
# The listings in flight, by client and settings: a hundred tasks started at once ask
# Temporal once, not a hundred times (each answer is as fresh as a call of its own).
_listing: dict[tuple[int, int], asyncio.Future[Offers]] = {}


async def offers_of(client: Client, settings: Settings) -> Offers:
    """`live_offers` of the settings' queue; the settings' storage is opened only for
    offers not seen yet. A server that cannot list pollers: no worker is known. Callers
    that ask while a listing of theirs is in flight share its answer."""
    key = (id(client), id(settings))
    listing = _listing.get(key)
    if listing is None:
        listing = _listing[key] = asyncio.ensure_future(_list_offers(client, settings))
        listing.add_done_callback(lambda done: _forget(key, done))
    # One caller cancelled leaves the listing to the others.
    return await asyncio.shield(listing)


# When this process last listed a worker on a queue, by client and queue name.
_last_seen: dict[tuple[int, str], float] = {}


def seen_lately(client: Client, task_queue: str, within: float) -> bool:
    """Whether a listing in this process named a worker on `task_queue` in the last `within`
    seconds: an empty listing then is more likely a worker Temporal missed (it forgets a
    live poller for a moment when it reloads a queue) than a fleet gone."""
    seen = _last_seen.get((id(client), task_queue))
    return seen is not None and time.monotonic() - seen < within


def _forget(key: tuple[int, int], listing: asyncio.Future[Offers]) -> None:
    _listing.pop(key, None)
    if not listing.cancelled():
        listing.exception()  # read here too: its callers may all have left


async def _list_offers(client: Client, settings: Settings) -> Offers:
    try:
        identities = await polling_workers(
            client, settings.task_queue, "activity", this_process=True
        )
    except RPCError:
        return []
    if identities:
        _last_seen[(id(client), settings.task_queue)] = time.monotonic()
    if all(d in _known for i in identities if (d := offer_digest_in(i))):
        return await _with_offers(identities, None, None)
    storage = Storage.from_settings(settings)
    try:
        await storage.open()
    except StorageError:
        return await _with_offers(identities, None, None)
    try:
        return await _with_offers(identities, storage, codec_for(settings, "client"))
    finally:
        await storage.close()


def other_models(task: AgentTask, agents: Iterable[AgentSpec] = ()) -> list[tuple[str, str]]:
    """The models a task may move to besides its own, each with what it is to the task:
    its fallbacks, and its sub-agents' models and theirs."""
    found = [(name, "a fallback model") for name in task.model.fallback_models]
    for spec in agents:
        if spec.model is not None:
            what = f"the model of sub-agent {spec.name!r}"
            found += [(name, what) for name in [spec.model.name, *spec.model.fallback_models]]
    return [(name, what) for name, what in found if name != task.model.name]


def check_servable(
    task: AgentTask,
    task_queue: str,
    offers: list[tuple[str, WorkerOffer | None]],
    endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS,
    agents: Iterable[AgentSpec] = (),
) -> None:
    """Refuse (TaskRefusedError, 409) a task that no live worker can serve, or whose
    fallback or sub-agent model no live worker can call, when every live worker's offer is
    known; with no worker at all the task is started, to wait for one. `endpoints`: the
    ones this side knows, to read model names with; `agents`: the sub-agents it may call."""
    if not offers or any(offer is None for _, offer in offers):
        return
    known = [offer for _, offer in offers if offer is not None]
    workers = "the worker" if len(known) == 1 else f"each of the {len(known)} workers"
    start = f"start a worker with the settings that offer it: {command('worker')}"
    lacking = [offer.missing(task.requires, task.model.name, endpoints) for offer in known]
    if all(lacking):
        first = min(lacking, key=len)
        raise TaskRefusedError(
            "tools",
            409,
            "no_capable_worker",
            f"no worker polling task queue {task_queue!r} can serve this task: {workers} lacks "
            f"{', '.join(first)}; start a worker with the settings that offer it "
            f"(WAYSTATION_TOOLS, WAYSTATION_AGENTS, the model endpoint): {command('worker')}",
        )
    for name, what in other_models(task, agents):
        if not any(offer.serves_model(name, endpoints) for offer in known):
            raise TaskRefusedError(
                "model",
                409,
                "no_capable_worker",
                f"no worker polling task queue {task_queue!r} can call {name!r}, {what}: "
                f"{workers} lacks {model_need(name, endpoints)}; {start}",
            )


def differences_from(mine: WorkerOffer, offers: list[tuple[str, WorkerOffer | None]]) -> list[str]:
    """One line per live worker whose settings differ from this side's, saying how."""
    lines = []
    for identity, offer in offers:
        if offer is not None and offer.digest != mine.digest and (said := mine.differences(offer)):
            lines.append(f"worker {without_offer(identity)}: {'; '.join(said)}")
    return lines
