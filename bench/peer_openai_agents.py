"""The workload on the OpenAI Agents SDK on Temporal (`openai-agents` with Temporal's
`temporalio-openai-agents`, which `temporalio.contrib.openai_agents` forwards to).

The model runs as the plugin's activity, through a chat-completions model provider on the
fake endpoint (the SDK's default is the Responses API); the calculator is an activity made
a tool by `activity_as_tool`. The runner stops at 10 turns unless raised, so each run raises
`max_turns` to its own number of steps. Tracing is off for each run: it would export to
OpenAI.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from agents import Agent, RunConfig, Runner
    from agents.models.openai_provider import OpenAIProvider
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

    import bench.peer_workload as peer_workload

if TYPE_CHECKING:
    from bench.common import Bench

MODEL = "bench-openai-agents"
WORKFLOW = "BenchOpenAiAgents"
TIMEOUT = timedelta(seconds=60)


@activity.defn(name="bench_calculator")
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '2 * (3 + 4)'."""
    return peer_workload.calculate(expression)


@workflow.defn(name=WORKFLOW)
class OpenAiAgentsBench:
    """One task: the SDK's runner, with `max_turns` raised to the task's steps."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        job = peer_workload.parse_prompt(prompt)
        agent = Agent(
            name="bench",
            instructions="Use the calculator as the task says, then answer.",
            model=MODEL,
            tools=[activity_as_tool(calculator, start_to_close_timeout=TIMEOUT)],
        )
        result = await Runner.run(
            agent, prompt, max_turns=job.steps + 1, run_config=RunConfig(tracing_disabled=True)
        )
        return str(result.final_output)


async def connect(address: str, scratch: Path) -> Client:
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=TIMEOUT),
        model_provider=OpenAIProvider(openai_client=peer_workload.FAKE_CLIENT, use_responses=False),
    )
    return await Client.connect(address, plugins=[plugin])


def worker(client: Client, queue: str) -> Worker:
    return Worker(client, task_queue=queue, workflows=[OpenAiAgentsBench], activities=[calculator])


async def run(client: Client, queue: str, workflow_id: str, prompt: str) -> str:
    return await client.execute_workflow(
        OpenAiAgentsBench.run, prompt, id=workflow_id, task_queue=queue
    )


SETUP = peer_workload.PeerSetup("openai-agents", connect, worker, run)


def serve(bench: Bench) -> AbstractAsyncContextManager[peer_workload.Runner]:
    """A worker for the workflow in this process, and the runner that starts a task on it."""
    return peer_workload.serve_in_process(SETUP, bench.address, bench.scratch)
