"""How an MCP server is declared in settings: stdio (command) or streamable HTTP (url).

Values may name environment variables as `${NAME}`; they are expanded on the worker when
it connects, so a secret lives in the worker's environment and never in settings output,
a workflow input or history.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from waystation.settings.validation import validation_sentence
from waystation.vocabulary import AGENT_TOOL_PREFIX, ApprovalRule

SERVER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")
MAX_SERVER_NAME = 30  # leaves 32 of OpenAI's 64 function-name characters for the tool
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ALL_TOOLS = "*"


class McpConfigError(ValueError):
    """A server declaration that cannot be used (bad name, missing variable, bad file)."""


# Sub-agents are the tools agent__<name>: no MCP server may be called that.
RESERVED_SERVER_NAME = AGENT_TOOL_PREFIX.removesuffix("__")


def check_server_name(name: str) -> str:
    """A server name that keeps `server__tool` unambiguous: letters, digits, `-`, single `_`."""
    if not 1 <= len(name) <= MAX_SERVER_NAME or not SERVER_NAME_PATTERN.match(name):
        raise McpConfigError(
            f"MCP server name {name!r} must be 1-{MAX_SERVER_NAME} letters, digits, '-' or "
            "single '_' (not at either end): its tools are offered as '<server>__<tool>'"
        )
    if name == RESERVED_SERVER_NAME:
        raise McpConfigError(
            f"MCP server name {name!r} is taken: sub-agents are offered as "
            f"'{RESERVED_SERVER_NAME}__<name>'; name the server otherwise"
        )
    return name


class McpServerConfig(BaseModel):
    """One MCP server: `command` (stdio) or `url` (streamable HTTP), and how to treat its tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["stdio", "http", "streamable-http", "streamable_http"] | None = Field(
        default=None, description="Optional: inferred from command / url."
    )
    command: str | None = Field(default=None, description="stdio: the program to start.")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict, description="stdio: extra environment (PATH, HOME... are inherited)."
    )
    cwd: Path | None = None
    url: str | None = Field(default=None, description="streamable HTTP: the endpoint.")
    headers: dict[str, str] = Field(
        default_factory=dict, description='HTTP headers, e.g. {"Authorization": "Bearer ${TOKEN}"}.'
    )
    protocol: Literal["auto", "legacy"] = Field(
        default="auto",
        description="auto: the newest revision both sides speak; legacy: the 2025 "
        "initialize handshake (for a server whose discovery probe misbehaves).",
    )
    connect_timeout_seconds: float = Field(default=30, gt=0, le=3600)
    list_timeout_seconds: float = Field(default=30, gt=0, le=3600)
    call_timeout_seconds: float = Field(default=300, gt=0, le=7 * 24 * 3600)
    approval: dict[str, ApprovalRule] = Field(
        default_factory=dict,
        description="Per tool (its own name, or '*' for all), over the default the tool's "
        "annotations give; a task's approval policy still overrides this.",
    )
    retry_safe: dict[str, bool] = Field(
        default_factory=dict,
        description="Per tool (or '*'): true when a retry cannot repeat its effect, over "
        "the annotations' idempotentHint / readOnlyHint.",
    )

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.type is not None and (self.type == "stdio") != (self.command is not None):
            raise ValueError(f"type {self.type!r} does not match the command / url given")
        if self.url is None and self.headers:
            raise ValueError("headers are for url servers")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for command (stdio) servers")
        return self

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://", "${")):
            raise ValueError("url must start with http:// or https://")
        return url

    def shown(self) -> dict[str, Any]:
        """This declaration for display: header and env values masked, unless they only
        name environment variables (`${NAME}`), which are no secret."""

        def mask(value: str) -> str:
            return value if not _VARIABLE.sub("", value).strip() else "****"

        shown = self.model_dump(mode="json", exclude_defaults=True)
        for field in ("headers", "env"):
            if field in shown:
                shown[field] = {k: mask(v) for k, v in shown[field].items()}
        return shown

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    def approval_for(self, tool: str) -> ApprovalRule | None:
        return self.approval.get(tool, self.approval.get(ALL_TOOLS))

    def retry_safe_for(self, tool: str) -> bool | None:
        return self.retry_safe.get(tool, self.retry_safe.get(ALL_TOOLS))


def expand(value: str, environ: Mapping[str, str], where: str) -> str:
    """`value` with each `${NAME}` replaced from `environ`; a missing name is an error."""

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise McpConfigError(f"environment variable {name} (used in {where}) is not set")
        return environ[name]

    return _VARIABLE.sub(lookup, value)


def variables_named(value: str) -> list[str]:
    """The names `value` refers to as `${NAME}`."""
    return _VARIABLE.findall(value)


def expand_mapping(
    values: Mapping[str, str], environ: Mapping[str, str], where: str
) -> dict[str, str]:
    return {key: expand(v, environ, f"{where} {key}") for key, v in values.items()}


def parse_servers(raw: Any, source: str) -> dict[str, McpServerConfig]:
    """Servers from a JSON value: `{"name": {...}}` or a client config's `{"mcpServers": {...}}`."""
    if isinstance(raw, dict) and set(raw) == {"mcpServers"}:
        raw = raw["mcpServers"]
    if not isinstance(raw, dict):
        raise McpConfigError(f"{source}: expected a JSON object of servers by name")
    servers: dict[str, McpServerConfig] = {}
    for name, body in raw.items():
        check_server_name(str(name))
        try:
            servers[name] = McpServerConfig.model_validate(body)
        except ValidationError as err:
            problems = validation_sentence(err, "server")
            raise McpConfigError(f"{source}: MCP server {name!r}: {problems}") from None
    return servers


def load_servers_file(path: Path) -> dict[str, McpServerConfig]:
    """Servers from a JSON file (the same shape as WAYSTATION_MCP_SERVERS)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise McpConfigError(f"cannot read MCP servers file {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise McpConfigError(f"MCP servers file {path} is not JSON: {err}") from None
    return parse_servers(raw, str(path))


def worker_environment() -> Mapping[str, str]:
    """Where `${NAME}` values come from: the worker process's environment."""
    return os.environ
