"""Starting a task's workflow, and the task a start sends: one place for each, shared by
`run`, `fork`, a follow-up message (waystation/client/messaging.py) and the servers and CLI
that build tasks."""

from __future__ import annotations

import asyncio
import difflib
import json
import re
import time
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from waystation.activities.agent_tools import spec_with_facts
from waystation.activities.redaction import url_without_credentials
from waystation.client.start_gate import start_gate
from waystation.client.task_errors import UnknownToolsError
from waystation.client.task_list import run_attributes
from waystation.client.task_rights import TaskRefusedError
from waystation.client.tenant_priority import tenant_priority
from waystation.prices import ModelPrice
from waystation.settings import Settings
from waystation.settings.model_endpoints import (
    BARE_NAME_ENDPOINT,
    ModelEndpoint,
    api_key_of,
    base_url_of,
    is_configured,
    split_model_name,
)
from waystation.settings.model_facts import fact_updates
from waystation.vocabulary import AGENT_TOOL_PREFIX, OFFLINE_MODEL, ApprovalRule
from waystation.workflows import options
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.memory import FORGET_TOOL, REMEMBER_TOOL
from waystation.workflows.models import (
    TENANT_PATTERN,
    AgentSpec,
    AgentTask,
    Message,
    ModelSettings,
)
from waystation.workflows.run import MESSAGE_SIGNAL, AgentOutcome, AgentRun
from waystation.workflows.tool_catalog import split_name

WORKFLOW_TASK_TIMEOUT = options.WORKFLOW_TASK_TIMEOUT  # (workflows/options.py)
SUMMARY_CHARS = 200
# The most names AgentTask.requires holds.
REQUIRES_RECORDED = 500


def default_model(settings: Settings, name: str | None = None, **options: Any) -> ModelSettings:
    """The model a task calls: `name`, else the deployment's default (its WAYSTATION_MODEL,
    else the endpoint's default model, else the offline one)."""
    return ModelSettings(name=name or settings.default_model, **options)


def new_task(settings: Settings, text: str, **fields: Any) -> AgentTask:
    """An AgentTask with the deployment's default model unless `fields` name one."""
    fields.setdefault("model", default_model(settings))
    return AgentTask(task=text, **fields)


def with_defaults(
    settings: Settings,
    task: AgentTask,
    tool_names: frozenset[str] = frozenset(),
    agents: Sequence[AgentSpec] = (),
) -> AgentTask:
    """The task as it will run: what it leaves unset, the settings fill in (with no MCP
    servers named, every one they declare; the heartbeat timeout; the definitions of the
    sub-agents it may call (`agents`, unless it holds its own), their models resolved; what
    a worker must offer it: the tools it names, or every one of `tool_names`, sub-agents
    excepted (it holds their definitions); its model's context window and way of structured
    output, from what is known of its models: settings/model_facts.py; the prices of the
    models it and its sub-agents call)."""
    defaults: dict[str, Any] = {}
    endpoints = settings.endpoints()
    held = task.agents if task.agents is not None else agents
    resolved = [spec_with_facts(spec, endpoints) for spec in held]
    if resolved != task.agents:
        defaults["agents"] = resolved
    prices = price_table(endpoints, models_called(task, resolved))
    if prices != task.prices:
        defaults["prices"] = prices
    if facts := fact_updates(task.model, endpoints):
        defaults["model"] = task.model.model_copy(update=facts)
    if task.requires is None:
        named = task.tools if task.tools is not None else sorted(tool_names)
        needed = [
            name for name in named if name in tool_names and not name.startswith(AGENT_TOOL_PREFIX)
        ]
        # More than a task may record: any worker may take it (as a task started without).
        if len(needed) <= REQUIRES_RECORDED:
            defaults["requires"] = needed
    if task.mcp_servers is None:
        defaults["mcp_servers"] = list(settings.mcp_server_configs())
    heartbeat = settings.heartbeat_timeout_seconds
    if task.heartbeat_timeout_seconds is None and heartbeat is not None:
        defaults["heartbeat_timeout_seconds"] = heartbeat
    if (policy := memory_policy(settings, task)) != task.approval.policy:
        defaults["approval"] = task.approval.model_copy(update={"policy": policy})
    return task.model_copy(update=defaults) if defaults else task


def memory_policy(settings: Settings, task: AgentTask) -> dict[str, ApprovalRule]:
    """The task's approval policy, with the deployment's rule for the memory tools that
    write (WAYSTATION_MEMORY_APPROVAL) where it sets none, when it may call them."""
    policy = dict(task.approval.policy)
    if settings.memory_approval == "never":
        return policy
    for name in (REMEMBER_TOOL, FORGET_TOOL):
        if task.tools is None or name in task.tools:
            policy.setdefault(name, settings.memory_approval)
    return policy


