"""Who may send a model call now under the quotas it counts against: the decision both
backends take inside one locked transaction, over what the database holds for those quotas
(the calls admitted in the last minute, the live waiters, a pause). Pure: no I/O here.

A quota's minute is paced, not admitted at once: a rate limit's calls are spread evenly
over its minute (a GCRA over the window's calls), so capacity frees a little at a time and
whoever's turn it is goes within a moment. Admitted as a burst whenever the window had
room, a minute's calls all left it together a minute later: capacity came back in waves,
and a tenant with one call waiting waited for the next wave, whatever its turn.

Turns are max-min fair between tenants: a tenant whose minute (its calls of the window and
those it has waiting) fits its equal share of the quota goes first, as it would alone; the
others share what is left, the one admitted least first. Ordered by admissions alone, two
tenants that started together took turns: a tenant with five tasks got half the quota
beside another's backlog and took 1.6 to 1.9 times as long as alone, though its whole
minute was a fifth of the quota.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from waystation.settings.model_endpoints import QuotaLimits
from waystation.vocabulary import QuotaLimitKind

# A provider counts a call in the minute after it arrives. A call admitted here reaches it a
# moment later, and the next may reach it sooner: counted a little longer than the provider
# counts it, a call never arrives while the provider still counts the one it follows.
PROVIDER_WINDOW_SECONDS = 60.0
ARRIVAL_MARGIN_SECONDS = 2.0
WINDOW_SECONDS = PROVIDER_WINDOW_SECONDS + ARRIVAL_MARGIN_SECONDS
# Pacing: a quota of N a minute admits one unit every PACE_PERIOD_SECONDS / N seconds. Any
# call may go up to ASK_TOLERANCE_SECONDS early (one ask admits what its poll interval
# freed); a tenant within its share beside one that is not, or one that no other active
# tenant trails with no more waiting than that would let go, may go FAIR_SHARE_SECONDS
# earlier still: credit a tenant over its share never spends, so a tenant with a few calls
# goes ahead of the pace beside another's backlog as it would alone, however the two
# arrived. The period counts both allowances: however the credit is spent, no window holds
# more than the limit.
ASK_TOLERANCE_SECONDS = 0.5
FAIR_SHARE_SECONDS = 2.0
PACE_PERIOD_SECONDS = WINDOW_SECONDS + ASK_TOLERANCE_SECONDS + FAIR_SHARE_SECONDS
# Waiters that join in one batch keep their order by this much apart.
_SINCE_STEP = 1e-6


@dataclass(frozen=True)
class QuotaRequest:
    """A call that wants its turn: counted once against each of `quotas`."""

    call_id: str
    tenant: str
    quotas: tuple[tuple[str, QuotaLimits], ...]
    input_tokens: int
    lease_seconds: float


@dataclass(frozen=True)
class QuotaDecision:
    call_id: str
    admitted: bool
    quota: str = ""
    limit: QuotaLimitKind | None = None
    wait_seconds: float | None = None
    """How long until the limit frees (None: when a running call ends, or another waiter
    goes first: not known in advance)."""


@dataclass
class AdmittedCall:
    call_id: str
    tenant: str
    admitted_at: float
    input_tokens: int
    output_tokens: int
    live: bool


@dataclass
class Waiter:
    call_id: str
    tenant: str
    since: float
    blocked_on: str | None = None
    """The quota whose capacity held it back at its last ask: meanwhile it holds up only
    the calls that count against that quota too (a model's own quota, full, must not stop
    the endpoint's other models)."""
    input_tokens: int | None = 0
    """Its estimate: what it asks of its tenant's share. None: a worker of an earlier build
    asked for it, which takes turns by admissions alone; the quota does too while it waits,
    or the two orders could each wait for the other's head."""
    waits_for: str | None = None
    """The waiter whose turn held it back at its last ask. Workers whose limits for the
    quota differ (a change rolling out) can disagree on shares: two heads that each wait
    for the other go, rather than wait for each other until the workers agree."""


@dataclass
class QuotaView:
    """One quota as the transaction found it: live waiters only, calls of the window or live."""

    paused_until: float = 0.0
    calls: list[AdmittedCall] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)


