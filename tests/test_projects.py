"""Two projects beside each other on one Temporal server never run each other's tasks: each
directory is a project (WAYSTATION_PROJECT defaults to its name) with its own task queue,
data directory and workspace, so the tour's `ws worker` and a new project's are strangers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from waystation.testing.settings import USER_ENV_PREFIXES

WS = str(Path(sys.executable).parent / "ws")
MATH = json.dumps(
    [{"name": "math", "description": "Works out arithmetic.", "tools": ["calculator"]}]
)


def project_environment(env: WorkflowEnvironment, **more: str) -> dict[str, str]:
    """A user's shell in a project directory: only Temporal's address is set."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(USER_ENV_PREFIXES)}
    shell.update(
        TEMPORAL_ADDRESS=env.client.service_client.config.target_host,
        WAYSTATION_EMBEDDED_SERVER="false",
        **more,
    )
    return shell


@asynccontextmanager
async def ws_worker(directory: Path, shell: dict[str, str]) -> AsyncIterator[int]:
    """`ws worker` started in `directory`, once it says it polls; its pid."""
    process = await asyncio.create_subprocess_exec(
        WS,
        "worker",
        cwd=directory,
        env=shell,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    said: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not any("worker polling" in line for line in said):
                line = (await process.stdout.readline()).decode()
                assert line, f"the worker ended: {''.join(said)}"
                said.append(line)
        assert f"'waystation-{directory.name}'" in "".join(said), said
        yield process.pid
    finally:
        process.terminate()
        await process.wait()


async def ws(directory: Path, shell: dict[str, str], *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        WS,
        *args,
        cwd=directory,
        env=shell,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def workers_that_ran(env: WorkflowEnvironment, task_id: str) -> set[str]:
    """The identities of the workers that took the task's model and tool calls."""
    history = await env.client.get_workflow_handle(task_id).fetch_history()
    return {
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    }


async def test_two_projects_on_one_server_each_run_their_own_tasks(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    tour, shop = tmp_path / "tour", tmp_path / "shop"
    tour.mkdir()
    shop.mkdir()
    tour_shell = project_environment(dev_env)
    shop_shell = project_environment(dev_env, WAYSTATION_AGENTS=MATH)
    async with ws_worker(tour, tour_shell) as tour_pid, ws_worker(shop, shop_shell) as shop_pid:
        code, said = await ws(tour, tour_shell, "status")
        assert code == 0 and "task queue  waystation-tour" in said, said
        started = await asyncio.gather(
            *(
                ws(where, shell, "run", "--no-worker", "--id", f"{where.name}-{i}", text)
                for i in range(3)
                for where, shell, text in (
                    (tour, tour_shell, "What is 2 + 3?"),
                    (shop, shop_shell, "Have the math agent work out (12 + 30) * 7"),
                )
            )
        )
        for code, said in started:
            assert code == 0, said
        for i in range(3):
            assert {i.split("@")[0] for i in await workers_that_ran(dev_env, f"tour-{i}")} == {
                str(tour_pid)
            }
            assert {i.split("@")[0] for i in await workers_that_ran(dev_env, f"shop-{i}")} == {
                str(shop_pid)
            }
        code, said = await ws(shop, shop_shell, "status", "shop-0")
        assert "294" in said, said
    # Each project keeps its data in its own directory.
    assert (tour / ".waystation").is_dir() and (shop / ".waystation").is_dir()
