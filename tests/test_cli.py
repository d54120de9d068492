"""starter.py as a user runs it: a real subprocess against the dev server, offline model."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from temporalio.testing import WorkflowEnvironment

from runtime.settings import Settings
from runtime.streaming import StreamItem
from testing.workers import REPO


async def starter(
    dev_env: WorkflowEnvironment, settings: Settings, *args: str
) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYSTATION_"))}
    env.update(
        TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "starter.py"),
        *args,
        cwd=REPO,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_run_streams_json_lines_and_status_and_list_show_the_task(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, out, err = await starter(
        dev_env,
        settings,
        "run",
        "--id",
        "cli-sum",
        "--json",
        "What is 2 + 3? Write it to scratch/sum.txt",
    )
    assert code == 0, err
    items = [StreamItem.model_validate_json(line) for line in out.splitlines()]
    assert items[0].data.type == "task_started" and items[-1].data.type == "done"
    assert "2 + 3 = 5" in items[-1].data.result
    assert (settings.workspace_dir / "scratch" / "sum.txt").read_text() == "2 + 3 = 5\n"

    code, out, err = await starter(dev_env, settings, "status", "cli-sum")
    assert code == 0, err
    assert "status    done" in out and "step      3" in out

    code, out, err = await starter(dev_env, settings, "stream", "cli-sum", "--since", "3")
    assert code == 0, err
    assert "✔ done after 3 step(s)" in out

    code, out, _ = await starter(dev_env, settings, "list")
    assert any(line.startswith("cli-sum") and "done" in line for line in out.splitlines())


async def test_run_without_a_terminal_exits_waiting_then_approve_finishes(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, out, err = await starter(
        dev_env, settings, "run", "--id", "cli-shell", "Run `echo from-the-shell`"
    )
    assert code == 3, err
    assert "waits for approval of [1-call_1_0]" in err
    assert "python starter.py approve cli-shell 1-call_1_0" in err

    code, out, err = await starter(dev_env, settings, "status", "cli-shell", "--json")
    assert code == 3
    assert list(json.loads(out)["pending_approvals"]) == ["1-call_1_0"]

    code, out, err = await starter(dev_env, settings, "approve", "cli-shell", "--approver", "erin")
    assert code == 0, err
    assert "request 1-call_1_0: approve" in err
    assert "from-the-shell" in out and "✔ done" in out

    code, out, err = await starter(
        dev_env, settings, "approve", "cli-shell", "1-call_1_0", "--reject"
    )
    assert code == 1 and "already decided: approve" in err


async def test_unknown_task_is_a_clear_error(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "stream", "no-such-task")
    assert code == 1 and "no task with id 'no-such-task'" in err
    code, _, err = await starter(dev_env, settings, "approve", "no-such-task")
    assert code == 1 and "no task with id 'no-such-task'" in err


def test_run_in_a_terminal_asks_y_n_inline(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    import pty
    import select

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYSTATION_"))}
    env.update(
        TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: starter.py on a terminal
        os.chdir(REPO)
        os.execve(
            sys.executable, [sys.executable, "starter.py", "run", "Run `echo typed-yes`"], env
        )
    screen = b""

    def read_until(marker: bytes, timeout: float = 60) -> None:
        nonlocal screen
        deadline = time.monotonic() + timeout
        while marker not in screen:
            assert time.monotonic() < deadline, screen.decode(errors="replace")
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    screen += os.read(fd, 4096)
                except OSError:
                    break

    read_until(b"approve run_shell? [y/N/message to reject]")
    os.write(fd, b"y\n")
    read_until(b"done after 2 step(s)")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"typed-yes" in screen
