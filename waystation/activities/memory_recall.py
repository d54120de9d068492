"""The `recall_memory` activity: the items a task asked to start with (`AgentTask.recall`),
read from the deployment's memory store. Reads happen here, never in workflow code."""

from __future__ import annotations

from temporalio import activity

from waystation.activities.storage.memory import MemoryStore
from waystation.workflows.memory import RecalledItem, RecallRequest, RecallResult


class MemoryActivities:
    """Activities over the memory store a worker opens with its storage."""

    def __init__(self, memory: MemoryStore) -> None:
        self._memory = memory

    @activity.defn(name="recall_memory")
    async def recall_memory(self, request: RecallRequest) -> RecallResult:
        """The items of the namespace that best match the query."""
        found = await self._memory.search(request.namespace, request.query, request.limit)
        return RecallResult(items=[RecalledItem(key=i.key, value=i.value) for i in found])
