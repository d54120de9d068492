"""Small and quirky models: tool calls written as text, and a model that repeats itself."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import agent_task, of_type
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.workflows.models import ApprovalSettings, ModelSettings


async def test_a_tool_call_written_as_text_is_run_not_taken_for_the_answer(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    written = '```json\n{"name": "calculator", "arguments": {"expression": "(12 + 30) * 7"}}\n```'
    model = fake_openai.script(
        lambda body: (
            text(f"it is {body['messages'][-1]['content']}")
            if body["messages"][-1]["role"] == "tool"
            else text(written)
        )
    )
    handle = await ts_runtime.run(agent_task(model))
    outcome = await handle.result()
    assert outcome.result == "it is 294"
    events = await handle.events()
    [first, _] = of_type(events, "thought")
    assert first.calls_from_text and first.tool_calls[0].tool == "calculator"
    assert of_type(events, "observation")[0].output == "294"
    # The model is sent its call back as a structured call, answered by the tool.
    sent = fake_openai.requests[model][-1]["messages"]
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "calculator"


async def test_a_call_written_twice_in_one_message_runs_once(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    # Qwen2.5-Coder-0.5B wrote a ```json block, then the same JSON bare, in one message.
    call = '{"name": "calculator", "arguments": {"expression": "2^10"}}'
    written = f"```json\n{call}\n```\nThat is:\n{call}"
    model = fake_openai.script(
        lambda body: text("done") if body["messages"][-1]["role"] == "tool" else text(written)
    )
    handle = await ts_runtime.run(agent_task(model))
    assert (await handle.result()).result == "done"
    events = await handle.events()
    assert len(of_type(events, "thought")[0].tool_calls) == 1
    assert [o.output for o in of_type(events, "observation")] == ["1024"]


async def test_recovering_calls_from_text_can_be_turned_off(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    written = '{"name": "calculator", "arguments": {"expression": "1 + 1"}}'
    model = fake_openai.script([text(written)])
    task = agent_task(model)
    task = task.model_copy(
        update={"model": task.model.model_copy(update={"recover_text_tool_calls": False})}
    )
    handle = await ts_runtime.run(task)
    assert (await handle.result()).result == written


async def test_a_model_repeating_one_call_is_told_then_stopped_then_resumed_with_a_message(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    def reply(body: dict[str, Any]) -> Reply:
        said = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if any("stop writing" in s for s in said):
            return text("done writing")
        line = {"path": "scratch/log.txt", "content": "again\n", "append": True}
        return tools(("write_file", line))

    model = fake_openai.script(reply)
    handle = await dev_runtime.run(agent_task(model, max_repeated_calls=2))
    with pytest.raises(TaskFailedError) as failure:
        await handle.result()
    assert failure.value.kind == "repeated_calls"
    events = await handle.events()
    notes = [o.output for o in of_type(events, "observation")][1:]
    assert len(notes) >= 2 and all("not run again" in n for n in notes)
    # Each note quotes the write's own result, never an earlier note.
    assert all(n.count("You made") == 1 and "began: appended 6 bytes" in n for n in notes)
    assert (settings.workspace_dir / "scratch" / "log.txt").read_text() == "again\n"
    resumed = await dev_runtime.resume(handle.id, message="stop writing and finish")
    assert (await resumed.result()).result == "done writing"
    types = [e.type for e in await resumed.events()]
    assert types.index("failed") < types.index("resumed") < types.index("user_message")
    assert (settings.workspace_dir / "scratch" / "log.txt").read_text() == "again\n"


async def test_asking_again_for_a_call_a_person_rejected_says_so(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    shell = ("run_shell", {"command": "rm -rf scratch"})
    other = ("calculator", {"expression": "1"})
    steps = [shell, other, ("list_files", {}), other, shell]
    model = fake_openai.script([*(tools(s) for s in steps), text("gave up")])
    handle = await dev_runtime.run(
        agent_task(model, approval=ApprovalSettings(policy={"run_shell": "always"}))
    )
    first = await _pending(handle)
    await handle.approve(first, reject=True, message="never delete scratch")
    second = await _pending(handle, not_this=first)
    state = await handle.state()
    assert "identical call was rejected at step 1" in (state.pending_approvals[second].reason or "")
    assert "never delete scratch" in (state.pending_approvals[second].reason or "")
    await handle.approve(second, reject=True)
    assert (await handle.result()).result == "gave up"


async def _pending(handle: Any, not_this: str | None = None) -> str:
    from tests.helpers import wait_for_state

    state = await wait_for_state(
        handle, lambda s: any(r != not_this for r in s.pending_approvals), timeout=30
    )
    return next(r for r in state.pending_approvals if r != not_this)


def test_model_settings_recover_calls_by_default() -> None:
    assert ModelSettings().recover_text_tool_calls
