"""One frozen settings model, read from the environment by worker.py, starter.py and the API.

Temporal's own connection settings (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY,
TOML profiles) are read by `temporalio.envconfig`, so an existing Temporal setup just works.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from waystation.settings.mcp_servers import McpServerConfig, check_server_name, load_servers_file
from waystation.settings.model_endpoints import (
    ModelEndpoint,
    ModelEndpointError,
    all_endpoints,
    is_configured,
    parse_endpoints,
)
from waystation.settings.webhooks import WebhookEndpoint, check_console_url, parse_webhooks
from waystation.vocabulary import OFFLINE_MODEL, ApprovalRule

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_NOT_IN_PROJECT_NAME = re.compile(r"[^a-z0-9._-]+")
BUILTIN_TOOLS_MODULE = "waystation.activities.builtin_tools"


# Who a caller is (waystation/client/task_rights.py says what each may set on a task): a reader
# starts and reads tasks, an approver also decides approvals and widens a task's rights.
Role = Literal["reader", "approver"]

# What a tenant's name may be: the same as AgentTask.tenant's (workflows/models.py, a layer
# this one may not import; tests/test_tenants.py holds them equal).
TENANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


def project_of_directory(directory: Path) -> str:
    """A project name from a directory's: lower case, runs of other characters as `-`."""
    name = _NOT_IN_PROJECT_NAME.sub("-", directory.name.lower()).strip("-._")[:63]
    return name or "default"


class ApiToken(BaseModel):
    """A bearer token of the HTTP API: a reader starts and reads tasks, an approver decides."""

    role: Role
    name: str = Field(min_length=1, description="Recorded as the approver of its decisions.")
    tenant: str | None = Field(
        default=None,
        pattern=TENANT_NAME_PATTERN,
        description="The tenant the token is bound to: its tasks carry it, and it sees and "
        "decides only that tenant's tasks. Unbound: any task, and the tasks it starts are "
        "its name's (or the tenant it names).",
    )

    def tenant_of_start(self) -> str | None:
        """The tenant a task this token starts carries when the caller names none: the
        bound tenant, else the token's name where it can be one (else none)."""
        if self.tenant is not None:
            return self.tenant
        return self.name if re.fullmatch(TENANT_NAME_PATTERN, self.name) else None