def models_called(task: AgentTask, agents: Sequence[AgentSpec]) -> list[str]:
    """Every model the task may call: its own and its fallbacks, and its sub-agents'."""
    chains = [task.model, *(spec.model for spec in agents if spec.model is not None)]
    names = [name for model in chains for name in (model.name, *model.fallback_models)]
    return list(dict.fromkeys(names))


def price_table(
    endpoints: Mapping[str, ModelEndpoint], models: Sequence[str]
) -> dict[str, ModelPrice] | None:
    """The prices of `models` (by the name a task calls each) their endpoints declare; the
    models without one are left out, and a table of none is None."""
    table: dict[str, ModelPrice] = {}
    for name in models:
        if name == OFFLINE_MODEL:
            continue
        endpoint, model_id = split_model_name(name, endpoints)
        declared = endpoints.get(endpoint or BARE_NAME_ENDPOINT)
        price = declared.price_of(model_id) if declared is not None else None
        if price is not None:
            table[name] = price
    return table or None


def check_cost_budget(task: AgentTask) -> None:
    """Refuse a cost_budget on a task whose model has no price: it could never be honoured."""
    if task.cost_budget is None or task.model.name in (task.prices or {}):
        return
    raise TaskRefusedError(
        "cost_budget",
        400,
        "unpriced_model",
        f"a cost_budget needs a price for the task's model {task.model.name!r}, and its "
        "endpoint declares none (the prices of WAYSTATION_MODEL_ENDPOINTS): set one, or "
        "use token_budget",
    )


def checked_tenant(tenant: str) -> str:
    """`tenant` if it has a tenant's form (AgentTask.tenant's), else TaskRefusedError."""
    if re.fullmatch(TENANT_PATTERN, tenant) is None:
        raise TaskRefusedError(
            "tenant",
            400,
            "invalid_tenant",
            f"tenant {tenant[:80]!r} is not a tenant's name: 1 to 64 letters, digits and "
            "`_.@-`, starting with a letter or digit",
        )
    return tenant


def check_tools(task: AgentTask, tool_names: frozenset[str]) -> None:
    """Refuse a task whose `tools`, or whose sub-agents' tools, name a tool nobody offers
    (rather than drop it)."""
    servers = set(task.mcp_servers or [])
    if task.agents is not None:  # besides the deployment's, the sub-agents it holds
        tool_names = tool_names | {spec.tool_name for spec in task.agents}
    unknown = [name for name in task.tools or [] if not is_offered(name, tool_names, servers)]
    for spec in task.agents or []:
        own = set(spec.mcp_servers) if spec.mcp_servers is not None else servers
        unknown += [
            n for n in spec.tools or [] if not is_offered(n, tool_names, own) and n not in unknown
        ]
    unknown += [n for n in task.requires or [] if n not in tool_names and n not in unknown]
    if not unknown:
        return
    named = ", ".join(repr(n) for n in unknown)
    offered = ", ".join(sorted(tool_names))
    mcp = (
        f"; MCP tools are server__tool for the servers {', '.join(sorted(servers))}"
        if servers
        else ""
    )
    raise UnknownToolsError(
        unknown, f"unknown tool(s) in the task's tools: {named} (the tools are {offered}{mcp})"
    )


def is_offered(name: str, tool_names: frozenset[str], servers: set[str]) -> bool:
    """Whether a tool of `tool_names`, or of one of the MCP `servers`, is named `name`."""
    return name in tool_names or ((split := split_name(name)) is not None and split[0] in servers)


OPENAI_URL = "https://api.openai.com/v1"  # the openai client's default endpoint
MODEL_LIST_SECONDS = 3.0  # a start waits no longer for the endpoint's list of models
MODEL_LIST_RETRY_SECONDS = 60.0  # an endpoint that could not list is asked again after this
MODELS_SHOWN = 12

# The models each endpoint (by base URL) offers, and when it said so (None: it could not
# list them), kept for this process: a start asks again only for a name not in the list.
_offered: dict[str, tuple[float, frozenset[str] | None]] = {}


