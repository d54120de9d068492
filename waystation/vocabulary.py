"""The words every layer shares: names and closed sets of values that workflows, settings,
activities, the client, the servers and the CLI all speak.

A leaf: it imports nothing of waystation, so the lowest layers (workflows, settings) read
it without reaching above themselves (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import Literal, get_args

OFFLINE_MODEL = "offline"
"""The model name of the built-in offline model (no endpoint needed)."""

AGENT_TOOL_PREFIX = "agent__"
"""A sub-agent is offered to its parent as a tool named with this prefix."""

ApprovalRule = Literal["always", "never", "outside_scratch"]
"""When a tool call waits for a person's approval."""

NotifiableKind = Literal["approval_requested", "question_asked", "done", "failed", "stuck"]
"""What a webhook endpoint may subscribe to."""
NOTIFIABLE_KINDS: tuple[str, ...] = get_args(NotifiableKind)
