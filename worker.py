"""The worker: settings -> client (pydantic converter) -> Worker hosting the agent workflow,
the LLM activity and the tool activity. The one place things are registered.

    python worker.py            # polls the task queue until Ctrl-C / SIGTERM
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.builtin_tools import builtin_registry
from activities.chat import ChatBackend
from activities.conversation_cache import ConversationCache
from activities.ledger import IdempotencyLedger
from activities.llm import LlmActivities
from activities.mcp.activities import McpActivities
from activities.mcp.manager import McpClientManager
from activities.tools import ToolActivities, ToolRegistry
from runtime.settings import Settings
from runtime.temporal import connect
from workflows.agent import AgentWorkflow

# A dead worker's sticky queue otherwise holds the next workflow task for 10 s.
STICKY_SCHEDULE_TO_START = timedelta(seconds=1)
# Workflows run outside Temporal's sandbox. Measured by bench/ on this machine: the
# sandbox made an agent step 1.4x the bare-Temporal floor instead of 1.2x, and each cached
# task cost ~0.5 MB (500 tasks starting at once took four minutes to park, not 40 s).
# Determinism is kept by other means: workflows/ruff.toml bans clocks, randomness and I/O
# in workflow code, and CI replays every recorded history under the strict sandbox.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()


class AgentWorker(Worker):
    """A Worker that also closes the model client and the MCP connections it holds."""

    def __init__(
        self, client: Client, *, llm: LlmActivities, mcp: McpActivities, **options: Any
    ) -> None:
        super().__init__(client, **options)
        self.llm = llm
        self.mcp = mcp

    async def shutdown(self) -> None:
        await super().shutdown()
        await self.llm.close()
        await self.mcp.manager.close()  # stdio MCP servers stop with the worker


def build_worker(
    client: Client,
    settings: Settings,
    *,
    registry: ToolRegistry | None = None,
    task_queue: str | None = None,
    graceful_shutdown: timedelta = timedelta(seconds=5),
    activities: bool = True,
    backends: Mapping[str, ChatBackend] | None = None,
) -> AgentWorker:
    """A worker for the agent workflow and its activities on the settings' task queue.

    With `activities=False` it takes no LLM or tool call from the server (a short-lived
    process would abandon them), only workflow tasks, which may run pure tools locally.
    `backends` serves models by name from something other than the OpenAI endpoint.
    """
    registry = registry or builtin_registry()
    conversations = ConversationCache()  # shared: LLM calls reuse what tool calls produced
    llm = LlmActivities(
        registry,
        api_key=settings.api_key,
        base_url=settings.openai_base_url,
        backends=backends,
        conversations=conversations,
    )
    ledger = IdempotencyLedger(settings.data_dir.absolute() / "ledger.sqlite3")
    tools = ToolActivities(registry, settings.workspace_dir, ledger, conversations)
    # Connections start on first use, so a worker with servers it never needs spawns none.
    mcp = McpActivities(McpClientManager(settings.mcp_server_configs()))
    return AgentWorker(
        client,
        llm=llm,
        mcp=mcp,
        task_queue=task_queue or settings.task_queue,
        workflows=[AgentWorkflow],
        activities=[llm.call_llm, llm.summarize_context, tools.run_tool, mcp.list_tools],
        no_remote_activities=not activities,
        workflow_runner=WORKFLOW_RUNNER,
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        max_cached_workflows=settings.worker_cached_tasks,
        graceful_shutdown_timeout=graceful_shutdown,
    )


async def main() -> None:
    settings = Settings()
    client = await connect(settings)
    worker = build_worker(client, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    model = (
        "offline model"
        if not settings.endpoint_configured
        else settings.openai_base_url or "OpenAI"
    )
    print(
        f"worker polling task queue {settings.task_queue!r} on "
        f"{client.service_client.config.target_host} "
        f"(model endpoint: {model}; workspace: {settings.workspace_dir})",
        file=sys.stderr,
        flush=True,
    )
    async with worker:
        await stop.wait()
    print("worker stopped", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
