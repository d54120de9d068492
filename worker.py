"""The worker: settings -> client (pydantic converter) -> Worker hosting the agent workflow,
the LLM activity and the tool activity. The one place things are registered.

    python worker.py            # polls the task queue until Ctrl-C / SIGTERM
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.builtin_tools import builtin_registry
from activities.chat import ChatBackend
from activities.conversation_cache import TASKS_KEPT, ConversationCache
from activities.conversation_store import ConversationStore
from activities.event_archive import ArchiveActivities, EventArchive
from activities.llm import LlmActivities
from activities.mcp.activities import McpActivities
from activities.mcp.manager import McpClientManager
from activities.sealed_blobs import SealedBlobs
from activities.storage import Storage, StorageError
from activities.storage.deployment import check_single_machine, check_workspace
from activities.tools import ToolActivities, ToolRegistry
from runtime.agent_runtime import AgentRuntime
from runtime.auto_repair import repair_now_and_then
from runtime.settings import Settings
from runtime.temporal import connect
from workflows.agent import AgentWorkflow

# A dead worker's sticky queue otherwise holds the next workflow task for 10 s.
STICKY_SCHEDULE_TO_START = timedelta(seconds=1)
# The SDK holds back an activity's heartbeats for 0.8x its heartbeat timeout, so the server
# would hear one only a fifth of the timeout before its deadline: a worker slowed by load
# abandons live calls for late heartbeats. Activities beat every third of
# the timeout (at least 1 s, so every 0.33 s or slower): with this cap every beat goes out.
HEARTBEAT_THROTTLE = timedelta(milliseconds=250)
# Workflows run outside Temporal's sandbox. Measured by bench/ on this machine: the
# sandbox made an agent step 1.4x the bare-Temporal floor instead of 1.2x, and each cached
# task cost ~0.5 MB (500 tasks starting at once took four minutes to park, not 40 s).
# Determinism is kept by other means: workflows/ruff.toml bans clocks, randomness and I/O
# in workflow code, and CI replays every recorded history under the strict sandbox.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()


logger = logging.getLogger("waystation.worker")


class AgentWorker(Worker):
    """A Worker that, when it serves tool calls, opens its storage and checks its deployment
    before it polls and prunes the storage now and then; it closes what it holds at shutdown."""

    def __init__(
        self,
        client: Client,
        *,
        llm: LlmActivities,
        mcp: McpActivities,
        storage: Storage,
        settings: Settings,
        serves_tools: bool,
        owns_storage: bool,
        **options: Any,
    ) -> None:
        super().__init__(client, **options)
        self.llm = llm
        self.mcp = mcp
        self.storage = storage
        self._temporal = client
        self._settings = settings
        self._queue: str = options["task_queue"]
        self._serves_tools = serves_tools
        self._owns_storage = owns_storage
        self._prepared = False
        self._pruning: asyncio.Task[None] | None = None
        self._repairing: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Open the storage and refuse a workspace or a task queue that breaks exactly-once
        (a StorageError whose message is one sentence saying what to change)."""
        if self._prepared or not self._serves_tools:
            return
        await self.storage.open()
        try:
            # The host check first: a refused worker leaves no marker in the workspace.
            await check_single_machine(self.storage, self._temporal, self._queue)
            await check_workspace(self.storage, self._settings.workspace_dir)
        except BaseException:
            if self._owns_storage:
                await self.storage.close()
            raise
        self._prepared = True

    async def __aenter__(self) -> AgentWorker:
        await self.prepare()
        if self._serves_tools and self._settings.prune_interval_hours > 0:
            self._pruning = asyncio.create_task(self._prune_now_and_then())
        if self._settings.auto_repair:
            served = self._settings.model_copy(update={"task_queue": self._queue})
            runtime = AgentRuntime(self._temporal, served)
            self._repairing = asyncio.create_task(repair_now_and_then(runtime))
        await super().__aenter__()
        return self

    async def _prune_now_and_then(self) -> None:
        age = timedelta(days=self._settings.retention_days)
        conversations = timedelta(days=self._settings.conversation_retention_days)
        while True:
            try:
                report = await self.storage.prune(age, blobs_older_than=conversations)
                logger.info(
                    "pruned %d ledger entries and %d blobs", report.ledger_entries, report.blobs
                )
            except StorageError as err:
                logger.warning("could not prune the storage: %s", err)
            await asyncio.sleep(self._settings.prune_interval_hours * 3600)

    async def shutdown(self) -> None:
        await super().shutdown()
        for chore in (self._pruning, self._repairing):
            if chore is not None:
                chore.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await chore
        await self.llm.close()
        await self.mcp.manager.close()  # stdio MCP servers stop with the worker
        if self._owns_storage:
            await self.storage.close()


