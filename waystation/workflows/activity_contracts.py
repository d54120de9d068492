"""The activities the workflows call, as typed contracts: each one's registered name, its
argument and its result.

Workflow code sits at the bottom of the layers (docs/architecture.md) and never imports an
activity's implementation. It schedules these contracts instead: Temporal needs only the
name and the types, and a worker serves the implementation registered under the same name
(activities/, worker/). tests/test_layers.py checks that every contract has an
implementation with the same name and types, and that the worker registers it.
"""

from __future__ import annotations

from temporalio import activity

from waystation.workflows.memory import RecallRequest, RecallResult
from waystation.workflows.models import (
    ConversationSnapshot,
    LlmRequest,
    LlmResult,
    SummaryRequest,
    SummaryResult,
    ToolRequest,
    ToolResult,
)
from waystation.workflows.notice import Delivered, Delivery, NotificationTargets
from waystation.workflows.run import (
    ArchiveRequest,
    ChildOutcome,
    ClaimedTurn,
    SealRequest,
    TurnClaim,
)
from waystation.workflows.scheduled import TurnDelivered, TurnDelivery
from waystation.workflows.tool_catalog import ListToolsRequest, ToolCatalog


class ContractOnly(NotImplementedError):
    """A contract was called as a function: the worker's implementation runs instead."""


@activity.defn(name="call_llm")
async def call_llm(request: LlmRequest) -> LlmResult:
    raise ContractOnly("call_llm")


@activity.defn(name="summarize_context")
async def summarize_context(request: SummaryRequest) -> SummaryResult:
    raise ContractOnly("summarize_context")


@activity.defn(name="save_conversation")
async def save_conversation(snapshot: ConversationSnapshot) -> None:
    raise ContractOnly("save_conversation")


@activity.defn(name="run_tool")
async def run_tool(request: ToolRequest) -> ToolResult:
    raise ContractOnly("run_tool")


@activity.defn(name="list_tools")
async def list_tools(request: ListToolsRequest) -> ToolCatalog:
    raise ContractOnly("list_tools")


@activity.defn(name="child_outcome")
async def child_outcome(child_id: str) -> ChildOutcome:
    raise ContractOnly("child_outcome")


@activity.defn(name="archive_events")
async def archive_events(request: ArchiveRequest) -> None:
    raise ContractOnly("archive_events")


@activity.defn(name="seal_run")
async def seal_run(request: SealRequest) -> None:
    raise ContractOnly("seal_run")


@activity.defn(name="claim_turn")
async def claim_turn(claim: TurnClaim) -> ClaimedTurn:
    raise ContractOnly("claim_turn")


@activity.defn(name="notification_targets")
async def notification_targets() -> NotificationTargets:
    raise ContractOnly("notification_targets")


@activity.defn(name="deliver_notification")
async def deliver_notification(delivery: Delivery) -> Delivered:
    raise ContractOnly("deliver_notification")


@activity.defn(name="recall_memory")
async def recall_memory(request: RecallRequest) -> RecallResult:
    raise ContractOnly("recall_memory")


@activity.defn(name="deliver_scheduled_turn")
async def deliver_scheduled_turn(delivery: TurnDelivery) -> TurnDelivered:
    raise ContractOnly("deliver_scheduled_turn")


@activity.defn(name="watch_scheduled_turn")
async def watch_scheduled_turn(delivered: TurnDelivered) -> bool:
    raise ContractOnly("watch_scheduled_turn")


CONTRACTS = (
    call_llm,
    summarize_context,
    save_conversation,
    run_tool,
    list_tools,
    child_outcome,
    archive_events,
    seal_run,
    claim_turn,
    notification_targets,
    deliver_notification,
    recall_memory,
    deliver_scheduled_turn,
    watch_scheduled_turn,
)
