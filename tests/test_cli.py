"""starter.py as a user runs it: a real subprocess against the dev server, offline model."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from runtime.commands import command
from runtime.settings import Settings
from runtime.streaming import StreamItem
from runtime.temporal import temporal_binary
from testing.fake_openai import FakeOpenAI, error, text
from testing.workers import REPO, WorkerProcess


async def starter(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    *args: str,
    endpoint: FakeOpenAI | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """`python starter.py ARGS` on the test's task queue: the offline model, or the fake
    OpenAI server as the model endpoint when `endpoint` is given; `extra_env` on top (e.g.
    encryption keys)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYSTATION_"))}
    env.update(
        TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    if endpoint is not None:
        env.update(OPENAI_BASE_URL=endpoint.url, OPENAI_API_KEY="sk-test")
    env.update(extra_env or {})
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


async def temporal_cli(dev_env: WorkflowEnvironment, *args: str) -> tuple[int, str]:
    """The Temporal CLI (`temporal ARGS`) against the dev server: exit code, output."""
    process = await asyncio.create_subprocess_exec(
        temporal_binary(),
        *args,
        "--address",
        dev_env.client.service_client.config.target_host,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


@pytest.mark.long(minutes=0.4)
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


@pytest.mark.long(minutes=0.45)
async def test_run_without_a_terminal_exits_waiting_then_approve_finishes(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, out, err = await starter(
        dev_env, settings, "run", "--id", "cli-shell", "Run `echo from-the-shell`"
    )
    assert code == 3, err
    assert "waits for approval of [1-call_1_0]" in err
    assert f"  {command('approve', 'cli-shell', '1-call_1_0')}\n" in err

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


async def test_a_rejection_is_told_in_the_past_tense(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-no", "Run `echo nope`")
    assert code == 3, err
    code, out, err = await starter(
        dev_env, settings, "approve", "cli-no", "--reject", "--approver", "erin", "--message", "no"
    )
    assert code == 0, err
    assert "rejected by erin [1-call_1_0]: no" in out and "rejectd" not in out


async def test_a_failed_model_attempt_is_one_line_and_verbose_shows_the_traceback(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([error(500, "the GPU caught fire"), text("all good now")])
    code, out, err = await starter(
        dev_env, settings, "run", "--model", model, "say hi", endpoint=fake_openai
    )
    assert code == 0, err
    failed = [line for line in out.splitlines() if "failed" in line]
    assert failed == [
        "✗ step 1: model attempt 1 of 8 failed: model endpoint answered 500: the GPU caught "
        "fire; next try in 1 s"
    ]
    assert "Traceback" not in out + err and "void" not in out and "↻" not in out
    assert "✔ done after 1 step(s): all good now" in out

    model = fake_openai.script([error(500, "the GPU caught fire"), text("all good now")])
    code, out, err = await starter(
        dev_env, settings, "run", "--verbose", "--model", model, "say hi", endpoint=fake_openai
    )
    assert code == 0, err
    assert "Completing activity as failed" in err and "Traceback" in err


async def test_model_flags_reach_the_endpoint(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("cool and short")])
    code, _, err = await starter(
        dev_env,
        settings,
        "run",
        "--model",
        model,
        "--temperature",
        "0.3",
        "--max-tokens",
        "50",
        "--tool-choice",
        "none",
        "say hi",
        endpoint=fake_openai,
    )
    assert code == 0, err
    (request,) = fake_openai.requests[model]
    assert (request["temperature"], request["max_tokens"], request["tool_choice"]) == (
        0.3,
        50,
        "none",
    )
    code, _, err = await starter(dev_env, settings, "run", "--tool-choice", "no such;", "hi")
    assert code == 2 and err.strip().startswith("error: tool_choice: String should match pattern")
    assert "Traceback" not in err


async def test_no_wait_and_status_say_when_no_worker_polls_the_task_queue(
    dev_env: WorkflowEnvironment, settings: Settings, spawn_worker: Any
) -> None:
    code, out, err = await starter(
        dev_env, settings, "run", "--no-wait", "--id", "cli-alone", "What is 2 + 2?"
    )
    assert code == 0 and out.strip() == "cli-alone"
    note = f"no worker polls task queue '{settings.task_queue}'"
    assert note in err and f"start one with: {command('worker')}" in err

    code, out, err = await starter(dev_env, settings, "status", "cli-alone")
    assert code == 0 and "status    running" in out and "step      0" in out
    assert note in err and f"start one with: {command('worker')}" in err

    worker: WorkerProcess = await (await spawn_worker()).ready()
    code, out, err = await starter(
        dev_env, settings, "run", "--no-wait", "--id", "cli-served", "What is 3 + 3?"
    )
    assert code == 0 and note not in err
    assert worker.process.poll() is None


@pytest.mark.long(minutes=0.45)
async def test_a_worker_that_a_finished_command_hosted_does_not_count_as_serving(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    # `run` hosts a worker (workflow and activity tasks) until it exits waiting for approval;
    # Temporal lists that worker's polls for a minute more, though nothing serves the queue.
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-gone", "Run `echo g`")
    assert code == 3, err
    approve = '{"request_id": "1-call_1_0"}'
    code, out = await temporal_cli(
        dev_env,
        "workflow",
        "signal",
        "--workflow-id",
        "cli-gone",
        "--name",
        "approve",
        "--input",
        approve,
    )
    assert code == 0, out
    # `status` hosts a query-only worker, which applies the approval: the tool call waits.
    code, out, err = await starter(dev_env, settings, "status", "cli-gone")
    assert code == 0 and "status    running" in out, out + err
    assert f"no worker polls task queue '{settings.task_queue}' for workflow tasks" in err, err
    code, out, err = await starter(
        dev_env, settings, "events", "cli-gone", "--no-worker", "--timeout", "1"
    )
    assert (code, out) == (1, "")
    assert err.strip() == (
        "error: no worker answered the events query within 1 s: no worker polls task queue "
        f"'{settings.task_queue}': the task waits until one does; start one with "
        "`python worker.py` (or `python starter.py worker`)"
    )


async def test_events_that_no_worker_answers_are_one_sentence(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--no-wait", "--id", "cli-q", "hi")
    assert code == 0, err
    code, out, err = await starter(
        dev_env, settings, "events", "cli-q", "--no-worker", "--timeout", "1"
    )
    assert code == 1 and out == ""
    assert err.strip() == (
        "error: no worker answered the events query within 1 s: no worker polls task queue "
        f"'{settings.task_queue}': the task waits until one does; start one with "
        f"`{command('worker')}`"
    )


@pytest.mark.long(minutes=0.55)
async def test_status_and_approve_that_no_worker_answers_are_one_sentence(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--no-wait", "--id", "cli-idle", "hi")
    assert code == 0, err
    no_worker = (
        f"no worker polls task queue '{settings.task_queue}': the task waits until one does; "
        f"start one with `{command('worker')}`"
    )
    code, out, err = await starter(
        dev_env, settings, "status", "cli-idle", "--no-worker", "--timeout", "1"
    )
    assert (code, out) == (1, "")
    assert err.strip() == f"error: no worker answered the state query within 1 s: {no_worker}"
    code, out, err = await starter(dev_env, settings, "approve", "cli-idle", "--no-worker")
    assert (code, out) == (1, "")
    assert err.strip() == (
        f"error: no worker answered the stream's head query within 10 s: {no_worker}"
    )
    code, out, err = await starter(
        dev_env, settings, "approve", "cli-idle", "--no-worker", "--no-follow"
    )
    assert (code, out) == (1, "")
    assert err.strip() == f"error: no worker answered the state query within 10 s: {no_worker}"


async def test_a_blank_task_and_unknown_tools_are_one_line_errors(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, out, err = await starter(dev_env, settings, "run", "--no-wait", " \t ")
    assert (code, out) == (2, "")
    assert err.strip() == ("error: task: Value error, must contain something other than whitespace")
    code, out, err = await starter(
        dev_env, settings, "run", "--no-wait", "--tools", "calculator,teleport,x__y", "hi"
    )
    assert (code, out) == (2, "")
    [line] = err.strip().splitlines()
    assert line.startswith("error: unknown tool(s) in the task's tools: 'teleport', 'x__y' ")
    assert "run_shell" in line  # it names the tools there are


async def test_the_readmes_temporal_cli_approval_commands_do_what_it_says(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    approvals = (REPO / "docs" / "approvals.md").read_text()
    assert "temporal workflow update execute --workflow-id via-update --name decide" in approvals
    cli = (REPO / "docs" / "cli.md").read_text()
    assert "temporal workflow show --workflow-id ID --detailed" in cli
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-tctl", "Run `echo t`")
    assert code == 3, err

    typo = '{"request_id": "1-call_1_9"}'
    code, out = await temporal_cli(
        dev_env,
        "workflow",
        "signal",
        "--workflow-id",
        "cli-tctl",
        "--name",
        "approve",
        "--input",
        typo,
    )
    assert code == 0 and "Signal workflow succeeded" in out
    # The Update needs a worker to answer: `stream` hosts one while it follows the task,
    # which ends once the approved call has run.
    async with asyncio.TaskGroup() as group:
        group.create_task(starter(dev_env, settings, "stream", "cli-tctl", "--since", "0"))
        code, out = await temporal_cli(
            dev_env,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            "cli-tctl",
            "--name",
            "decide",
            "--input",
            '{"request_id": "1-call_1_9", "decision": "approve"}',
        )
        assert code != 0
        assert "unknown approval request 1-call_1_9; pending: 1-call_1_0" in out
        assert "retryable: false" in out  # a refusal: sending it again cannot help
        code, out = await temporal_cli(
            dev_env,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            "cli-tctl",
            "--name",
            "decide",
            "--input",
            '{"request_id": "1-call_1_0", "decision": "approve"}',
        )
        assert code == 0 and "decision:approve" in out
