"""A task is a conversation: follow-ups after an answer, and messages that steer it while
it works, each reaching the model once, in order (real dev server, the real `openai`
client against the fake server, workers in this process)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy

from tests.helpers import agent_task, of_type, wait_for_state
from waystation.activities.builtin_tools import builtin_registry
from waystation.activities.tools import Tool, ToolContext
from waystation.client.agent_runtime import AgentRuntime, MessageRefusedError, TaskNotFoundError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows import errors, messages
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.events import Interrupted, Thought, UserMessage
from waystation.workflows.models import ApprovalSettings, Message, MessageReceipt
from waystation.workflows.run import AgentOutcome, AgentRun
from waystation.workflows.stream import TokenDelta


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


async def test_a_follow_up_goes_on_with_the_same_id_log_and_offsets(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [text("Paris."), tools(("calculator", {"expression": "2 + 2"})), text("It is 4.")]
    )
    handle = await dev_runtime.run(agent_task(model, task="Capital of France?"))
    first = await handle.result()
    assert first.result == "Paris." and first.turn == 0
    before = await handle.events()
    last_offset = [i async for i in dev_runtime.stream(handle.id)][-1].offset

    same = await handle.send("And what is 2 + 2?")
    assert same is handle
    second = await handle.result()
    assert second.result == "It is 4." and second.turn == 1

    # The same task: one id, one log whose seq goes on, one stream whose offsets go on.
    events = await dev_runtime.get(handle.id).events()
    assert events[: len(before)] == before
    assert [e.seq for e in events] == list(range(len(events)))
    [follow_up] = of_type(events, "user_message")
    assert follow_up.turn == 1 and follow_up.via == "signal"
    assert [e.type for e in events].count("done") == 2
    items = [i async for i in dev_runtime.stream(handle.id, since=last_offset + 1)]
    assert items[0].offset == last_offset + 1
    assert items[-1].data.type == "done" and items[-1].data.result == "It is 4."
    # The model saw the whole conversation, the first answer included.
    last = fake_openai.requests[model][-1]
    assert user_texts(last) == ["Capital of France?", "And what is 2 + 2?"]
    assert any(m["role"] == "assistant" and m.get("content") == "Paris." for m in last["messages"])
    # The first handle still gives the task's own answer; a fresh one the latest.
    assert (await dev_runtime.get(handle.id).result()).result == "It is 4."
    state = await dev_runtime.get(handle.id).state()
    assert (state.status, state.turn, state.step) == ("done", 1, 3)


async def test_max_steps_is_per_turn_and_a_message_may_give_new_ones(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "1 + 1"})),
            text("two"),
            tools(("calculator", {"expression": "3 - 1"})),
            text("two again"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model, max_steps=2))
    assert (await handle.result()).result == "two"
    # Two more steps are allowed in the next turn although the task has used two already.
    await handle.send("once more, please", max_steps=2)
    assert (await handle.result()).result == "two again"
    events = await handle.events()
    [message] = of_type(events, "user_message")
    assert message.max_steps == 2


async def test_a_message_while_a_tool_runs_reaches_the_next_model_call_once(
    dev_env: Any, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    started, release = threading.Event(), threading.Event()
    registry = builtin_registry()
    registry.register(held_tool(started, release))
    model = fake_openai.script([tools(("hold", {})), text("done, with the note")])
    async with running_worker(dev_env.client, settings, registry=registry):
        runtime = AgentRuntime(dev_env.client, settings, tools=registry)
        handle = await runtime.run(agent_task(model, task="hold on"))
        assert await asyncio.to_thread(started.wait, 60)
        # Sent while the tool runs; a repeat of the same message counts once.
        await runtime.send(handle.id, "also mention the weather", message_id="note-1")
        await runtime.send(handle.id, "also mention the weather", message_id="note-1")
        # Kept, not yet taken: the model is busy with nothing, the tool still runs.
        queued = await handle.queued_messages()
        assert [(m.message_id, m.content) for m in queued] == [
            ("note-1", "also mention the weather")
        ]
        release.set()
        outcome = await handle.result()
        messages = of_type(await handle.events(), "user_message")
    assert outcome.result == "done, with the note"
    [first, second] = fake_openai.requests[model]
    assert user_texts(first) == ["hold on"]
    # After the step's tool result, before the next model call, exactly once.
    roles = [m["role"] for m in second["messages"]]
    assert roles[-2:] == ["tool", "user"]
    assert user_texts(second) == ["hold on", "also mention the weather"]
    assert [(m.message_id, m.turn) for m in messages] == [("note-1", 0)]


async def test_concurrent_senders_after_an_answer_are_all_kept_in_order(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: text(f"heard {len(user_texts(body))}"))
    handle = await dev_runtime.run(agent_task(model, task="start"))
    await handle.result()
    sends = [dev_runtime.send(handle.id, f"message {n}", message_id=f"m{n}") for n in range(3)]
    await asyncio.gather(*sends)
    state = await wait_for_state(
        dev_runtime.get(handle.id),
        lambda s: s.status == "done" and len(s.message_ids) == 3,
    )
    events = await dev_runtime.get(handle.id).events()
    taken = [e.message_id or "" for e in events if isinstance(e, UserMessage)]
    assert sorted(taken) == ["m0", "m1", "m2"] and len(set(taken)) == 3
    # The order the model read them in is the order the task took them in.
    last = fake_openai.requests[model][-1]
    assert user_texts(last) == ["start", *(f"message {t[-1]}" for t in taken)]
    assert state.message_ids == taken


async def test_the_send_message_update_and_a_temporal_cli_follow_up_with_an_empty_input(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("first"), text("second")])
    handle = await dev_runtime.run(agent_task(model))
    await handle.result()
    client = dev_runtime.client
    # What `temporal workflow execute-update-with-start --input '{}'` sends: a run with
    # nothing in it finds the answer it follows and goes on from it.
    start: WorkflowHandle[AgentWorkflow, AgentOutcome] = client.get_workflow_handle_for(
        AgentWorkflow.run, handle.id
    )
    # The SDK types an async update method's result as its coroutine: hence the ignores.
    receipt: MessageReceipt = await client.execute_update_with_start_workflow(  # type: ignore[assignment]
        AgentWorkflow.send_message,  # type: ignore[arg-type]
        Message(content="go on"),
        start_workflow_operation=_with_start(handle.id, dev_runtime.settings),
    )
    assert receipt.message_id.startswith("update-") and not receipt.duplicate
    state = await wait_for_state(
        dev_runtime.get(handle.id), lambda s: s.turn == 1 and s.status == "done"
    )
    assert state.result is not None or (await start.result()).result == "second"
    assert (await dev_runtime.get(handle.id).result()).result == "second"
    # An empty message is refused before anything is sent.
    with pytest.raises(ValidationError):
        Message(content="   ")


def _with_start(task_id: str, settings: Settings) -> Any:
    from temporalio.client import WithStartWorkflowOperation

    return WithStartWorkflowOperation(
        AgentWorkflow.run,
        AgentRun(),
        id=task_id,
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def test_messages_that_cannot_be_taken_are_refused_with_a_sentence(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    with pytest.raises(TaskNotFoundError, match="no task with id"):
        await dev_runtime.send("no-such-task", "hello")
    with pytest.raises(ValidationError):
        await dev_runtime.send("no-such-task", "x" * 200_001)
    model = fake_openai.script([tools(("calculator", {"expression": "1+1"}))] * 3)
    failed = await dev_runtime.run(agent_task(model, max_steps=1))
    await wait_for_state(failed, lambda s: s.status == "failed")
    with pytest.raises(MessageRefusedError, match="resume it"):
        await failed.send("go on")
    # The Update says so too, before anything enters history.
    with pytest.raises(WorkflowUpdateFailedError):
        workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            dev_runtime.client.get_workflow_handle_for(AgentWorkflow.run, failed.id)
        )
        _ = await workflow.execute_update(AgentWorkflow.send_message, Message(content="go on"))


class _Nothing(BaseModel):
    pass


class _Wait(BaseModel):
    seconds: float = Field(default=0, ge=0)


def held_tool(started: threading.Event, release: threading.Event) -> Tool[_Nothing]:
    """A tool that runs until the test releases it (the test knows it is running)."""

    def hold(args: _Nothing, context: ToolContext) -> str:
        started.set()
        release.wait(120)
        return json.dumps({"held": True})

    return Tool(
        name="hold",
        description="waits for the test",
        arguments=_Nothing,
        function=hold,
        retry_safe=True,
    )


async def test_an_interrupting_message_cancels_the_model_call_and_voids_its_text(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    gate = threading.Event()
    model = fake_openai.script(
        [
            Reply(content="one two three four five", hold_after_chunks=3, gate=gate),
            text("hi"),
        ]
    )
    try:
        # A long idle clock: only the interrupt may end the held call, however busy the machine.
        handle = await dev_runtime.run(agent_task(model, task="tell me a long story", timeout=60))
        await fake_openai.until_streaming(model, 3, request=0)
        await handle.send("stop that, just say hi", interrupt=True)
        outcome = await handle.result()
    finally:
        gate.set()
    assert outcome.result == "hi" and outcome.steps == 1
    events = await handle.events()
    types = [e.type for e in events]
    assert types == ["task_started", "interrupted", "user_message", "thought", "done"]
    interrupted, message, thought = events[1], events[2], events[3]
    assert isinstance(interrupted, Interrupted) and isinstance(message, UserMessage)
    assert isinstance(thought, Thought)
    assert interrupted.interrupted_step == 1 and message.interrupted
    # The step started again with the message: its attempts are numbered past the void ones.
    assert thought.step == 1 and thought.attempt > interrupted.attempt
    [_, second] = fake_openai.requests[model]
    assert user_texts(second) == ["tell me a long story", "stop that, just say hi"]
    items = [i async for i in dev_runtime.stream(handle.id)]
    cut = next(i.offset for i in items if i.data.type == "interrupted")
    void = [
        i for i in items if isinstance(i.data, TokenDelta) and i.data.attempt <= interrupted.attempt
    ]
    # Text streamed before the cut is void; a viewer drops it at the `interrupted` event.
    assert void and all(i.offset < cut for i in void)


async def test_an_interrupting_message_lets_a_shell_command_in_flight_finish(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    scratch = settings.workspace_dir / "scratch"
    command = "touch scratch/running; while [ ! -e scratch/go ]; do sleep 0.05; done; echo finished"
    model = fake_openai.script([tools(("run_shell", {"command": command})), text("all done")])
    policy = ApprovalSettings(policy={"run_shell": "never"})
    handle = await dev_runtime.run(agent_task(model, task="run it", approval=policy))
    async with asyncio.timeout(60):
        while not (scratch / "running").exists():
            await asyncio.sleep(0.05)
    await handle.send("hurry up", interrupt=True)
    (scratch / "go").touch()
    outcome = await handle.result()
    events = await handle.events()
    assert outcome.result == "all done"
    [observation] = of_type(events, "observation")
    assert "finished" in observation.output and not observation.is_error
    assert not of_type(events, "interrupted")
    types = [e.type for e in events]
    assert types.index("observation") < types.index("user_message")
    [_, second] = fake_openai.requests[model]
    assert user_texts(second) == ["run it", "hurry up"]


async def test_a_temporal_cli_follow_up_of_a_task_that_does_not_exist_says_so(
    dev_runtime: AgentRuntime,
) -> None:
    client = dev_runtime.client
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        _ = await client.execute_update_with_start_workflow(
            AgentWorkflow.send_message,  # type: ignore[arg-type]
            Message(content="hello?"),
            start_workflow_operation=_with_start("never-started", dev_runtime.settings),
        )
    assert "there is no task 'never-started' to follow up" in str(refused.value.cause)


async def test_a_follow_up_may_run_the_same_call_again(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    calc = ("calculator", {"expression": "2^10"})
    model = fake_openai.script([tools(calc), text("1024"), tools(calc), text("still 1024")])
    handle = await dev_runtime.run(agent_task(model, task="2^10?"))
    await handle.result()
    await handle.send("once more: 2^10?")
    assert (await handle.result()).result == "still 1024"
    outputs = [o.output for o in of_type(await handle.events(), "observation")]
    # The repeat guard spans a turn's steps, not the turns a person asked for.
    assert outputs == ["1024", "1024"]


async def test_a_follow_up_with_a_worker_running_starts_one_run_with_no_hold_back(
    dev_env: Any, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """The follow-up's run starts from the answered run's continuation: it claims its turn
    and goes on in that run. A run that continued as new instead (as one started naming only
    the run it follows does) waited up to a second first: Temporal holds back the first
    workflow task of a run continued within a second of its predecessor's start."""
    model = fake_openai.script([text("one"), text("two")])
    handle = await dev_runtime.run(agent_task(model, task="count"))
    await handle.result()
    await handle.send("again")
    assert (await handle.result()).result == "two"
    runs = [e async for e in dev_env.client.list_workflows(f'WorkflowId="{handle.id}"')]
    latest = dev_env.client.get_workflow_handle(handle.id)
    started = (await latest.fetch_history()).events[0].workflow_execution_started_event_attributes
    assert started.first_workflow_task_backoff.ToTimedelta().total_seconds() == 0
    assert not started.continued_execution_run_id  # the message started it
    assert len({run.run_id for run in runs}) <= 2  # visibility may lag: never a third


