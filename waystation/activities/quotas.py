"""The quota gate: a model call waits its turn under its endpoint's quotas before it is sent,
and every worker of the deployment honours them together.

The state lives in the storage every worker shares (activities/storage/quota_state.py
decides, in one locked transaction): the calls admitted in the last minute and their tokens,
the slots of running calls (leases their worker renews), the waiters (leases too, so a dead
worker's waiter and slot lapse), and pauses a provider's 429 or rate-limit headers ask for.

One coordinator per process asks the database for all of its waiters at once, at most every
POLL_SECONDS while a wait's end is unknown, or when the capacity is known to free; a call
that ends in this process wakes it at once. A call whose endpoint has no limits never
reaches the gate's database.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from waystation.activities.storage.backend import Backend
from waystation.activities.storage.errors import StorageError
from waystation.activities.storage.quota_state import QuotaDecision, QuotaRequest
from waystation.settings.model_endpoints import QuotaLimits
from waystation.workflows.models import Usage

logger = logging.getLogger("waystation.quotas")

POLL_SECONDS = 0.2
# The longest a coordinator goes without asking while calls wait (a wait's progress, under
# the watchdog's limit of the call's work without any).
MAX_ASK_SECONDS = 30.0
# A waiter's and a slot's lease when the call has no heartbeat timeout of its own.
DEFAULT_LEASE_SECONDS = 10.0
# A wait longer than this is told to the task (waiting_quota).
NOTICE_AFTER_SECONDS = 1.0
_RELEASE_SECONDS = 5.0

Quotas = Sequence[tuple[str, QuotaLimits]]
DecisionListener = Callable[[QuotaDecision], Awaitable[None]]


@dataclass
class _Waiting:
    request: QuotaRequest
    admitted: asyncio.Future[None]
    decisions: asyncio.Queue[QuotaDecision] = field(default_factory=asyncio.Queue)


class QuotaCoordinator:
    """The waiters and slots of one process, over the shared storage."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"
        self._waiting: dict[str, _Waiting] = {}
        self._held: dict[str, float] = {}  # call id -> its lease
        self._wake = asyncio.Event()
        self._held_changed = asyncio.Event()
        self._asking: asyncio.Task[None] | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._ask_in_flight: asyncio.Future[list[QuotaDecision]] | None = None
        self.asks = 0
        """Admission transactions this process ran (tests: one per poll, not one per call)."""

    async def admit(self, request: QuotaRequest, listener: DecisionListener) -> None:
        """Return once `request` has its turn; each refusal goes to `listener` meanwhile.
        A cancelled wait leaves the queue at once (its waiter row is deleted)."""
        waiting = _Waiting(request, asyncio.get_running_loop().create_future())
        self._waiting[request.call_id] = waiting
        self._wake.set()
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._ask_while_waiting())
        try:
            while not waiting.admitted.done():
                told = asyncio.ensure_future(waiting.decisions.get())
                try:
                    either: set[asyncio.Future[Any]] = {told, waiting.admitted}
                    await asyncio.wait(either, return_when="FIRST_COMPLETED")
                finally:
                    told.cancel()
                if told.done() and not told.cancelled():
                    await listener(told.result())
            waiting.admitted.result()
        except asyncio.CancelledError:
            self._waiting.pop(request.call_id, None)
            if (asking := self._ask_in_flight) is not None and not asking.done():
                # Its answer may still admit this call or record it waiting: settle it first.
                await asyncio.wait([asking], timeout=_RELEASE_SECONDS)
            admitted = waiting.admitted.done() and not waiting.admitted.cancelled()
            leaving = (
                self.release(request.call_id, None, Usage())
                if admitted
                else self._backend.quota_leave([request.call_id])
            )
            # The cancellation stands whatever the database says: what is left lapses.
            try:
                await _shielded(leaving)
            except (StorageError, TimeoutError) as err:
                logger.warning("a cancelled wait could not leave the quota's queue: %s", err)
            raise
        self._hold(request)

    def _hold(self, request: QuotaRequest) -> None:
        self._held[request.call_id] = request.lease_seconds
        self._held_changed.set()  # a shorter lease than the renewer sleeps for
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew_while_holding())

    async def release(self, call_id: str, input_tokens: int | None, usage: Usage) -> None:
        """End a call's slot, counting the tokens the provider reported; wake the waiters."""
        self._held.pop(call_id, None)
        try:
            await self._backend.quota_release(call_id, input_tokens, usage.output_tokens)
        finally:
            self._wake.set()

    async def pause(self, quotas: list[str], seconds: float) -> None:
        await self._backend.quota_pause(quotas, seconds)
        self._wake.set()

    async def _ask_while_waiting(self) -> None:
        try:
            await self._ask_until_none_wait()
        except Exception as err:  # a waiter must not wait for a coordinator that died
            for waiting in self._waiting.values():
                if not waiting.admitted.done():
                    waiting.admitted.set_exception(err)
            self._waiting.clear()
            raise

    async def _ask_until_none_wait(self) -> None:
        while self._waiting:
            self._wake.clear()
            batch = list(self._waiting.values())
            asking = asyncio.ensure_future(
                self._backend.quota_admit(self.owner, [w.request for w in batch])
            )
            self._ask_in_flight = asking
            try:
                decisions = await asking
                self.asks += 1
            except StorageError as err:
                logger.warning("could not ask for quota: %s", err)
                decisions = []
            known: list[float] = []
            for waiting, decision in zip(batch, decisions, strict=False):
                gone = decision.call_id not in self._waiting  # its wait was cancelled
                if decision.admitted:
                    self._waiting.pop(decision.call_id, None)
                if decision.admitted and not gone:
                    waiting.admitted.set_result(None)
                elif decision.admitted or gone:
                    await self._let_go(decision.call_id, decision.admitted)
                else:
                    waiting.decisions.put_nowait(decision)
                    known.append(decision.wait_seconds or 0.0)
            if not self._waiting:
                return
            lease = min(w.request.lease_seconds for w in self._waiting.values())
            pause = min(known, default=0.0)
            # Asked at least every MAX_ASK_SECONDS: each answer is a waiting call's progress.
            pause = min(max(pause, POLL_SECONDS), lease / 3, MAX_ASK_SECONDS)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()

    async def _let_go(self, call_id: str, admitted: bool) -> None:
        """A call whose wait was cancelled as its answer came: give back what it got."""
        try:
            if admitted:
                await self._backend.quota_release(call_id, None, 0)
            else:
                await self._backend.quota_leave([call_id])
        except StorageError as err:  # its waiter's or slot's lease lapses instead
            logger.warning("could not give back a cancelled call's quota: %s", err)

    async def close(self) -> None:
        """Stop asking and renewing (the worker shuts down): what is left lapses."""
        for task in (self._asking, self._renewing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _renew_while_holding(self) -> None:
        while self._held:
            self._held_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self._held.values()) / 3):
                    await self._held_changed.wait()
            if not self._held:
                return
            try:
                await self._backend.quota_renew(self.owner, list(self._held))
            except StorageError as err:
                logger.warning("could not renew the quota slots of %s: %s", self.owner, err)


