"""The step a failed model attempt belongs to, carried on its exception.

The SDK logs a failed attempt with the activity's info, which names the task and the
attempt but not the step. A command-line process that hosts the worker shows that log
line in its live view (waystation.worker.log), which the stream of the task lags behind:
without the step on the exception the view could only guess it from the events it has
shown so far, and the first failure of a task came before any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_STEP = "waystation_step"


@contextlib.contextmanager
def failures_name_step(step: int) -> Iterator[None]:
    """An exception leaving the block carries `step` (see `step_of`)."""
    try:
        yield
    except BaseException as err:  # a cancelled attempt (heartbeat timeout) is logged too
        # An exception that refuses attributes leaves the view to guess the step.
        with contextlib.suppress(Exception):
            setattr(err, _STEP, step)
        raise


def step_of(err: BaseException | None) -> int | None:
    """The step a failed attempt's exception was raised in, if `failures_name_step` said."""
    step = getattr(err, _STEP, None)
    return step if isinstance(step, int) else None
