"""The errors a task operation raises: each carries the task id and a sentence for people."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from temporalio.client import WorkflowFailureError, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from waystation.activities.payload_codec import DISAGREE, UNKNOWN_KEY, WRONG_KEY
from waystation.workflows.models import FailureDetail


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
    """A response to a person-request (a decision or an answer) was refused: unknown
    request, conflict, a choice it does not offer, or the task is not waiting (`kind`,
    from waystation/workflows/errors.py, says which)."""

    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class MessageRefusedError(TaskError):
    """A message was refused: the task failed or was cancelled (`kind` says which way on:
    resume or fork), it has too many messages waiting, or it is unknown."""

    def __init__(self, task_id: str, message: str, kind: str | None) -> None:
        super().__init__(task_id, message)
        self.kind = kind


class NoWorkerError(TaskError):
    """A query or Update that needs a worker got no answer in time (none runs, or all busy)."""


class UnreadableTaskError(TaskError):
    """Something the task stored cannot be decoded here (e.g. encrypted with an unknown key)."""


def not_found(task_id: str) -> TaskNotFoundError:
    return TaskNotFoundError(task_id, f"no task with id {task_id!r}")


@contextmanager
def task_errors(task_id: str) -> Iterator[None]:
    """Temporal's answers as the task errors they mean: an unknown workflow is
    TaskNotFoundError, a run that ended without an answer TaskFailedError or
    TaskCancelledError, a payload this side (or the worker that answers a query) cannot
    decode UnreadableTaskError; anything else goes through as it is."""
    try:
        yield
    except WorkflowFailureError as err:
        cause = err.cause
        if isinstance(cause, CancelledError):
            raise TaskCancelledError(task_id, f"task {task_id} was cancelled") from err
        if isinstance(cause, ApplicationError):
            detail = FailureDetail.of(cause.details)
            raise TaskFailedError(task_id, cause.message, detail.kind if detail else None) from err
        raise TaskFailedError(task_id, str(cause or err), None) from err
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise not_found(task_id) from err
        raise
    except (ValueError, WorkflowQueryFailedError) as err:
        if (problem := unreadable(task_id, err)) is not None:
            raise problem from err
        raise


def unreadable(task_id: str, err: BaseException) -> UnreadableTaskError | None:
    """The error to raise when `err` (a codec's, or a worker's failed query that carries its
    sentence) says a payload of the task cannot be decrypted here; None for anything else."""
    if isinstance(err, UnicodeDecodeError):
        return UnreadableTaskError(task_id, f"cannot decode what task {task_id} stored: {err}")
    return undecryptable(task_id, str(err))


def undecryptable(task_id: str, said: str, lead: str = "") -> UnreadableTaskError | None:
    """The error for a codec's sentence, said here or by the worker (in a failed query or
    workflow task; `lead` may say what that stops); None if `said` is not one."""
    if DISAGREE in said:
        return UnreadableTaskError(task_id, f"{lead or f'task {task_id}'}: {said}")
    if UNKNOWN_KEY not in said and WRONG_KEY not in said:
        return None
    return UnreadableTaskError(
        task_id,
        f"{lead or f'cannot read task {task_id}'}: {said}; keep the key it was written with in "
        "WAYSTATION_ENCRYPTION_KEYS",
    )


class UnknownToolsError(ValueError):
    """A task names tools that no worker offers; nothing was started."""

    def __init__(self, names: list[str], message: str) -> None:
        super().__init__(message)
        self.names = names


class TaskStuckError(TaskError):
    """The task's workflow task keeps failing, so it answers no query until it is repaired."""


class TaskEndedError(TaskError):
    """The task has already ended (done, failed or cancelled): there is nothing to cancel."""
