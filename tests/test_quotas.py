"""The quota gate on both backends: requests, tokens (estimated, then corrected by the
provider's usage), concurrent slots, a model's quota on top of its endpoint's, the order
between tenants, a dead worker's waiter and slot lapsing, a cancelled wait leaving the
queue, and a pause. Each gate here is a worker of its own, with its own connection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.test_storage import Place
from waystation.activities.quotas import InputCalibration, QuotaGate, QuotaTurn, rate_limit_reset
from waystation.activities.storage import Storage
from waystation.activities.storage.quota_state import (
    PACE_PERIOD_SECONDS,
    PROVIDER_WINDOW_SECONDS,
    WINDOW_SECONDS,
    AdmittedCall,
    Outcome,
    QuotaDecision,
    QuotaRequest,
    QuotaView,
    Waiter,
    decide,
)
from waystation.settings.model_endpoints import EndpointLimits, ModelEndpoint, QuotaLimits
from waystation.testing.postgres import PostgresServer
from waystation.workflows.models import Usage

LEASE = 1.0


@pytest.fixture(params=["sqlite", "postgresql"])
def place(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer) -> Place:
    url = postgres.create_database() if request.param == "postgresql" else ""
    return Place(request.param, tmp_path / "storage.sqlite3", url)


@pytest.fixture
async def machines(place: Place) -> AsyncIterator[list[QuotaGate]]:
    """Three workers' gates, each over its own connection to the place."""
    storages = [Storage(place.backend()) for _ in range(3)]
    for storage in storages:
        await storage.open()
    gates = [QuotaGate(s.backend) for s in storages]
    yield gates
    for gate in gates:
        await gate.close()
    for storage in storages:
        await storage.close()


@dataclass
class Call:
    """A call through a gate, held open until `done` is set; what it heard while it waited."""

    heard: list[QuotaDecision] = field(default_factory=list)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    usage: Usage = field(default_factory=Usage)
    admitted_at: float = 0.0


def endpoint_quotas(**limits: Any) -> list[tuple[str, QuotaLimits]]:
    return ModelEndpoint(protocol="chat", limits=EndpointLimits(**limits)).quotas_of("ep", "m")


def start(
    gate: QuotaGate,
    quotas: list[tuple[str, QuotaLimits]],
    *,
    tenant: str = "t",
    tokens: int = 10,
) -> tuple[Call, asyncio.Task[None]]:
    call = Call()

    async def heard(decision: QuotaDecision, waited: float) -> None:
        call.heard.append(decision)
        call.waiting.set()

    async def run() -> None:
        turn: QuotaTurn
        async with gate.turn(
            quotas, tenant=tenant, input_tokens=tokens, lease_seconds=LEASE, on_wait=heard
        ) as turn:
            call.admitted_at = time.monotonic()
            call.admitted.set()
            await call.done.wait()
            turn.record(call.usage)

    return call, asyncio.create_task(run())


async def admitted(*calls: Call) -> None:
    async with asyncio.timeout(30):
        for call in calls:
            await call.admitted.wait()


async def waiting(*calls: Call) -> None:
    async with asyncio.timeout(30):
        for call in calls:
            await call.waiting.wait()


async def finish(call: Call, task: asyncio.Task[None], usage: Usage | None = None) -> None:
    call.usage = usage or Usage()
    call.done.set()
    await task


def elapse(place: Place, seconds: float) -> None:
    """Let `seconds` pass by the database's record of the calls it admitted."""
    place.sql(f"UPDATE quota_calls SET admitted_at = admitted_at - {seconds}")


