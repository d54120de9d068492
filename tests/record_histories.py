"""Record workflow histories for the replay test: `python -m tests.record_histories`.

Each scenario drives a real task on the dev server and saves its history under
tests/histories/. The replay test replays them all against the current workflow code, so a
change that would break running tasks fails CI. Existing files are kept unless `--replace`
is given: before the first release that promises replay compatibility
(docs/architecture.md, "Replay compatibility") a deliberate change to the workflow's
commands re-records them all; after it, such a
change is guarded by `workflow.patched` and adds new scenarios beside the old files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowExecution, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from tests.test_worker_versions import promote
from waystation.client.agent_runtime import AgentRuntime, TaskCancelledError, TaskError, TaskHandle
from waystation.client.schedules import ScheduleSpec
from waystation.client.starting import start_agent
from waystation.client.worker_versions import worker_version
from waystation.settings import BUILTIN_TOOLS_MODULE
from waystation.settings.mcp_servers import McpServerConfig
from waystation.settings.model_endpoints import ModelEndpoint, parse_endpoints
from waystation.testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from waystation.testing.mcp import CallLog, demo_stdio
from waystation.testing.servers import start_dev_env
from waystation.testing.settings import isolated_settings
from waystation.testing.webhook_receiver import WebhookReceiver
from waystation.worker import build_worker
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import AgentState
from waystation.workflows.models import (
    AgentSpec,
    AgentTask,
    ApprovalSettings,
    Decision,
    Message,
    ModelSettings,
    QuotaNotice,
)
from waystation.workflows.run import AgentOutcome, AgentRun

HISTORIES = Path(__file__).parent / "histories"


async def until(handle: TaskHandle, check: Callable[[AgentState], bool]) -> AgentState:
    """The task's state once `check` holds (bounded)."""
    async with asyncio.timeout(30):
        while not check(state := await handle.state()):
            await asyncio.sleep(0.05)
    return state


async def finished(handle: TaskHandle) -> None:
    try:
        await handle.result()
    except TaskError:
        pass


Scenario = Callable[[AgentRuntime, FakeOpenAI], Awaitable[str]]


async def all_runs(client: Client, task_id: str, latest: str) -> list[WorkflowExecution]:
    """Every run of the task, oldest first, once visibility lists the latest (it lags)."""
    async with asyncio.timeout(30):
        while True:
            runs = [e async for e in client.list_workflows(f'WorkflowId="{task_id}"')]
            if latest in {r.run_id for r in runs}:
                return sorted(runs, key=lambda e: e.start_time)
            await asyncio.sleep(0.1)


