"""The pure core without Temporal: what the loop does next, approvals, and a bounded state."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from waystation.vocabulary import FailureKind
from waystation.workflows import errors, requests
from waystation.workflows.approval import (
    APPROVALS,
    EARLY_DECISIONS_KEPT,
    RecordedDecision,
    decision_problem,
    request_events,
)
from waystation.workflows.calls import Run, verdict
from waystation.workflows.conversation import MAX_MESSAGES, compaction_range, total_tokens
from waystation.workflows.events import (
    Action,
    AgentEvent,
    AgentState,
    ApprovalResolved,
    ContextCompacted,
    ErrorEvent,
    Observation,
    QuestionAnswered,
    Resumed,
    TaskStarted,
    Thought,
    apply,
    draft,
    fold,
)
from waystation.workflows.messages import QueuedMessage
from waystation.workflows.models import (
    AgentTask,
    Answer,
    ApprovalSettings,
    Decision,
    Message,
    ToolCall,
    ToolResult,
    Usage,
)
from waystation.workflows.plan import (
    AddMessage,
    Announce,
    AskPeople,
    AwaitPeople,
    CallModel,
    Compact,
    Fail,
    HandOver,
    RunCalls,
    RunProgress,
    next_move,
)
from waystation.workflows.questions import (
    EARLY_ANSWERS_KEPT,
    QUESTIONS,
    RecordedAnswer,
    answer_problem,
)
from waystation.workflows.run import AgentRun, RunCarry

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TASK = AgentTask(task="do it", max_steps=50)
LIMIT = 100_000
FRESH = RunProgress(first_step=0)


class Log:
    """Builds a log and its fold, stamping events as the workflow does."""

    def __init__(self, task: AgentTask = TASK) -> None:
        self.task = task
        self.events: list[AgentEvent] = []
        self.state = AgentState()
        self.add(draft(TaskStarted, 0, task_id="t", task=task))

    def add(self, event: AgentEvent, at: datetime = T0) -> AgentState:
        event = event.model_copy(update={"seq": self.state.last_seq + 1, "at": at})
        self.events.append(event)
        self.state = apply(self.state, event)
        return self.state

    def thought(self, step: int, *calls: ToolCall, content: str = "") -> None:
        usage = Usage(input_tokens=100, output_tokens=10)
        self.add(draft(Thought, step, content=content, tool_calls=list(calls), usage=usage))

    def observe(self, step: int, call: ToolCall, output: str) -> None:
        self.add(draft(Observation, step, call_id=call.call_id, tool=call.tool, output=output))

    def move(self, task: AgentTask | None = None, **kw: Any) -> object:
        task = task or self.task
        return next_move(self.state, task, limit=kw.pop("limit", LIMIT), progress=FRESH, **kw)


def call(
    call_id: str, tool: str = "run_shell", needs_approval: bool = False, **args: Any
) -> ToolCall:
    arguments = args or {"command": "echo hi"}
    return ToolCall(
        call_id=call_id,
        tool=tool,
        raw_arguments=json.dumps(arguments),
        arguments=arguments,
        needs_approval=needs_approval,
        approval_reason="this tool always needs approval" if needs_approval else None,
    )


def run_step(log: Log, step: int, *calls: ToolCall, output: str = "ok") -> None:
    log.thought(step, *calls)
    for c in calls:
        log.add(draft(Action, step, call_id=c.call_id, tool=c.tool, arguments=c.arguments))
    for c in calls:
        log.observe(step, c, output)


def test_a_fresh_task_calls_the_model_then_walks_the_step() -> None:
    log = Log()
    assert log.move() == CallModel(1)
    shell = call("c1", needs_approval=True)
    calc = call("c2", tool="calculator", expression="1+1")
    log.thought(1, shell, calc, content="two calls")
    assert log.move() == Announce(1, [shell, calc])
    for c in (shell, calc):
        log.add(draft(Action, 1, call_id=c.call_id, tool=c.tool))
    assert log.move() == AskPeople("approval", 1, [shell])
    for event in request_events(1, [shell], log.state):
        log.add(event, at=T0 + timedelta(minutes=5))
    waiting = log.move()
    assert isinstance(waiting, AwaitPeople) and waiting.waiting == {"approval": ["1-c1"]}
    assert waiting.deadline == T0 + timedelta(minutes=5, seconds=TASK.approval.timeout_seconds)
    assert log.state.status == "waiting_approval"
    log.add(draft(ApprovalResolved, 1, request_id="1-c1", decision="approve"))
    assert log.move() == RunCalls(1, [shell, calc])
    log.observe(1, calc, "2")
    assert log.move() == RunCalls(1, [shell])  # only what is not observed yet
    log.observe(1, shell, "hi")
    assert log.state.open_step is None
    assert log.move() == CallModel(2)


def test_limits_end_the_task_and_a_waiting_message_goes_first() -> None:
    log = Log()
    run_step(log, 1, call("c1"))
    assert log.move(AgentTask(task="x", max_steps=1)) == Fail(
        FailureKind.MAX_STEPS,
        next_move(log.state, AgentTask(task="x", max_steps=1), limit=LIMIT, progress=FRESH).reason,  # type: ignore[union-attr]
    )
    budget = log.move(AgentTask(task="x", token_budget=1))
    assert isinstance(budget, Fail) and budget.kind == "token_budget"
    waiting = QueuedMessage(message=Message(content="try again"), via="resume")
    assert log.move(messages=[waiting]) == AddMessage(waiting)


def test_an_identical_call_in_consecutive_steps_is_noted_then_stops_the_task() -> None:
    log = Log()
    same = call("c1", tool="write_file", path="a.txt", content="x")
    run_step(log, 1, same, output="wrote 1 bytes to a.txt")
    task = AgentTask(task="x", max_repeated_calls=2)
    for step in (2, 3):
        again = same.model_copy(update={"call_id": f"c{step}"})
        note = verdict("t", step, again, log.state)
        assert isinstance(note, ToolResult) and note.is_error  # not run: a note answers it
        run_step(log, step, again, output=note.output)
        assert log.state.repeated_steps == step - 1
    again = same.model_copy(update={"call_id": "c4"})
    log.thought(4, again)
    repeating = log.move(task)
    # Its own name: `stuck` is a task whose workflow task keeps failing.
    assert isinstance(repeating, Fail) and repeating.kind == FailureKind.REPEATED_CALLS
    # Resumed, the repeat is answered without running it, and counting starts afresh.
    log.add(draft(Resumed, 4))
    assert log.state.repeated_steps == 0
    log.add(draft(Action, 4, call_id="c4", tool="write_file"))
    assert log.move(task) == RunCalls(4, [again])
    answer = verdict("t", 4, again, log.state)
    assert isinstance(answer, ToolResult) and answer.is_error
    # It quotes the first run's result, not the notes that answered the repeats.
    assert answer.output.startswith("You made this exact write_file call at step 1 and again")
    assert "at step 3" in answer.output and "began: wrote 1 bytes to a.txt\n" in answer.output
    assert answer.output.count("You made") == 1
    assert len(log.state.recent_calls) == 1


def test_a_model_alternating_between_calls_is_caught_too() -> None:
    log = Log()
    a = call("a1", tool="calculator", expression="1+1")
    b = call("b1", tool="calculator", expression="2+2")
    for step, c in enumerate([a, b, a, b], start=1):
        run_step(log, step, c.model_copy(update={"call_id": f"c{step}"}))
    assert log.state.repeated_steps == 2  # steps 3 and 4 repeated steps 1 and 2


def test_a_repeated_call_that_needs_approval_asks_nobody() -> None:
    log = Log()
    shell = call("c1", needs_approval=True)
    log.thought(1, shell)
    log.add(draft(Action, 1, call_id="c1", tool="run_shell"))
    log.add(request_events(1, [shell], log.state)[0])
    log.add(draft(ApprovalResolved, 1, request_id="1-c1", decision="approve"))
    log.observe(1, shell, "hi")
    again = shell.model_copy(update={"call_id": "c2"})
    log.thought(2, again)
    log.add(draft(Action, 2, call_id="c2", tool="run_shell"))
    assert log.move() == RunCalls(2, [again])


def test_a_request_identical_to_a_rejected_call_says_so() -> None:
    log = Log()
    shell = call("c1", needs_approval=True, command="rm -rf /")
    log.thought(1, shell)
    log.add(request_events(1, [shell], log.state)[0])
    log.add(draft(ApprovalResolved, 1, request_id="1-c1", decision="reject", message="no"))
    log.observe(1, shell, "rejected")
    other = call("c2", needs_approval=True, command="ls")
    log.observe(1, other, "")  # not of the open step: only the conversation changes
    run_step(log, 2, call("c3", tool="calculator", expression="1"))
    again = shell.model_copy(update={"call_id": "c9"})
    log.thought(3, again)
    [requested] = request_events(3, [again], log.state)
    assert requested.reason is not None
    assert (
        "identical call was rejected at step 1" in requested.reason and "'no'" in requested.reason
    )


def test_an_approval_timeout_fails_the_task_when_asked_then_resume_goes_on() -> None:
    task = AgentTask(task="x", approval=ApprovalSettings(timeout_seconds=60, on_timeout="fail"))
    log = Log(task)
    shell = call("c1", needs_approval=True)
    log.thought(1, shell)
    log.add(draft(Action, 1, call_id="c1", tool="run_shell"))
    log.add(request_events(1, [shell], log.state)[0])
    late = log.state.pending_approvals["1-c1"].requested_at + timedelta(seconds=60)
    for event in requests.timeout_events(APPROVALS, log.state, ["1-c1"], late, task):
        log.add(event)
    failed = log.move(task)
    assert isinstance(failed, Fail) and failed.kind == "approval_timeout"
    log.add(draft(Resumed, 1))
    assert log.move(task) == RunCalls(1, [shell])
    answer = verdict("t", 1, shell, log.state)
    assert isinstance(answer, ToolResult) and "in time" in answer.output


def test_decisions_are_checked_in_one_place() -> None:
    log = Log()
    shell = call("c1", needs_approval=True)
    log.thought(1, shell)
    log.add(request_events(1, [shell], log.state)[0])
    state = log.state
    assert decision_problem(state, Decision(request_id="1-c1")) is None
    unknown = decision_problem(state, Decision(request_id="9-x"))
    assert unknown is not None and unknown.kind == errors.UNKNOWN_REQUEST
    recorded = [RecordedDecision(decision=Decision(request_id="1-c1"), via="update")]
    assert decision_problem(state, Decision(request_id="1-c1"), recorded) is None  # a repeat
    conflict = decision_problem(state, Decision(request_id="1-c1", decision="reject"), recorded)
    assert conflict is not None and conflict.kind == errors.DECISION_CONFLICT
    log.add(draft(ApprovalResolved, 1, request_id="1-c1", decision="approve", approver="ann"))
    later = decision_problem(log.state, Decision(request_id="1-c1", decision="reject"))
    assert later is not None and "by ann" in later.message
    assert decision_problem(AgentState(status="done"), Decision(request_id="1-c1")) is not None


def absorb(state: AgentState, entry: RecordedDecision, early: int) -> Any:
    return requests.absorb(APPROVALS, state, entry, early)


def test_recorded_decisions_become_events_or_wait_for_their_request() -> None:
    log = Log()
    shell = call("c1", needs_approval=True)
    log.thought(1, shell)
    early = RecordedDecision(decision=Decision(request_id="1-c1"), via="signal")
    assert absorb(log.state, early, 0) == requests.KEEP  # asked before the request: kept
    refused = absorb(log.state, early, EARLY_DECISIONS_KEPT)
    assert isinstance(refused, ErrorEvent) and refused.kind == "unknown_request"
    log.add(request_events(1, [shell], log.state)[0])
    resolved = absorb(log.state, early, 0)
    assert isinstance(resolved, ApprovalResolved) and resolved.via == "signal"
    log.add(resolved)
    duplicate = absorb(log.state, early, 0)
    assert isinstance(duplicate, ErrorEvent) and duplicate.kind == "duplicate_decision"
    # A waiting client's identical repeat is dropped without a note.
    repeat = early.model_copy(update={"decision": Decision(request_id="1-c1", decision_id="d1")})
    assert absorb(log.state, repeat, 0) == requests.DROP


def test_recorded_answers_follow_the_same_rule_as_decisions() -> None:
    """One absorb rule for every kind of request: an answer is kept until its question is
    asked, resolves it, is refused when it names no choice, and a waiting client's repeat
    is dropped (DROP, as for a decision)."""
    log = Log()
    ask = call("c1", tool="ask_person", question="Which?", choices=["red", "blue"])
    log.thought(1, ask)
    early = RecordedAnswer(answer=Answer(request_id="1-c1", answer="Red"), via="signal")
    assert requests.absorb(QUESTIONS, log.state, early, 0) == requests.KEEP
    refused = requests.absorb(QUESTIONS, log.state, early, EARLY_ANSWERS_KEPT)
    assert isinstance(refused, ErrorEvent) and refused.kind == "refused_answer"
    for event in QUESTIONS.request_events(1, [ask], log.state):
        log.add(event)
    wrong = RecordedAnswer(answer=Answer(request_id="1-c1", answer="green"), via="signal")
    refused = requests.absorb(QUESTIONS, log.state, wrong, 0)
    assert isinstance(refused, ErrorEvent) and refused.kind == "refused_answer"
    resolved = requests.absorb(QUESTIONS, log.state, early, 0)
    assert isinstance(resolved, QuestionAnswered) and resolved.answer == "red"
    log.add(resolved)
    again = requests.absorb(QUESTIONS, log.state, early, 0)
    assert isinstance(again, ErrorEvent) and again.kind == "duplicate_answer"
    client = Answer(request_id="1-c1", answer="blue", answer_id="a1")
    repeat = RecordedAnswer(answer=client, via="update")
    assert requests.absorb(QUESTIONS, log.state, repeat, 0) == requests.DROP
    assert answer_problem(log.state, client) is None  # it gets the first answer back


def test_edited_arguments_run_and_a_note_follows_the_output() -> None:
    log = Log()
    shell = call("c1", needs_approval=True)
    log.thought(1, shell)
    log.add(request_events(1, [shell], log.state)[0])
    edited = {"command": "echo safe"}
    log.add(
        draft(
            ApprovalResolved,
            1,
            request_id="1-c1",
            decision="approve",
            arguments=edited,
            message="careful",
        )
    )
    run = verdict("task-1", 1, shell, log.state)
    assert isinstance(run, Run)
    assert run.request.arguments == edited and run.request.idempotency_key == "task-1/1/c1"
    assert "careful" in run.note


def test_a_long_conversation_is_compacted_and_the_state_stays_small() -> None:
    """Thousands of steps with 2 KB messages: what a run hands the next stays bounded."""
    log = Log(AgentTask(task="long", max_steps=100_000))
    limit = 20_000
    for step in range(1, 3001):
        move = log.move(limit=limit)
        if isinstance(move, Compact):
            log.add(
                draft(ContextCompacted, step, summary="s" * 400, start=move.start, end=move.end)
            )
        calc = call(f"c{step}", tool="calculator", expression=f"{step}+1")
        run_step(log, step, calc, output="x" * 2048)
        assert total_tokens(log.state.conversation) < 2 * limit
        assert len(log.state.conversation) <= MAX_MESSAGES + 4
    carry = AgentRun(task=TASK, carry=RunCarry(state=log.state))
    assert len(carry.model_dump_json()) < 48_000
    assert log.state.step == 3000 and len(log.state.step_usage) <= 20


def test_many_small_messages_are_compacted_by_count() -> None:
    log = Log(AgentTask(task="chatty", max_steps=100_000))
    for step in range(1, 400):
        move = log.move()
        if isinstance(move, Compact):
            log.add(draft(ContextCompacted, step, summary="s", start=move.start, end=move.end))
        run_step(log, step, call(f"c{step}", tool="calculator", expression=str(step)), output="1")
        assert len(log.state.conversation) <= MAX_MESSAGES + 2
    assert total_tokens(log.state.conversation) < LIMIT
    assert compaction_range(log.state.conversation, LIMIT) is None


def test_a_run_hands_over_only_after_progress_and_never_with_a_big_open_step() -> None:
    log = Log()
    run_step(log, 1, call("c1"))
    big = RunProgress(first_step=0, history_bytes=5_000_000)
    assert next_move(log.state, TASK, limit=LIMIT, progress=big) == HandOver()
    assert next_move(
        log.state, TASK, limit=LIMIT, progress=RunProgress(first_step=1, history_bytes=5_000_000)
    ) == CallModel(2)
    every = AgentTask(task="x", continue_as_new_after_steps=1)
    assert next_move(log.state, every, limit=LIMIT, progress=FRESH) == HandOver()
    huge = call("c2", tool="write_file", path="a.txt", content="z" * 50_000)
    log.thought(2, huge)
    assert isinstance(next_move(log.state, TASK, limit=LIMIT, progress=big), Announce)


def test_folding_all_events_gives_the_state_the_workflow_carries() -> None:
    log = Log()
    run_step(log, 1, call("c1", tool="calculator", expression="2"))
    assert fold(log.events) == log.state
