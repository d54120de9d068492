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
list: `WAYSTATION_TOOLS=activities.builtin_tools,mytools ws worker`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from activities.builtin_tools import builtin_registry
from activities.function_tools import tool
from activities.storage.errors import StorageError
from activities.tool_modules import load_tools
from activities.tools import Tool, ToolContext, ToolDefinitionError, ToolError, ToolRegistry
from runtime.agent_runtime import AgentRuntime, TaskHandle, TaskSummary
from runtime.settings import Settings
from runtime.streaming import StreamItem
from runtime.task_errors import (
    DecisionError,
    MessageRefusedError,
    NoWorkerError,
    TaskCancelledError,
    TaskError,
    TaskFailedError,
    TaskNotFoundError,
    UnknownToolsError,
    UnreadableTaskError,
)
from runtime.task_rights import TaskRefusedError
from runtime.task_tree import TaskTree, TreeNode
from runtime.temporal import TemporalUnavailableError, connect
from runtime.tree_stream import TreeItem
from worker import AgentWorker, build_worker
from workflows.events import AgentEvent, AgentState
from workflows.models import (
    AgentSpec as Agent,
)
from workflows.models import (
    AgentTask,
    Answer,
    AnswerOutcome,
    ApprovalSettings,
    Decision,
    DecisionOutcome,
    Message,
    MessageReceipt,
    ModelSettings,
    QuestionSettings,
)
from workflows.run import AgentOutcome

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
