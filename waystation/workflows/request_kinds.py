"""Every kind of request a person answers, in the order the loop asks and resolves them,
and the field of a hand-over's carry that holds each kind's recorded responses.

A new kind is added here once; the plan, the loop and the hand-over read this list.
"""

from __future__ import annotations

from waystation.workflows.approval import APPROVALS
from waystation.workflows.questions import QUESTIONS
from waystation.workflows.requests import AnyKind

KINDS: tuple[AnyKind, ...] = (APPROVALS, QUESTIONS)
BY_NAME: dict[str, AnyKind] = {kind.name: kind for kind in KINDS}
# The carry's field (workflows/run.py) of each kind's responses recorded and not yet taken.
CARRIED: dict[str, AnyKind] = {"decisions": APPROVALS, "answers": QUESTIONS}  # taken in this order
