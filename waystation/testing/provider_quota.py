"""A provider's quota, enforced by the fake OpenAI endpoint as a provider enforces it.

`FakeOpenAI.enforce(quota, model)` puts a model's requests under a `ProviderQuota`: requests,
input tokens and output tokens per minute, each over a sliding window of 60 s. A request
over any limit is refused before it is served: a 429 with `retry-after` (and
`retry-after-ms`) saying when it would fit, and OpenAI's `x-ratelimit-*` headers, which an
accepted reply carries too. Input tokens are counted from the request as the provider reads
it (a token per four characters of its messages and tools, `prompt_tokens`) when it
arrives; output tokens from the reply's usage once it is served. The quota counts what the
benchmark reports: accepted and refused calls, and the tokens of the accepted ones.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waystation.testing.fake_openai import Reply, error

WINDOW_SECONDS = 60.0
CHARS_PER_TOKEN = 4


def prompt_tokens(body: dict[str, Any]) -> int:
    """The input tokens of a chat-completions request as this provider counts them."""
    read = json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))
    return math.ceil(len(read) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class QuotaCounts:
    """What the provider saw: calls it accepted and refused, and the accepted calls' tokens."""

    accepted: int = 0
    refused: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def calls(self) -> int:
        return self.accepted + self.refused

    @property
    def refused_share(self) -> float:
        return self.refused / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class _Spent:
    """What one moment took from the window: a request and its input tokens when it was
    accepted, output tokens when its reply was served."""

    at: float
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


# The kinds a quota limits: the header suffix OpenAI names each by, and what a _Spent took.
_KINDS: dict[str, Callable[[_Spent], int]] = {
    "requests": lambda spent: spent.requests,
    "tokens": lambda spent: spent.input_tokens,
    "output-tokens": lambda spent: spent.output_tokens,
}


class ProviderQuota:
    """The limits of one API key (None: no limit of that kind). `clock`: monotonic seconds
    (a test's own, to move the window without waiting)."""

    def __init__(
        self,
        *,
        requests_per_minute: int | None = None,
        input_tokens_per_minute: int | None = None,
        output_tokens_per_minute: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        window_seconds: float = WINDOW_SECONDS,
    ) -> None:
        self.limits = {
            "requests": requests_per_minute,
            "tokens": input_tokens_per_minute,
            "output-tokens": output_tokens_per_minute,
        }
        self._clock = clock
        self._window = window_seconds
        self._lock = threading.Lock()
        self._spent: deque[_Spent] = deque()
        self._counts = QuotaCounts()

    @property
    def counts(self) -> QuotaCounts:
        with self._lock:
            return self._counts

    def admit(self, body: dict[str, Any]) -> Reply | None:
        """None if the request fits the quota now (it is counted as spent), else the 429 that
        refuses it."""
        wanted = _Spent(at=0.0, requests=1, input_tokens=prompt_tokens(body), output_tokens=1)
        with self._lock:
            now = self._clock()
            self._forget_before(now - self._window)
            waits = {
                kind: self._wait(kind, of(wanted), now)
                for kind, of in _KINDS.items()
                if self.limits[kind] is not None
            }
            # A request that can never fit is refused for that first.
            refused_by = sorted(
                (kind for kind, wait in waits.items() if wait is None or wait > 0),
                key=lambda kind: waits[kind] is not None,
            )
            if refused_by:
                self._counts = _add(self._counts, refused=1)
                return self._refusal(refused_by[0], waits, now)
            self._spent.append(_Spent(now, requests=1, input_tokens=wanted.input_tokens))
            self._counts = _add(self._counts, accepted=1, input_tokens=wanted.input_tokens)
            return None

    def served(self, reply: Reply) -> dict[str, str]:
        """Count the output tokens of an accepted request's reply; the rate-limit headers it
        is sent with."""
        output = reply.usage[1] if reply.status == 200 else 0
        with self._lock:
            now = self._clock()
            if output:
                self._spent.append(_Spent(now, output_tokens=output))
                self._counts = _add(self._counts, output_tokens=output)
            return self._headers(now)

    def _forget_before(self, start: float) -> None:
        while self._spent and self._spent[0].at <= start:
            self._spent.popleft()

    def _used(self, kind: str) -> int:
        return sum(_KINDS[kind](spent) for spent in self._spent)

    def _wait(self, kind: str, amount: int, now: float) -> float | None:
        """Seconds until `amount` more of `kind` fits the window (0: it fits now; None: it
        never fits, more than the whole limit)."""
        limit = self.limits[kind]
        assert limit is not None
        if amount > limit:
            return None
        used = self._used(kind)
        for spent in self._spent:  # the oldest leaves the window first
            if used + amount <= limit:
                break
            used -= _KINDS[kind](spent)
            if used + amount <= limit:
                return spent.at + self._window - now
        return 0.0

    def _headers(self, now: float) -> dict[str, str]:
        """OpenAI's `x-ratelimit-{limit,remaining,reset}-<kind>` for every limited kind."""
        headers: dict[str, str] = {}
        for kind, limit in self.limits.items():
            if limit is None:
                continue
            used = self._used(kind)
            reset = self._wait(kind, 1, now) or 0.0
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{kind}"] = f"{reset:.3f}s"
        return headers

    def _refusal(self, kind: str, waits: dict[str, float | None], now: float) -> Reply:
        if waits[kind] is None:
            # A request larger than the whole limit never fits: the provider says so.
            return error(
                429,
                f"Request too large: limit {self.limits[kind]} {kind} per minute",
                self._headers(now),
            )
        wait = max(w for w in waits.values() if w is not None)
        headers = {
            **self._headers(now),
            "retry-after": str(math.ceil(wait)),
            "retry-after-ms": str(math.ceil(wait * 1000)),
        }
        message = f"Rate limit reached for {kind} per minute: limit {self.limits[kind]}"
        return error(429, f"{message}. Please try again in {wait:.3f}s.", headers)


def _add(counts: QuotaCounts, **more: int) -> QuotaCounts:
    return QuotaCounts(
        accepted=counts.accepted + more.get("accepted", 0),
        refused=counts.refused + more.get("refused", 0),
        input_tokens=counts.input_tokens + more.get("input_tokens", 0),
        output_tokens=counts.output_tokens + more.get("output_tokens", 0),
    )
