"""Conversations survive dead workers: a steer accepted while a tool runs reaches the model
once after the worker is SIGKILLed, and a follow-up to a task whose worker died while it
waited goes on on a fresh worker (real worker processes, the dev server, the fake model)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.testing import WorkflowEnvironment

from tests.chaos.workload import until_file
from tests.helpers import agent_task, of_type
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import WorkerProcess
from waystation.workflows.models import ApprovalSettings

Spawn = Callable[[], Awaitable[WorkerProcess]]


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


async def test_a_steer_accepted_during_a_tool_call_reaches_the_model_once_after_a_kill(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    spawn_worker: Spawn,
) -> None:
    # The command records the pid of the worker running it, then waits for the test.
    wait = "while [ ! -e scratch/release ]; do sleep 0.05; done"
    command = f"cut -d' ' -f4 /proc/$PPID/stat > scratch/holder; {wait}; echo ran"

    def reply(body: dict[str, Any]) -> Reply:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return tools(("run_shell", {"command": command}))
        return text(f"heard: {' | '.join(user_texts(body))}")

    model = fake_openai.script(reply)
    runtime = AgentRuntime(dev_env.client, settings)
    first = await spawn_worker()
    task = agent_task(
        model, task="run it", approval=ApprovalSettings(policy={"run_shell": "never"})
    )
    handle = await runtime.run(task)
    holder = int(await until_file(settings.workspace_dir / "scratch" / "holder"))
    assert holder == first.pid
    await runtime.send(handle.id, "and say it twice", message_id="steer")
    # Accepted (Temporal holds the Signal): the worker dies before the loop could take it.
    first.kill()
    await spawn_worker()
    (settings.workspace_dir / "scratch" / "release").touch()
    outcome = await handle.result()
    assert outcome.result == "heard: run it | and say it twice"
    after_tool = [
        b for b in fake_openai.requests[model] if any(m["role"] == "tool" for m in b["messages"])
    ]
    assert after_tool and all(user_texts(b) == ["run it", "and say it twice"] for b in after_tool)
    messages = of_type(await handle.events(), "user_message")
    assert [m.message_id for m in messages] == ["steer"]


async def test_a_follow_up_goes_on_on_a_fresh_worker_after_the_old_one_was_killed(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    spawn_worker: Spawn,
) -> None:
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "6 * 7"})),
            text("It is 42."),
            text("Half of it is 21."),
        ]
    )
    runtime = AgentRuntime(dev_env.client, settings)
    first = await spawn_worker()
    handle = await runtime.run(agent_task(model, task="What is 6 * 7?"))
    assert (await handle.result()).result == "It is 42."
    # The task waits for its next message holding no process; its worker dies meanwhile.
    first.kill()
    await spawn_worker()  # a new process: nothing of the conversation in its memory
    await handle.send("And half of that?")
    assert (await handle.result()).result == "Half of it is 21."
    last = fake_openai.requests[model][-1]
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert [m.get("content") for m in last["messages"]][3:] == [
        "42",
        "It is 42.",
        "And half of that?",
    ]
