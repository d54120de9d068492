"""Notices for stuck tasks: `stuck` is no event of a task's log (a task whose workflow task
keeps failing appends nothing), so a worker whose endpoints want it looks for such tasks.

Every `webhook_stuck_check_seconds` it lists the running tasks of its task queue that
Temporal reports stuck (workflows/search.py's STUCK_QUERY, as auto-repair does), and for
each starts a notification workflow whose id is the task's, its run's and its failure
point's (the workflow task a repair resets it to). That id is kept once the workflow has
closed, so however many workers watch, and however often they look, each failure point is
told once; a task stuck again after a repair is a new point, told again.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from waystation.activities.run_history import read_run_input
from waystation.client.health import stuck, with_failures_readable
from waystation.workflows import search
from waystation.workflows.notice import (
    Notice,
    NotificationTargets,
    StuckNote,
    notification_workflow_id,
    stuck_notice,
)
from waystation.workflows.notifications import NotificationWorkflow
from waystation.workflows.run import WORKFLOW_TYPE

logger = logging.getLogger("waystation.worker")


async def task_text(client: Client, task_id: str, run_id: str) -> str:
    """The task's text, from the run's input ("" for a run started with none, or one this
    worker cannot decode: the notice goes out without it)."""
    try:
        run = await read_run_input(client, task_id, run_id)
        if run is not None and run.task is not None:
            return run.task.task
    except RPCError:
        raise  # Temporal's answer, not the text's: the round looks again
    except Exception as err:  # encrypted under a key this worker lacks, or not ours
        logger.warning("task %s is stuck and its text cannot be read here: %s", task_id, err)
    return ""


async def notify_stuck_tasks(
    client: Client, task_queue: str, targets: NotificationTargets
) -> list[str]:
    """Start the notification of each stuck task of the queue not told yet; their ids. A
    task that cannot be told is logged and passed: the ones after it are told all the same."""
    query = f'WorkflowType="{WORKFLOW_TYPE}" AND TaskQueue="{task_queue}" AND {search.STUCK_QUERY}'
    told: list[str] = []
    if not targets.wanting("stuck") or targets.retry is None:
        return told
    async for execution in client.list_workflows(query):
        try:
            notice = await _stuck_notice(client, execution.id, execution.run_id, targets)
            if notice is None:
                continue
            await client.start_workflow(
                NotificationWorkflow.run,
                notice,
                id=notification_workflow_id(notice),
                task_queue=task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            continue  # told already, by this worker or another
        except RPCError:
            raise  # Temporal unreachable: the whole round waits for the next
        except Exception:
            logger.exception("could not tell that task %s is stuck; trying again", execution.id)
            continue
        logger.warning("task %s is stuck: notified %s", execution.id, ", ".join(notice.endpoints))
        told.append(execution.id)
    return told


async def _stuck_notice(
    client: Client, task_id: str, run_id: str, targets: NotificationTargets
) -> Notice | None:
    """The notice of a listed task, or None when it is not stuck after all (visibility lags)
    or no endpoint wants to know."""
    handle = client.get_workflow_handle(task_id, run_id=run_id)
    history = await handle.fetch_history()
    events = await with_failures_readable(client.data_converter, list(history.events))
    found = stuck(await handle.describe(), events)
    if found is None:
        return None
    note = StuckNote(
        run_id=run_id,
        problem=found.problem,
        attempts=found.attempts,
        reset_to_event=found.reset_to_event,
    )
    return stuck_notice(task_id, await task_text(client, task_id, run_id), note, targets)


async def notify_stuck_now_and_then(
    client: Client, task_queue: str, targets: NotificationTargets, interval: float
) -> None:
    """Look for stuck tasks every `interval` seconds, until cancelled."""
    while True:
        try:
            await notify_stuck_tasks(client, task_queue, targets)
        except RPCError as err:  # Temporal unreachable for a moment: look again next round
            logger.warning("could not look for stuck tasks to notify: %s", err)
        except Exception:  # said, and tried again: the watch never ends quietly
            logger.exception("looking for stuck tasks to notify failed; trying again")
        await asyncio.sleep(interval)
