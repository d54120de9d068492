"""How `pytest -n N` hands tests to its processes: one at a time, in collection order, and a
module whose tests share module-scoped set-up as one unit.

pytest-xdist's default (`--dist load`) hands each process a run of consecutive tests at the
start: the long tests, collected first, all went to the first process (509 s of tests there,
355-374 s on the others). Handed out one at a time instead, the tests of a module with a
module-scoped fixture would be spread over every process and the set-up built again on each
move (the browser module's dev server and API: 7 times in one run, 128 CPU-seconds instead
of 60). `xdist_group` would keep them together, but pytest-xdist 3.8 marks a group by
rewriting `item._nodeid`, which pytest 9 no longer reads.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

# Modules whose tests share a module-scoped fixture (a dev server and API, MCP servers, a
# probe client): each runs whole, in one process.
SHARED_SETUP_MODULES = frozenset(
    {
        "tests/browser/test_console.py",
        "tests/browser/test_console_looks.py",
        "tests/browser/test_console_conversation.py",
        "tests/browser/test_console_questions.py",
        "tests/browser/test_console_composed.py",
        "tests/browser/test_console_roles.py",
        "tests/browser/test_console_memory.py",
        "tests/browser/test_console_schedules.py",
        "tests/test_mcp_tools.py",
        "tests/sdk/test_sdk_query_then_update.py",
        "tests/test_real_models.py",
        "tests/test_deploy_cli.py",
    }
)


class OneTestAtATime(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """Each process holds at most three units (a test, or a whole module of
    SHARED_SETUP_MODULES) and gets the next one in collection order as one ends."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        # Keep the collection order (long tests first, tests/conftest.py), not biggest unit first.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SHARED_SETUP_MODULES else nodeid
