"""starter.py as a user runs it: a real subprocess against the dev server, offline model."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from waystation.client.streaming import StreamItem
from waystation.client.temporal import temporal_binary
from waystation.settings import Settings
from waystation.settings.commands import command
from waystation.testing.fake_openai import FakeOpenAI, error, text, tools
from waystation.testing.workers import REPO, WorkerProcess


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
        f"`{command('worker')}`"
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


@pytest.mark.long(minutes=0.6)
async def test_a_fork_after_a_resume_has_the_limits_the_resume_raised(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    task = "What is 2 + 3? Write it to scratch/sum.txt"  # three steps for the offline model
    code, _, err = await starter(
        dev_env, settings, "run", "--id", "cli-lim", "--max-steps", "1", task
    )
    assert code == 1 and "reached max_steps=1" in err, err
    code, out, err = await starter(dev_env, settings, "resume", "cli-lim", "--max-steps", "5")
    assert code == 0 and "✔ done after 3 step(s)" in out, out + err
    code, out, err = await starter(dev_env, settings, "events", "cli-lim")
    assert code == 0, err
    [resumed] = [e for e in map(json.loads, out.splitlines()) if e["type"] == "resumed"]
    assert resumed["max_steps"] == 5

    at = str(resumed["seq"])
    code, out, err = await starter(
        dev_env, settings, "fork", "cli-lim", "--at", at, "--new-id", "cli-lim-fork"
    )
    assert code == 0 and "✔ done after 3 step(s)" in out, out + err
    # Before the resume, max_steps=1 was in force: a fork there stops where the task did.
    code, out, err = await starter(dev_env, settings, "fork", "cli-lim", "--at", "1")
    assert code == 1 and "reached max_steps=1" in err, out + err
    # The resumed task is listed once, as its latest run (a resume resets its failed run).
    code, out, err = await starter(dev_env, settings, "list")
    assert code == 0, err
    [row] = [line.split() for line in out.splitlines() if line.split()[0] == "cli-lim"]
    assert row[1:4] == ["done", "step", "3"]


async def listed_ids(dev_env: WorkflowEnvironment, settings: Settings, *args: str) -> list[str]:
    code, out, err = await starter(dev_env, settings, "list", *args)
    assert code == 0, err
    return [line.split()[0] for line in out.splitlines()]


@pytest.mark.long(minutes=0.5)
async def test_list_shows_tasks_newest_started_first_not_by_when_they_ended(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-older", "Run `echo o`")
    assert code == 3, err
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-newer", "What is 2 + 2?")
    assert code == 0, err
    code, _, err = await starter(dev_env, settings, "approve", "cli-older")
    assert code == 0, err  # the older task ends last
    async with asyncio.timeout(60):  # until visibility shows both as done
        while not {"cli-older", "cli-newer"} <= set(
            ids := await listed_ids(dev_env, settings, "--status", "done")
        ):
            pass
    assert [i for i in ids if i in ("cli-older", "cli-newer")] == ["cli-newer", "cli-older"]


async def test_cancel_of_a_task_that_has_ended_says_so_with_its_own_exit_code(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-ended", "What is 2 + 2?")
    assert code == 0, err
    code, out, err = await starter(dev_env, settings, "cancel", "cli-ended")
    assert (code, out, err.strip()) == (
        4,
        "",
        "task cli-ended has already ended (done): there is nothing to cancel",
    )
    code, _, err = await starter(dev_env, settings, "run", "--no-wait", "--id", "cli-going", "hi")
    assert code == 0, err
    code, _, err = await starter(dev_env, settings, "cancel", "cli-going")
    assert (code, err.strip()) == (0, "cancellation of cli-going requested")


async def test_an_api_port_in_use_is_one_sentence_and_exit_code_1(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await starter(
            dev_env, settings, "api", extra_env={"WAYSTATION_API_PORT": str(port)}
        )
    assert (code, out, err.strip()) == (
        1,
        "",
        f"error: cannot serve the API on 127.0.0.1:{port}: the port is in use (another "
        f"`{command('api')}`?): stop that, or set WAYSTATION_API_PORT to a free port",
    )


@pytest.mark.long(minutes=0.6)
async def test_the_temporal_cli_signal_needs_no_worker_and_the_update_waits_for_one(
    dev_env: WorkflowEnvironment, settings: Settings, spawn_worker: Any
) -> None:
    # Two tasks wait for approval; the `run`s that hosted their worker have exited.
    for task_id in ("cli-by-signal", "cli-by-update"):
        code, _, err = await starter(dev_env, settings, "run", "--id", task_id, "Run `echo x`")
        assert code == 3, err
    approve = '{"request_id": "1-call_1_0", "decision": "approve"}'
    code, out = await temporal_cli(
        dev_env,
        "workflow",
        "signal",
        "--workflow-id",
        "cli-by-signal",
        "--name",
        "approve",
        "--input",
        '{"request_id": "1-call_1_0"}',
    )
    assert code == 0 and "Signal workflow succeeded" in out  # recorded, with no worker
    update = asyncio.create_task(
        temporal_cli(
            dev_env,
            "workflow",
            "update",
            "execute",
            "--workflow-id",
            "cli-by-update",
            "--name",
            "decide",
            "--update-id",
            "decision-1",
            "--input",
            approve,
        )
    )
    async with asyncio.timeout(60):  # until Temporal holds the Update for a worker
        while True:
            code, out = await temporal_cli(
                dev_env,
                "workflow",
                "update",
                "describe",
                "--workflow-id",
                "cli-by-update",
                "--update-id",
                "decision-1",
            )
            if code == 0:
                break
    assert "Admitted" in out and not update.done()
    await spawn_worker()
    code, out = await update
    assert code == 0 and "decision:approve" in out
    for task_id in ("cli-by-signal", "cli-by-update"):
        code, out, err = await starter(dev_env, settings, "stream", task_id, "--no-worker")
        assert code == 0 and "✔ done after 2 step(s)" in out, out + err


async def test_say_follows_up_a_task_and_shows_the_next_answer_live(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Any
) -> None:
    code, _, err = await starter(dev_env, settings, "run", "--id", "cli-talk", "What is 6 * 7?")
    assert code == 0, err
    code, out, err = await starter(dev_env, settings, "say", "cli-talk", "And 2^10?")
    assert code == 0, err
    assert "(it had answered: a new turn)" in err
    assert "calculator(expression=2^10)" in out and "2^10 = 1024" in out
    assert "6 * 7" not in out  # the live view starts at the new turn
    long = tmp_path / "message.txt"
    long.write_text("What is 1 + 1?\n" + "(please)" * 1000)
    code, out, err = await starter(dev_env, settings, "say", "cli-talk", "--file", str(long))
    assert code == 0, err
    assert "1 + 1 = 2" in out
    code, out, err = await starter(dev_env, settings, "status", "cli-talk", "--json")
    state = json.loads(out)
    assert (state["turn"], state["status"]) == (2, "done")
    # Bad input: one sentence, exit code 2, nothing sent.
    too_long = tmp_path / "too-long.txt"
    too_long.write_text("x" * 200_001)
    for args in (
        ["say", "cli-talk", "   "],
        ["say", "cli-talk"],
        ["say", "cli-talk", "--file", str(too_long)],
        ["say", "cli-talk", "--file", str(tmp_path / "missing.txt")],
    ):
        code, _, err = await starter(dev_env, settings, *args)
        assert code == 2, err
        assert err.startswith("error:") and "Traceback" not in err
    code, _, err = await starter(dev_env, settings, "say", "no-such-task", "hi")
    assert code == 1 and "no task with id 'no-such-task'" in err


async def test_answer_answers_a_question_and_run_says_how_while_it_waits(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    def reply(body: dict[str, Any]) -> Any:
        told = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not told:
            return tools(("ask_person", {"question": "Which city?", "choices": ["Oslo", "Rome"]}))
        return text(f"so: {told[-1]}")

    model = fake_openai.script(reply)
    code, _, err = await starter(
        dev_env,
        settings,
        "run",
        "--id",
        "cli-ask",
        "--model",
        model,
        "plan a trip",
        endpoint=fake_openai,
    )
    assert code == 3, err
    assert "waits for an answer to [1-call_1_0]" in err
    assert f"{command('answer', 'cli-ask', '1-call_1_0')} 'the answer'" in err
    async with asyncio.timeout(60):  # Temporal's visibility lists it a moment later
        while (
            "cli-ask"
            not in (await starter(dev_env, settings, "list", "--status", "waiting_input"))[1]
        ):
            await asyncio.sleep(0.2)
    code, out, err = await starter(dev_env, settings, "status", "cli-ask")
    assert code == 3 and "question  [1-call_1_0] Which city? [Oslo / Rome]" in out
    code, _, err = await starter(
        dev_env, settings, "answer", "cli-ask", "Paris", "--no-follow", endpoint=fake_openai
    )
    assert code == 1 and "not one of the choices" in err and "'Oslo', 'Rome'" in err
    code, out, err = await starter(
        dev_env,
        settings,
        "answer",
        "cli-ask",
        "1-call_1_0",
        "rome",
        "--answerer",
        "ann",
        endpoint=fake_openai,
    )
    assert code == 0, err
    assert "question 1-call_1_0: answered 'Rome'" in err
    assert "so: ann answered: Rome" in out


async def test_an_output_schema_that_is_not_one_is_refused_before_anything_starts(
    dev_env: WorkflowEnvironment, settings: Settings, tmp_path: Any
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "thing"}')
    code, _, err = await starter(dev_env, settings, "run", "--output-schema", str(bad), "x")
    assert code == 2 and "not a valid JSON Schema at type" in err and "Traceback" not in err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    code, _, err = await starter(dev_env, settings, "run", "--output-schema", str(broken), "x")
    assert code == 2 and "is not JSON" in err
    good = tmp_path / "good.json"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    good.write_text(json.dumps(schema))
    code, out, err = await starter(
        dev_env, settings, "run", "--id", "typed-cli", "--output-schema", str(good), "6 * 7?"
    )
    assert code == 0, err
    code, out, err = await starter(dev_env, settings, "status", "typed-cli")
    assert "output    n  42" in out, out


async def test_a_pending_call_is_shown_whole_and_inert_by_run_and_status(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    # Shown raw, `\r` and erase-line leave `ls -la` on the screen; the long tail would be cut.
    command_line = "touch /tmp/pwned #\r\x1b[2Kls -la; echo " + "x" * 120 + " && rm -rf ~/work"
    model = fake_openai.script(
        [tools(("run_shell", {"command": command_line}), content="ok\x1b]52;c;cHduZWQ=\x07")]
    )
    run = ("run", "--id", "cli-hidden", "--model", model, "tidy up")
    code, out, err = await starter(dev_env, settings, *run, endpoint=fake_openai)
    assert code == 3, err
    code, status, err = await starter(dev_env, settings, "status", "cli-hidden")
    assert code == 3, err
    for shown in (out, status, err):
        assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown, repr(shown)
    for shown in (out, status):
        assert "#\\r\\u001b[2Kls -la" in shown and "rm -rf ~/work" in shown, shown
    assert "ok\\x1b]52;c;cHduZWQ=\\x07" in out
    code, as_json, _ = await starter(dev_env, settings, "status", "cli-hidden", "--json")
    assert code == 3 and "\x1b" not in as_json and "\r" not in as_json
    [pending] = json.loads(as_json)["pending_approvals"].values()
    assert pending["arguments"]["command"] == command_line  # the same JSON, escaped
