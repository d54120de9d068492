"""The idempotency ledger: what a side-effecting tool call did, keyed by its idempotency key.

A retry after "request sent, response lost" finds the first attempt's result here and
returns it instead of acting again. An attempt first *claims* the key (atomically, on the
database every worker shares), records `start` with whatever it needs to tell later whether
its effect happened, acts, and records `finish` with the result. A claim is a lease the
attempt renews while it runs: a second attempt that finds the key held by a live one waits
for its outcome; one that finds the lease expired (its holder died) takes the key over and
inspects what the effect left before acting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

from waystation.activities.storage.backend import Backend, LedgerEntry
from waystation.activities.storage.errors import ClaimLostError, StorageError

HOST = socket.gethostname()
# Long enough that a live attempt never loses its claim to a stall (its renewals come every
# third of it); short enough that the retry of a killed attempt waits only seconds.
DEFAULT_LEASE = timedelta(seconds=10)
_POLL_SECONDS = 0.2
_RELEASE_SECONDS = 5.0
logger = logging.getLogger("waystation.storage")


class Ledger:
    """The ledger every worker of a deployment shares. Tools see it through an attempt."""

    def __init__(self, backend: Backend, *, lease: timedelta = DEFAULT_LEASE) -> None:
        self._backend = backend
        self.lease = lease

    def attempt(self) -> LedgerAttempt:
        """A new attempt: the claims it makes are its own."""
        return LedgerAttempt(self._backend, self.lease.total_seconds())

    async def lookup(self, key: str) -> LedgerEntry | None:
        return await self._backend.ledger_get(key)

    async def claim_once(self, key: str, tool: str, claimant: str) -> str:
        """Record `claimant` under `key` unless someone is recorded there; who is. A claim
        that was never contended is settled at once (its row is finished, so it is pruned
        like any other after the retention period)."""
        while True:
            if await self._backend.ledger_insert(
                key, tool, claimant, HOST, self.lease.total_seconds()
            ):
                await self._backend.ledger_finish(key, claimant, False)
                return claimant
            entry = await self._backend.ledger_get(key)
            if entry is None:
                continue  # pruned in between
            if entry.state != "done" and entry.owner == claimant:
                await self._backend.ledger_finish(key, claimant, False)  # a retry of ours
            return entry.result if entry.state == "done" and entry.result else entry.owner

    async def prune(self, older_than: timedelta) -> int:
        """Delete finished entries last changed more than `older_than` ago; how many."""
        return await self._backend.ledger_prune(older_than.total_seconds())


class LedgerAttempt:
    """One attempt of a tool call: the ledger as its tool uses it (`ToolContext.ledger`)."""

    def __init__(self, backend: Backend, lease: float) -> None:
        self._backend = backend
        self._lease = lease
        self._owner: str | None = None
        self._claimed = False

    @property
    def owner(self) -> str:
        """Who holds this attempt's claims: named on first use (most attempts claim none,
        and a fresh id is a system call)."""
        if self._owner is None:
            self._owner = f"{HOST}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
        return self._owner

    async def lookup(self, key: str) -> LedgerEntry | None:
        return await self._backend.ledger_get(key)

    async def claim(self, key: str, tool: str) -> LedgerEntry | None:
        """Hold `key` for this attempt, waiting while another live attempt holds it.

        None: nothing was recorded under `key` before (this attempt holds it and acts).
        An entry in state `done`: the key's result; this attempt must not act.
        An entry in state `started`: an earlier attempt recorded `start` and died (its lease
        expired); this attempt now holds the key and must inspect what that attempt's effect
        left (`entry.detail`) before acting.
        """
        while True:
            if await self._backend.ledger_insert(key, tool, self.owner, HOST, self._lease):
                self._claimed = True
                return None
            entry = await self._backend.ledger_get(key)
            if entry is None:
                continue  # pruned in between
            if entry.state == "done":
                return entry
            if entry.owner == self.owner or (
                not entry.lease_live
                and await self._backend.ledger_take_over(
                    key, entry.owner, self.owner, HOST, self._lease
                )
            ):
                self._claimed = True
                return entry if entry.detail else None
            if entry.lease_live:
                await asyncio.sleep(_POLL_SECONDS)

    async def start(self, key: str, detail: Mapping[str, Any] | None = None) -> None:
        """Record what this attempt is about to do under a key it holds."""
        if not await self._backend.ledger_record_start(key, self.owner, detail or {}, self._lease):
            raise ClaimLostError(
                f"the idempotency key {key!r} is not held by this attempt: claim it first, "
                "or its lease expired and another attempt took it over"
            )

    async def finish(self, key: str, result: str, *, is_error: bool = False) -> None:
        """Record the result: every later attempt of `key` returns it."""
        await self._backend.ledger_finish(key, result, is_error)

    async def record(self, key: str, tool: str, detail: Mapping[str, Any]) -> None:
        """Record a fact under `key`, replacing what was recorded there: no claim, no
        result (write_file's note of which call appends at an offset of a file)."""
        await self._backend.ledger_put(key, tool, detail, self.owner, HOST)

    async def renew(self) -> None:
        """Extend the lease on every key this attempt holds."""
        if self._claimed:
            await self._backend.ledger_renew(self.owner, self._lease)

    async def release(self) -> None:
        """Give up the keys this attempt holds unfinished, so a retry inspects them at once."""
        if self._claimed:
            await self._backend.ledger_release(self.owner)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[LedgerAttempt]:
        """Renew this attempt's claims while the block runs; release them when it ends."""
        stop = asyncio.Event()

        async def renew_until_stopped() -> None:
            while True:
                try:
                    async with asyncio.timeout(self._lease / 3):
                        await stop.wait()
                    return
                except TimeoutError:
                    pass
                try:
                    await self.renew()
                except StorageError as err:
                    logger.warning("could not renew the ledger lease of %s: %s", self.owner, err)

        renewing = asyncio.create_task(renew_until_stopped())
        try:
            yield self
        finally:
            # Stopped by an event, not only cancelled: a cancellation delivered while the
            # connection pool waits for the database can be lost (Python 3.11's wait_for).
            stop.set()
            renewing.cancel()
            await asyncio.wait([renewing], timeout=_RELEASE_SECONDS)
            try:  # unreleased, the lease expires by itself: only a retry's wait is longer
                await asyncio.wait_for(self.release(), _RELEASE_SECONDS)
            except (StorageError, TimeoutError) as err:
                logger.warning("could not release the ledger claims of %s: %s", self.owner, err)
