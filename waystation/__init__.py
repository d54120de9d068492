"""waystation's public API: everything a user needs to define tools, serve them and run
tasks, importable from here (the modules behind it may move; these names stay).

    import asyncio

    from waystation import AgentRuntime, Settings, ToolRegistry, build_worker, builtin_registry
    from waystation import connect, tool


    @tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b


    async def main() -> None:
        settings = Settings()
        client = await connect(settings)
        tools = ToolRegistry([*builtin_registry().allowed(None), add])
        # A worker serves the tools; the runtime checks a task's tools against the same ones.
        async with build_worker(client, settings, registry=tools):
            runtime = AgentRuntime(client, settings, tools=tools)
            handle = await runtime.run("What is 2 + 3?")
            print((await handle.result()).result)


    asyncio.run(main())

Workers, the command line and the API load the deployment's tools from the modules that
WAYSTATION_TOOLS names (default: the built-in ones), so tools defined in a module need no
list: `WAYSTATION_TOOLS=waystation.activities.builtin_tools,mytools ws worker`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each is imported on first use
    from waystation.activities.builtin_tools import builtin_registry as builtin_registry
    from waystation.activities.function_tools import tool as tool
    from waystation.activities.storage.errors import StorageError as StorageError
    from waystation.activities.tool_modules import load_tools as load_tools
    from waystation.activities.tools import Tool as Tool
    from waystation.activities.tools import ToolContext as ToolContext
    from waystation.activities.tools import ToolDefinitionError as ToolDefinitionError
    from waystation.activities.tools import ToolError as ToolError
    from waystation.activities.tools import ToolRegistry as ToolRegistry
    from waystation.client.agent_runtime import AgentRuntime as AgentRuntime
    from waystation.client.agent_runtime import TaskHandle as TaskHandle
    from waystation.client.agent_runtime import TaskSummary as TaskSummary
    from waystation.client.schedules import ScheduleChange as ScheduleChange
    from waystation.client.schedules import ScheduleError as ScheduleError
    from waystation.client.schedules import ScheduleInfo as ScheduleInfo
    from waystation.client.schedules import ScheduleSpec as ScheduleSpec
    from waystation.client.streaming import StreamItem as StreamItem
    from waystation.client.task_errors import DecisionError as DecisionError
    from waystation.client.task_errors import MessageRefusedError as MessageRefusedError
    from waystation.client.task_errors import NoWorkerError as NoWorkerError
    from waystation.client.task_errors import TaskCancelledError as TaskCancelledError
    from waystation.client.task_errors import TaskError as TaskError
    from waystation.client.task_errors import TaskFailedError as TaskFailedError
    from waystation.client.task_errors import TaskNotFoundError as TaskNotFoundError
    from waystation.client.task_errors import UnknownToolsError as UnknownToolsError
    from waystation.client.task_errors import UnreadableTaskError as UnreadableTaskError
    from waystation.client.task_rights import TaskRefusedError as TaskRefusedError
    from waystation.client.task_tree import TaskTree as TaskTree
    from waystation.client.task_tree import TreeNode as TreeNode
    from waystation.client.temporal import TemporalUnavailableError as TemporalUnavailableError
    from waystation.client.temporal import connect as connect
    from waystation.client.tree_stream import TreeItem as TreeItem
    from waystation.settings import Settings as Settings
    from waystation.worker import AgentWorker as AgentWorker
    from waystation.worker import build_worker as build_worker
    from waystation.workflows.events import AgentEvent as AgentEvent
    from waystation.workflows.events import AgentState as AgentState
    from waystation.workflows.models import AgentSpec as Agent
    from waystation.workflows.models import AgentTask as AgentTask
    from waystation.workflows.models import Answer as Answer
    from waystation.workflows.models import AnswerOutcome as AnswerOutcome
    from waystation.workflows.models import ApprovalSettings as ApprovalSettings
    from waystation.workflows.models import Decision as Decision
    from waystation.workflows.models import DecisionOutcome as DecisionOutcome
    from waystation.workflows.models import Message as Message
    from waystation.workflows.models import MessageReceipt as MessageReceipt
    from waystation.workflows.models import ModelSettings as ModelSettings
    from waystation.workflows.models import QuestionSettings as QuestionSettings
    from waystation.workflows.run import AgentOutcome as AgentOutcome

# Each public name and the module it lives in. Imported lazily: `ws --help` and a
# workflow sandbox importing waystation.workflows pay for none of the rest.
_HOMES: dict[str, tuple[str, str]] = {
    "Agent": ("waystation.workflows.models", "AgentSpec"),
    "AgentEvent": ("waystation.workflows.events", "AgentEvent"),
    "AgentOutcome": ("waystation.workflows.run", "AgentOutcome"),
    "AgentRuntime": ("waystation.client.agent_runtime", "AgentRuntime"),
    "AgentState": ("waystation.workflows.events", "AgentState"),
    "AgentTask": ("waystation.workflows.models", "AgentTask"),
    "AgentWorker": ("waystation.worker", "AgentWorker"),
    "Answer": ("waystation.workflows.models", "Answer"),
    "AnswerOutcome": ("waystation.workflows.models", "AnswerOutcome"),
    "ApprovalSettings": ("waystation.workflows.models", "ApprovalSettings"),
    "Decision": ("waystation.workflows.models", "Decision"),
    "DecisionError": ("waystation.client.task_errors", "DecisionError"),
    "DecisionOutcome": ("waystation.workflows.models", "DecisionOutcome"),
    "Message": ("waystation.workflows.models", "Message"),
    "MessageReceipt": ("waystation.workflows.models", "MessageReceipt"),
    "MessageRefusedError": ("waystation.client.task_errors", "MessageRefusedError"),
    "ModelSettings": ("waystation.workflows.models", "ModelSettings"),
    "NoWorkerError": ("waystation.client.task_errors", "NoWorkerError"),
    "QuestionSettings": ("waystation.workflows.models", "QuestionSettings"),
    "ScheduleChange": ("waystation.client.schedules", "ScheduleChange"),
    "ScheduleError": ("waystation.client.schedules", "ScheduleError"),
    "ScheduleInfo": ("waystation.client.schedules", "ScheduleInfo"),
    "ScheduleSpec": ("waystation.client.schedules", "ScheduleSpec"),
    "Settings": ("waystation.settings", "Settings"),
    "StorageError": ("waystation.activities.storage.errors", "StorageError"),
    "StreamItem": ("waystation.client.streaming", "StreamItem"),
    "TaskCancelledError": ("waystation.client.task_errors", "TaskCancelledError"),
    "TaskError": ("waystation.client.task_errors", "TaskError"),
    "TaskFailedError": ("waystation.client.task_errors", "TaskFailedError"),
    "TaskHandle": ("waystation.client.agent_runtime", "TaskHandle"),
    "TaskNotFoundError": ("waystation.client.task_errors", "TaskNotFoundError"),
    "TaskRefusedError": ("waystation.client.task_rights", "TaskRefusedError"),
    "TaskSummary": ("waystation.client.agent_runtime", "TaskSummary"),
    "TaskTree": ("waystation.client.task_tree", "TaskTree"),
    "TemporalUnavailableError": ("waystation.client.temporal", "TemporalUnavailableError"),
    "Tool": ("waystation.activities.tools", "Tool"),
    "ToolContext": ("waystation.activities.tools", "ToolContext"),
    "ToolDefinitionError": ("waystation.activities.tools", "ToolDefinitionError"),
    "ToolError": ("waystation.activities.tools", "ToolError"),
    "ToolRegistry": ("waystation.activities.tools", "ToolRegistry"),
    "TreeItem": ("waystation.client.tree_stream", "TreeItem"),
    "TreeNode": ("waystation.client.task_tree", "TreeNode"),
    "UnknownToolsError": ("waystation.client.task_errors", "UnknownToolsError"),
    "UnreadableTaskError": ("waystation.client.task_errors", "UnreadableTaskError"),
    "build_worker": ("waystation.worker", "build_worker"),
    "builtin_registry": ("waystation.activities.builtin_tools", "builtin_registry"),
    "connect": ("waystation.client.temporal", "connect"),
    "load_tools": ("waystation.activities.tool_modules", "load_tools"),
    "tool": ("waystation.activities.function_tools", "tool"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'waystation' has no attribute {name!r}")
    value = getattr(importlib.import_module(home[0]), home[1])
    globals()[name] = value  # once found, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


try:
    __version__ = version("waystation")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0"

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentOutcome",
    "AgentRuntime",
    "AgentState",
    "AgentTask",
    "AgentWorker",
    "Answer",
    "AnswerOutcome",
    "ApprovalSettings",
    "Decision",
    "DecisionError",
    "DecisionOutcome",
    "Message",
    "MessageReceipt",
    "MessageRefusedError",
    "ModelSettings",
    "NoWorkerError",
    "QuestionSettings",
    "ScheduleChange",
    "ScheduleError",
    "ScheduleInfo",
    "ScheduleSpec",
    "Settings",
    "StorageError",
    "StreamItem",
    "TaskCancelledError",
    "TaskError",
    "TaskFailedError",
    "TaskHandle",
    "TaskNotFoundError",
    "TaskRefusedError",
    "TaskSummary",
    "TaskTree",
    "TemporalUnavailableError",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolRegistry",
    "TreeItem",
    "TreeNode",
    "UnknownToolsError",
    "UnreadableTaskError",
    "__version__",
    "build_worker",
    "builtin_registry",
    "connect",
    "load_tools",
    "tool",
]
