"""The live view's wording: decisions in the past tense, one line per failed attempt, and the
"text above is void" note only when text of an earlier attempt was shown."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from waystation.activities.attempt_step import failures_name_step
from waystation.cli.render import LiveView, render_state, visible_json
from waystation.client.streaming import StreamItem
from waystation.worker.log import AttemptFailure, OneLineWorkerLog, attempt_failure
from waystation.workflows.events import (
    AgentState,
    ApprovalRequested,
    ApprovalResolved,
    Done,
    PendingApproval,
    QuotaGranted,
    TaskStarted,
    Thought,
    WaitingQuota,
)
from waystation.workflows.models import AgentTask, ModelSettings
from waystation.workflows.options import RETRY_SAFE_TOOL
from waystation.workflows.stream import LlmAttemptStarted, TokenDelta

AT = datetime(2026, 1, 1, tzinfo=UTC)


def view_of(*data: Any) -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    view = LiveView(out, color=False)
    for offset, item in enumerate(data):
        topic = "tokens" if isinstance(item, TokenDelta | LlmAttemptStarted) else "events"
        view.show(StreamItem(offset=offset, topic=topic, data=item))
    return view, out


def started(max_attempts: int = 8) -> TaskStarted:
    task = AgentTask(task="t", model=ModelSettings(name="m", max_attempts=max_attempts))
    return TaskStarted(seq=0, step=0, at=AT, task_id="task-1", task=task)


@pytest.mark.parametrize(
    ("decision", "shown"),
    [("approve", "approved"), ("reject", "rejected"), ("timeout", "timed out")],
)
def test_decisions_are_told_in_the_past_tense(decision: str, shown: str) -> None:
    resolved = ApprovalResolved(
        seq=3, step=1, at=AT, request_id="1-call_1_0", decision=decision, approver="erin"
    )
    _, out = view_of(resolved)
    assert out.getvalue().startswith(f"  {shown} by erin [1-call_1_0]")
    assert "rejectd" not in out.getvalue() and "timeoutd" not in out.getvalue()


def test_a_retry_after_shown_text_says_the_text_is_void() -> None:
    _, out = view_of(
        started(),
        TokenDelta(step=1, attempt=1, index=0, text="half an ans"),
        LlmAttemptStarted(step=1, attempt=2),
    )
    assert "↻ step 1: attempt 2 of 8 (the text above is void)" in out.getvalue()


def test_a_retry_after_no_text_says_nothing_of_void_text() -> None:
    _, out = view_of(
        started(),
        TokenDelta(step=1, attempt=1, index=0, text="step one's text"),
        Thought(seq=1, step=1, at=AT, content="step one's text"),
        LlmAttemptStarted(step=2, attempt=2),  # step 2's first attempt showed nothing
    )
    assert out.getvalue().splitlines()[-1] == "↻ step 2: attempt 2 of 8"


def test_a_failed_attempt_is_one_line_and_its_retry_adds_none() -> None:
    view, out = view_of(started(max_attempts=5))
    failure = AttemptFailure(
        workflow_id="task-1",
        activity="call_llm",
        attempt=1,
        max_attempts=5,
        reason="model endpoint timed out",
        retry_in=timedelta(seconds=2),
    )
    assert view.attempt_failed(failure)
    view.show(StreamItem(offset=1, topic="tokens", data=LlmAttemptStarted(step=1, attempt=2)))
    assert out.getvalue().splitlines()[2:] == [
        "✗ step 1: model attempt 1 of 5 failed: model endpoint timed out; next try in 2 s"
    ]


def _logged_failure(
    err: BaseException,
    max_attempts: int,
    *,
    activity_type: str = "call_llm",
    attempt: int = 1,
    policy: RetryPolicy | None = None,
) -> logging.LogRecord:
    """The record the SDK's worker logs for a failed attempt of `call_llm` (by default)."""
    record = logging.LogRecord(
        "temporalio.activity",
        logging.WARNING,
        __file__,
        0,
        "Completing activity as failed ({'activity_id': '5'})",
        None,
        (type(err), err, err.__traceback__),
    )
    record.activity_info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        activity_type=activity_type,
        attempt=attempt,
        workflow_id="task-1",
        retry_policy=policy
        or RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=max_attempts),
    )
    return record