async def test_requests_per_minute_are_paced_and_counted_across_workers(
    place: Place, machines: list[QuotaGate]
) -> None:
    quotas = endpoint_quotas(requests_per_minute=3)
    period = PACE_PERIOD_SECONDS / 3
    for number, gate in enumerate(machines):
        call, task = start(gate, quotas)
        if number:
            # The minute's three requests are spread over it: each waits for its pace.
            await waiting(call)
            refusal = call.heard[0]
            assert (refusal.quota, refusal.limit) == ("ep", "requests_per_minute")
            assert refusal.wait_seconds is not None
            assert period - 3 < refusal.wait_seconds < period
            assert not call.admitted.is_set()
            elapse(place, period)
        await admitted(call)
        await finish(call, task)
    fourth, task = start(machines[0], quotas)
    await waiting(fourth)
    refusal = fourth.heard[0]
    assert (refusal.quota, refusal.limit) == ("ep", "requests_per_minute")
    # The first request is still in the window: the fourth goes once it leaves.
    assert refusal.wait_seconds is not None
    assert 0 < refusal.wait_seconds <= WINDOW_SECONDS - 2 * period
    elapse(place, WINDOW_SECONDS)
    await admitted(fourth)
    await finish(fourth, task)


async def test_input_tokens_are_estimated_then_corrected_and_output_tokens_counted(
    place: Place,
    machines: list[QuotaGate],
) -> None:
    quotas = endpoint_quotas(input_tokens_per_minute=1000, output_tokens_per_minute=100)
    big, big_task = start(machines[0], quotas, tokens=600)
    await admitted(big)
    second, second_task = start(machines[1], quotas, tokens=600)
    await waiting(second)
    assert second.heard[0].limit == "input_tokens_per_minute"
    # The provider read 300 tokens of the 600 estimated: 300 + 600 fit the minute's 1000,
    # once the pace has spread the first call's 300 tokens.
    await finish(big, big_task, Usage(input_tokens=300, output_tokens=60))
    elapse(place, PACE_PERIOD_SECONDS * 300 / 1000)
    await admitted(second)
    await finish(second, second_task, Usage(input_tokens=600, output_tokens=40))
    # The minute's output (60 + 40) has reached its limit: the next call waits for it.
    third, third_task = start(machines[2], quotas, tokens=1)
    await waiting(third)
    assert third.heard[0].limit == "output_tokens_per_minute"
    third_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await third_task


async def test_a_call_bigger_than_a_minutes_quota_goes_alone(
    place: Place, machines: list[QuotaGate]
) -> None:
    quotas = endpoint_quotas(input_tokens_per_minute=1000)
    huge, huge_task = start(machines[0], quotas, tokens=5000)
    await admitted(huge)  # alone in its minute: never a deadlock
    small, small_task = start(machines[1], quotas, tokens=5)
    await waiting(small)
    assert small.heard[0].limit == "input_tokens_per_minute"
    await finish(huge, huge_task, Usage(input_tokens=5000))
    place.sql(f"UPDATE quota_calls SET admitted_at = admitted_at - {WINDOW_SECONDS}")
    await admitted(small)
    await finish(small, small_task)


async def test_a_concurrent_slot_is_given_to_a_waiter_as_soon_as_it_frees(
    place: Place,
    machines: list[QuotaGate],
) -> None:
    quotas = endpoint_quotas(concurrent_requests=1)
    holder, holder_task = start(machines[0], quotas)
    await admitted(holder)
    same, same_task = start(machines[0], quotas)
    await waiting(same)
    other, other_task = start(machines[1], quotas)
    await waiting(other)
    assert {d.limit for d in same.heard + other.heard} == {"concurrent_requests"}
    assert same.heard[0].wait_seconds is None  # when a call ends is not known in advance
    # The slot is renewed while its call runs: past its first lease it is still held.
    [(first_lease,)] = place.sql("SELECT lease_until FROM quota_calls")
    async with asyncio.timeout(30):
        while place.sql("SELECT lease_until FROM quota_calls")[0][0] < first_lease + LEASE:
            await asyncio.sleep(0.05)
    assert not same.admitted.is_set() and not other.admitted.is_set()
    await finish(holder, holder_task)
    # The waiter of the same worker was queued first.
    await admitted(same)
    assert not other.admitted.is_set()
    await finish(same, same_task)
    await admitted(other)
    await finish(other, other_task)


