"""No function in the package is longer than MOST_LINES (issue 38: a long function is
several steps that want names of their own)."""

from __future__ import annotations

import ast
from pathlib import Path

import waystation

PACKAGE = Path(waystation.__file__).parent
MOST_LINES = 80
AGENT_WORKFLOW_MOST_LINES = 400


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MOST_LINES:
                    where = path.relative_to(root.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    assert long_functions(PACKAGE) == []


def test_the_agent_workflow_class_stays_at_most_400_lines() -> None:
    """The loop, its handlers and queries; every part of a run is a module of its own."""
    path = PACKAGE / "workflows" / "agent.py"
    tree = ast.parse(path.read_text(), str(path))
    [agent] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentWorkflow"]
    lines = (agent.end_lineno or agent.lineno) - agent.lineno + 1
    assert lines <= AGENT_WORKFLOW_MOST_LINES, f"AgentWorkflow is {lines} lines"
