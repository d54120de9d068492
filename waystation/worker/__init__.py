"""The worker: settings -> client (pydantic converter) -> Worker hosting the agent workflow,
the LLM activity and the tool activity. The one place things are registered.

    ws worker                   # polls the task queue until Ctrl-C / SIGTERM
    python worker.py            # the same, from a source tree
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig

from waystation.activities.agent_tools import with_model_facts
from waystation.activities.chat import ChatBackend
from waystation.activities.conversation_cache import TASKS_KEPT, ConversationCache
from waystation.activities.conversation_store import ConversationStore
from waystation.activities.event_archive import ArchiveActivities, EventArchive
from waystation.activities.llm import LlmActivities
from waystation.activities.mcp.activities import McpActivities
from waystation.activities.mcp.manager import McpClientManager
from waystation.activities.memory_recall import MemoryActivities
from waystation.activities.notify.delivery import NotificationActivities, webhook_retry
from waystation.activities.payload_codec import codec_for
from waystation.activities.program_environment import program_environment
from waystation.activities.quotas import QuotaGate
from waystation.activities.redaction import RedactingInterceptor, Redactor
from waystation.activities.sealed_blobs import SealedBlobs
from waystation.activities.storage import DeploymentMismatchError, Storage, StorageError
from waystation.activities.storage.deployment import (
    QUEUE_CHECK_SECONDS,
    check_task_queue,
    check_workspace,
    worker_identity,
)
from waystation.activities.tool_activities import ToolActivities
from waystation.activities.tool_modules import load_tools
from waystation.activities.tools import ToolDefinitionError, ToolRegistry
from waystation.activities.turns import TurnActivities
from waystation.activities.worker_offer import (
    WorkerOffer,
    offer_of,
    publish,
    with_offer,
    without_offer,
)
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.auto_repair import repair_now_and_then
from waystation.client.hidden_environment import hide_starting_environment
from waystation.client.known_secrets import redactor_for
from waystation.client.serving_workers import live_offers
from waystation.client.stuck_notices import notify_stuck_now_and_then
from waystation.client.temporal import TemporalUnavailableError, connect
from waystation.client.worker_versions import worker_version
from waystation.settings import Settings
from waystation.settings.errors import SettingsProblem, load_settings
from waystation.settings.webhooks import WebhookConfigError, check_console_url
from waystation.worker import log as worker_log
from waystation.worker.activity_slots import ActivitySlots, worker_tuner
from waystation.worker.child_outcomes import ChildActivities
from waystation.worker.first_version import become_current_if_none
from waystation.worker.scheduled_turns import ScheduledTurnActivities
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.notifications import NotificationWorkflow
from waystation.workflows.scheduled_turn import ScheduledTurnWorkflow

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
    before it polls and prunes the storage now and then; it closes what it holds at shutdown.
    On SQLite it stops by itself when workers that keep their ledger elsewhere join its task
    queue (`refusal` says why). A versioned worker makes its version current when its
    deployment has none (`version_note` says where its version stands)."""

    def __init__(
        self,
        client: Client,
        *,
        llm: LlmActivities,
        mcp: McpActivities,
        notify: NotificationActivities,
        storage: Storage,
        settings: Settings,
        serves_tools: bool,
        owns_storage: bool,
        offer: WorkerOffer,
        version: WorkerDeploymentVersion | None,
        **options: Any,
    ) -> None:
        super().__init__(client, **options)
        self.offer = offer
        self.version = version
        self.version_note: str | None = None
        self.llm = llm
        self.mcp = mcp
        self.notify = notify
        self.storage = storage
        self._temporal = client
        self._settings = settings
        self._queue: str = options["task_queue"]
        self._serves_tools = serves_tools
        self._owns_storage = owns_storage
        self._prepared = False
        self._pruning: asyncio.Task[None] | None = None
        self._repairing: asyncio.Task[None] | None = None
        self._guarding: asyncio.Task[None] | None = None
        self.refusal: DeploymentMismatchError | None = None
        self._refused = asyncio.Event()
        self._watching_stuck: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Open the storage and refuse a workspace or a task queue that breaks exactly-once
        (a StorageError whose message is one sentence saying what to change)."""
        if self._prepared or not self._serves_tools:
            return
        await self.storage.open()
        try:
            # The task queue first: a refused worker leaves no marker in the workspace.
            await check_task_queue(self.storage, self._temporal, self._queue)
            await check_workspace(self.storage, self._settings.workspace_dir)
            await publish(self.storage, self.offer, codec_for(self._settings, "worker"))
        except BaseException:
            if self._owns_storage:
                await self.storage.close()
            raise
        self._prepared = True

    async def say_how_others_differ(self) -> None:
        """Log how the other live workers of this queue are set up otherwise (a worker
        started before a setting changed, or another project's on the same queue). For a
        worker that serves a queue for good (`ws worker`), not one a command hosts."""
        try:
            codec = codec_for(self._settings, "client")
            others = await live_offers(self._temporal, self._queue, self.storage, codec)
        except RPCError:  # a server that cannot list pollers (the time-skipping one)
            return
        for identity, offer in others:
            if offer is None or offer.digest == self.offer.digest:
                continue
            if said := self.offer.differences(offer):
                logger.warning(
                    "worker %s on task queue %r differs from this one: %s",
                    without_offer(identity),
                    self._queue,
                    "; ".join(said),
                )

    async def __aenter__(self) -> AgentWorker:
        await self.prepare()
        if self._serves_tools and self._settings.prune_interval_hours > 0:
            self._pruning = asyncio.create_task(self._prune_now_and_then())
        if self._serves_tools and self.storage.kind == "sqlite":
            self._guarding = asyncio.create_task(self._check_queue_now_and_then())
        if self._settings.auto_repair:
            served = self._settings.model_copy(update={"task_queue": self._queue})
            runtime = AgentRuntime(self._temporal, served)
            self._repairing = asyncio.create_task(repair_now_and_then(runtime))
        targets = self.notify.targets()
        if self._serves_tools and targets.wanting("stuck"):
            interval = self._settings.webhook_stuck_check_seconds
            watch = notify_stuck_now_and_then(self._temporal, self._queue, targets, interval)
            self._watching_stuck = asyncio.create_task(watch)
        await super().__aenter__()
        if self.version is not None:
            # After the first poll: the server records a version only once it is polled.
            identity = self.config().get("identity") or self._temporal.identity
            self.version_note = await become_current_if_none(
                self._temporal, self.version, self._queue, identity
            )
            if self.version_note:
                logger.info("%s", self.version_note)
        return self

    async def _prune_now_and_then(self) -> None:
        age = timedelta(days=self._settings.retention_days)
        conversations = timedelta(days=self._settings.conversation_retention_days)
        while True:
            try:
                report = await self.storage.prune(age, blobs_older_than=conversations)
                logger.info(
                    "pruned %d ledger entries, %d blobs and %d expired memory items",
                    report.ledger_entries,
                    report.blobs,
                    report.memory_items,
                )
            except StorageError as err:
                logger.warning("could not prune the storage: %s", err)
            await asyncio.sleep(self._settings.prune_interval_hours * 3600)

    async def _check_queue_now_and_then(self) -> None:
        while True:
            await asyncio.sleep(QUEUE_CHECK_SECONDS)
            try:
                if not await check_task_queue(self.storage, self._temporal, self._queue):
                    return  # Temporal does not tell this worker who polls: it never will
            except DeploymentMismatchError as err:
                self.refusal = err
                self._refused.set()
                await super().shutdown()  # no more tool calls here; shutdown() closes the rest
                return

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Until `stop` is set, or the worker stopped by itself (see `refusal`)."""
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(self._refused.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def shutdown(self) -> None:
        await super().shutdown()
        for chore in (self._pruning, self._repairing, self._guarding, self._watching_stuck):
            if chore is not None:
                chore.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await chore
        await self.llm.close()
        await self.notify.close()
        await self.mcp.manager.close()  # stdio MCP servers stop with the worker
        if self._owns_storage:
            await self.storage.close()


@dataclass(frozen=True)
class ServedActivities:
    """The activity implementations a worker serves, built from the settings once."""

    llm: LlmActivities
    mcp: McpActivities
    notify: NotificationActivities
    tools: ToolActivities
    archive: ArchiveActivities
    turns: TurnActivities
    children: ChildActivities
    memory: MemoryActivities
    redactor: Redactor
    scheduled: ScheduledTurnActivities

    def functions(self) -> list[Callable[..., Any]]:
        """What the worker registers: one implementation for each contract the workflows
        schedule (workflows/activity_contracts.py; tests/test_layers.py checks it)."""
        return [
            self.llm.call_llm,
            self.llm.summarize_context,
            self.llm.save_conversation,
            self.archive.archive_events,
            self.archive.seal_run,
            self.tools.run_tool,
            self.mcp.list_tools,
            self.turns.claim_turn,
            self.children.child_outcome,
            self.notify.notification_targets,
            self.notify.deliver,
            self.memory.recall_memory,
            self.scheduled.deliver_scheduled_turn,
            self.scheduled.watch_scheduled_turn,
        ]


def served_activities(
    settings: Settings,
    registry: ToolRegistry,
    storage: Storage,
    *,
    serves_activities: bool = True,
    backends: Mapping[str, ChatBackend] | None = None,
) -> ServedActivities:
    """The activities over the settings, the tools and the storage. A bad
    WAYSTATION_WEBHOOKS raises WebhookConfigError, one sentence naming the endpoint."""
    console = check_console_url(settings.console_url)
    notify = NotificationActivities(
        settings.webhook_endpoints(),
        webhook_retry(settings),
        console,
        serves_activities=serves_activities,
    )
    # Shared: LLM calls reuse what tool calls produced. It keeps as many tasks as the workflow
    # cache: each task it forgets costs a query at its next call, and so a replay.
    conversations = ConversationCache(tasks=max(TASKS_KEPT, settings.worker_cached_tasks))
    # Connections start on first use, so a worker with servers it never needs spawns none.
    # Every secret the settings hold, kept out of tool outputs, error texts and the log.
    redactor = redactor_for(settings, os.environ)
    mcp = McpActivities(McpClientManager(settings.mcp_server_configs()), redactor)
    sealed = SealedBlobs(storage.blobs, codec_for(settings, "worker"))
    store = ConversationStore(sealed)
    llm = LlmActivities(
        registry,
        store,
        backends=backends,
        endpoints=settings.model_endpoints,
        environ=settings.model_environment(os.environ),
        conversations=conversations,
        mcp=mcp,
        redactor=redactor,
        # The storage opens before the worker polls, so before any call reaches the gate.
        quotas=QuotaGate(storage.backend),
    )
    tools = ToolActivities(
        registry,
        settings.workspace_dir,
        storage.ledger,
        conversations,
        mcp,
        redactor=redactor,
        environment=program_environment(settings.workspace_dir, settings.shell_env, os.environ),
        memory=storage.memory,
    )
    archive = EventArchive(sealed)
    return ServedActivities(
        llm=llm,
        mcp=mcp,
        notify=notify,
        tools=tools,
        archive=ArchiveActivities(archive, store),
        turns=TurnActivities(storage.ledger, archive),
        children=ChildActivities(),
        memory=MemoryActivities(storage.memory),
        redactor=redactor,
        scheduled=ScheduledTurnActivities(),
    )


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
    identity: str | None = None,
) -> AgentWorker:
    """A worker for the agent workflow and its activities on the settings' task queue.

    `registry` (default: the tools of the settings' `tools` modules, as clients load them)
    holds the tools it offers. With `activities=False` it takes no LLM or tool call from
    the server (a short-lived process would abandon them), only workflow tasks, which may
    run pure tools locally; it then never opens the storage. `backends` serves models by
    name from something other than the OpenAI endpoint. `storage` (default: the settings')
    is opened when the worker starts; one passed in is left open at shutdown. `identity`
    names it to Temporal (default: the client's); a worker that takes tool calls adds its
    storage's kind to it. A bad WAYSTATION_WEBHOOKS raises WebhookConfigError, one sentence
    naming the endpoint. With `settings.worker_versioning` it joins the settings' Worker
    Deployment as their version (waystation.client.worker_versions), every run it starts
    pinned to that version, and it makes the version current if the deployment has none
    (waystation.worker.first_version).
    """
    registry = with_model_facts(
        registry or load_tools(settings.tools, settings.agents), settings.endpoints()
    )
    owns_storage = storage is None
    storage = storage or Storage.from_settings(settings)
    served = served_activities(
        settings, registry, storage, serves_activities=activities, backends=backends
    )
    worker_log.redact_records(served.redactor)
    # Other workers read the storage in the identity to refuse a queue with two ledgers.
    queue = task_queue or settings.task_queue
    offer = offer_of(settings, registry, list(backends or {}), queue)
    named = (
        with_offer(worker_identity(identity or client.identity, storage.kind), offer)
        if activities
        else identity
    )
    version = worker_version(settings) if settings.worker_versioning else None
    return AgentWorker(
        client,
        version=version,
        deployment_config=deployment_config(version),
        llm=served.llm,
        mcp=served.mcp,
        notify=served.notify,
        storage=storage,
        settings=settings,
        serves_tools=activities,
        owns_storage=owns_storage,
        offer=offer,
        task_queue=queue,
        workflows=[AgentWorkflow, NotificationWorkflow, ScheduledTurnWorkflow],
        activities=served.functions(),
        no_remote_activities=not activities,
        workflow_runner=WORKFLOW_RUNNER,
        interceptors=[RedactingInterceptor(served.redactor)],
        sticky_queue_schedule_to_start_timeout=STICKY_SCHEDULE_TO_START,
        max_cached_workflows=settings.worker_cached_tasks,
        tuner=worker_tuner(
            ActivitySlots(
                other=settings.worker_activity_slots,
                model_calls=settings.worker_model_call_slots,
            )
        ),
        graceful_shutdown_timeout=graceful_shutdown,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        identity=named,
    )


def deployment_config(version: WorkerDeploymentVersion | None) -> WorkerDeploymentConfig | None:
    """A versioned worker's: every run it starts pinned to its version. Pinned by the
    worker's default, not by the workflow classes: a class that declares a behaviour fails
    every workflow task on an unversioned worker (worker_versioning off)."""
    if version is None:
        return None
    return WorkerDeploymentConfig(
        version=version,
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


async def main() -> int:
    """Serve until SIGINT/SIGTERM; 1 (with one sentence on stderr) if the worker cannot start."""
    worker_log.configure_worker()
    try:
        settings = load_settings()
    except SettingsProblem as err:
        print(f"worker cannot start: {err}", file=sys.stderr, flush=True)
        return 1
    hide_starting_environment()  # a shell command cannot read the worker's secrets in /proc
    try:
        settings.webhook_endpoints()  # before connecting: nothing is started to stop
    except WebhookConfigError as err:
        print(f"worker cannot start: {err}", file=sys.stderr, flush=True)
        return 1
    try:
        client = await connect(
            settings, side="worker", wait_seconds=settings.worker_connect_wait_seconds
        )
    except TemporalUnavailableError as err:
        print(f"worker cannot start: {err}", file=sys.stderr, flush=True)
        return 1
    try:
        worker = build_worker(client, settings)
        await worker.prepare()
        await worker.say_how_others_differ()
    except (StorageError, ToolDefinitionError, WebhookConfigError) as err:
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
    if worker.offer.endpoints:
        model += f"; model endpoints: {', '.join(worker.offer.endpoints)}"
    names = [e.name for e in worker.notify.endpoints]
    webhooks = f"; webhooks: {', '.join(names)}" if names else ""
    print(
        f"worker polling task queue {settings.task_queue!r} on "
        f"{client.service_client.config.target_host} "
        f"(model endpoint: {model}; workspace: {settings.workspace_dir}; storage: "
        f"{worker.storage.location}, deployment {worker.storage.deployment_id}"
        f"{webhooks})",
        file=sys.stderr,
        flush=True,
    )
    async with worker:
        if worker.version_note:
            print(worker.version_note, file=sys.stderr, flush=True)
        await worker.serve_until(stop)
    if worker.refusal is not None:
        print(f"worker stopped: {worker.refusal}", file=sys.stderr, flush=True)
        return 1
    print("worker stopped", file=sys.stderr)
    return 0


def run() -> None:
    """`python worker.py`: the exit code of main(), without the interpreter's own shutdown
    under Temporal's core threads (which can abort a process that connected, -6)."""
    code = asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