async def test_a_models_own_quota_applies_on_top_of_its_endpoints(
    machines: list[QuotaGate],
) -> None:
    endpoint = ModelEndpoint(
        protocol="chat",
        limits=EndpointLimits(
            requests_per_minute=100, per_model={"small": QuotaLimits(concurrent_requests=1)}
        ),
    )
    small = endpoint.quotas_of("ep", "small")
    assert [key for key, _ in small] == ["ep", "ep:small"]
    first, first_task = start(machines[0], small)
    await admitted(first)
    second, second_task = start(machines[1], small)
    await waiting(second)
    assert (second.heard[0].quota, second.heard[0].limit) == ("ep:small", "concurrent_requests")
    other, other_task = start(machines[2], endpoint.quotas_of("ep", "large"))
    await admitted(other)  # another model of the endpoint is not held by small's slot
    for call, task in ((first, first_task), (other, other_task)):
        await finish(call, task)
    await admitted(second)
    await finish(second, second_task)


async def test_the_tenant_admitted_least_goes_next_then_the_oldest_waiter(
    machines: list[QuotaGate],
) -> None:
    quotas = endpoint_quotas(concurrent_requests=1)
    holder, holder_task = start(machines[0], quotas, tenant="busy")
    await admitted(holder)
    queued = []
    for name, gate, tenant in (("busy-1", 1, "busy"), ("busy-2", 2, "busy"), ("quiet", 1, "q")):
        call, task = start(machines[gate], quotas, tenant=tenant)
        await waiting(call)  # in the queue before the next joins
        queued.append((name, call, task))
    order: list[str] = []
    running = (holder, holder_task)
    for _ in queued:
        await finish(*running)
        async with asyncio.timeout(30):
            while not (
                ready := [q for q in queued if q[1].admitted.is_set() and q[0] not in order]
            ):
                await asyncio.sleep(0.05)
        [(name, call, task)] = ready
        order.append(name)
        running = (call, task)
    await finish(*running)
    # "busy" had one admission in the window, "q" none; then each has one: the oldest goes.
    assert order == ["quiet", "busy-1", "busy-2"]


@pytest.mark.parametrize("waiter_of", ["this build", "an earlier build"])
async def test_a_tenant_within_its_share_goes_before_a_backlog_through_the_database(
    place: Place, machines: list[QuotaGate], waiter_of: str
) -> None:
    """Across workers, through the database: `q` had more calls in the window than `busy`,
    but its minute fits its half of the quota and busy's does not (a call of 40,000 of
    60,000 tokens waits), so q's waiter goes first. A waiter of an earlier build (its
    tokens unknown) turns the quota back to the order that build keeps: fewest calls."""
    quotas = endpoint_quotas(
        concurrent_requests=1, requests_per_minute=600, input_tokens_per_minute=60_000
    )
    for _ in range(2):  # q's two calls of the window
        call, task = start(machines[0], quotas, tenant="q")
        await admitted(call)
        await finish(call, task)
    holder, holder_task = start(machines[0], quotas, tenant="busy")
    await admitted(holder)
    backlog, backlog_task = start(machines[1], quotas, tenant="busy", tokens=40_000)
    await waiting(backlog)
    quiet, quiet_task = start(machines[2], quotas, tenant="q")
    await waiting(quiet)
    stored = sorted(place.sql("SELECT tenant, input_tokens FROM quota_waiters"))
    assert stored == [("busy", 40_000), ("q", 10)]
    if waiter_of == "an earlier build":
        place.sql("UPDATE quota_waiters SET input_tokens = NULL WHERE tenant = 'busy'")
    await finish(holder, holder_task)
    first, then = (quiet, backlog) if waiter_of == "this build" else (backlog, quiet)
    await admitted(first)
    assert not then.admitted.is_set()
    await finish(first, quiet_task if first is quiet else backlog_task)
    # The other waits for the pace (40,000 tokens are 43 s of it): it leaves the queue.
    left = backlog_task if then is backlog else quiet_task
    left.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await left


