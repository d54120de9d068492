"""The errors a task operation raises: each carries the task id and a sentence for people."""

from __future__ import annotations


class TaskError(Exception):
    """Base of the errors a task operation raises."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class TaskNotFoundError(TaskError):
    pass


class TaskFailedError(TaskError):
    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class TaskCancelledError(TaskError):
    pass


class DecisionError(TaskError):
    """A decision was refused: unknown request, conflict, or the task is not waiting."""

    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class NoWorkerError(TaskError):
    """A query or Update that needs a worker got no answer in time (none runs, or all busy)."""


class UnreadableTaskError(TaskError):
    """Something the task stored cannot be decoded here (e.g. encrypted with an unknown key)."""


class TaskStuckError(TaskError):
    """The task's workflow task keeps failing, so it answers no query until it is repaired."""
