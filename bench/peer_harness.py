"""The workload on `temporal-agent-harness`, with pydantic-ai inside (the harness's own
Pydantic AI integration: a `TemporalAgent` whose model calls stream onto the harness's turn
stream, and harness tools run by the harness in the workflow).

An agent is a session: the bench opens it with update-with-start (the task as its one
message) and sends `close` at once, which lets the open turn finish before the workflow
ends; the handler leaves its answer in the memo (one small event). The calculator is an
activity tool marked `inherently_safe`, and the session's policy approves such tools (any
other would wait for a person). pydantic-ai's usage limit is raised to the task's steps, as
in `bench.peer_pydantic_ai`. Oversized payloads go to the harness's local offload store
under the bench's scratch directory.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.worker import Worker
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import AgentPlugin, PydanticAIPlugin, TemporalAgent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits
    from temporal_agent_harness.ai_sdks.pydantic_ai_harness import (
        HarnessDeps,
        build_harness_toolset,
        harness_event_stream_handler,
    )
    from temporal_agent_harness.harness import AgentWorkflowRunner, agent
    from temporal_agent_harness.harness.agent_client import AgentClient
    from temporal_agent_harness.harness.agent_protocol import (
        AgentConfig,
        TextMessage,
        TextReply,
        ToolApprovalPolicy,
    )
    from temporal_agent_harness.plugin import AgentHarnessPlugin
    from temporal_agent_harness.utils.large_payload import local_payload_storage

    import bench.peer_workload as peer_workload

if TYPE_CHECKING:
    from bench.common import Bench

MODEL = "bench-harness"
WORKFLOW = "BenchHarnessAgent"
HANDLER = "work"
# The handler's answer, read from the closed session's memo: a handler that raises does not
# fail the session, and a query would replay the whole session on the worker (seconds).
OUTCOME = "bench_outcome"


@agent.activity_tool_defn(  # type: ignore[untyped-decorator]
    inherently_safe=True,
    activity_config=ActivityConfig(start_to_close_timeout=timedelta(seconds=60)),
)
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '2 * (3 + 4)'."""
    return peer_workload.calculate(expression)


PROVIDER = OpenAIProvider(openai_client=peer_workload.FAKE_CLIENT)
_TOOLSET, _TOOL_CONFIG = build_harness_toolset([calculator], id="bench_harness_tools")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # pydantic-ai deprecates TemporalAgent; the harness uses it
    AGENT = TemporalAgent(
        Agent(
            OpenAIChatModel(MODEL, provider=PROVIDER),
            name="bench_harness",
            instructions="Use the calculator as the task says, then answer.",
            deps_type=HarnessDeps,
            toolsets=[_TOOLSET],
        ),
        event_stream_handler=harness_event_stream_handler,
        tool_activity_config=_TOOL_CONFIG,
    )


@agent.defn(name=WORKFLOW)
class HarnessBench:
    """A session whose one handler runs the task and leaves its answer in the memo."""

    @agent.init  # type: ignore[untyped-decorator]
    def __init__(self, config: AgentConfig) -> None:
        self._runner = AgentWorkflowRunner(
            config,
            stream=WorkflowStream(),
            approval_policy_default=ToolApprovalPolicy.allow_inherently_safe(),
        )

    @agent.accepts  # type: ignore[untyped-decorator]
    async def work(self, message: TextMessage) -> TextReply:
        """Run one task to its answer."""
        job = peer_workload.parse_prompt(message.text)
        try:
            result = await AGENT.run(
                message.text,
                deps=HarnessDeps(runner=self._runner),
                usage_limits=UsageLimits(request_limit=job.steps + 1),
            )
        except Exception as err:
            workflow.upsert_memo({OUTCOME: f"{type(err).__name__}: {err}"})
            raise
        workflow.upsert_memo({OUTCOME: result.output})
        return TextReply(text=result.output)


async def connect(address: str, scratch: Path) -> Client:
    offload = local_payload_storage(base_dir=scratch / "harness-payloads")
    return await Client.connect(
        address,
        plugins=[
            PydanticAIPlugin(),
            AgentHarnessPlugin(tools=[calculator], large_payload_offload=offload),
        ],
    )


def worker(client: Client, queue: str) -> Worker:
    return Worker(client, task_queue=queue, workflows=[HarnessBench], plugins=[AgentPlugin(AGENT)])


async def run(client: Client, queue: str, workflow_id: str, prompt: str) -> str:
    """One session per task: the task as its one message, then `close`."""
    await AgentClient(client, workflow_id).start_and_submit_message(
        HANDLER,
        TextMessage(text=prompt).model_dump(),
        workflow_name=WORKFLOW,
        task_queue=queue,
        start_config=AgentConfig(),
    )
    handle = client.get_workflow_handle(workflow_id)
    await handle.signal("close")
    await handle.result()
    return str(await (await handle.describe()).memo_value(OUTCOME, ""))


SETUP = peer_workload.PeerSetup("harness", connect, worker, run)


def serve(bench: Bench) -> AbstractAsyncContextManager[peer_workload.Runner]:
    """A worker for the agent in this process, and the runner that holds one session per task."""
    return peer_workload.serve_in_process(SETUP, bench.address, bench.scratch)