def build_worker(
    client: Client,
    settings: Settings,
    *,
    registry: ToolRegistry | None = None,
    task_queue: str | None = None,
    graceful_shutdown: timedelta = timedelta(seconds=5),
    activities: bool = True,
    backends: Mapping[str, ChatBackend] | None = None,
    storage: Storage | None = None,
) -> AgentWorker:
    """A worker for the agent workflow and its activities on the settings' task queue.

    With `activities=False` it takes no LLM or tool call from the server (a short-lived
    process would abandon them), only workflow tasks, which may run pure tools locally; it
    then never opens the storage. `backends` serves models by name from something other
    than the OpenAI endpoint. `storage` (default: the settings') is opened when the worker
    starts; one passed in is left open at shutdown.
    """
    registry = registry or builtin_registry()
    # Shared: LLM calls reuse what tool calls produced. It keeps as many tasks as the workflow
    # cache: each task it forgets costs a query at its next call, and so a replay.
    conversations = ConversationCache(tasks=max(TASKS_KEPT, settings.worker_cached_tasks))
    owns_storage = storage is None
    storage = storage or Storage.from_settings(settings)
    # Connections start on first use, so a worker with servers it never needs spawns none.
    mcp = McpActivities(McpClientManager(settings.mcp_server_configs()))
    sealed = SealedBlobs(storage.blobs, settings.payload_codec())
    archive = ArchiveActivities(EventArchive(sealed))
    llm = LlmActivities(
        registry,
        ConversationStore(sealed),
        api_key=settings.api_key,
        base_url=settings.openai_base_url,
        backends=backends,
        conversations=conversations,
        mcp=mcp,
    )
    tools = ToolActivities(registry, settings.workspace_dir, storage.ledger, conversations, mcp)
    return AgentWorker(
        client,
        llm=llm,
        mcp=mcp,
        storage=storage,
        settings=settings,
        serves_tools=activities,
        owns_storage=owns_storage,
        task_queue=task_queue or settings.task_queue,
        workflows=[AgentWorkflow],
        activities=[
            llm.call_llm,
            llm.summarize_context,
            llm.save_conversation,
            archive.archive_events,
            tools.run_tool,
            mcp.list_tools,
        ],
        no_remote_activities=not activities,
        workflow_runner=WORKFLOW_RUNNER,
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        max_cached_workflows=settings.worker_cached_tasks,
        graceful_shutdown_timeout=graceful_shutdown,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )


async def main() -> int:
    """Serve until SIGINT/SIGTERM; 1 (with one sentence on stderr) if the worker cannot start."""
    settings = Settings()
    client = await connect(settings)
    try:
        worker = build_worker(client, settings)
        await worker.prepare()
    except StorageError as err:
        print(f"worker cannot start: {err}", file=sys.stderr, flush=True)
        return 1
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
        f"(model endpoint: {model}; workspace: {settings.workspace_dir}; storage: "
        f"{worker.storage.location}, deployment {worker.storage.deployment_id})",
        file=sys.stderr,
        flush=True,
    )
    async with worker:
        await stop.wait()
    print("worker stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