def _fetch_models(base_url: str, api_key: str | None) -> frozenset[str] | None:
    """The endpoint's `GET /models`: the model ids, or None when it cannot say."""
    request = urllib.request.Request(base_url.rstrip("/") + "/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=MODEL_LIST_SECONDS) as answer:
            listing = json.load(answer)
        return frozenset(str(model["id"]) for model in listing["data"])
    except (OSError, ValueError, KeyError, TypeError):  # unreachable, no route, not a list
        return None


async def offered_models(
    base_url: str, api_key: str | None, *, fresh: bool = False
) -> frozenset[str] | None:
    """The models an OpenAI-compatible endpoint offers (None: it cannot list them), cached
    for this process; `fresh` asks the endpoint again."""
    known = _offered.get(base_url)
    stale = known is None or (
        known[1] is None and time.monotonic() - known[0] > MODEL_LIST_RETRY_SECONDS
    )
    if fresh or stale:
        models = await asyncio.to_thread(_fetch_models, base_url, api_key)
        known = _offered[base_url] = (time.monotonic(), models)
    assert known is not None
    return known[1]


async def check_model(settings: Settings, task: AgentTask) -> None:
    """Refuse (TaskRefusedError, before anything starts) a task whose model, or fallback
    model, its endpoint does not offer, naming the ones it does. The offline model is always
    there; an endpoint not configured on this side, or one that cannot list its models,
    starts the task as before (its worker's model call says what is wrong)."""
    for name in [task.model.name, *task.model.fallback_models]:
        await _check_listed(settings, name)


async def _check_listed(settings: Settings, name: str) -> None:
    """Refuse `name` when the endpoint it selects lists its models and not this one. Only
    the OpenAI protocols' `GET /models` is asked: Anthropic's list is not read here (it
    wants the key and a version header on every client, and a typo there is said by the
    worker's first call, a 404 in one sentence)."""
    if name == OFFLINE_MODEL:
        return
    endpoints = settings.endpoints()
    endpoint, model_id = split_model_name(name, endpoints)
    declared = endpoints[endpoint or BARE_NAME_ENDPOINT]
    environ = settings.model_environment()
    if declared.protocol == "anthropic" or not is_configured(declared, environ):
        return
    base_url = base_url_of(declared, environ) or OPENAI_URL
    api_key = api_key_of(declared, environ)
    offered = await offered_models(base_url, api_key)
    if offered is None or model_id in offered:
        return
    offered = await offered_models(base_url, api_key, fresh=True)  # served since we asked
    if offered is None or model_id in offered:
        return
    names = sorted(offered)
    close = difflib.get_close_matches(model_id, names, n=1)
    prefix = f"{endpoint}:" if endpoint else ""
    guess = f" (did you mean {prefix + close[0]!r}?)" if close else ""
    shown = ", ".join(names[:MODELS_SHOWN])
    more = f" and {len(names) - MODELS_SHOWN} more" if len(names) > MODELS_SHOWN else ""
    where = url_without_credentials(base_url)
    variable = (
        f" ({declared.base_url_env})" if declared.base_url is None and declared.base_url_env else ""
    )
    raise TaskRefusedError(
        "model.name",
        400,
        "unknown_model",
        f"unknown model {name!r}{guess}: the endpoint {where}{variable} offers "
        f"{shown or 'none'}{more}, and {OFFLINE_MODEL!r} is always there",
    )


def summary(text: str, limit: int = SUMMARY_CHARS) -> str:
    """What the Web UI shows for a task (encoded like every payload when a codec is on)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def start_agent(
    client: Client,
    task_id: str,
    run: AgentRun,
    *,
    task_queue: str,
    text: str,
    started_at: datetime | None = None,
    message: Message | None = None,
    on_conflict: WorkflowIDConflictPolicy = WorkflowIDConflictPolicy.USE_EXISTING,
    reuse: WorkflowIDReusePolicy = WorkflowIDReusePolicy.REJECT_DUPLICATE,
    tenant: str | None = None,
) -> WorkflowHandle[AgentWorkflow, AgentOutcome]:
    """Start the agent workflow `task_id` with `run`: its summary is the task's `text`, its
    first start `started_at` (default now: the task list orders by it), and `message`, if
    given, is its first Signal (signal-with-start: a follow-up's message). Its tenant (the
    task's, else `tenant`: a follow-up's run carries no task) is its AgentTenant and its
    fairness key: Temporal shares the queue's workers fairly between keys."""
    if run.task is not None:
        tenant = run.task.tenant
    priority = await tenant_priority(client, tenant)
    async with start_gate(client).turn(priority):
        return await client.start_workflow(
            AgentWorkflow.run,
            run,
            id=task_id,
            task_queue=task_queue,
            start_signal=MESSAGE_SIGNAL if message is not None else None,
            start_signal_args=[message] if message is not None else [],
            id_conflict_policy=on_conflict,
            id_reuse_policy=reuse,
            static_summary=summary(text),
            search_attributes=run_attributes(started_at or datetime.now(UTC), tenant),
            priority=priority,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