@dataclass
class Outcome:
    decisions: list[QuotaDecision]
    admitted: list[QuotaRequest]
    waiting: list[tuple[QuotaRequest, dict[str, float], str | None, str | None]]
    """Each request still waiting, with its `since` by quota (kept from its first wait),
    the quota whose capacity holds it back (None: it waits for another waiter's turn), and
    the waiter whose turn it waits for."""

    def waiter_rows(self, owner: str, now: float) -> list[tuple[object, ...]]:
        """quota_waiters rows of the calls still waiting: (call_id, quota, tenant, owner,
        since, lease_until, blocked_on, input_tokens, waits_for)."""
        return [
            (
                r.call_id,
                key,
                r.tenant,
                owner,
                since[key],
                now + r.lease_seconds,
                on,
                r.input_tokens,
                head,
            )
            for r, since, on, head in self.waiting
            for key, _ in r.quotas
        ]

    def call_rows(self, owner: str, now: float) -> list[tuple[object, ...]]:
        """quota_calls rows of the calls admitted: (call_id, quota, tenant, owner,
        admitted_at, input_tokens, lease_until, lease_seconds)."""
        return [
            (
                r.call_id,
                key,
                r.tenant,
                owner,
                now,
                r.input_tokens,
                now + r.lease_seconds,
                r.lease_seconds,
            )
            for r in self.admitted
            for key, _ in r.quotas
        ]


def decide(now: float, views: dict[str, QuotaView], requests: list[QuotaRequest]) -> Outcome:
    """Admit, in order, each request that every one of its quotas lets through now."""
    known = {key: {w.call_id for w in view.waiters} for key, view in views.items()}
    limits_of: dict[str, QuotaLimits] = {}
    for index, request in enumerate(requests):
        for key, limits in request.quotas:
            limits_of[key] = limits
            if request.call_id not in known.setdefault(key, set()):
                joined = now + index * _SINCE_STEP
                waiter = Waiter(request.call_id, request.tenant, joined, None, request.input_tokens)
                views.setdefault(key, QuotaView()).waiters.append(waiter)
    books = {key: _QuotaBook(now, view, limits_of.get(key)) for key, view in views.items()}
    outcome = Outcome([], [], [])
    for request in requests:
        blocked, by_capacity, head = _blocked(books, request)
        if blocked is not None:
            outcome.decisions.append(blocked)
            blocked_on = blocked.quota if by_capacity else None
            since = {}
            for key, _ in request.quotas:
                mine = books[key].waiter(request.call_id)
                mine.blocked_on = blocked_on
                mine.waits_for = head
                since[key] = mine.since
            outcome.waiting.append((request, since, blocked_on, head))
            continue
        for key, _ in request.quotas:
            books[key].admit(
                AdmittedCall(request.call_id, request.tenant, now, request.input_tokens, 0, True)
            )
        outcome.decisions.append(QuotaDecision(request.call_id, admitted=True))
        outcome.admitted.append(request)
    return outcome


def _blocked(
    books: dict[str, _QuotaBook], request: QuotaRequest
) -> tuple[QuotaDecision | None, bool, str | None]:
    """What keeps `request` from going now, whether it is a quota's capacity (else another
    waiter's turn, for a time not known in advance), and that waiter."""
    for key, limits in request.quotas:
        capacity = books[key].capacity_blocked(limits, request)
        if capacity is not None:
            limit, wait = capacity
            return QuotaDecision(request.call_id, False, key, limit, wait), True, None
    # Whose turn it is, by the call's first quota alone (the endpoint's when it has limits
    # of its own: it counts every model's calls). Turns taken by each quota's own counts
    # could disagree, and two calls each wait for the other's turn.
    key, limits = request.quotas[0]
    book = books[key]
    head = book.next_in_turn(request)
    # Each waited for the other at its last ask: orders that disagree, not a turn to wait.
    mutual = head is not None and (head.waits_for, book.waiter(request.call_id).waits_for) == (
        request.call_id,
        head.call_id,
    )
    if head is not None and head.call_id != request.call_id and not mutual:
        # Named by what holds the head back, if a quota does: that is what this call awaits.
        held = dict(request.quotas)
        if head.blocked_on in held:
            key, limits = head.blocked_on, held[head.blocked_on]
        decision = QuotaDecision(request.call_id, False, key, _first_limit(limits), None)
        return decision, False, head.call_id
    return None, False, None


