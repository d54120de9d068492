"""How a task id sits in a route's path. A sub-agent's id is its parent's id, the step and
the call id joined by slashes (workflows/agents.py `child_id`), so `TASK` takes those
segments too, and only those: `/tasks/ID/log` is still the log of task ID, and
`/tasks/ID/1/call_1_0/log` the log of ID's sub-agent."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from starlette.convertors import Convertor, register_url_convertor


class TaskIdConvertor(Convertor[str]):
    """A task id: one segment, then a `/<step>/<call id>` pair per level of sub-agent."""

    # The first segment may be empty so that `/tasks//log` reaches the route, whose
    # validation says the id is empty (422), rather than matching no route at all.
    regex = r"[^/]*(?:/[0-9]+/[^/]+)*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("task_id", TaskIdConvertor())
TASK = "{task_id:task_id}"  # the path parameter `task_id` of every task route
# A task id in a route: a sub-agent's holds slashes, sent as they are or as %2F.
TaskId = Annotated[str, Path(min_length=1, max_length=1000)]