async def test_a_flood_of_messages_is_bounded_in_bytes_on_every_path_and_the_task_goes_on(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """Messages waiting for the next model call are bounded in bytes, not only in number:
    the client refuses one that does not fit (429 on the API), the Update's validator too,
    and a bare Signal past the bound is not kept but logged; the task then takes what it
    kept and answers."""
    gate = threading.Event()
    held = Reply(content="working", hold_after_chunks=1, gate=gate)
    model = fake_openai.script([held, text("took them")])
    big = "m" * 190_000
    try:
        # A window that takes what is kept, so nothing is summarized.
        task = agent_task(model, timeout=60, context_limit_tokens=1_000_000)
        handle = await dev_runtime.run(task)
        await fake_openai.until_streaming(model, 1, request=0)
        await handle.send(big, message_id="big-1")
        await handle.send(big, message_id="big-2")
        with pytest.raises(MessageRefusedError, match="bytes of messages waiting") as refused:
            await handle.send(big, message_id="big-3")
        assert refused.value.kind == errors.TOO_MANY_MESSAGES
        await handle.send(big, message_id="big-2")  # a repeat of a waiting one: no refusal
        workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
            dev_runtime.client.get_workflow_handle_for(AgentWorkflow.run, handle.id)
        )
        with pytest.raises(WorkflowUpdateFailedError):
            _ = await workflow.execute_update(
                AgentWorkflow.send_message, Message(content=big, message_id="big-4")
            )
        # A sender that only signals (the Temporal CLI) learns it from the task's log.
        await workflow.signal(AgentWorkflow.message, Message(content=big, message_id="big-5"))
        assert (await workflow.query(AgentWorkflow.message_room)).message_ids == [
            "big-1",
            "big-2",
        ]
    finally:
        gate.set()
    assert (await handle.result()).result == "took them"
    events = await handle.events()
    assert [e.message_id for e in of_type(events, "user_message")] == ["big-1", "big-2"]
    [refusal] = [e for e in of_type(events, "error") if e.kind == "message_refused"]
    assert refusal.message.startswith(f"message big-5 was not taken: task {handle.id} already has")