class _QuotaBook:
    """One quota during a decision: its window's calls, sums and tenants' admissions, kept
    up to date as calls are admitted (counted again after each admission; the tenants
    within their share once)."""

    def __init__(self, now: float, view: QuotaView, limits: QuotaLimits | None) -> None:
        self.now = now
        self.view = view
        self.limits = limits
        self._waiters = {w.call_id: w for w in view.waiters}
        self._count()
        # An admission moves a call of a tenant from waiting to the window: its share stays.
        self.within_share = self._within_share()
        self.beside_backlog = len(self.within_share) < len(self.active)
        self._order_turns()

    def _count(self) -> None:
        window_start = self.now - WINDOW_SECONDS
        self.recent = sorted(
            (c for c in self.view.calls if c.admitted_at > window_start),
            key=lambda c: c.admitted_at,
        )
        self.leaves = [c.admitted_at + WINDOW_SECONDS - self.now for c in self.recent]
        self.live = sum(c.live for c in self.view.calls)
        self.admissions = Counter(c.tenant for c in self.recent)
        self.waiting = Counter(w.tenant for w in self.view.waiters)
        self.active = set(self.admissions) | set(self.waiting)
        self.fewest = min((self.admissions[t] for t in self.active), default=0)
        self._paced: dict[tuple[QuotaLimitKind, int], float] = {}

    def _order_turns(self) -> None:
        # Waiters in turn order: tenants within their share first, then the tenant admitted
        # least in the window, then the oldest.
        self._turns = sorted(
            self.view.waiters,
            key=lambda w: (
                w.tenant not in self.within_share,
                self.admissions[w.tenant],
                w.since,
                w.call_id,
            ),
        )

    def _within_share(self) -> set[str]:
        """The tenants whose minute (calls of the window and waiting, in each rate limit's
        units; a waiting call's output is not known yet) fits an equal share of what the
        pace lets through in a window, among the active tenants. All of them where limits
        are unknown, concurrency is all there is, or an earlier build's waiter waits."""
        limits, active = self.limits, self.active
        earlier_build = any(w.input_tokens is None for w in self.view.waiters)
        if limits is None or len(active) < 2 or earlier_build:
            return set(active)
        asked: dict[str, list[int]] = {t: [0, 0, 0] for t in active}
        for call in self.recent:
            units = asked[call.tenant]
            units[0] += 1
            units[1] += call.input_tokens
            units[2] += call.output_tokens
        for waiter in self.view.waiters:
            asked[waiter.tenant][0] += 1
            asked[waiter.tenant][1] += waiter.input_tokens or 0
        rates = (
            limits.requests_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
        )
        # What the pace lets through in a window, not the nominal limit: shares of the limit
        # held by many tenants would leave the one over its share nothing.
        delivered = WINDOW_SECONDS / PACE_PERIOD_SECONDS / len(active)
        share = [rate * delivered if rate else None for rate in rates]
        return {
            tenant
            for tenant, units in asked.items()
            if all(cap is None or used <= cap for used, cap in zip(units, share, strict=True))
        }

    def waiter(self, call_id: str) -> Waiter:
        return self._waiters[call_id]

    def admit(self, call: AdmittedCall) -> None:
        self.view.waiters = [w for w in self.view.waiters if w.call_id != call.call_id]
        self._waiters.pop(call.call_id, None)
        self.view.calls.append(call)
        self._count()
        self._order_turns()

    def next_in_turn(self, asking: QuotaRequest) -> Waiter | None:
        """The waiter whose turn it is for `asking` (which may be it): the first in turn
        order but those held back at their last ask by a quota `asking` does not count
        against. One held back by a quota `asking` shares keeps its turn: what frees there
        is its first, or a backlog of one tenant asking more often takes every unit."""
        shared = {key for key, _ in asking.quotas}
        return next(
            (
                w
                for w in self._turns
                if w.blocked_on is None or w.blocked_on in shared or w.call_id == asking.call_id
            ),
            None,
        )

    def capacity_blocked(
        self, limits: QuotaLimits, request: QuotaRequest
    ) -> tuple[QuotaLimitKind, float | None] | None:
        """The limit that keeps `request` from going now, and for how long."""
        if self.view.paused_until > self.now:
            return "paused", self.view.paused_until - self.now
        if limits.concurrent_requests is not None and self.live >= limits.concurrent_requests:
            return "concurrent_requests", None
        rates: list[tuple[QuotaLimitKind, int | None, list[int], int]] = [
            ("requests_per_minute", limits.requests_per_minute, [1] * len(self.recent), 1),
            (
                "input_tokens_per_minute",
                limits.input_tokens_per_minute,
                [c.input_tokens for c in self.recent],
                request.input_tokens,
            ),
            # Output is known only once a call ends: the minute's output must be under the limit.
            (
                "output_tokens_per_minute",
                limits.output_tokens_per_minute,
                [c.output_tokens for c in self.recent],
                1,
            ),
        ]
        declared = [(kind, limit, used, wanted) for kind, limit, used, wanted in rates if limit]
        for kind, limit, used, wanted in declared:  # a full minute first, then the pace
            if (wait := _window_wait(used, self.leaves, wanted, limit)) is not None:
                return kind, wait
        tenant = request.tenant
        trailing = self.admissions[tenant] <= self.fewest
        within = self.beside_backlog and tenant in self.within_share
        for kind, limit, used, wanted in declared:
            credit = FAIR_SHARE_SECONDS * limit / PACE_PERIOD_SECONDS
            favoured = within or (trailing and self.waiting[tenant] * wanted <= credit)
            if (wait := self._pace_wait(kind, limit, used, favoured)) is not None:
                return kind, wait
        return None

    def _pace_wait(
        self, kind: QuotaLimitKind, limit: int, used: list[int], favoured: bool
    ) -> float | None:
        """None if the pace lets a call go now; else how long until it does."""
        paced = self._paced.get((kind, limit))
        if paced is None:
            # The theoretical time the window's calls, spaced at the pace, would have ended.
            period = PACE_PERIOD_SECONDS / limit
            paced = float("-inf")
            for call, units in zip(self.recent, used, strict=True):
                paced = max(paced, call.admitted_at) + units * period
            self._paced[kind, limit] = paced
        early = ASK_TOLERANCE_SECONDS + (FAIR_SHARE_SECONDS if favoured else 0.0)
        wait = paced - early - self.now
        if wait <= 0:
            return None
        # The window forgets its oldest call then, and the pace with it: ask again.
        return min(wait, self.leaves[0])


def _window_wait(used: list[int], leaves: list[float], wanted: int, limit: int) -> float | None:
    """None if `wanted` more units fit the minute; else how long until they do. A call
    bigger than the whole minute's quota fits a minute that holds nothing else."""
    total = sum(used)
    if total == 0 or total + wanted <= limit:
        return None
    for units, leaving in zip(used, leaves, strict=True):
        total -= units
        if total == 0 or total + wanted <= limit:
            return max(0.0, leaving)
    return None


def _first_limit(limits: QuotaLimits) -> QuotaLimitKind:
    if limits.concurrent_requests is not None:
        return "concurrent_requests"
    if limits.requests_per_minute is not None:
        return "requests_per_minute"
    if limits.input_tokens_per_minute is not None:
        return "input_tokens_per_minute"
    return "output_tokens_per_minute"