def test_a_failed_attempt_names_its_own_step_while_the_stream_lags_behind() -> None:
    """The hosted worker's log reaches the view before the stream: step 3's failure must not
    be shown as the step the view last saw."""
    view, out = view_of(started(max_attempts=5))
    with pytest.raises(ApplicationError) as raised, failures_name_step(3):
        raise ApplicationError("model endpoint answered 500: the GPU caught fire")
    failure = attempt_failure(_logged_failure(raised.value, max_attempts=5))
    assert failure is not None and failure.step == 3
    assert view.attempt_failed(failure)
    view.show(StreamItem(offset=1, topic="tokens", data=LlmAttemptStarted(step=3, attempt=2)))
    assert out.getvalue().splitlines()[2:] == [
        "✗ step 3: model attempt 1 of 5 failed: model endpoint answered 500: the GPU caught "
        "fire; next try in 1 s"
    ]


def test_a_cancelled_attempt_names_its_step_too() -> None:
    """A heartbeat timeout cancels the attempt, and the SDK logs the cancellation as its
    failure: that line names the step as well."""
    with pytest.raises(asyncio.CancelledError) as raised, failures_name_step(4):
        raise asyncio.CancelledError()
    failure = attempt_failure(_logged_failure(raised.value, max_attempts=5))
    assert failure is not None and failure.step == 4


def test_the_last_failed_attempt_says_no_more_tries() -> None:
    failure = AttemptFailure("task-1", "call_llm", 8, 8, "model endpoint answered 500: x", None)
    assert (
        failure.describe() == "attempt 8 of 8 failed: model endpoint answered 500: x; no more tries"
    )


def test_a_late_attempt_of_a_retry_safe_tool_call_says_when_it_is_tried_again() -> None:
    """Attempt 60 of 100: its uncapped backoff (2^59 s) does not fit a timedelta."""
    unreachable = ApplicationError("the database cannot be reached")
    record = _logged_failure(
        unreachable, 100, activity_type="run_tool", attempt=60, policy=RETRY_SAFE_TOOL
    )
    failure = attempt_failure(record)
    assert failure is not None and failure.retry_in == RETRY_SAFE_TOOL.maximum_interval
    assert failure.describe() == (
        "attempt 60 of 100 failed: the database cannot be reached; next try in 10 s"
    )


# A command that shows as `ls -la` on a terminal (`\r` and erase-line hide the start), a
# clipboard write (OSC 52), a title change, and text that reorders itself (RLO).
HIDDEN = "touch /tmp/pwned #\r\x1b[2Kls -la"
CLIPBOARD = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
REORDERED = "safe\u202eexe.txt"
LONG = "echo " + "x" * 150 + " && rm -rf ~/project-that-matters"


def pending_request(arguments: dict[str, Any]) -> ApprovalRequested:
    return ApprovalRequested(
        seq=2,
        step=1,
        at=AT,
        request_id="1-call\x1b[8m_1_0",
        call_id="call_1",
        tool="run_shell",
        arguments=arguments,
        reason="run_shell needs approval",
    )


def our_own_escapes_only(shown: str) -> None:
    """Nothing a terminal acts on but the view's own colours."""
    bare = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    assert not [c for c in bare if ord(c) < 0x20 and c not in "\n\t"], repr(bare)
    assert not [c for c in bare if 0x7F <= ord(c) <= 0x9F or c == "\u202e"], repr(bare)


@pytest.mark.parametrize("color", [False, True])
def test_control_characters_from_a_task_are_shown_as_escapes_and_do_nothing(color: bool) -> None:
    out = io.StringIO()
    view = LiveView(out, color=color)
    task = AgentTask(task=f"check {CLIPBOARD}the files", model=ModelSettings(name="m"))
    items: list[Any] = [
        TaskStarted(seq=0, step=0, at=AT, task_id="task\x1b]0;owned\x07-1", task=task),
        TokenDelta(step=1, attempt=1, index=0, text=f"let me look {CLIPBOARD}"),
        Thought(seq=1, step=2, at=AT, content=f"first line\nsecond {REORDERED} — café ✓ 日本"),
        pending_request({"command": HIDDEN}),
        Done(seq=3, step=2, at=AT, result=f"all\rdone {CLIPBOARD}"),
    ]
    for offset, item in enumerate(items):
        topic = "tokens" if isinstance(item, TokenDelta) else "events"
        view.show(StreamItem(offset=offset, topic=topic, data=item))
    shown = out.getvalue()
    our_own_escapes_only(shown)
    assert "#\\r\\x1b[2Kls -la" in shown  # the whole command, escapes visible
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in shown
    assert "task\\x1b]0;owned\\x07-1" in shown and "1-call\\x1b[8m_1_0" in shown
    assert "safe\\u202eexe.txt" in shown and "café ✓ 日本" in shown
    assert "all\\rdone" in shown
    # A newline of the model's text stays, and what follows it is indented: it cannot pass
    # for a line of the view's own.
    assert "first line\n    second" in shown