async def test_the_database_keeps_whose_turn_a_waiter_waits_for(place: Place) -> None:
    storage = place.storage()
    await storage.open()
    try:
        quotas = tuple(endpoint_quotas(concurrent_requests=1))
        backend = storage.backend

        async def ask(call_id: str, tenant: str) -> bool:
            request = QuotaRequest(call_id, tenant, quotas, 10, 10.0)
            [decision] = await backend.quota_admit("worker", [request])
            return decision.admitted

        assert await ask("holder", "busy")
        assert not await ask("busy-call", "busy")  # the slot is held: capacity
        assert not await ask("quiet-call", "quiet")
        await backend.quota_release("holder", None, 0)
        assert not await ask("busy-call", "busy")  # quiet's turn: it has fewer calls
        stored = dict(place.sql("SELECT call_id, waits_for FROM quota_waiters"))
        assert stored == {"busy-call": "quiet-call", "quiet-call": None}
        assert await ask("quiet-call", "quiet")
    finally:
        await storage.close()


async def test_a_dead_workers_waiter_and_slot_lapse_with_their_leases(
    place: Place, machines: list[QuotaGate]
) -> None:
    quotas = tuple(endpoint_quotas(concurrent_requests=1))
    dead = place.backend()
    await dead.open()
    try:
        # A worker that took the slot, and one queued behind it, then both died: nobody
        # renews their leases.
        [slot] = await dead.quota_admit("dead-1", [QuotaRequest("slot", "t", quotas, 1, LEASE)])
        assert slot.admitted
        [queued] = await dead.quota_admit("dead-2", [QuotaRequest("queued", "t", quotas, 1, LEASE)])
        assert not queued.admitted
    finally:
        await dead.close()
    began = time.monotonic()
    live, live_task = start(machines[0], quotas=list(quotas))
    await admitted(live)
    assert time.monotonic() - began >= LEASE * 0.5
    assert place.sql("SELECT call_id FROM quota_waiters") == []
    await finish(live, live_task)


async def test_a_cancelled_wait_leaves_the_queue_at_once(
    place: Place, machines: list[QuotaGate]
) -> None:
    quotas = endpoint_quotas(concurrent_requests=1)
    holder, holder_task = start(machines[0], quotas)
    await admitted(holder)
    gone, gone_task = start(machines[1], quotas)
    await waiting(gone)
    assert len(place.sql("SELECT call_id FROM quota_waiters")) == 1
    gone_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone_task
    assert place.sql("SELECT call_id FROM quota_waiters") == []
    await finish(holder, holder_task)
    assert place.sql("SELECT count(*) FROM quota_calls WHERE lease_until > 0") == [(0,)]


async def test_a_pause_holds_every_worker_until_it_ends(machines: list[QuotaGate]) -> None:
    quotas = endpoint_quotas(requests_per_minute=1000)
    began = time.monotonic()
    await machines[0].pause(quotas, 1.5)
    calls = [start(gate, quotas) for gate in machines]
    await waiting(*(c for c, _ in calls))
    assert {(d.quota, d.limit) for c, _ in calls for d in c.heard} == {("ep", "paused")}
    assert all(0 < (c.heard[0].wait_seconds or 0) <= 1.5 for c, _ in calls)
    await admitted(*(c for c, _ in calls))
    assert min(c.admitted_at for c, _ in calls) - began >= 1.45
    for call, task in calls:
        await finish(call, task)


async def test_one_worker_asks_once_for_all_of_its_waiters(machines: list[QuotaGate]) -> None:
    quotas = endpoint_quotas(concurrent_requests=1)
    holder, holder_task = start(machines[0], quotas)
    await admitted(holder)
    gate = machines[1]
    queued = [start(gate, quotas) for _ in range(5)]
    await waiting(*(c for c, _ in queued))
    asked = gate.coordinator.asks
    async with asyncio.timeout(30):
        while sum(len(c.heard) for c, _ in queued) < 25:
            await asyncio.sleep(0.05)
    # Each poll answered all five waiters: about a fifth as many asks as refusals heard.
    assert gate.coordinator.asks - asked <= 7
    await finish(holder, holder_task)
    for call, task in queued:
        await admitted(call)
        await finish(call, task)


