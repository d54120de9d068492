"""Who may send a model call now under the quotas it counts against: the decision both
backends take inside one locked transaction, over what the database holds for those quotas
(the calls admitted in the last minute, the live waiters, a pause). Pure: no I/O here."""

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
    """The quota whose capacity held it back at its last ask: it does not hold up the
    waiters of its other quotas meanwhile (a model's own quota, full, must not stop the
    endpoint's other models)."""


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
    waiting: list[tuple[QuotaRequest, dict[str, float], str | None]]
    """Each request still waiting, with its `since` by quota (kept from its first wait) and
    the quota whose capacity holds it back (None: it waits for another waiter's turn)."""


def decide(now: float, views: dict[str, QuotaView], requests: list[QuotaRequest]) -> Outcome:
    """Admit, in order, each request that every one of its quotas lets through now."""
    for index, request in enumerate(requests):
        for key, _ in request.quotas:
            waiters = views.setdefault(key, QuotaView()).waiters
            if not any(w.call_id == request.call_id for w in waiters):
                waiters.append(Waiter(request.call_id, request.tenant, now + index * _SINCE_STEP))
    outcome = Outcome([], [], [])
    for request in requests:
        blocked, by_capacity = _blocked(now, views, request)
        if blocked is not None:
            outcome.decisions.append(blocked)
            blocked_on = blocked.quota if by_capacity else None
            since = {}
            for key, _ in request.quotas:
                mine = next(w for w in views[key].waiters if w.call_id == request.call_id)
                mine.blocked_on = blocked_on
                since[key] = mine.since
            outcome.waiting.append((request, since, blocked_on))
            continue
        for key, _ in request.quotas:
            view = views[key]
            view.waiters = [w for w in view.waiters if w.call_id != request.call_id]
            view.calls.append(
                AdmittedCall(request.call_id, request.tenant, now, request.input_tokens, 0, True)
            )
        outcome.decisions.append(QuotaDecision(request.call_id, admitted=True))
        outcome.admitted.append(request)
    return outcome


def _blocked(
    now: float, views: dict[str, QuotaView], request: QuotaRequest
) -> tuple[QuotaDecision | None, bool]:
    """What keeps `request` from going now, and whether it is a quota's capacity (else
    another waiter's turn, for a time not known in advance)."""
    for key, limits in request.quotas:
        capacity = _capacity_blocked(now, limits, views[key], request.input_tokens)
        if capacity is not None:
            limit, wait = capacity
            return QuotaDecision(request.call_id, False, key, limit, wait), True
    # Whose turn it is, by the call's first quota alone (the endpoint's: it counts every
    # model's calls). Turns taken by each quota's own counts could disagree, and two calls
    # each wait for the other's turn.
    key, limits = request.quotas[0]
    head = _next_in_turn(now, key, views[key], request.call_id)
    if head is not None and head.call_id != request.call_id:
        return QuotaDecision(request.call_id, False, key, _first_limit(limits), None), False
    return None, False


def _capacity_blocked(
    now: float, limits: QuotaLimits, view: QuotaView, input_tokens: int
) -> tuple[QuotaLimitKind, float | None] | None:
    """The limit that keeps a call of `input_tokens` from going now, and for how long."""
    if view.paused_until > now:
        return "paused", view.paused_until - now
    if limits.concurrent_requests is not None:
        if sum(c.live for c in view.calls) >= limits.concurrent_requests:
            return "concurrent_requests", None
    recent = sorted(
        (c for c in view.calls if c.admitted_at > now - WINDOW_SECONDS),
        key=lambda c: c.admitted_at,
    )
    leaves = [c.admitted_at + WINDOW_SECONDS - now for c in recent]
    if limits.requests_per_minute is not None and len(recent) >= limits.requests_per_minute:
        return "requests_per_minute", leaves[len(recent) - limits.requests_per_minute]
    if limits.input_tokens_per_minute is not None:
        wait = _tokens_wait(
            [c.input_tokens for c in recent], leaves, input_tokens, limits.input_tokens_per_minute
        )
        if wait is not None:
            return "input_tokens_per_minute", wait
    if limits.output_tokens_per_minute is not None:
        # Output is known only once a call ends: the minute's output must be under the limit.
        wait = _tokens_wait(
            [c.output_tokens for c in recent], leaves, 1, limits.output_tokens_per_minute
        )
        if wait is not None:
            return "output_tokens_per_minute", wait
    return None


def _tokens_wait(used: list[int], leaves: list[float], wanted: int, limit: int) -> float | None:
    """None if `wanted` more tokens fit the minute; else how long until they do. A call
    bigger than the whole minute's quota fits a minute that holds nothing else."""
    total = sum(used)
    if total == 0 or total + wanted <= limit:
        return None
    for tokens, leaving in zip(used, leaves, strict=True):
        total -= tokens
        if total == 0 or total + wanted <= limit:
            return max(0.0, leaving)
    return None


def _next_in_turn(now: float, key: str, view: QuotaView, asking: str) -> Waiter | None:
    """The waiter whose turn it is: the oldest of the tenant admitted least in the window,
    among those no other quota held back at their last ask (`asking` is asking again)."""
    admissions = Counter(c.tenant for c in view.calls if c.admitted_at > now - WINDOW_SECONDS)
    return min(
        (w for w in view.waiters if w.blocked_on in (None, key) or w.call_id == asking),
        key=lambda w: (admissions[w.tenant], w.since, w.call_id),
        default=None,
    )


def _first_limit(limits: QuotaLimits) -> QuotaLimitKind:
    if limits.concurrent_requests is not None:
        return "concurrent_requests"
    if limits.requests_per_minute is not None:
        return "requests_per_minute"
    if limits.input_tokens_per_minute is not None:
        return "input_tokens_per_minute"
    return "output_tokens_per_minute"
