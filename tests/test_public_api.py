"""The public import root: `waystation` names everything a user writes against, and only
that; its `__all__` is pinned, so a name cannot leave (or arrive) unnoticed."""

from __future__ import annotations

import subprocess
import sys

import waystation
from waystation.activities.function_tools import tool
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.workers import REPO
from waystation.worker import build_worker

PUBLIC = [
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


def test_the_public_names_are_pinned_and_are_the_real_objects() -> None:
    assert waystation.__all__ == PUBLIC
    for name in PUBLIC:
        assert hasattr(waystation, name), name
    assert (waystation.AgentRuntime, waystation.tool, waystation.build_worker) == (
        AgentRuntime,
        tool,
        build_worker,
    )
    assert waystation.__version__ == "0.1.0"


def test_a_star_import_gives_exactly_the_public_names() -> None:
    probe = "from waystation import *\nprint(sorted(k for k in dir() if not k.startswith('__')))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(sorted(n for n in PUBLIC if not n.startswith("__")))
