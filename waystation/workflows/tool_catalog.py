"""The tool catalog of MCP servers: what `list_tools` records in history, and the rules
that turn a tool's annotations into an approval default and a retry policy.

Pure models and functions (no I/O), so workflow code may import them.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import Field

from waystation.vocabulary import AGENT_TOOL_PREFIX, ApprovalRule
from waystation.workflows.models import Contract

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_FUNCTION_NAME = 64
SEPARATOR = "__"
MAX_DESCRIPTION = 4_000  # a tool's description in history and in every model call
MAX_REASON_IN_NOTE = 300  # of each unavailable server's error, in every model call
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]")


class McpToolHints(Contract):
    """A tool's MCP annotations, as the server declares them (hints, not guarantees)."""

    title: str | None = None
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None


class McpToolSpec(Contract):
    """One tool of one server, as offered to the model."""

    name: str = Field(description="What the model calls: <server>__<tool>, OpenAI-valid.")
    server: str
    tool: str = Field(description="The server's own name for the tool.")
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    hints: McpToolHints = Field(default_factory=McpToolHints)
    approval: ApprovalRule = Field(
        description="Default rule: from the annotations, or the server's settings."
    )
    retry_safe: bool = Field(
        description="A lost attempt may be retried (idempotent or read-only); else at most once."
    )
    timeout_seconds: float = Field(
        default=300,
        description="How long the worker lets a call run (the server's call_timeout_seconds): "
        "the run_tool activity's start-to-close timeout must be longer.",
    )

    def openai_tool(self) -> dict[str, Any]:
        """The OpenAI `tools` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


class McpServerTools(Contract):
    """One server's tools, or why there are none."""

    server: str
    tools: list[McpToolSpec] = Field(default_factory=list)
    error: str | None = Field(
        default=None, description="Why the server could not be listed (start, timeout...)."
    )
    notes: list[str] = Field(
        default_factory=list, description="Tools renamed or left out, and why."
    )
    fingerprint: str = Field(default="", description="Digest of the listing, to notice changes.")


class ToolCatalog(Contract):
    """The MCP tools a task saw, server by server: the result of `list_tools`."""

    servers: list[McpServerTools] = Field(default_factory=list)

    def tools(self) -> list[McpToolSpec]:
        return [tool for server in self.servers for tool in server.tools]

    def get(self, name: str) -> McpToolSpec | None:
        return next((tool for tool in self.tools() if tool.name == name), None)

    def openai_tools(self, allowed: list[str] | None = None) -> list[dict[str, Any]]:
        """The `tools` entries to offer the model (all, or those named in `allowed`)."""
        return [t.openai_tool() for t in self.tools() if allowed is None or t.name in allowed]

    def unavailable(self, tool: str) -> McpServerTools | None:
        """The entry of the server of `tool` if that server could not be listed."""
        parts = split_name(tool)
        server = parts[0] if parts else None
        return next((s for s in self.servers if s.server == server and s.error), None)

    def unavailable_note(self) -> str | None:
        """What the model is told of the servers it cannot use, a line each, or None."""
        reasons = [_one_line(s.error) for s in self.servers if s.error]
        if not reasons:
            return None
        lines = "\n".join(f"- {reason}" for reason in reasons)
        return f"These MCP servers are unavailable; none of their tools can be called:\n{lines}"

    def problems(self) -> list[str]:
        """A sentence for each server whose tools could not be listed."""
        return [
            f"the tools of MCP server {s.server!r} are missing: {s.error}"
            for s in self.servers
            if s.error
        ]

    def merged(self, newer: ToolCatalog) -> ToolCatalog:
        """This catalog with the servers listed again in `newer` replaced."""
        relisted = {server.server: server for server in newer.servers}
        kept = [relisted.pop(s.server, s) for s in self.servers]
        return ToolCatalog(servers=kept + list(relisted.values()))


def unlisted(servers: list[str], reason: str) -> ToolCatalog:
    """A catalog of these servers without their tools, each saying `reason`."""
    return ToolCatalog(
        servers=[McpServerTools(server=s, error=f"MCP server {s!r}: {reason}") for s in servers]
    )


class ListToolsRequest(Contract):
    """Input of the `list_tools` activity."""

    servers: list[str] | None = Field(
        default=None, description="Server names to list; None lists every configured server."
    )


def split_name(name: str) -> tuple[str, str] | None:
    """(server, exposed tool part) of an MCP tool name, or None for any other tool name."""
    server, sep, rest = name.partition(SEPARATOR)
    if not sep or not server or not rest:
        return None
    return server, rest


def is_mcp_tool_name(name: str) -> bool:
    """Whether `name` is `<server>__<tool>`: built-in tools never contain `__`, and
    `agent__<name>` is a sub-agent (no MCP server may be named `agent`)."""
    return split_name(name) is not None and not name.startswith(AGENT_TOOL_PREFIX)


def exposed_name(server: str, tool: str) -> str:
    """The name the model sees for `tool` of `server`.

    `server__tool` when that is a valid OpenAI function name. Otherwise (characters outside
    `[A-Za-z0-9_-]`, or longer than 64) the tool part is the name with other characters
    replaced by `_`, cut to fit, and followed by `_` and 8 hex digits of its SHA-256: the
    same tool always gets the same name, and two tools that clean up alike still differ.
    """
    plain = f"{server}{SEPARATOR}{tool}"
    if FUNCTION_NAME.match(plain):
        return plain
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    room = MAX_FUNCTION_NAME - len(server) - len(SEPARATOR) - len(digest) - 1
    cleaned = _NOT_IN_NAME.sub("_", tool)[:room]
    return f"{server}{SEPARATOR}{cleaned}_{digest}"


def default_policy(hints: McpToolHints) -> tuple[ApprovalRule, bool]:
    """(approval rule, retry-safe) that a tool's annotations give.

    - `readOnlyHint` → never asks, and a retry is safe (reading twice changes nothing).
    - anything else asks: `destructiveHint`, no hints at all, and also `destructiveHint:
      false` (an additive write is still a side effect a person may not want).
    - `idempotentHint` → a lost attempt is retried; otherwise the call runs at most once.
    Annotations come from the server and are only hints: a server's settings
    (`approval`, `retry_safe`) and a task's approval policy override them.
    """
    read_only = hints.read_only_hint is True
    approval: ApprovalRule = "never" if read_only else "always"
    return approval, read_only or hints.idempotent_hint is True


def catalog_digest(catalog: ToolCatalog) -> str:
    """The digest an LLM request names its run's catalog by."""
    return hashlib.sha256(catalog.model_dump_json().encode()).hexdigest()[:32]


def fingerprint(tools: list[McpToolSpec]) -> str:
    """A digest of a server's listing: equal listings give equal fingerprints."""
    encoded = json.dumps([t.model_dump(mode="json") for t in tools], sort_keys=True)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]


def _one_line(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= MAX_REASON_IN_NOTE else text[: MAX_REASON_IN_NOTE - 1] + "…"


def cap_description(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION:
        return text
    return text[: MAX_DESCRIPTION - 1] + "…"
