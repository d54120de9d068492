"""Record workflow histories for the replay test: `python -m tests.record_histories`.

Existing files are kept: each stands for tasks that may be running somewhere. New
scenarios are added as new files. After a deliberate change to the workflow's commands
(guarded by `workflow.patched` for running tasks), add a scenario and commit its file.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from runtime.agent_runtime import AgentRuntime, TaskCancelledError, TaskFailedError
from testing.fake_openai import FakeOpenAI, Reply, error, text, tools
from testing.servers import start_dev_env
from testing.settings import isolated_settings
from worker import build_worker
from workflows.models import AgentTask, ApprovalSettings, ModelSettings

HISTORIES = Path(__file__).parent / "histories"


async def record() -> None:
    fake = FakeOpenAI()
    env = await start_dev_env()
    scratch = Path(tempfile.mkdtemp(prefix="waystation-record-"))
    settings = isolated_settings(scratch, fake.url, name="record")
    async with env, build_worker(env.client, settings):
        runtime = AgentRuntime(env.client, settings)
        scenarios: dict[str, str] = {}

        handle = await runtime.run(
            AgentTask(
                task="What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt"
            ),
            task_id="offline-readme-task",
        )
        await handle.result()
        scenarios["offline_readme_task"] = handle.id

        model = fake.script(
            [
                error(429, "slow down", {"Retry-After": "0"}),
                tools(
                    ("write_file", {"path": "report.txt", "content": "x"}),
                    ("run_shell", {"command": "echo hi"}),
                    ("calculator", {"expression": "1 +"}),
                ),
                text("finished"),
            ]
        )
        handle = await runtime.run(
            AgentTask(task="approvals", model=ModelSettings(name=model)), task_id="approvals"
        )
        while len((await handle.state()).pending_approvals) < 2:
            await asyncio.sleep(0.05)
        pending = list((await handle.state()).pending_approvals)
        await handle.approve(pending[0], approver="alice", message="ok")
        await handle.approve(pending[0], approver="alice", message="ok")  # idempotent repeat
        await env.client.get_workflow_handle(handle.id).signal(
            "reject", {"request_id": pending[1], "message": "no shells"}
        )
        await handle.result()
        scenarios["approvals_update_and_signal"] = handle.id

        model = fake.script(lambda body: tools(("calculator", {"expression": "2"})))
        handle = await runtime.run(
            AgentTask(task="loop", model=ModelSettings(name=model), max_steps=2),
            task_id="max-steps",
        )
        try:
            await handle.result()
        except TaskFailedError:
            pass
        scenarios["max_steps_failure"] = handle.id

        policy = ApprovalSettings(policy={"run_shell": "never"})
        model = fake.script(
            lambda body: (
                text("all done")
                if sum(m["role"] == "tool" for m in body["messages"]) >= 3
                else tools(("run_shell", {"command": "echo step >> effects.txt"}))
            )
        )
        handle = await runtime.run(
            AgentTask(
                task="continue as new",
                model=ModelSettings(name=model),
                approval=policy,
                continue_as_new_after_steps=2,
                max_steps=2,
            ),
            task_id="continue-as-new-then-resume",
        )
        try:
            await handle.result()
        except TaskFailedError:
            pass
        handle = await runtime.resume(handle.id, max_steps=10)
        await handle.result()
        scenarios["resumed_after_reset"] = handle.id

        fork = await runtime.fork("offline-readme-task", 3, message="and now?", max_steps=5)
        await fork.result()
        scenarios["fork_with_message"] = fork.id

        model = fake.script([Reply(content=" ".join(["slow"] * 200), chunk_delay=0.02)])
        handle = await runtime.run(
            AgentTask(task="cancel me", model=ModelSettings(name=model)), task_id="cancelled"
        )
        await asyncio.sleep(1.0)
        await handle.cancel()
        try:
            await handle.result()
        except TaskCancelledError:
            pass
        scenarios["cancelled_mid_stream"] = handle.id

        words = " ".join(f"w{i}" for i in range(300))
        model = fake.script(
            [tools(("calculator", {"expression": f"{i}+1"}), content=words) for i in range(5)]
            + [text("done")]
        )
        handle = await runtime.run(
            AgentTask(task="long", model=ModelSettings(name=model), continue_as_new_after_steps=2),
            task_id="continue-as-new-chain",
        )
        await handle.result()
        scenarios["continue_as_new_bounded_carry"] = handle.id

        # Local-activity tools, a quiet (instant) step, a live streaming step, an approval.
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
        handle = await runtime.run(
            AgentTask(task="local tools", model=ModelSettings(name=model)),
            task_id="local-tools",
        )
        while not (await handle.state()).pending_approvals:
            await asyncio.sleep(0.05)
        [request] = list((await handle.state()).pending_approvals)
        await handle.approve(request, approver="alice")
        await handle.result()
        scenarios["local_tools_and_quiet_tokens"] = handle.id

        HISTORIES.mkdir(exist_ok=True)
        for name, workflow_id in scenarios.items():
            path = HISTORIES / f"{name}.json"
            if path.exists():
                continue  # a recorded history stands for tasks already running: keep it
            history = await env.client.get_workflow_handle(workflow_id).fetch_history()
            path.write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
    fake.close()


if __name__ == "__main__":
    asyncio.run(record())
