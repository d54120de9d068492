"""The workload on pydantic-ai's `TemporalAgent` (`pydantic-ai-slim[temporal,openai]`).

Its model requests and the calculator run as activities, as the wrapper does by default;
the chat-completions model reaches the fake endpoint. Its usage limit stops a run at 50
model requests unless raised, so each run raises it to its own number of steps.
(pydantic-ai 2.x deprecates `TemporalAgent` for the `TemporalDurability` capability, which
records the same activities and payloads; the wrapper is what the issue measured.)
"""

from __future__ import annotations

import warnings
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import (
        PydanticAIPlugin,
        TemporalAgent,
    )
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    import bench.peer_workload as peer_workload

if TYPE_CHECKING:
    from bench.common import Bench

MODEL = "bench-pydantic-ai"
WORKFLOW = "BenchPydanticAi"


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as '2 * (3 + 4)'."""
    return peer_workload.calculate(expression)


PROVIDER = OpenAIProvider(openai_client=peer_workload.FAKE_CLIENT)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the deprecation of TemporalAgent, said above
    AGENT = TemporalAgent(
        Agent(
            OpenAIChatModel(MODEL, provider=PROVIDER),
            name="bench_pydantic_ai",
            instructions="Use the calculator as the task says, then answer.",
            tools=[calculator],
        )
    )


@workflow.defn(name=WORKFLOW)
class PydanticAiBench:
    """One task: the agent's run, with the usage limit raised to the task's steps."""

    __pydantic_ai_agents__ = (AGENT,)  # PydanticAIPlugin registers its activities

    @workflow.run
    async def run(self, prompt: str) -> str:
        job = peer_workload.parse_prompt(prompt)
        result = await AGENT.run(prompt, usage_limits=UsageLimits(request_limit=job.steps + 1))
        return str(result.output)


async def connect(address: str, scratch: Path) -> Client:
    return await Client.connect(address, plugins=[PydanticAIPlugin()])


def worker(client: Client, queue: str) -> Worker:
    return Worker(client, task_queue=queue, workflows=[PydanticAiBench])


async def run(client: Client, queue: str, workflow_id: str, prompt: str) -> str:
    return await client.execute_workflow(
        PydanticAiBench.run, prompt, id=workflow_id, task_queue=queue
    )


SETUP = peer_workload.PeerSetup("pydantic-ai", connect, worker, run)


def serve(bench: Bench) -> AbstractAsyncContextManager[peer_workload.Runner]:
    """A worker for the workflow in this process, and the runner that starts a task on it."""
    return peer_workload.serve_in_process(SETUP, bench.address, bench.scratch)