class Settings(BaseSettings):
    # An empty variable (as compose passes an unset one) means "not set".
    model_config = SettingsConfigDict(
        env_prefix="WAYSTATION_", frozen=True, extra="ignore", env_ignore_empty=True
    )

    project: str = Field(
        default_factory=lambda: project_of_directory(Path.cwd()),
        description="The project's name: its task queue is waystation-<project>, so projects "
        "beside each other on one Temporal server never run each other's tasks. Default: the "
        "current directory's name.",
    )
    task_queue: str = Field(
        default_factory=lambda fields: f"waystation-{fields['project']}",
        min_length=1,
        max_length=200,
        description="The task queue of workers and clients; default waystation-<project>.",
    )
    worker_deployment: str = Field(
        default="waystation",
        pattern=r"^[A-Za-z0-9_-]{1,100}$",
        validation_alias=AliasChoices("WAYSTATION_DEPLOYMENT", "WAYSTATION_WORKER_DEPLOYMENT"),
        description="The Temporal Worker Deployment the workers join (letters, digits, _ and "
        "-; no '.', which Temporal reads as the version's separator).",
    )
    build_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.+-]{1,200}$",
        description="The worker's version in its deployment; default: the package's version "
        "and a hash of the workflow code, so two builds of different workflow code never "
        "share an id.",
    )
    worker_versioning: bool = Field(
        default=True,
        description="Workers join the deployment as versions (a task's run pinned to its "
        "version, new runs on the current one); false: unversioned workers "
        "(docs/production.md, Deploys).",
    )
    data_dir: Path = Field(
        default=Path(".waystation"), description="Dev server database, workspace, logs."
    )
    workspace: Path | None = Field(
        default=None, description="Where file and shell tools work; default <data_dir>/workspace."
    )
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("WAYSTATION_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("WAYSTATION_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("WAYSTATION_MODEL", "OPENAI_MODEL"),
        description="Model for new tasks; default gpt-4o-mini with an endpoint, else offline.",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL (postgresql://user:password@host:port/db) for the idempotency "
        "ledger, blobs and the deployment id, shared by workers on several machines; none: "
        "SQLite in data_dir, for one machine.",
    )
    retention_days: float = Field(
        default=30,
        gt=0,
        description="Finished ledger entries older than this are pruned.",
    )
    conversation_retention_days: float = Field(
        default=400,
        gt=0,
        description="Saved conversation messages unused this long are pruned; longer than a "
        "task may wait for a person (at most a year), so a waiting task never loses them.",
    )
    prune_interval_hours: float = Field(
        default=24,
        ge=0,
        description="How often a worker prunes (0: never; `ws storage prune` does it).",
    )
    embedded_server: bool = Field(
        default=True,
        description="Start the Temporal dev server (SQLite under data_dir) when none is reachable "
        "at a local address.",
    )
    worker_connect_wait_seconds: float = Field(
        default=60,
        ge=0,
        description="How long a worker that starts waits for Temporal to answer before it "
        "gives up (a server restarting, or started after the worker).",
    )
    worker_cached_tasks: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Running tasks a worker keeps in memory (Temporal's workflow cache, the "
        "SDK's default size). With more tasks moving than this, an evicted task is replayed "
        "from its history at its next step; each cached task costs about 0.1 MB.",
    )
    worker_activity_slots: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Tool calls, notifications and other activities (model calls apart) a "
        "worker runs at once (Temporal's default).",
    )
    worker_model_call_slots: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Model calls a worker takes at once, apart from its other activities: a "
        "call waiting for its quota's turn holds one of these, never a tool call's slot.",
    )
    heartbeat_timeout_seconds: float | None = Field(
        default=None,
        ge=1,
        le=600,
        validation_alias=AliasChoices(
            "WAYSTATION_HEARTBEAT_TIMEOUT", "WAYSTATION_HEARTBEAT_TIMEOUT_SECONDS"
        ),
        description="Heartbeat timeout of model and tool calls for tasks that set none: how "
        "soon a dead worker's call is retried elsewhere, and how long a starved worker may go "
        "silent before its call is abandoned (default 5 s).",
    )
    auto_repair: bool = Field(
        default=False,
        description="The worker repairs the stuck tasks of its task queue by itself (a reset "
        "to the last good workflow task, decisions kept), once per failure point, each logged "
        "as a `repaired` event by `worker`.",
    )
    auto_repair_interval_seconds: float = Field(
        default=30,
        gt=0,
        description="How often a worker with auto_repair looks for stuck tasks.",
    )
    dev_server_port: int = 7233
    dev_server_ui_port: int = 8233
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    encryption_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='JSON: {"<key id>": "<base64 32-byte key>"}; old keys stay to decrypt.',
    )
    encryption_key_id: str | None = Field(
        default=None, description="The key new payloads are encrypted with."
    )
    codec_cors_origins: list[str] = Field(
        default_factory=lambda: ["http://localhost:8233"],
        description="Web UIs allowed to call the codec endpoints from a browser.",
    )
    tracing: bool = Field(default=False, description="OpenTelemetry spans through Temporal.")
    api_tokens: dict[str, ApiToken] = Field(
        default_factory=dict,
        description='JSON: {"<token>": {"role": "approver", "name": "alice", "tenant": '
        '"acme"}} ("tenant" optional: the token sees only that tenant\'s tasks). None: the API '
        "binds to localhost only and lets every local caller in.",
    )
    max_steps_cap: int = Field(
        default=10_000,
        ge=1,
        le=100_000,
        description="The most max_steps any task, sub-agent, resume, fork or message may "
        "ask for; more is refused, whoever asks.",
    )
    memory_max_value_chars: int = Field(
        default=16_000,
        ge=1,
        le=1_000_000,
        description="The most characters a memory item's value may hold; a longer one is "
        "refused with a sentence, nothing written.",
    )
    memory_approval: ApprovalRule = Field(
        default="never",
        description="The approval rule of the remember and forget tools for tasks that set "
        "none (recall never asks).",
    )
    max_agent_depth_cap: int = Field(
        default=5,
        ge=0,
        le=20,
        description="The most max_agent_depth a task may ask for; more is refused.",
    )
    max_agent_calls_cap: int = Field(
        default=16,
        ge=1,
        le=100,
        description="The most max_agent_calls a task may ask for; more is refused.",
    )

    api_allowed_hosts: Annotated[list[str] | None, NoDecode] = Field(
        default=None,
        description="Host names the API answers to (its DNS-rebinding guard), comma-separated: "
        "`name` (any port), `name:port`, or `*` for any. Default: 127.0.0.1, localhost and "
        "[::1] when the API has no tokens or binds to a loopback address; any host otherwise.",
    )
    api_max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="The largest request body the API reads (413 beyond it): room for a task's "
        "longest text and system prompt, and for the codec's payloads.",
    )

    tools: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [BUILTIN_TOOLS_MODULE],
        min_length=1,
        description="The modules whose tools the deployment offers, comma-separated: "
        "`module` (every Tool at its top level, e.g. by @tool) or `module:attribute`. Read "
        "alike by workers, the command line and the API (activities/tool_modules.py), which "
        f"refuse a task naming a tool none of them defines. Default: {BUILTIN_TOOLS_MODULE}, "
        "the built-in tools; keep it in the list to keep them.",
    )
    agents: str | None = Field(
        default=None,
        description="Sub-agents the deployment offers, as a JSON list of definitions (name, "
        "description, system_prompt, tools, model, max_steps, token_budget, output_schema, "
        "mcp_servers) or the path of a file holding one; each is offered to the model as the "
        "tool agent__<name>. Python definitions (Agent) at the top level of a WAYSTATION_TOOLS "
        "module count too.",
    )
    shell_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Variables of the worker's environment passed on to shell commands, by "
        "name, comma-separated. A command gets only PATH, HOME, USER, SHELL, TERM, LOGNAME, "
        "the locale and WAYSTATION_WORKSPACE besides: none of the worker's secrets.",
    )
    mcp_servers: dict[str, McpServerConfig] = Field(
        default_factory=dict,
        description='JSON: {"<name>": {"command": "...", "args": [...]} or {"url": "...", '
        '"headers": {...}}}. Tools appear to the model as <name>__<tool>. Read by workers; '
        "`${VAR}` in env, args, url and headers is expanded from the worker's environment.",
    )
    model_endpoints: Annotated[dict[str, ModelEndpoint], NoDecode] = Field(
        default_factory=dict,
        description='JSON: {"<name>": {"protocol": "chat" | "responses" | "anthropic", '
        '"base_url": "...", "api_key_env": "VARIABLE", "headers": {...}}}: endpoints a model '
        "named <name>:<model> is called at, besides (or instead of) openai, openai-responses "
        "and anthropic. Keys are named by their variable, read by workers; `${VAR}` in "
        "headers is expanded from the worker's environment.",
    )
    mcp_servers_file: Path | None = Field(
        default=None,
        description="A JSON file of MCP servers, the same shape (or a client config's "
        '{"mcpServers": {...}}); WAYSTATION_MCP_SERVERS entries win over it.',
    )

    webhooks: SecretStr | None = Field(
        default=None,
        description='JSON, or the path of a JSON file: [{"name": "ops", "url": "https://...", '
        '"events": ["approval_requested", "question_asked", "done", "failed", "stuck"], '
        '"secret": "...", "format": "json" or "slack"}]. Read by workers, which sign and send '
        "each notice from an activity; checked when a worker starts.",
    )
    webhook_retry_hours: float = Field(
        default=24,
        gt=0,
        le=24 * 30,
        description="How long a notice that fails to arrive is retried (with backoff) before "
        "it becomes an `error` event on its task.",
    )
    webhook_retry_initial_seconds: float = Field(
        default=1, gt=0, le=3600, description="The first wait before a delivery is retried."
    )
    webhook_retry_max_seconds: float = Field(
        default=600, gt=0, le=24 * 3600, description="The longest wait between two attempts."
    )
    webhook_timeout_seconds: float = Field(
        default=10, gt=0, le=600, description="How long one attempt waits for the endpoint."
    )
    webhook_stuck_check_seconds: float = Field(
        default=30,
        gt=0,
        description="How often a worker whose endpoints want `stuck` looks for stuck tasks.",
    )
    console_url: str | None = Field(
        default=None,
        description="Where people open the console (the API's address, e.g. "
        "https://waystation.example.com): notices link to {console_url}/#/tasks/{id}.",
    )

    @field_validator("tools", "api_allowed_hosts", "shell_env", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):  # the variable: entries separated by commas
            return [entry.strip() for entry in value.split(",") if entry.strip()]
        return value

    @field_validator("model_endpoints", mode="before")
    @classmethod
    def _endpoints_json(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return parse_endpoints(value)
            except ModelEndpointError as err:
                # The sentence as it is (it names the endpoint), after the variable's name.
                said = str(err).removeprefix("WAYSTATION_MODEL_ENDPOINTS ")
                raise PydanticCustomError("model_endpoints", said) from None
        return value

    @field_validator("project")
    @classmethod
    def _project_name(cls, name: str) -> str:
        if not PROJECT_NAME.match(name):
            raise ValueError(
                "a project name is 1 to 63 lower-case letters, digits, '.', '_' or '-', "
                "starting with a letter or a digit"
            )
        return name

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in servers:
            check_server_name(name)
        return servers

    def mcp_server_configs(self) -> dict[str, McpServerConfig]:
        """Every declared MCP server: the file's, then WAYSTATION_MCP_SERVERS over them."""
        from_file = load_servers_file(self.mcp_servers_file) if self.mcp_servers_file else {}
        return {**from_file, **self.mcp_servers}

    def webhook_endpoints(self) -> list[WebhookEndpoint]:
        """The endpoints of WAYSTATION_WEBHOOKS; WebhookConfigError (one sentence naming the
        endpoint) for a bad one, or a bad WAYSTATION_CONSOLE_URL."""
        check_console_url(self.console_url)
        return parse_webhooks(self.webhooks.get_secret_value()) if self.webhooks else []

    def endpoints(self) -> dict[str, ModelEndpoint]:
        """Every model endpoint: the defaults, and the declared ones over them."""
        return all_endpoints(self.model_endpoints)

    def model_environment(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables endpoints read (`environ`, default this process's), with the OpenAI
        ones as these settings read them (WAYSTATION_OPENAI_API_KEY and _BASE_URL too)."""
        found = dict(os.environ if environ is None else environ)
        if self.api_key:
            found["OPENAI_API_KEY"] = self.api_key
        if self.openai_base_url:
            found["OPENAI_BASE_URL"] = self.openai_base_url
        return found

    def configured_endpoints(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """The endpoints this machine can call: each one whose base URL or key is set."""
        variables = self.model_environment(environ)
        return sorted(n for n, e in self.endpoints().items() if is_configured(e, variables))

    @property
    def endpoint_configured(self) -> bool:
        return self.openai_api_key is not None or self.openai_base_url is not None

    @property
    def default_model(self) -> str:
        if self.model:
            return self.model
        return DEFAULT_OPENAI_MODEL if self.endpoint_configured else OFFLINE_MODEL

    @property
    def workspace_dir(self) -> Path:
        return (self.workspace or self.data_dir / "workspace").absolute()

    @property
    def api_key(self) -> str | None:
        return self.openai_api_key.get_secret_value() if self.openai_api_key else None
