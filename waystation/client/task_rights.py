"""What a caller may set on a task it starts: the one check every entry path runs.

AgentRuntime.run and fork call `admit`, so the HTTP API, MCP's run_task, the console's
form (through the API), the CLI and Python code are held to the same rules:

- a task may only make approval stricter than the deployment's rules (each tool's default,
  an MCP server's declared rule), and name only the MCP servers the deployment declares,
  unless its caller may decide approvals (an approver; the CLI and Python code hold
  Temporal's credentials, so they are approvers);
- a task may call only the deployment's sub-agents as it defines them, unless its caller
  is an approver (a definition names the tools, prompt and model its child runs with);
- the deployment's caps on max_steps, sub-agent depth and sub-agent calls hold for every
  caller, and for the sub-agents the task may call;
- ids of a sub-agent's form (`parent/step/call`) and the `parent` link are the workflow's
  alone: a client that took one could answer for another task's sub-agent; the `schedule`
  link is a schedule's firings' alone (its notices name the schedule).
"""

from __future__ import annotations

from collections.abc import Mapping

from waystation.activities.agent_tools import spec_with_facts
from waystation.activities.tools import ToolRegistry
from waystation.settings import Role, Settings
from waystation.settings.mcp_servers import McpServerConfig
from waystation.settings.model_endpoints import ModelEndpoint
from waystation.vocabulary import ApprovalRule
from waystation.workflows.agents import levels_offered, reachable
from waystation.workflows.memory import FORGET_TOOL, REMEMBER_TOOL, tenant_of
from waystation.workflows.models import SCHEDULED_ID_PREFIX, AgentSpec, AgentTask
from waystation.workflows.tool_catalog import split_name

# Looser to stricter: a reader may move a tool's rule only rightwards.
STRICTNESS: dict[ApprovalRule, int] = {"never": 0, "outside_scratch": 1, "always": 2}


