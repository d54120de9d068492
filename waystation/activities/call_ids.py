"""The ids a step's tool calls are known by, unique within the step.

Everything about a call is keyed by its id: its approval request, the ledger's idempotency
key, its notice's Idempotency-Key, its observation, its sub-agent's task id, and the pairing
of the assistant message with its results that goes back to the model. A model may send two
calls under one id, or none at all, so the ids are settled here, inside the LLM activity,
whose result is recorded in history: a replay reads the same ids back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# What a provider's id may look like to be kept as it is (OpenAI's `call_…`, Anthropic's
# `toolu_…`, `functions.name:0`); anything else is named after its place in the message.
_KEPT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def unique_call_ids(given: Sequence[str | None], prefix: str) -> list[str]:
    """One id per call, in order, no two alike: a well-formed id the model gave is kept where
    it first stands; a missing or malformed one becomes `<prefix>_<index>`; a repeat becomes
    `<id>_<n>`, the smallest n from 2 that no other call of the message uses."""
    wanted = [
        value if value is not None and _KEPT_ID.fullmatch(value) else f"{prefix}_{index}"
        for index, value in enumerate(given)
    ]
    taken = set(wanted)
    used: set[str] = set()
    ids: list[str] = []
    for value in wanted:
        if value in used:
            n = 2
            while f"{value}_{n}" in taken:
                n += 1
            value = f"{value}_{n}"
            taken.add(value)
        used.add(value)
        ids.append(value)
    return ids
