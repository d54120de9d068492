"""What a process loads to start: the CLI and a worker without MCP servers or a model
endpoint skip the `openai` and `mcp` packages (together ~2.5 s of CPU and ~50 MB each time
a command or a worker starts); they load where a configured endpoint or server needs them."""

from __future__ import annotations

import json
import subprocess
import sys

from waystation.testing.workers import REPO

HEAVY = ("openai", "mcp", "mcp_types")


def loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    modules = set(json.loads(out.splitlines()[-1]))
    return [name for name in HEAVY if name in modules]


def test_the_cli_starts_without_openai_or_mcp() -> None:
    assert loaded_after("from waystation.cli import starter; starter.parser()") == []


def test_a_worker_without_endpoint_or_mcp_servers_starts_without_them() -> None:
    code = (
        "from waystation import worker\n"
        "from waystation.activities.builtin_tools import builtin_registry\n"
        "from waystation.activities.llm import LlmActivities\n"
        "from waystation.activities.mcp.activities import McpActivities\n"
        "from waystation.activities.mcp.manager import McpClientManager\n"
        "mcp = McpActivities(McpClientManager({}))\n"
        "LlmActivities(builtin_registry(), None, api_key=None, base_url=None, mcp=mcp)"
    )
    assert loaded_after(code) == []


def test_a_configured_endpoint_loads_openai_when_it_is_first_called() -> None:
    built = (
        "from waystation.activities.builtin_tools import builtin_registry\n"
        "from waystation.activities.llm import LlmActivities\n"
        "LlmActivities(builtin_registry(), None, api_key='sk-x', base_url=None)"
    )
    assert loaded_after(built) == []  # a worker whose tasks never call it never loads it
    called = (
        "from waystation.activities.model_backends import ModelBackends\n"
        "ModelBackends({}, {'OPENAI_API_KEY': 'sk-x'}).route('gpt-4o')"
    )
    assert loaded_after(called) == ["openai"]
