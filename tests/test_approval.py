"""Human approval: pause without a process, decide once, resume anywhere."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import QueryWorkflowInput, SignalWorkflowInput, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, pending_requests, wait_for_state
from waystation.client.agent_runtime import (
    QUERY_TIMEOUT,
    AgentRuntime,
    DecisionError,
    TaskFailedError,
)
from waystation.client.temporal import temporal_binary
from waystation.settings import Settings
from waystation.testing.client_hooks import ClientHooks
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows import errors
from waystation.workflows.approval import EARLY_DECISIONS_KEPT
from waystation.workflows.models import ApprovalSettings, Decision, DecisionOutcome


def side_effects(settings: Settings, name: str = "effects.txt") -> list[str]:
    path = settings.workspace_dir / name
    return path.read_text().splitlines() if path.exists() else []


def shell(line: str, name: str = "effects.txt") -> tuple[str, dict[str, Any]]:
    return ("run_shell", {"command": f"echo {line} >> {name}"})


# --- long waits and timeouts: the time-skipping server --------------------------------------


async def test_waits_three_days_then_completes_when_approved(
    ts_env: WorkflowEnvironment,
    ts_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = fake_openai.script([tools(shell("approved")), text("ran it")])
    handle = await ts_runtime.run(agent_task(model))
    [request] = await pending_requests(handle)
    await ts_env.sleep(timedelta(days=3))
    assert (await handle.state()).status == "waiting_approval"
    await ts_env.client.get_workflow_handle(handle.id).signal(
        "approve", Decision(request_id=request, approver="bob")
    )
    assert (await handle.result()).result == "ran it"
    events = await handle.events()
    requested = of_type(events, "approval_requested")[0]
    resolved = of_type(events, "approval_resolved")[0]
    assert resolved.at - requested.at >= timedelta(days=3)
    assert resolved.approver == "bob" and resolved.via == "signal"
    assert side_effects(settings) == ["approved"]


async def test_approval_timeout_rejects_at_the_configured_time(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    seen: list[str] = []

    def model_reply(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            seen.append(last["content"])
            return text("nobody answered, so I stopped")
        return tools(shell("never"))

    model = fake_openai.script(model_reply)
    handle = await ts_runtime.run(
        agent_task(model, approval=ApprovalSettings(timeout_seconds=3600, on_timeout="reject"))
    )
    assert (await handle.result()).result == "nobody answered, so I stopped"
    events = await handle.events()
    requested = of_type(events, "approval_requested")[0]
    resolved = of_type(events, "approval_resolved")[0]
    assert resolved.decision == "timeout" and resolved.via == "timeout"
    assert timedelta(hours=1) <= resolved.at - requested.at < timedelta(hours=1, minutes=1)
    assert "not run" in seen[0]
    assert side_effects(settings) == []


async def test_approval_timeout_can_fail_the_task(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(shell("never"))])
    handle = await ts_runtime.run(
        agent_task(model, approval=ApprovalSettings(timeout_seconds=600, on_timeout="fail"))
    )
    with pytest.raises(TaskFailedError) as failure:
        await handle.result()
    assert failure.value.kind == "approval_timeout"
    types = [e.type for e in await handle.events()]
    assert types[-2:] == ["approval_resolved", "failed"]


# --- decisions: the dev server (Updates) ---------------------------------------------------


async def test_twenty_concurrent_identical_decisions_run_the_tool_once(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    model = fake_openai.script([tools(shell("once")), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    [request] = await pending_requests(handle)
    outcomes = await asyncio.gather(*(handle.approve(request, approver="alice") for _ in range(20)))
    assert {(o.request_id, o.decision, o.approver) for o in outcomes} == {
        (request, "approve", "alice")
    }
    assert sum(not o.duplicate for o in outcomes) == 1
    await handle.result()
    assert len(of_type(await handle.events(), "approval_resolved")) == 1
    assert side_effects(settings) == ["once"]


async def test_a_fork_past_a_decision_asks_again(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    """A decision belongs to the task it was made in: a fork at the approval, before the
    call ran, asks for a decision of its own before anything runs."""
    model = fake_openai.script([tools(shell("approved")), text("ran it"), text("ran it again")])
    original = await dev_runtime.run(agent_task(model))
    [request] = await pending_requests(original)
    await original.approve(request, approver="alice")
    await original.result()
    [resolved] = of_type(await original.events(), "approval_resolved")
    fork = await dev_runtime.fork(original.id, resolved.seq)
    state = await wait_for_state(fork, lambda s: s.status in ("waiting_approval", "done"))
    assert state.status == "waiting_approval"
    assert list(state.pending_approvals) == [request]
    assert side_effects(settings) == ["approved"]
    await fork.approve(request, approver="carol")
    assert (await fork.result()).result == "ran it again"
    assert side_effects(settings) == ["approved", "approved"]
    forked = of_type(await fork.events(), "approval_resolved")
    assert [(e.seq > resolved.seq, e.approver) for e in forked] == [
        (False, "alice"),
        (True, "carol"),
    ]


async def test_a_sent_decision_waits_for_its_outcome_longer_than_a_status_query(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, spawn_worker: Any
) -> None:
    """The worker stops answering right after the decision is sent, for longer than a status
    query's bound: the decision is not reported as "no worker"; its outcome comes back."""
    worker = await spawn_worker()
    paused = asyncio.Event()

    async def pause_the_worker(_: SignalWorkflowInput) -> None:
        # A worker too loaded to answer, made exact: no query is answered until SIGCONT.
        os.kill(worker.pid, signal.SIGSTOP)
        paused.set()

    client = ClientHooks(after_signal=pause_the_worker).client(dev_env.client)
    handle = await AgentRuntime(client, settings).run(
        agent_task(fake_openai.script([tools(shell("late")), text("done")]))
    )
    [request] = await pending_requests(handle)
    deciding = asyncio.create_task(handle.approve(request, approver="alice"))
    try:
        await asyncio.wait_for(paused.wait(), 60)
        await asyncio.sleep(QUERY_TIMEOUT.total_seconds() + 1)  # past a status query's bound
        assert not deciding.done()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    outcome = await deciding
    assert (outcome.decision, outcome.approver, outcome.duplicate) == ("approve", "alice", False)
    await handle.result()
    assert side_effects(settings) == ["late"]