class Unreachable:
    """A storage that must never be asked."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the gate asked the storage ({name}) for an unlimited endpoint")


async def test_an_endpoint_without_limits_never_touches_the_storage() -> None:
    gate = QuotaGate(Unreachable())  # type: ignore[arg-type]
    assert ModelEndpoint(protocol="chat").quotas_of("ep", "m") == []
    async with gate.turn([], tenant=None, input_tokens=10) as turn:
        turn.record(Usage(input_tokens=10))
    await gate.pause([], 5)


def test_a_providers_rate_limit_headers_say_how_long_a_used_up_limit_lasts() -> None:
    openai_headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m2.5s"}
    assert rate_limit_reset(openai_headers) == timedelta(seconds=62.5)
    tokens = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}
    assert rate_limit_reset(tokens) == timedelta(milliseconds=20)
    reset = datetime.fromtimestamp(time.time() + 30, tz=UTC).isoformat().replace("+00:00", "Z")
    anthropic = {
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": reset,
    }
    waited = rate_limit_reset(anthropic)
    assert waited is not None and 28 < waited.total_seconds() <= 30
    left = {"x-ratelimit-remaining-requests": "12", "x-ratelimit-reset-requests": "1s"}
    assert rate_limit_reset(left) is None


def test_the_input_estimate_learns_how_the_provider_counts_its_quotas_tokens() -> None:
    calibration = InputCalibration()
    assert calibration.scaled("endpoint", 1000) == 1000  # nothing learnt: the estimate
    for _ in range(30):  # the provider counts a fifth more than four characters a token
        calibration.learn("endpoint", 1000, 1200)
    assert calibration.scaled("endpoint", 1000) == 1200
    assert calibration.scaled("another", 1000) == 1000
    calibration.learn("endpoint", 1000, 0)  # a call that reported no usage teaches nothing
    calibration.learn("wild", 10, 1_000_000)  # nor believes an absurd ratio
    assert calibration.scaled("endpoint", 1000) == 1200
    assert calibration.scaled("wild", 1000) == 4000


def test_turns_follow_the_endpoints_order_so_two_waiters_never_wait_for_each_other() -> None:
    endpoint = QuotaLimits(requests_per_minute=100)
    model = QuotaLimits(requests_per_minute=100)
    quotas = (("e", endpoint), ("e:x", model))
    # On the endpoint, tenant b made more calls (of another model); on model x, tenant a
    # did: by each quota's own counts, each waiter would be the other's turn.
    views = {
        "e": QuotaView(calls=[AdmittedCall(f"b{n}", "b", -30.0, 10, 0, False) for n in range(5)]),
        "e:x": QuotaView(calls=[AdmittedCall(f"a{n}", "a", -30.0, 10, 0, False) for n in range(3)]),
    }
    views["e"].calls += views["e:x"].calls
    first = QuotaRequest("first", "a", quotas, 10, 10.0)
    second = QuotaRequest("second", "b", quotas, 10, 10.0)
    outcome = decide(1.0, views, [second, first])
    assert [d.call_id for d in outcome.decisions if d.admitted] == ["first"]
    outcome = decide(2.0, views, [second])  # a pace (0.65 s) later
    assert [d.call_id for d in outcome.decisions if d.admitted] == ["second"]


async def test_only_the_slots_a_worker_still_holds_are_renewed(
    place: Place, machines: list[QuotaGate]
) -> None:
    quotas = endpoint_quotas(concurrent_requests=2)
    kept, kept_task = start(machines[0], quotas)
    lost, lost_task = start(machines[0], quotas)
    await admitted(kept, lost)
    [(lost_id,)] = place.sql("SELECT call_id FROM quota_calls ORDER BY admitted_at DESC LIMIT 1")
    # Its release never reached the database (and the process forgot it): it must lapse,
    # however long the worker goes on renewing its other slot.
    machines[0].coordinator._held.pop(lost_id)
    async with asyncio.timeout(30):
        while True:
            leases = dict(place.sql("SELECT call_id, lease_until FROM quota_calls"))
            if leases[lost_id] < time.time():
                break
            await asyncio.sleep(0.05)
    # Read in the same moment: the kept slot's lease, renewed meanwhile, is live.
    assert all(lease > time.time() for call, lease in leases.items() if call != lost_id)
    await finish(kept, kept_task)
    await finish(lost, lost_task)


@dataclass
class Backlog:
    """Tenant a keeps `size` calls waiting, asked for together as a worker asks."""

    quotas: tuple[tuple[str, QuotaLimits], ...]
    size: int
    views: dict[str, QuotaView] = field(default_factory=dict)
    waiting: list[QuotaRequest] = field(default_factory=list)
    admitted_at: list[float] = field(default_factory=list)

    def ask(self, now: float, joining: tuple[QuotaRequest, ...] = ()) -> Outcome:
        self.waiting += [self.call(f"a{now}-{n}") for n in range(self.size - len(self.waiting))]
        outcome = decide(now, self.views, [*self.waiting, *joining])
        went = {r.call_id for r in outcome.admitted if r.tenant == "a"}
        self.admitted_at += [now] * len(went)
        self.waiting = [r for r in self.waiting if r.call_id not in went]
        return outcome

    def call(self, call_id: str, tenant: str = "a") -> QuotaRequest:
        return QuotaRequest(call_id, tenant, self.quotas, 100, 10.0)


def test_a_quotas_minute_is_paced_so_its_capacity_frees_a_little_at_a_time() -> None:
    backlog = Backlog(
        (("ep", QuotaLimits(requests_per_minute=60, input_tokens_per_minute=5_000)),), 40
    )
    for tick in range(1500):  # five minutes, asked every 0.2 s
        backlog.ask(tick * 0.2)
    admitted_at = backlog.admitted_at
    # Tokens bind (50 calls of 100 a minute): never more than the quota in a window, and
    # never a minute's worth at once followed by a minute of nothing.
    for start_at in admitted_at:
        assert sum(start_at <= at < start_at + PROVIDER_WINDOW_SECONDS for at in admitted_at) <= 50
    gaps = [later - earlier for earlier, later in itertools.pairwise(admitted_at)]
    assert max(gaps) <= PACE_PERIOD_SECONDS * 100 / 5_000 + 0.2
    assert max(Counter(admitted_at).values()) <= 3  # the start: what the tolerances allow
    late = [at for at in admitted_at if at >= 60.0]
    assert len(late) / 240.0 * 60 >= 0.9 * 50  # the quota is used, not wasted


def test_a_tenant_with_little_to_send_goes_at_once_beside_anothers_backlog() -> None:
    backlog = Backlog((("ep", QuotaLimits(requests_per_minute=120)),), 200)
    for tick in range(900):  # a's backlog alone for three minutes, then b's calls among it
        joining = (backlog.call(f"b{tick}", "b"),) if tick > 450 and tick % 7 == 0 else ()
        outcome = backlog.ask(tick * 0.2, joining)
        if joining:
            assert outcome.decisions[-1].admitted, f"b's call at {tick * 0.2:.1f} s waited"
    # a spent none of the credit kept for b, and lost little of its pace to b.
    assert len(backlog.admitted_at) >= 0.9 * 180 * 120 / 60 - len(range(451, 900, 7))


def test_a_backlog_alone_leaves_the_credit_to_a_tenant_that_comes_later() -> None:
    limits = QuotaLimits(requests_per_minute=300, input_tokens_per_minute=200_000)
    backlog = Backlog((("ep", limits),), 150)
    for tick in range(5):  # a's 150 calls first, alone: it may not spend the credit
        backlog.ask(tick * 0.2)
    assert backlog.admitted_at.count(0.0) == 3  # the pace's half a second, not its credit
    # b's five calls come a second later: they all go in the ask they join.
    quiet = tuple(backlog.call(f"b{n}", "b") for n in range(5))
    outcome = backlog.ask(1.0, quiet)
    assert all(d.admitted for d in outcome.decisions[-5:])


@dataclass
class Played:
    """Tasks of several tenants played against one quota in simulated time."""

    answered: dict[str, list[float]] = field(default_factory=dict)
    """When each task of a tenant had its last call answered."""
    admitted: dict[str, list[float]] = field(default_factory=dict)
    """When each call of a tenant went."""


def play(tasks: dict[str, int], limits: QuotaLimits, *, until: str | None = None) -> Played:
    """Each task of a tenant makes 4 model calls, its conversation growing (1,350 to 2,250
    input tokens), each after the last is answered (1 s later); all started together, in
    the order given, and asked for every 0.2 s as a worker asks: the bench's workload in
    the decision alone. Played until every task of `until` (all, if None) is answered."""
    sizes = (1_350, 1_650, 1_950, 2_250)
    quotas = (("ep:m", limits),)
    views: dict[str, QuotaView] = {}
    played = Played()
    made = {f"{t}{n}": 0 for t, count in tasks.items() for n in range(count)}
    asks_at = dict.fromkeys(made, 0.0)
    asking: dict[str, QuotaRequest] = {}
    for tick in range(10_000):
        now = tick * 0.2
        for task, calls in made.items():
            if calls < len(sizes) and task not in asking and asks_at[task] <= now:
                tenant = task.rstrip("0123456789")
                asking[task] = QuotaRequest(f"{task}/{calls}", tenant, quotas, sizes[calls], 10.0)
        for request in decide(now, views, list(asking.values())).admitted:
            task = request.call_id.split("/")[0]
            del asking[task]
            made[task] += 1
            asks_at[task] = now + 1.0
            played.admitted.setdefault(request.tenant, []).append(now)
            if made[task] == len(sizes):
                played.answered.setdefault(request.tenant, []).append(now + 1.0)
        waiting_for = [t for t in tasks if until is None or t == until]
        if all(len(played.answered.get(t, [])) == tasks[t] for t in waiting_for):
            return played
    raise AssertionError("the tasks were not answered in 2,000 s")


BENCH_QUOTA = QuotaLimits(requests_per_minute=300, input_tokens_per_minute=200_000)


def test_a_tenant_with_a_few_tasks_started_beside_anothers_backlog_goes_as_it_would_alone() -> None:
    """Issue 41's fairness workload in the decision alone: b's 5 tasks, started together
    with a's 300, end about when they end alone (b's minute is a fifth of the quota: it is
    served as it asks). Ordered by admissions alone, b and a took turns at the start, and
    b's tasks took 1.78 times as long."""
    alone = play({"b": 5}, BENCH_QUOTA).answered["b"]
    beside = play({"a": 300, "b": 5}, BENCH_QUOTA, until="b").answered["b"]
    assert statistics.median(beside) <= statistics.median(alone), (alone, beside)