class TaskRefusedError(ValueError):
    """A task its caller may not start as given (nothing was started): `setting` names the
    field, `status` is the HTTP answer (403: the caller's role may not; 400: no caller may)."""

    def __init__(self, setting: str, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting
        self.status = status
        self.kind = kind


def may_widen(role: Role) -> bool:
    """Whether a caller may give a task more than the deployment's rules (decide approvals)."""
    return role == "approver"


def check_task_id(task_id: str) -> None:
    """Refuse an id a client chose that has a sub-agent's form (`parent/step/call`) or a
    schedule's (`schedule:...`: a schedule's firings would reach that task)."""
    if task_id.startswith(SCHEDULED_ID_PREFIX):
        raise TaskRefusedError(
            "task_id",
            400,
            "reserved_task_id",
            f"task id {task_id[:80]!r} starts with {SCHEDULED_ID_PREFIX!r}, the form of the ids "
            "a schedule gives its tasks: choose another id",
        )
    if "/" in task_id:
        raise TaskRefusedError(
            "task_id",
            400,
            "reserved_task_id",
            f"task id {task_id!r} contains '/', the form of a sub-agent's id "
            "(parent/step/call), which only a parent task may start: choose an id without '/'",
        )


def check_max_steps(max_steps: int | None, settings: Settings, setting: str = "max_steps") -> None:
    """Refuse a max_steps above the deployment's cap (a task's, a resume's, a message's)."""
    if max_steps is not None and max_steps > settings.max_steps_cap:
        raise _over_cap(setting, max_steps, settings.max_steps_cap, "WAYSTATION_MAX_STEPS_CAP")


def deployment_rule(
    name: str,
    tools: ToolRegistry,
    servers: Mapping[str, McpServerConfig],
    memory_rule: ApprovalRule = "never",
) -> ApprovalRule:
    """The approval rule a tool has when a task sets none, as this side can know it: an
    MCP tool's default comes from annotations only a worker reads, so unless its server
    declares a rule, it counts as `always` (the strictest) here. The memory tools that
    write follow WAYSTATION_MEMORY_APPROVAL (`memory_rule`)."""
    tool = tools.get(name)
    if tool is not None:
        if name in (REMEMBER_TOOL, FORGET_TOOL):
            return max(tool.approval, memory_rule, key=STRICTNESS.__getitem__)
        return tool.approval
    split = split_name(name)
    if split is not None and split[0] in servers:
        declared = servers[split[0]].approval_for(split[1])
        if declared is not None:
            return declared
    return "always"


def callable_agents(task: AgentTask, tools: ToolRegistry) -> list[AgentSpec]:
    """The sub-agents a task may call, and those they may call in turn, down the tree as
    deep as it may grow: those it holds, else the deployment's (`tools`)."""
    if task.agents is not None:
        return task.agents
    specs = [tool.agent for tool in tools.allowed(None) if tool.agent is not None]
    depth = task.parent.depth if task.parent is not None else 0
    return reachable(specs, task.tools, levels_offered(task, depth))


def deployment_agents(
    tools: ToolRegistry, endpoints: Mapping[str, ModelEndpoint]
) -> dict[str, AgentSpec]:
    """The deployment's sub-agents by name, as a task created here holds them."""
    return {
        tool.agent.name: spec_with_facts(tool.agent, endpoints)
        for tool in tools.allowed(None)
        if tool.agent is not None
    }


def admit(
    task: AgentTask,
    role: Role,
    settings: Settings,
    tools: ToolRegistry,
    servers: Mapping[str, McpServerConfig],
) -> None:
    """Refuse (TaskRefusedError, one sentence naming the setting) a task `role` may not
    start as given; `task` is as it will run (the settings' defaults filled in)."""
    if task.parent is not None:
        raise TaskRefusedError(
            "parent",
            400,
            "reserved_field",
            "parent is set only by a task that starts a sub-agent, never by a client: leave it out",
        )
    if task.schedule is not None:
        raise TaskRefusedError(
            "schedule",
            400,
            "reserved_field",
            "schedule is set only on a schedule's firings (POST /schedules), never by a "
            "client: leave it out",
        )
    _check_caps(task, settings, tools)
    check_namespace_tenant(task)
    if may_widen(role):
        return
    check_agents(task, role, deployment_agents(tools, settings.endpoints()))
    for name, rule in task.approval.policy.items():
        default = deployment_rule(name, tools, servers, settings.memory_approval)
        if STRICTNESS[rule] < STRICTNESS[default]:
            raise TaskRefusedError(
                f"approval.policy.{name}",
                403,
                "forbidden_setting",
                f"approval.policy.{name}: a {role} may not set {rule!r}, looser than the "
                f"deployment's rule {default!r}; only an approver may loosen approval",
            )
    unknown = [name for name in task.mcp_servers or [] if name not in servers]
    if unknown:
        named = ", ".join(repr(n) for n in unknown)
        raise TaskRefusedError(
            "mcp_servers",
            403,
            "forbidden_setting",
            f"mcp_servers: a {role} may name only the MCP servers the deployment declares, "
            f"not {named}",
        )


def check_agents(task: AgentTask, role: Role, deployment: Mapping[str, AgentSpec]) -> None:
    """Refuse sub-agents other than the deployment's definitions: a definition names the
    tools, prompt, model and MCP servers its child task runs with, so giving one's own
    widens what a task may do (an approver's right)."""
    for spec in task.agents or []:
        if deployment.get(spec.name) != spec:
            raise TaskRefusedError(
                f"agents.{spec.name}",
                403,
                "forbidden_setting",
                f"agents.{spec.name}: a {role} may call only the deployment's sub-agents as "
                "it defines them (WAYSTATION_AGENTS); only an approver may define its own",
            )


def check_namespace_tenant(task: AgentTask) -> None:
    """Refuse a memory namespace of another tenant than the task's (whoever asks: a task
    reaches only its own tenant's memory)."""
    namespace = task.memory_namespace
    if namespace is not None and tenant_of(namespace) != task.tenant:
        whose = f"tenant {task.tenant!r}" if task.tenant is not None else "no tenant"
        raise TaskRefusedError(
            "memory_namespace",
            403,
            "forbidden_namespace",
            f"memory_namespace {namespace!r} is not a namespace of the task's tenant: a task "
            f"for {whose} remembers in "
            + (f"{task.tenant}:AGENT" if task.tenant is not None else "AGENT (no ':')"),
        )


def _check_caps(task: AgentTask, settings: Settings, tools: ToolRegistry) -> None:
    check_max_steps(task.max_steps, settings)
    for setting, value, cap in (
        ("max_agent_depth", task.max_agent_depth, settings.max_agent_depth_cap),
        ("max_agent_calls", task.max_agent_calls, settings.max_agent_calls_cap),
    ):
        if value > cap:
            raise _over_cap(setting, value, cap, f"WAYSTATION_{setting.upper()}_CAP")
    for spec in callable_agents(task, tools):
        if spec.max_steps > settings.max_steps_cap:
            raise _over_cap(
                f"the sub-agent {spec.name}'s max_steps",
                spec.max_steps,
                settings.max_steps_cap,
                "WAYSTATION_MAX_STEPS_CAP",
            )


def _over_cap(setting: str, value: int, cap: int, variable: str) -> TaskRefusedError:
    return TaskRefusedError(
        setting,
        400,
        "over_cap",
        f"{setting} {value} is above this deployment's cap of {cap} ({variable})",
    )