async def offline_readme_task(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    task = AgentTask(task="What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt")
    handle = await runtime.run(task, task_id="offline-readme-task")
    await handle.result()
    return handle.id


async def approvals_update_and_signal(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script(
        [
            error(429, "slow down", {"Retry-After": "0"}),
            tools(
                ("write_file", {"path": "report.txt", "content": "x"}),
                ("run_shell", {"command": "echo hi"}),
                ("run_shell", {"command": "echo again"}),
                ("calculator", {"expression": "1 +"}),
            ),
            text("finished"),
        ]
    )
    task = AgentTask(task="approvals", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="approvals")
    first, second, third = (
        await until(handle, lambda s: len(s.pending_approvals) == 3)
    ).pending_approvals
    await handle.approve(first, approver="alice", message="ok")
    await handle.approve(first, approver="alice", message="ok")  # an idempotent repeat
    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = runtime.client.get_workflow_handle_for(
        AgentWorkflow.run, handle.id
    )
    await workflow.execute_update(AgentWorkflow.decide, Decision(request_id=second, approver="cli"))
    await workflow.signal(AgentWorkflow.reject, Decision(request_id=third, message="no shells"))
    await handle.result()
    return handle.id


async def max_steps_then_resume(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script(
        lambda body: (
            text("enough")
            if sum(m["role"] == "tool" for m in body["messages"]) >= 3
            else tools(("calculator", {"expression": str(len(body["messages"]))}))
        )
    )
    task = AgentTask(task="loop", model=ModelSettings(name=model), max_steps=2)
    handle = await runtime.run(task, task_id="max-steps")
    await finished(handle)
    await (await runtime.resume(handle.id, max_steps=10)).result()
    return handle.id


async def continue_as_new_with_approval(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    words = " ".join(f"w{i}" for i in range(300))
    model = fake.script(
        [tools(("calculator", {"expression": f"{i}+1"}), content=words) for i in range(4)]
        + [tools(("run_shell", {"command": "echo late"})), text("done")]
    )
    task = AgentTask(task="long", model=ModelSettings(name=model), continue_as_new_after_steps=2)
    handle = await runtime.run(task, task_id="continue-as-new-chain")
    await until(handle, lambda s: bool(s.pending_approvals))
    await handle.approve()
    await handle.result()
    return handle.id


async def archived_runs(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """Runs that archive their events as they hand over, and a last run large enough to
    archive as it ends."""
    big = "z" * 45_000

    def reply(body: dict[str, Any]) -> Reply:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        step = int(results[-1]) if results else 1
        if step == 14:
            return text("archived")
        return tools(("calculator", {"expression": f"{step}+1"}), content=big)

    task = AgentTask(
        task="count with big thoughts",
        model=ModelSettings(name=fake.script(reply)),
        continue_as_new_after_steps=7,
        context_limit_tokens=150_000,
    )
    handle = await runtime.run(task, task_id="archived-runs")
    await handle.result()
    return handle.id


async def fork_with_message(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    fork = await runtime.fork("offline-readme-task", 3, message="and now?", max_steps=5)
    await fork.result()
    return fork.id


async def cancelled_mid_stream(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script([Reply(content=" ".join(["slow"] * 400), chunk_delay=0.02)])
    task = AgentTask(task="cancel me", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="cancelled")
    async for item in runtime.stream(handle.id, topics=["tokens"]):
        if item.data.type == "token":
            break  # the model is provably streaming
    await handle.cancel()
    try:
        await handle.result()
    except TaskCancelledError:
        pass
    return handle.id


async def local_tools_and_quiet_tokens(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script(
        [
            tools(("calculator", {"expression": "6*7"}), content="quick"),
            tools(
                ("run_shell", {"command": "echo local"}),
                content=" ".join(["live"] * 20),
                chunk_delay=0.02,
            ),
            tools(("calculator", {"expression": "1/0"})),
            text("42"),
        ]
    )
    task = AgentTask(task="local tools", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="local-tools")
    await until(handle, lambda s: bool(s.pending_approvals))
    await handle.approve(approver="alice")
    await handle.result()
    return handle.id


async def stuck_then_resumed_with_a_message(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script(
        lambda body: (
            text("listed, then stopped")
            if any("differently" in (m.get("content") or "") for m in body["messages"])
            else tools(("list_files", {"path": "."}))
        )
    )
    task = AgentTask(task="repeat", model=ModelSettings(name=model), max_repeated_calls=1)
    handle = await runtime.run(task, task_id="stuck-repeating")
    await finished(handle)
    resumed = await runtime.resume(handle.id, message="do it differently")
    await resumed.result()
    return handle.id


async def compacted_context(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    steps: list[int] = []

    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text("a summary of the early steps")
        steps.append(len(steps))
        if len(steps) > 6:
            return text("done")
        return tools(("calculator", {"expression": f"{len(steps)}+1"}), content="x" * 900)

    model = fake.script(reply)
    task = AgentTask(
        task="compact",
        model=ModelSettings(name=model),
        context_limit_tokens=1000,
        approval=ApprovalSettings(policy={"calculator": "never"}),
    )
    handle = await runtime.run(task, task_id="compacted")
    await handle.result()
    return handle.id


async def mcp_tools(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    model = fake.script([tools(("time__get_current_time", {"timezone": "UTC"})), text("it is now")])
    task = AgentTask(task="the time", model=ModelSettings(name=model), mcp_servers=["time"])
    handle = await runtime.run(task, task_id="mcp-tools")
    await handle.result()
    return handle.id


async def three_turn_conversation(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """An answer, a follow-up by Signal (a new run), and one from the Temporal CLI's
    update-with-start with an empty input (a run that continues as new from the answer)."""
    model = fake.script(
        [
            text("turn zero"),
            tools(("calculator", {"expression": "2 * 21"})),
            text("turn one: 42"),
            text("turn two"),
        ]
    )
    task = AgentTask(task="talk with me", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="conversation")
    await handle.result()
    await handle.send("now compute 2 * 21", message_id="follow-up-1")
    await handle.result()
    start = WithStartWorkflowOperation(
        AgentWorkflow.run,
        AgentRun(),
        id=handle.id,
        task_queue=runtime.settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    _ = await runtime.client.execute_update_with_start_workflow(
        AgentWorkflow.send_message,  # type: ignore[arg-type]
        Message(content="and finally?"),
        start_workflow_operation=start,
    )
    await until(handle, lambda s: s.turn == 2 and s.status == "done")
    return handle.id


async def steered_task(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A model call interrupted by a message, then a message sent while a call waits for
    approval (kept for after the decision)."""
    gate = threading.Event()
    model = fake.script(
        [
            Reply(content=" ".join(["musing"] * 30), hold_after_chunks=3, gate=gate),
            tools(("run_shell", {"command": "echo steered"})),
            text("steered and done"),
        ]
    )
    task = AgentTask(task="think aloud", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="steered")
    try:
        await fake.until_streaming(model, 3, request=0)
        await runtime.send(handle.id, "stop musing: run echo", interrupt=True, message_id="stop")
        await until(handle, lambda s: bool(s.pending_approvals))
        await runtime.send(handle.id, "then finish", message_id="then")
        await handle.approve(approver="alice")
        await handle.result()
    finally:
        gate.set()
    return handle.id


async def mcp_tools_changed(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A server announces tools/list_changed mid-task: the task lists it again (a patch)."""
    model = fake.script(
        [tools(("demo__add_tool", {"name": "fresh"})), tools(("demo__fresh", {})), text("done")]
    )
    policy = {"demo__add_tool": "never", "demo__fresh": "never"}
    task = AgentTask(
        task="add a tool and use it",
        model=ModelSettings(name=model),
        mcp_servers=["demo"],
        approval=ApprovalSettings(policy=policy),
    )
    handle = await runtime.run(task, task_id="mcp-tools-changed")
    await handle.result()
    return handle.id


async def question_and_approval(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A step that asks a person (with choices) and needs an approval: both wait, then the
    answer is the question's observation."""
    model = fake.script(
        [
            tools(
                ("ask_person", {"question": "Which greeting?", "choices": ["hi", "hello"]}),
                ("run_shell", {"command": "echo asked"}),
            ),
            text("greeted"),
        ]
    )
    task = AgentTask(task="greet", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="question-and-approval")
    await until(handle, lambda s: bool(s.pending_questions) and bool(s.pending_approvals))
    await handle.approve(approver="alice")
    await handle.answer("Hello", answerer="bob")
    await handle.result()
    return handle.id


def first_user_message(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


# The sub-agent the recorder's worker offers (the children use their parent's model).
FINDER = "finder"
FINDER_SPEC = AgentSpec(name=FINDER, description="looks for something in one place")
PLACES = ("the attic", "the cellar")


async def parent_with_two_children(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A parent calls the sub-agent `finder` twice in one step (two child workflows, each
    with a tool step of its own), then answers with both results. The recorder saves the
    children's histories beside the parent's."""

    def reply(body: dict[str, Any]) -> Reply:
        asked = first_user_message(body)
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if asked.startswith("look in "):  # a child
            if not results:
                return tools(("calculator", {"expression": f"{len(asked)} * 2"}))
            return text(f"found nothing in {asked.removeprefix('look in ')} ({results[-1]})")
        if not results:
            return tools(*((f"agent__{FINDER}", {"task": f"look in {place}"}) for place in PLACES))
        return text("both looked: " + "; ".join(results))

    # No MCP servers: the history holds the tree and little else.
    model = ModelSettings(name=fake.script(reply))
    task = AgentTask(task="find the key", model=model, mcp_servers=[])
    # The replay test gives a history its file's name as workflow id, and the parent's
    # commands name its children by ids derived from its own: the same name, then.
    handle = await runtime.run(task, task_id="parent_with_two_children")
    await handle.result()
    return handle.id


async def sub_agent_held_by_its_task(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task that holds the definition of the sub-agent it calls (`AgentTask.agents`, filled
    in by the client): the model call offers the task's `finder`, and the child task holds
    the sub-agents it may call in turn (none)."""

    def reply(body: dict[str, Any]) -> Reply:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if first_user_message(body).startswith("look in "):  # the child
            return text("found nothing there")
        if not results:
            return tools((f"agent__{FINDER}", {"task": "look in the drawer"}))
        return text("it looked: " + results[-1])

    model = ModelSettings(name=fake.script(reply))
    task = AgentTask(task="find the key", model=model, mcp_servers=[], tools=[f"agent__{FINDER}"])
    handle = await runtime.run(task, task_id="sub_agent_held_by_its_task")
    await handle.result()
    return handle.id


async def question_with_notifications(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """An approval, a question and the answer, each told to a webhook endpoint by a worker
    that notifies (its own task queue): the run reads the targets and starts a child per
    notice. The task id is the file's name: the replay test replays under it, and the
    children's ids are derived from it."""
    receiver = WebhookReceiver()
    ops = {
        "name": "ops",
        "url": receiver.url("ops"),
        "events": ["approval_requested", "question_asked", "done", "failed"],
        "secret": "recorded-nowhere",
    }
    settings = runtime.settings.model_copy(
        update={
            "task_queue": f"{runtime.settings.task_queue}-notify",
            "webhooks": SecretStr(json.dumps([ops])),
        }
    )
    model = fake.script(
        [
            tools(("run_shell", {"command": "echo told"})),
            tools(("ask_person", {"question": "Which colour?", "choices": ["Red", "Blue"]})),
            text("painted it blue"),
        ]
    )
    task = AgentTask(task="paint the shed", model=ModelSettings(name=model))
    try:
        async with build_worker(runtime.client, settings):
            notifying = AgentRuntime(runtime.client, settings)
            handle = await notifying.run(task, task_id="question_with_notifications")
            await until(handle, lambda s: bool(s.pending_approvals))
            await handle.approve(approver="alice")
            await until(handle, lambda s: bool(s.pending_questions))
            await handle.answer("blue", answerer="bob")
            await handle.result()
            await receiver.until(lambda received: len(received) == 3)
    finally:
        receiver.close()
    return handle.id


async def typed_output_retry(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task with an output schema: a final answer that does not fit it (told as the call's
    observation), one in plain text (an output_rejected event), then one that fits."""
    model = fake.script(
        [
            tools(("final_answer", {"city": "Oslo", "people": "many"})),
            text("Oslo has about 709,000 people."),
            tools(("final_answer", {"city": "Oslo", "people": 709037})),
        ]
    )
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
        "required": ["city", "people"],
    }
    task = AgentTask(task="Oslo?", model=ModelSettings(name=model), output_schema=schema)
    handle = await runtime.run(task, task_id="typed-output-retry")
    await handle.result()
    return handle.id


async def visibility_what_changed(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """Steps, an approval between them and the answer, recorded with the visibility patch
    (a status change writes its step; a new step alone waits for STEP_REFRESH; only the
    attributes that changed are written)."""
    model = fake.script(
        [
            tools(("calculator", {"expression": "1 + 1"})),
            tools(("run_shell", {"command": "echo hi"})),
            tools(("calculator", {"expression": "2 + 2"})),
            text("finished"),
        ]
    )
    task = AgentTask(task="steps and an approval", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="visibility-what-changed")
    [request] = (await until(handle, lambda s: len(s.pending_approvals) == 1)).pending_approvals
    await handle.approve(request, approver="alice")
    await handle.result()
    return handle.id


async def duplicate_call_ids(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """Two shell calls under one id, each needing approval. The saved history was recorded
    with `call_llm` as it was before call ids were made unique within a step (so the
    thought holds `dup` twice, one request stands for both, and one observation closes the
    step): such histories must go on replaying. Recorded again, the calls get two ids."""

    def reply(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "tool" for m in body["messages"]):
            return text("done")
        first = tools(
            ("run_shell", {"command": "echo shown"}), ("run_shell", {"command": "echo hidden"})
        )
        first.call_ids = ["dup", "dup"]
        return first

    task = AgentTask(task="two calls, one id", model=ModelSettings(name=fake.script(reply)))
    handle = await runtime.run(task, task_id="duplicate-call-ids")
    await until(handle, lambda s: s.status == "waiting_approval")
    for request in (await handle.state()).pending_approvals:
        await handle.approve(request, approver="alice")
    await handle.result()
    return handle.id


async def waited_for_a_capable_worker(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task that requires a sub-agent the recorder's worker lacks: its model call fails
    there (`waiting_worker`), and a worker that has it, started after, takes the next."""
    math = AgentSpec(name="math", description="works out arithmetic", tools=["calculator"])
    settings = runtime.settings.model_copy(
        update={"agents": json.dumps([math.model_dump(mode="json", exclude_defaults=True)])}
    )
    task = AgentTask(task="Have the math agent work out (12 + 30) * 7", requires=["agent__math"])
    # Started as it is, past the client's check, so the lacking worker takes the first call.
    handle = await start_agent(
        runtime.client,
        "waited_for_a_capable_worker",  # the replay test names the run after its file
        AgentRun(task=task),
        task_queue=settings.task_queue,
        text=task.task,
    )
    waiting = runtime.get(handle.id)
    await until(waiting, lambda s: s.status == "waiting_worker")
    base = runtime.client
    other = await Client.connect(
        base.service_client.config.target_host, data_converter=base.data_converter
    )
    async with build_worker(other, settings):
        await waiting.result()
    return handle.id


async def quota_wait_told_by_signal(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """Model calls that tell their task of their wait under a quota (signal `quota_notice`,
    sent here by hand as the call's activity sends it): step 1 waits, is told of another
    limit, of an earlier attempt's turn (dropped) and of its own turn; step 2's call ends
    while the task still shows its wait (the loop closes it)."""
    first, second = threading.Event(), threading.Event()
    model = fake.script(
        [
            tools(("calculator", {"expression": "1 + 1"}), hold_after_chunks=1, gate=first),
            text("two", hold_after_chunks=1, gate=second),
        ]
    )
    task = AgentTask(task="add, waiting for the quota", model=ModelSettings(name=model))
    handle = await runtime.run(task, task_id="quota-wait-told-by-signal")
    signals = runtime.client.get_workflow_handle(handle.id)

    async def tell(**notice: Any) -> None:
        await signals.signal(AgentWorkflow.quota_notice, QuotaNotice.model_validate(notice))

    waiting = {"state": "waiting", "quota": "openai", "expected_seconds": 12.0}
    try:
        await fake.until_streaming(model, 1, request=0)
        await tell(**waiting, step=1, attempt=1, limit="requests_per_minute")
        await until(handle, lambda s: s.status == "waiting_quota")
        await tell(state="granted", step=1, attempt=0, quota="openai", waited_seconds=1.0)
        await tell(**waiting, step=1, attempt=1, limit="input_tokens_per_minute")
        await tell(state="granted", step=1, attempt=1, quota="openai", waited_seconds=2.0)
        await until(handle, lambda s: s.status == "running" and s.last_seq >= 3)
        first.set()
        await fake.until_streaming(model, 1, request=1)
        await tell(**waiting, step=2, attempt=1, limit="paused")
        await until(handle, lambda s: s.status == "waiting_quota")
        second.set()
        await handle.result()
    finally:
        first.set()
        second.set()
    return handle.id


# The recorder's worker's endpoint with a quota of one call at a time, and a price.
LIMITED_ENDPOINT = "limited"


def limited_endpoint(url: str) -> dict[str, ModelEndpoint]:
    declared = {
        LIMITED_ENDPOINT: {
            "protocol": "chat",
            "base_url": url,
            "limits": {"concurrent_requests": 1},
            "prices": {"*": {"input": 2.0, "output": 8.0, "cached_input": 0.5}},
        }
    }
    return parse_endpoints(json.dumps(declared))


async def waited_for_its_quota(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A priced task of tenant `b` whose model call waits for the one slot of its endpoint's
    quota while tenant `a`'s call holds it (the gate tells it: waiting_quota), then has its
    turn (quota_granted), calls a tool and answers."""
    gate = threading.Event()

    def reply(body: dict[str, Any]) -> Reply:
        _, results = turn_of(body)
        first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if first_user == "hold the slot":
            return text("held", hold_after_chunks=1, gate=gate)
        if not results:
            return tools(("calculator", {"expression": "6 * 7"}))
        return text("42")

    model = ModelSettings(name=f"{LIMITED_ENDPOINT}:{fake.script(reply)}")
    holder = AgentTask(task="hold the slot", model=model, tenant="a")
    waiter = AgentTask(task="What is 6 * 7?", model=model, tenant="b")
    try:
        holding = await runtime.run(holder, task_id="quota-slot-holder")
        await fake.until_streaming(model.name.partition(":")[2], 1, request=0)
        handle = await runtime.run(waiter, task_id="waited-for-its-quota")
        await until(handle, lambda s: s.status == "waiting_quota")
        gate.set()
        await handle.result()
        await holding.result()
    finally:
        gate.set()
    return handle.id


def turn_of(body: dict[str, Any]) -> tuple[int, int]:
    """(turn, tool results since the turn's message) of a request in chat shape."""
    messages = body["messages"]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    results = sum(1 for m in messages[users[-1] + 1 :] if m["role"] == "tool")
    return len(users), results


async def responses_with_reasoning(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task on the Responses API whose model reasons: each reasoning item (encrypted, with
    store=false) comes back with its calls on the next step and in the next turn."""

    def reply(body: dict[str, Any]) -> Reply:
        turn, results = turn_of(body)
        if turn == 1 and not results:
            call = ("calculator", {"expression": "(12 + 30) * 7"})
            return tools(call, reasoning="Multiply after adding.")
        return text("294" if turn == 1 else "Yes: 294.", reasoning="It is settled.")

    model = ModelSettings(name=f"openai-responses:{fake.script(reply)}", reasoning_effort="low")
    task = AgentTask(task="What is (12 + 30) * 7?", model=model)
    handle = await runtime.run(task, task_id="responses-with-reasoning")
    await handle.result()
    await handle.send("Are you sure?")
    await handle.result()
    return handle.id


async def anthropic_thinking_with_fallback(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task on Anthropic with extended thinking: its first step's thinking block goes back
    signed; then Anthropic is overloaded (529) and the step moves to the Responses model
    (model_switched, the thinking left out); the next turn starts on Anthropic again."""

    def claude(body: dict[str, Any]) -> Reply:
        turn, results = turn_of(body)
        if turn == 1 and not results:
            return tools(("calculator", {"expression": "2^10"}), reasoning="A power of two.")
        if turn == 1:
            return error(529, "Overloaded")
        return text("Still 1024.", reasoning="Nothing changed.")

    fallback = f"openai-responses:{fake.script(lambda body: text('1024'))}"
    model = ModelSettings(
        name=f"anthropic:{fake.script(claude)}",
        thinking_budget_tokens=2048,
        fallback_models=[fallback],
        fallback_after_seconds=2,
    )
    task = AgentTask(task="What is 2^10?", model=model)
    handle = await runtime.run(task, task_id="anthropic-thinking-with-fallback")
    await handle.result()
    await handle.send("Check again.")
    await handle.result()
    return handle.id


async def sub_agent_on_the_new_version(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A parent pinned to the recorder's version starts its sub-agent after another version
    was promoted: the child's first run, on its parent's version, hands over at once to a
    run on the current one (a patch). The recorder's version is current again after."""

    def reply(body: dict[str, Any]) -> Reply:
        asked = first_user_message(body)
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if asked.startswith("look in "):  # the child
            return text(f"nothing in {asked.removeprefix('look in ')}")
        if not results:
            return tools(("run_shell", {"command": "echo looking"}))
        if len(results) == 1:
            return tools((f"agent__{FINDER}", {"task": "look in the shed"}))
        return text(f"looked: {results[-1]}")

    task = AgentTask(task="find the key", model=ModelSettings(name=fake.script(reply)))
    # Named as its file: the parent's commands name the child by an id derived from it.
    handle = await runtime.run(task, task_id="sub_agent_on_the_new_version")
    await until(handle, lambda s: s.status == "waiting_approval")
    ours = worker_version(runtime.settings)
    newer = runtime.settings.model_copy(update={"build_id": "recorded-next"})
    base = runtime.client
    other = await Client.connect(
        base.service_client.config.target_host, data_converter=base.data_converter
    )
    async with build_worker(other, newer):
        await promote(base, ours.deployment_name, "recorded-next")
        try:
            await handle.approve(approver="alice")
            await handle.result()
        finally:
            await promote(base, ours.deployment_name, ours.build_id)
    return handle.id


async def sealed_follow_up(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """An answer whose run seals what a follow-up needs as it closes (a local activity),
    and a follow-up that starts from that seal and answers (sealed too)."""
    model = fake.script(
        [tools(("calculator", {"expression": "6 * 7"})), text("42"), text("still 42")]
    )
    handle = await runtime.run(AgentTask(task="6 * 7?", model=ModelSettings(name=model)))
    await handle.result()
    await handle.send("are you sure?", message_id="sealed-follow-up")
    await handle.result()
    return handle.id


async def sealed_failure(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task that fails at its step limit: its run seals as it closes, and its failure
    names its last event."""
    model = fake.script([tools(("calculator", {"expression": "1 + 1"}))] * 2)
    task = AgentTask(task="count", model=ModelSettings(name=model), max_steps=1)
    handle = await runtime.run(task)
    try:
        await handle.result()
    except TaskError:
        pass
    return handle.id


async def sealed_cancel(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A task cancelled while it waits for an approval: the run seals, then ends cancelled."""
    model = fake.script([tools(("run_shell", {"command": "true"}))])
    asks = ApprovalSettings(policy={"run_shell": "always"})
    task = AgentTask(task="wait", model=ModelSettings(name=model), approval=asks)
    handle = await runtime.run(task)
    await until(handle, lambda s: bool(s.pending_approvals))
    await handle.cancel()
    try:
        await handle.result()
    except (TaskCancelledError, TaskError):
        pass
    return handle.id


async def memory_remember_and_recall(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """One task remembers; a later task of the same tenant starts with it loaded (--recall),
    recalls it with the tool, remembers another item and forgets the first."""
    first = fake.script(
        [tools(("remember", {"key": "plan", "text": "ship on Friday"})), text("ok")]
    )
    remembering = AgentTask(task="remember the plan", model=ModelSettings(name=first))
    await finished(await runtime.run(remembering, tenant="acme", task_id="memory-remembers"))
    later = fake.script(
        [
            tools(
                ("recall", {"query": "when do we ship?"}),
                ("remember", {"key": "owner", "text": "Dana owns the release"}),
            ),
            tools(("forget", {"key": "plan"})),
            text("Friday, and Dana owns it."),
        ]
    )
    recalling = AgentTask(
        task="when do we ship?", model=ModelSettings(name=later), recall="the shipping plan"
    )
    handle = await runtime.run(recalling, tenant="acme", task_id="memory-recalls")
    await finished(handle)
    return handle.id


async def fired_task(runtime: AgentRuntime, schedule: str) -> str:
    """The workflow of the schedule's latest firing, once it has one (bounded)."""
    async with asyncio.timeout(30):
        while not (info := await runtime.schedules.describe(schedule)).recent_runs:
            await asyncio.sleep(0.1)
    return info.recent_runs[0].firing_id


async def scheduled_firing(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A schedule's firing, triggered: a task whose id is the schedule's and the firing's
    time, and whose task names the schedule."""
    model = fake.script([tools(("calculator", {"expression": "6*7"})), text("42 tickets")])
    task = AgentTask(task="count the tickets", model=ModelSettings(name=model))
    spec = ScheduleSpec(name="scheduled-firing", task=task, every_seconds=86400, paused=True)
    await runtime.create_schedule(spec)
    try:
        await runtime.schedules.trigger(spec.name)
        task_id = await fired_task(runtime, spec.name)
        await finished(runtime.get(task_id))
    finally:
        await runtime.schedules.delete(spec.name)
    return task_id


async def scheduled_conversation(runtime: AgentRuntime, fake: FakeOpenAI) -> str:
    """A conversation schedule fired twice: its first firing's turn workflow starts the task,
    the second's delivers the next turn as a message. The first firing's own workflow, which
    lasts until its turn answers, is saved as `scheduled_turn_watched.json` (its replay:
    tests/test_replay.py)."""
    model = fake.script([text("3 open"), text("1 open")])
    task = AgentTask(task="how many tickets are open?", model=ModelSettings(name=model))
    name = "scheduled-conversation"
    spec = ScheduleSpec(name=name, task=task, every_seconds=86400, paused=True, conversation=True)
    await runtime.create_schedule(spec)
    try:
        await runtime.schedules.trigger(name)
        first_turn = await fired_task(runtime, name)
        await runtime.client.get_workflow_handle(first_turn).result()  # the task has started
        handle = runtime.get(f"schedule:{name}")
        await until(handle, lambda s: s.status == "done")
        await runtime.schedules.trigger(name)
        await until(handle, lambda s: s.status == "done" and s.result == "1 open")
        # Beside the turn recorded before a firing lasted its turn (scheduled_turn.json).
        turn = HISTORIES / "scheduled_turn_watched.json"
        if not turn.exists():
            history = await runtime.client.get_workflow_handle(first_turn).fetch_history()
            turn.write_text(history.to_json())
    finally:
        await runtime.schedules.delete(name)
    return handle.id


SCENARIOS: dict[str, Scenario] = {
    "offline_readme_task": offline_readme_task,
    "waited_for_a_capable_worker": waited_for_a_capable_worker,
    "approvals_update_and_signal": approvals_update_and_signal,
    "max_steps_then_resume": max_steps_then_resume,
    "continue_as_new_with_approval": continue_as_new_with_approval,
    "fork_with_message": fork_with_message,
    "cancelled_mid_stream": cancelled_mid_stream,
    "local_tools_and_quiet_tokens": local_tools_and_quiet_tokens,
    "stuck_then_resumed_with_a_message": stuck_then_resumed_with_a_message,
    "compacted_context": compacted_context,
    "mcp_tools": mcp_tools,
    "mcp_tools_changed": mcp_tools_changed,
    "archived_runs": archived_runs,
    "three_turn_conversation": three_turn_conversation,
    "steered_task": steered_task,
    "question_and_approval": question_and_approval,
    "question_with_notifications": question_with_notifications,
    "parent_with_two_children": parent_with_two_children,
    "typed_output_retry": typed_output_retry,
    "visibility_what_changed": visibility_what_changed,
    "duplicate_call_ids": duplicate_call_ids,
    "responses_with_reasoning": responses_with_reasoning,
    "anthropic_thinking_with_fallback": anthropic_thinking_with_fallback,
    "quota_wait_told_by_signal": quota_wait_told_by_signal,
    "waited_for_its_quota": waited_for_its_quota,
    "sealed_follow_up": sealed_follow_up,
    "sealed_failure": sealed_failure,
    "sealed_cancel": sealed_cancel,
    "memory_remember_and_recall": memory_remember_and_recall,
    "scheduled_firing": scheduled_firing,
    "scheduled_conversation": scheduled_conversation,
    "sub_agent_held_by_its_task": sub_agent_held_by_its_task,
    # Last: it promotes another version for a while.
    "sub_agent_on_the_new_version": sub_agent_on_the_new_version,
}


async def save_runs(client: Client, runtime: AgentRuntime, task_id: str, stem: str) -> None:
    """Every run of the task (a continue-as-new chain, a run reset by a resume), oldest
    first, each in its own file: `<stem>.json`, or `<stem>.run<N>.json` for a chain."""
    latest = (await runtime.get(task_id).overview()).run_id
    runs = await all_runs(client, task_id, latest)
    for index, execution in enumerate(runs):
        handle = client.get_workflow_handle(task_id, run_id=execution.run_id)
        history = await handle.fetch_history()
        path = HISTORIES / (f"{stem}.json" if len(runs) == 1 else f"{stem}.run{index}.json")
        path.write_text(history.to_json())
        print(f"recorded {path.name}: {len(history.events)} events")


async def record(replace: bool, only: list[str]) -> None:
    fake = FakeOpenAI()
    env = await start_dev_env()
    time_server = McpServerConfig(
        command=str(Path(sys.executable).parent / "mcp-server-time"),
        args=["--local-timezone", "UTC"],
    )
    scratch = Path(tempfile.mkdtemp(prefix="waystation-record-"))
    demo_server = demo_stdio(CallLog(scratch / "demo-calls.jsonl"))
    servers = {"time": time_server, "demo": demo_server}
    agents = json.dumps([FINDER_SPEC.model_dump(mode="json", exclude_defaults=True)])
    settings = isolated_settings(
        scratch,
        fake.url,
        mcp_servers=servers,
        agents=agents,
        model_endpoints=limited_endpoint(fake.url),
        worker_versioning=True,  # the sub-agent's scenario moves between two versions
        tools=[BUILTIN_TOOLS_MODULE, "waystation.activities.memory_tools"],
    )
    # The worker's anthropic endpoint, as a user's environment points it.
    os.environ.update(ANTHROPIC_BASE_URL=fake.anthropic_url, ANTHROPIC_API_KEY="sk-ant-record")
    HISTORIES.mkdir(exist_ok=True)
    async with env, build_worker(env.client, settings):
        runtime = AgentRuntime(env.client, settings)
        for name, scenario in SCENARIOS.items():
            if only and name not in only:
                continue
            task_id = await scenario(runtime, fake)
            if any(HISTORIES.glob(f"{name}*.json")) and not replace:
                continue  # a recorded history stands for tasks already running: keep it
            for old in HISTORIES.glob(f"{name}*.json"):
                old.unlink()
            await save_runs(env.client, runtime, task_id, name)
            # A parent's sub-agents are tasks of their own: each child's runs beside it.
            children = (await runtime.get(task_id).state()).children.values()
            for number, child_id in enumerate(sorted(c.task_id for c in children)):
                await save_runs(env.client, runtime, child_id, f"{name}.child{number}")
    fake.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replace", action="store_true", help="re-record existing files")
    parser.add_argument("--only", nargs="*", default=[], help="these scenarios alone")
    arguments = parser.parse_args()
    asyncio.run(record(arguments.replace, arguments.only))