def test_two_backlogs_share_the_quota_equally() -> None:
    """Neither tenant's minute fits its share: they take turns, whichever started first."""
    played = play({"a": 100, "c": 100}, BENCH_QUOTA)
    first_minute = {t: sum(at < 60.0 for at in times) for t, times in played.admitted.items()}
    assert abs(first_minute["a"] - first_minute["c"]) <= 2, first_minute
    assert abs(max(played.answered["a"]) - max(played.answered["c"])) <= 5.0


def test_a_tenant_over_its_share_still_leaves_the_other_its_share() -> None:
    """c's 20 tasks fit its half of the quota only at first: a's backlog is never starved,
    and c, served first while within its share, is done long before a."""
    played = play({"a": 100, "c": 20}, BENCH_QUOTA)
    for start_at in range(0, 60, 5):
        slice_of = {
            t: sum(start_at <= at < start_at + 30 for at in times)
            for t, times in played.admitted.items()
        }
        share = slice_of["a"] / (slice_of["a"] + slice_of["c"])
        assert share >= 0.25, f"a had {share:.0%} of the calls from {start_at} s: {slice_of}"
    assert max(played.answered["c"]) < statistics.median(played.answered["a"])


def test_workers_that_disagree_on_shares_never_wait_for_each_others_head() -> None:
    """A change of limits rolling out: one worker counts requests (tenant y, with one call
    in the window, is within its share; x, with 60, is not), another counts tokens (x is
    within; y, with a call of 50,000, is not). Each worker's call waits for the head its
    own order names, the other's: once each has waited for the other, they go."""
    by_requests = QuotaLimits(requests_per_minute=100, input_tokens_per_minute=10_000_000)
    by_tokens = QuotaLimits(requests_per_minute=100_000, input_tokens_per_minute=100_000)
    window = [AdmittedCall("y0", "y", -50.0, 50_000, 0, False)]
    window += [AdmittedCall(f"x{n}", "x", -60.0 + n, 10, 0, False) for n in range(60)]
    views = {"ep": QuotaView(paused_until=1.0, calls=window)}
    x = QuotaRequest("x-call", "x", (("ep", by_requests),), 10, 10.0)
    y = QuotaRequest("y-call", "y", (("ep", by_tokens),), 10, 10.0)
    went: dict[str, float] = {}
    for tick in range(10):  # each worker asks for its own call every 0.2 s, in turn
        now = tick * 0.2
        for request in (x, y):
            if request.call_id not in went:
                if decide(now, views, [request]).admitted:
                    went[request.call_id] = now
    assert set(went) == {"x-call", "y-call"}, views["ep"].waiters
    assert max(went.values()) <= 1.0 + 3 * 0.2  # the pause, then a few asks


