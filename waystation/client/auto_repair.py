"""Opt-in self-healing (WAYSTATION_AUTO_REPAIR=1): a worker repairs the stuck tasks of its
task queue by itself.

Temporal lists a task whose workflow task keeps failing with TemporalReportedProblems set
(waystation/client/health.py, workflows/search.py). The worker looks for such tasks now and then and
repairs each with `AgentRuntime.repair(by="worker")`: a reset to the last workflow task that
completed before the failure, with decisions re-applied and a `repaired` event in the log.
`repair` refuses a second repair at the same failure point (a task stuck there again has its
fault in the code, not in its history), so a worker never loops on one task.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio.service import RPCError

from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_errors import TaskError
from waystation.workflows import search
from waystation.workflows.run import WORKFLOW_TYPE

logger = logging.getLogger("waystation.worker")

REPAIRED_BY = "worker"


async def repair_stuck_tasks(runtime: AgentRuntime, refused: set[str]) -> list[str]:
    """Repair every stuck task of the runtime's task queue; returns the ids repaired. A task
    that cannot be repaired is logged once (its id and problem kept in `refused`)."""
    query = (
        f'WorkflowType="{WORKFLOW_TYPE}" AND TaskQueue="{runtime.settings.task_queue}" '
        f"AND {search.STUCK_QUERY}"
    )
    repaired: list[str] = []
    async for execution in runtime.client.list_workflows(query):
        try:
            await runtime.repair(execution.id, by=REPAIRED_BY)
        except TaskError as err:
            if f"{execution.id}: {err}" not in refused:
                refused.add(f"{execution.id}: {err}")
                logger.warning("task %s stays stuck: %s", execution.id, err)
            continue
        logger.warning("task %s was stuck and is repaired", execution.id)
        repaired.append(execution.id)
    return repaired


async def repair_now_and_then(runtime: AgentRuntime) -> None:
    """Look for stuck tasks every `auto_repair_interval_seconds`, until cancelled."""
    refused: set[str] = set()
    while True:
        try:
            await repair_stuck_tasks(runtime, refused)
        except RPCError as err:  # Temporal unreachable for a moment: try at the next round
            logger.warning("could not look for stuck tasks: %s", err)
        except Exception:  # anything else: said, and tried again; the loop never ends quietly
            logger.exception("looking for stuck tasks failed; trying again in the next round")
        await asyncio.sleep(runtime.settings.auto_repair_interval_seconds)