def test_status_shows_control_characters_as_escapes() -> None:
    state = AgentState(status="waiting_approval", step=1, result=f"so{CLIPBOARD}")
    state.pending_approvals["r"] = PendingApproval(
        request_id="r",
        call_id="call_1",
        tool="run_shell",
        arguments={"command": HIDDEN},
        reason="run_shell needs approval\nstatus    done",
        requested_at=AT,
        step=1,
    )
    shown = render_state(state, "task\r-1")
    our_own_escapes_only(shown)
    assert "task\\r-1" in shown and "#\\r\\x1b[2Kls -la" in shown
    assert "\nstatus    done" not in shown  # the reason's newline goes on indented


def test_an_approval_shows_every_argument_whole_before_anyone_decides() -> None:
    arguments = {"command": LONG, "timeout_seconds": 30, "cwd": "scratch"}
    _, out = view_of(started(), pending_request(arguments))
    shown = out.getvalue()
    assert "rm -rf ~/project-that-matters" in shown, shown
    # The summary line stays short; the whole call follows it, each argument as it is.
    summary = next(line for line in shown.splitlines() if "approval needed" in line)
    assert "rm -rf" not in summary and "…" in summary
    assert json.dumps(LONG) in shown and '"timeout_seconds": 30' in shown

    state = AgentState(status="waiting_approval", step=1)
    state.pending_approvals["r"] = PendingApproval(
        request_id="r",
        call_id="call_1",
        tool="run_shell",
        arguments=arguments,
        reason="needs approval",
        requested_at=AT,
        step=1,
    )
    assert json.dumps(LONG) in render_state(state, "task-1")


def test_a_short_call_is_one_line() -> None:
    _, out = view_of(started(), pending_request({"command": "ls -la"}))
    assert "in full" not in out.getvalue()
    assert "run_shell(command=ls -la)" in out.getvalue()


def test_json_output_stays_the_same_json_with_nothing_a_terminal_acts_on() -> None:
    value = {"command": HIDDEN, "c1": "a\x9b31mb\x7f", "rlo": REORDERED, "ok": "café\n日本"}
    for indent in (None, 2):
        shown = visible_json(json.dumps(value, ensure_ascii=False, indent=indent))
        our_own_escapes_only(shown)
        assert json.loads(shown) == value


def test_a_wait_for_the_quota_is_one_line_and_its_turn_another() -> None:
    waiting = WaitingQuota(
        seq=1,
        step=1,
        at=AT,
        quota="openai",
        limit="requests_per_minute",
        expected_seconds=12.4,
        attempt=1,
    )
    paused = waiting.model_copy(update={"seq": 2, "limit": "paused", "expected_seconds": 0.2})
    granted = QuotaGranted(seq=3, step=1, at=AT, quota="openai", waited_seconds=12.75)
    _, out = view_of(started(), waiting, paused, granted)
    assert out.getvalue().splitlines()[2:] == [
        "… step 1 waits for its turn under the quota of openai (requests per minute), about 12 s",
        "… step 1 waits for its turn under the quota of openai (paused by the provider), about 1 s",
        "  the call has its turn under openai after 12.8 s",
    ]


@pytest.mark.parametrize(
    "said",
    [
        "this client has no encryption keys, but a payload of task 'plain' is encrypted with "
        "key 'k1': the worker and the client disagree about encryption; set the workers' "
        "WAYSTATION_ENCRYPTION_KEYS here too",
        "payload encrypted with unknown key 'k9'",
    ],
)
def test_an_undecryptable_payload_is_left_to_the_command_that_needed_it(said: str) -> None:
    shown = io.StringIO()
    handler = OneLineWorkerLog(shown)
    failed = RuntimeError(said)
    record = logging.LogRecord(
        "temporalio.worker._workflow",
        logging.WARNING,
        __file__,
        1,
        "Failed handling activation on workflow with run ID r1",
        (),
        (RuntimeError, failed, None),
    )
    handler.emit(record)
    assert shown.getvalue() == ""  # the command says it once, in its own line
    record.exc_info = (RuntimeError, RuntimeError("something else broke"), None)
    handler.emit(record)
    assert shown.getvalue().startswith("worker: Failed handling activation")