def test_a_tenant_held_back_by_a_models_own_quota_keeps_its_turn_beside_a_backlog() -> None:
    """Both tenants wait for the model's quota: the one admitted least keeps its turn there,
    though another tenant's backlog asks first and more often."""
    quotas = (
        ("ep", QuotaLimits(requests_per_minute=1_000)),
        ("ep:m", QuotaLimits(requests_per_minute=120)),
    )
    backlog = Backlog(quotas, 200)
    for tick in range(900):  # a's backlog alone for three minutes
        backlog.ask(tick * 0.2)
    # b's five calls come at once, beside a's backlog, which is asked for first at every
    # ask: b's turn comes first at each unit the model's pace frees.
    quiet = [backlog.call(f"b{n}", "b") for n in range(5)]
    went: dict[str, float] = {}
    for tick in range(900, 1000):
        outcome = backlog.ask(tick * 0.2, tuple(quiet))
        went |= {r.call_id: tick * 0.2 - 180.0 for r in outcome.admitted if r.tenant == "b"}
        quiet = [r for r in quiet if r.call_id not in went]
    assert not quiet, "b's calls still wait"
    period = PACE_PERIOD_SECONDS / 120
    assert max(went.values()) <= 5 * period + 0.5, went  # one pace step each, no more


def test_an_endpoint_with_only_models_limits_is_no_quota_of_its_own() -> None:
    limits = EndpointLimits(per_model={"m": QuotaLimits(requests_per_minute=60)})
    endpoint = ModelEndpoint(protocol="chat", limits=limits)
    assert [key for key, _ in endpoint.quotas_of("ep", "m")] == ["ep:m"]
    assert endpoint.quotas_of("ep", "other") == []


def test_a_call_behind_a_waiter_held_by_a_models_quota_is_told_it_waits_for_that_quota() -> None:
    quotas = (
        ("ep", QuotaLimits(requests_per_minute=1_000)),
        ("ep:m", QuotaLimits(requests_per_minute=120)),
    )
    held = Waiter("first", "b", 0.0, "ep:m")  # the model's pace held it at its last ask
    views = {key: QuotaView(waiters=[held]) for key, _ in quotas}
    outcome = decide(1.0, views, [QuotaRequest("second", "a", quotas, 100, 10.0)])
    [decision] = outcome.decisions
    assert not decision.admitted
    assert (decision.quota, decision.limit) == ("ep:m", "requests_per_minute")
