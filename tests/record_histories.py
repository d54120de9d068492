"""Record workflow histories for the replay test: `python -m tests.record_histories`.

Run it after a deliberate change to the workflow's history shape (with `workflow.patched`
for running tasks), and commit the files: the replay test then keeps every later change
compatible with tasks that are already running.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from runtime.agent_runtime import AgentRuntime, TaskFailedError
from runtime.settings import Settings
from runtime.temporal import DEV_SERVER_TUNING, temporal_binary
from tests.fake_openai import FakeOpenAI, error, text, tools
from worker import build_worker
from workflows import search
from workflows.models import AgentTask, ModelSettings

HISTORIES = Path(__file__).parent / "histories"


async def record() -> None:
    fake = FakeOpenAI()
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=search.ALL,
        dev_server_extra_args=list(DEV_SERVER_TUNING),
    )
    workspace = Path("/tmp") / f"waystation-record-{uuid.uuid4().hex[:6]}"
    settings = Settings(
        task_queue="record",
        workspace=workspace,
        openai_api_key="sk-test",
        openai_base_url=fake.url,
        embedded_server=False,
    )
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

        HISTORIES.mkdir(exist_ok=True)
        for name, workflow_id in scenarios.items():
            history = await env.client.get_workflow_handle(workflow_id).fetch_history()
            (HISTORIES / f"{name}.json").write_text(history.to_json())
            print(f"recorded {name}: {len(history.events)} events")
    fake.close()


if __name__ == "__main__":
    asyncio.run(record())
