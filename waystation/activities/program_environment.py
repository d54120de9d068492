"""The environment of a program a tool starts: none of the worker's secrets.

A shell command gets what stdio MCP servers get from the MCP SDK (PATH, HOME, USER, SHELL,
TERM, LOGNAME: its list of variables safe to inherit), the locale, the workspace, and only
the variables the deployment passes on by name (WAYSTATION_SHELL_ENV). The worker's own
environment holds the model API key, the database URL and the rest: a command that runs
`env` must not print them into the task's events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

LOCALE = ("LANG", "LC_ALL")
WORKSPACE_VARIABLE = "WAYSTATION_WORKSPACE"


def program_environment(
    workspace: Path, passed: Iterable[str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The minimal environment, the workspace as WAYSTATION_WORKSPACE, and each variable of
    `passed` that `environ` sets."""
    # Imported here: the CLI and the API load the built-in tools too, without the MCP SDK.
    from mcp.client.stdio import get_default_environment

    environment = get_default_environment()
    for name in (*LOCALE, *passed):
        if name in environ:
            environment[name] = environ[name]
    environment[WORKSPACE_VARIABLE] = str(workspace)
    return environment