async def test_a_run_holding_more_than_a_payload_reads_its_conversation_in_pages(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    """Input within its limits can make one run hold more than one query may answer (2 MB):
    a task text of 200,000 control characters (6 bytes each in JSON) and a step of twelve
    shell commands that each print 16,000 more. The run's hand-over reads the conversation a
    page at a time to save it, and the task answers (before: the query passed 2 MB and the
    hand-over was retried without end). A message is bounded in bytes, so what waits beside
    such a text stays small."""
    heavy = "\x01" * 199_999 + "x"
    noisy = ("run_shell", {"command": "head -c 16000 /dev/zero | tr '\\0' '\\1'"})
    model = fake_openai.script([tools(*[noisy] * 12), text("read it all")])
    policy = ApprovalSettings(policy={"run_shell": "never"})
    task = agent_task(
        model,
        task=heavy,
        approval=policy,
        context_limit_tokens=10_000_000,
        continue_as_new_after_steps=1,  # its hand-over saves what the run holds
    )
    handle = await dev_runtime.run(task)
    with pytest.raises(MessageRefusedError, match="bytes as JSON and one may take") as refused:
        await handle.send(heavy)
    assert refused.value.kind == errors.MESSAGE_TOO_LARGE
    assert (await handle.result()).result == "read it all"
    last = fake_openai.requests[model][-1]
    assert [m["content"] for m in last["messages"] if m["role"] == "user"] == [heavy]


def test_one_refusal_rule_reads_a_view_the_workflow_and_a_client_both_build() -> None:
    """`message_refusal` is the rule of the Update's validator and the Signal's handler
    (over `view_of` the state and queue); a client builds the same view from the task's
    status and its `message_room` answer and gets the same answer."""
    full = messages.QueueVolume(
        messages=messages.QUEUED_MESSAGES_KEPT, bytes=10, message_ids=["m-waiting"]
    )
    running = messages.MessageView(task_id="t", status="running", waiting=full, taken=["m-taken"])
    refused = messages.message_refusal(running, Message(content="one more", message_id="m-new"))
    assert refused is not None and refused.kind == errors.TOO_MANY_MESSAGES
    for repeat in ("m-waiting", "m-taken"):
        assert messages.message_refusal(running, Message(content="x", message_id=repeat)) is None
    empty = messages.MessageView(task_id="t", status="running")
    assert messages.message_refusal(empty, Message(content="fits")) is None
    failed = messages.MessageView(task_id="t", status="failed")
    refused = messages.message_refusal(failed, Message(content="go on"))
    assert refused == (
        errors.TASK_NOT_TAKING_MESSAGES,
        "task t failed: a message cannot continue it; resume it, with a message if you like",
    )