async def test_a_lost_query_does_not_lose_the_decisions_outcome(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    """The first query after the decision goes unanswered: it is sent again after a status
    query's bound, and the outcome comes back within the decision's 30 s."""
    signalled = asyncio.Event()
    lost = asyncio.Event()
    queries_after_loss = 0

    async def note_the_signal(_: SignalWorkflowInput) -> None:
        signalled.set()

    async def lose_the_first_query_after_it(_: QueryWorkflowInput) -> None:
        # As a query the SDK dropped with the run it evicted: never delivered, never answered.
        nonlocal queries_after_loss
        if signalled.is_set() and not lost.is_set():
            lost.set()
            await asyncio.Event().wait()  # only its caller giving up ends it
        elif lost.is_set():
            queries_after_loss += 1

    hooks = ClientHooks(after_signal=note_the_signal, before_query=lose_the_first_query_after_it)
    handle = await AgentRuntime(hooks.client(dev_env.client), settings).run(
        agent_task(fake_openai.script([tools(shell("kept")), text("done")]))
    )
    [request] = await pending_requests(handle)
    outcome = await handle.approve(request, approver="alice")
    assert lost.is_set() and queries_after_loss >= 1
    assert (outcome.decision, outcome.approver, outcome.duplicate) == ("approve", "alice", False)
    await handle.result()
    assert side_effects(settings) == ["kept"]


async def test_conflicting_and_unknown_decisions_are_refused(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(shell("a"), shell("b")), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    first, second = await pending_requests(handle, count=2)
    workflow = dev_env.client.get_workflow_handle(handle.id)
    before = len((await workflow.fetch_history()).events)
    with pytest.raises(DecisionError, match="unknown approval request") as unknown:
        await handle.approve("9-nope")
    assert unknown.value.kind == errors.UNKNOWN_REQUEST
    # A rejected Update leaves no trace in history.
    assert len((await workflow.fetch_history()).events) == before

    await handle.approve(first)
    with pytest.raises(DecisionError, match="already decided: approve") as conflict:
        await handle.approve(first, reject=True)
    assert conflict.value.kind == errors.DECISION_CONFLICT
    await handle.approve(second, reject=True, message="not b")
    await handle.result()
    with pytest.raises(DecisionError) as late:
        await handle.approve("7-other")
    assert late.value.kind == errors.TASK_NOT_WAITING


async def test_rejection_message_reaches_the_model_and_edited_arguments_run(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    def model_reply(body: dict[str, Any]) -> Reply:
        tool_messages = [m for m in body["messages"] if m["role"] == "tool"]
        if not tool_messages:
            return tools(shell("rm-everything"))
        if len(tool_messages) == 1:
            assert "rejected" in tool_messages[0]["content"]
            assert "too dangerous" in tool_messages[0]["content"]
            return tools(shell("gentle"))
        return text(f"second try said: {tool_messages[1]['content']}")

    model = fake_openai.script(model_reply)
    handle = await dev_runtime.run(agent_task(model))
    [first] = await pending_requests(handle)
    await handle.approve(first, reject=True, message="too dangerous", approver="carol")
    state = await wait_for_state(
        handle, lambda s: len(s.pending_approvals) == 1 and first not in s.pending_approvals
    )
    [second] = list(state.pending_approvals)
    await handle.approve(second, arguments={"command": "echo edited >> effects.txt"})
    outcome = await handle.result()
    assert "exit code 0" in outcome.result
    assert side_effects(settings) == ["edited"]
    resolved = of_type(await handle.events(), "approval_resolved")
    assert [(r.decision, r.approver, r.message) for r in resolved] == [
        ("reject", "carol", "too dangerous"),
        ("approve", None, None),
    ]
    assert resolved[1].arguments == {"command": "echo edited >> effects.txt"}


async def temporal_cli_signal(address: str, task_id: str, name: str, payload: object) -> str:
    process = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "signal",
        "--address",
        address,
        "--workflow-id",
        task_id,
        "--name",
        name,
        "--input",
        json.dumps(payload),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()
    return output.decode()


async def test_signal_from_the_temporal_cli(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = fake_openai.script(
        [tools(shell("yes"), shell("no")), tools(shell("again")), text("done")]
    )
    handle = await dev_runtime.run(agent_task(model))
    first, second = await pending_requests(handle, count=2)
    address = dev_env.client.service_client.config.target_host
    await temporal_cli_signal(
        address, handle.id, "approve", {"request_id": first, "approver": "cli-user"}
    )
    await temporal_cli_signal(
        address, handle.id, "reject", {"request_id": second, "message": "not this one"}
    )
    # The next step waits for a person too: the task provably still runs when a duplicate
    # of the first decision arrives.
    state = await wait_for_state(handle, lambda s: "2-call_2_0" in s.pending_approvals)
    assert state.status == "waiting_approval"
    await temporal_cli_signal(address, handle.id, "approve", {"request_id": first})
    await wait_for_state(handle, lambda s: any("duplicate" in e for e in s.errors))
    await temporal_cli_signal(address, handle.id, "approve", {"request_id": "2-call_2_0"})
    await handle.result()
    events = await handle.events()
    resolved = of_type(events, "approval_resolved")
    assert [(r.request_id, r.decision, r.via) for r in resolved] == [
        (first, "approve", "signal"),
        (second, "reject", "signal"),
        ("2-call_2_0", "approve", "signal"),
    ]
    assert resolved[0].approver == "cli-user"
    notes = of_type(events, "error")
    assert len(notes) == 1 and notes[0].kind == "duplicate_decision"
    assert side_effects(settings) == ["yes", "again"]


async def test_a_decision_that_arrives_before_the_request_is_kept(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    # The model takes a while to answer; the approver is faster than the step.
    model = fake_openai.script([tools(shell("early"), chunk_delay=0.05), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    await dev_env.client.get_workflow_handle(handle.id).signal(
        "approve", Decision(request_id="1-call_1_0", approver="fast")
    )
    await handle.result()
    resolved = of_type(await handle.events(), "approval_resolved")
    assert [(r.request_id, r.approver) for r in resolved] == [("1-call_1_0", "fast")]
    assert side_effects(settings) == ["early"]


async def test_a_flood_of_decisions_for_requests_never_made_is_bounded(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = fake_openai.script([tools(shell("real")), text("done")])
    handle = await dev_runtime.run(agent_task(model))
    [request] = await pending_requests(handle)
    workflow = dev_env.client.get_workflow_handle(handle.id)
    for i in range(EARLY_DECISIONS_KEPT + 3):
        await workflow.signal("reject", Decision(request_id=f"99-bogus_{i}"))
    await handle.approve(request)
    await handle.result()
    ignored = [e for e in of_type(await handle.events(), "error") if e.kind == "unknown_request"]
    assert [e.message.split()[5] for e in ignored] == [
        f"99-bogus_{i}:" for i in range(EARLY_DECISIONS_KEPT, EARLY_DECISIONS_KEPT + 3)
    ]
    assert side_effects(settings) == ["real"]


async def test_no_worker_while_waiting_then_a_new_worker_process_finishes(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI, spawn_worker: Any
) -> None:
    model = fake_openai.script([tools(shell("by-signal"), shell("by-update")), text("all done")])
    runtime = AgentRuntime(dev_env.client, settings)
    async with running_worker(dev_env.client, settings):
        handle = await runtime.run(agent_task(model))
        by_signal, by_update = await pending_requests(handle, count=2)
    # Every worker is gone. The Signal is accepted at once; the Update waits for a worker.
    workflow = dev_env.client.get_workflow_handle(handle.id)
    await workflow.signal("approve", Decision(request_id=by_signal))
    update = asyncio.create_task(
        workflow.start_update(
            "decide",
            Decision(request_id=by_update, approver="dave"),
            wait_for_stage=WorkflowUpdateStage.COMPLETED,
            result_type=DecisionOutcome,
        )
    )
    await asyncio.sleep(1.0)  # a lower bound on the wait, not a race: it only gets longer
    assert not update.done()
    await spawn_worker()
    update_handle = await asyncio.wait_for(update, 60)
    assert (await update_handle.result()).decision == "approve"
    assert (await asyncio.wait_for(handle.result(), 60)).result == "all done"
    assert sorted(side_effects(settings)) == ["by-signal", "by-update"]


async def test_continue_as_new_between_two_approvals_keeps_decisions(
    dev_env: WorkflowEnvironment,
    dev_runtime: AgentRuntime,
    fake_openai: FakeOpenAI,
    settings: Settings,
) -> None:
    model = fake_openai.script([tools(shell("first")), tools(shell("second")), text("both ran")])
    handle = await dev_runtime.run(agent_task(model, continue_as_new_after_steps=1))
    first_run = (await dev_env.client.get_workflow_handle(handle.id).describe()).run_id
    [first] = await pending_requests(handle)
    await handle.approve(first)
    state = await wait_for_state(
        handle, lambda s: bool(s.pending_approvals) and first not in s.pending_approvals
    )
    second_run = (await dev_env.client.get_workflow_handle(handle.id).describe()).run_id
    assert second_run != first_run
    repeat = await handle.approve(first)
    assert repeat.duplicate and repeat.decision == "approve"
    [second] = list(state.pending_approvals)
    await handle.approve(second)
    assert (await handle.result()).result == "both ran"
    events = await handle.events()
    assert [e.seq for e in events] == list(range(len(events)))
    assert len(of_type(events, "approval_resolved")) == 2
    assert side_effects(settings) == ["first", "second"]


def test_readme_shows_both_ways_to_approve() -> None:
    root = Path(__file__).parent.parent
    assert "ws approve" in (root / "README.md").read_text()
    assert "temporal workflow signal --workflow-id" in (root / "docs" / "approvals.md").read_text()


async def test_resume_with_an_approval_returns_the_same_handle_type(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    model = fake_openai.script([tools(shell("resumed")), text("done")])
    started = await dev_runtime.run(agent_task(model), task_id="resume-me")
    [request] = await pending_requests(started)
    resumed = await dev_runtime.resume(
        "resume-me", approval=Decision(request_id=request, approver="ann")
    )
    assert type(resumed) is type(started) and resumed.id == started.id
    assert (await resumed.result()).result == "done"
    assert side_effects(settings) == ["resumed"]
    again = await dev_runtime.run(agent_task(model), task_id="resume-me")  # same id: same task
    assert (await again.result()).result == "done"
    assert fake_openai.calls(model) == 2