class InputCalibration:
    """How a provider counts input tokens against our estimate, learnt per quota from the
    usage it reports: a tokenizer that counts a fifth more than four characters a token
    would otherwise have calls admitted that its own quota refuses."""

    # How much one call's report moves the ratio, and the ratios believed at all.
    WEIGHT = 0.2
    BOUNDS = (0.25, 4.0)

    def __init__(self) -> None:
        self._ratios: dict[str, float] = {}

    def scaled(self, quota: str, estimate: int) -> int:
        return round(estimate * self._ratios.get(quota, 1.0))

    def learn(self, quota: str, estimate: int, reported: int) -> None:
        if estimate <= 0 or reported <= 0:
            return
        low, high = self.BOUNDS
        seen = min(high, max(low, reported / estimate))
        known = self._ratios.get(quota)
        self._ratios[quota] = seen if known is None else known + self.WEIGHT * (seen - known)


class QuotaTurn:
    """A call's turn under its quotas: what it sends and what the provider reports."""

    def __init__(self, quotas: Quotas, input_estimate: int) -> None:
        self.quotas = [key for key, _ in quotas]
        self.input_estimate = input_estimate
        self.usage = Usage()

    def record(self, usage: Usage) -> None:
        self.usage = usage


class QuotaGate:
    """The gate of one worker: built without I/O; the coordinator starts on first use."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._coordinator: QuotaCoordinator | None = None

    @property
    def coordinator(self) -> QuotaCoordinator:
        if self._coordinator is None:
            self._coordinator = QuotaCoordinator(self._backend)
        return self._coordinator

    @contextlib.asynccontextmanager
    async def turn(
        self,
        quotas: Quotas,
        *,
        tenant: str | None,
        input_tokens: int,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        on_wait: Callable[[QuotaDecision, float], Awaitable[None]] | None = None,
        on_granted: Callable[[str, float], Awaitable[None]] | None = None,
    ) -> AsyncIterator[QuotaTurn]:
        """Wait for the turn of a call under `quotas`, hold its slot while the block runs,
        and count what the provider reported (`turn.record`) when it ends. `on_wait` hears
        each refusal with the seconds waited so far; `on_granted` the turn (waited or not)."""
        turn = QuotaTurn(quotas, input_tokens)
        if not quotas:
            yield turn
            return
        request = QuotaRequest(
            call_id=uuid.uuid4().hex,
            tenant=tenant or "",
            quotas=tuple(quotas),
            input_tokens=input_tokens,
            lease_seconds=lease_seconds,
        )
        started = time.monotonic()
        last: list[QuotaDecision] = []

        async def heard(decision: QuotaDecision) -> None:
            last[:] = [decision]
            if on_wait is not None:
                await on_wait(decision, time.monotonic() - started)

        coordinator = self.coordinator
        await coordinator.admit(request, heard)
        try:  # from here the slot is held: whatever happens, it is released
            if on_granted is not None:
                quota = last[0].quota if last else quotas[0][0]
                await on_granted(quota, time.monotonic() - started)
            yield turn
        finally:
            reported = turn.usage.input_tokens or None
            try:
                await _shielded(coordinator.release(request.call_id, reported, turn.usage))
            except (StorageError, TimeoutError) as err:  # unreleased, its lease lapses
                logger.warning("could not release a quota slot: %s", err)

    async def close(self) -> None:
        if self._coordinator is not None:
            await self._coordinator.close()

    async def pause(self, quotas: Quotas, seconds: float) -> None:
        """Pause these quotas for every worker (a provider's 429 said so)."""
        if quotas and seconds > 0:
            await self.coordinator.pause([key for key, _ in quotas], seconds)


async def _shielded(operation: Awaitable[None]) -> None:
    """Run `operation` to its end even when the caller is cancelled meanwhile."""
    await asyncio.wait_for(asyncio.shield(operation), _RELEASE_SECONDS)


# --- a provider's rate-limit headers ---------------------------------------------------------

# (remaining, reset) header pairs: OpenAI's reset is a duration ("1s", "6m0s", "20ms"),
# Anthropic's an RFC 3339 time.
_RATE_LIMIT_HEADERS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def rate_limit_reset(headers: object) -> timedelta | None:
    """How long until a limit the provider says is used up resets (None: none is)."""
    get = getattr(headers, "get", None)
    if get is None:
        return None
    waits = [
        seconds
        for remaining, reset in _RATE_LIMIT_HEADERS
        if str(get(remaining, "")).strip() == "0"
        and (seconds := _reset_seconds(str(get(reset, "")))) is not None
    ]
    return timedelta(seconds=max(waits)) if waits else None


def _reset_seconds(value: str) -> float | None:
    value = value.strip()
    if not value:
        return None
    parts = _DURATION_PART.findall(value)
    if parts and "".join(n + u for n, u in parts) == value:
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    try:
        return max(
            0.0, datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() - time.time()
        )
    except ValueError:
        return None


# What the call being sent does with a used-up limit a successful response reports (set by
# the LLM activity around each call; the protocol backends report to it).
_rate_limit_listener: contextvars.ContextVar[Callable[[float], None] | None] = (
    contextvars.ContextVar("rate_limit_listener", default=None)
)


def report_rate_limits(headers: object) -> None:
    """A response's headers, from a protocol backend: a used-up limit pauses the quota."""
    listener = _rate_limit_listener.get()
    if listener is not None and (reset := rate_limit_reset(headers)) is not None:
        listener(reset.total_seconds())


@contextlib.contextmanager
def listening_for_rate_limits(listener: Callable[[float], None]) -> Iterator[None]:
    token = _rate_limit_listener.set(listener)
    try:
        yield
    finally:
        _rate_limit_listener.reset(token)
