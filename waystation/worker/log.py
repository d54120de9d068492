"""What a worker hosted in a command-line process logs, kept out of the live view's way.

The Temporal SDK logs every failed activity attempt as a warning with its traceback; with
no logging configured, Python prints that to stderr, ~30 lines per failed model attempt in
the middle of the live view. Without `--verbose` each record becomes one line instead, and
a failed attempt of the task being followed is handed to the live view, which says
"attempt n of m failed: why; next try in s". `--verbose` restores the full records.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TextIO

import temporalio.activity
from temporalio.exceptions import ApplicationError
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from waystation.activities.attempt_step import step_of
from waystation.activities.payload_codec import (
    DISAGREE,
    UNKNOWN_KEY,
    WRONG_KEY,
    UndecryptablePayloadError,
)
from waystation.activities.redaction import RedactingLogFilter, Redactor

_ACTIVITY_FAILED = "Completing activity as failed"
CORE_LOGGER = "temporalio.core"
VERBOSE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class AttemptFailure:
    """One failed attempt of an activity, as the worker that ran it logged it."""

    workflow_id: str
    activity: str
    attempt: int
    max_attempts: int | None
    """None when the retry policy sets no limit."""
    reason: str
    retry_in: timedelta | None
    """When the next attempt is due; None when there is none."""
    step: int | None = None
    """The task's step, when the activity named it (waystation.activities.attempt_step)."""

    def describe(self) -> str:
        of = f" of {self.max_attempts}" if self.max_attempts else ""
        then = "no more tries"
        if self.retry_in is not None:
            then = f"next try in {self.retry_in.total_seconds():g} s"
        return f"attempt {self.attempt}{of} failed: {self.reason}; {then}"


def attempt_failure(record: logging.LogRecord) -> AttemptFailure | None:
    """The failed attempt a log record reports, if it is the SDK's "activity failed" record."""
    info = getattr(record, "activity_info", None)
    if not isinstance(info, temporalio.activity.Info) or record.exc_info is None:
        return None
    if not str(record.msg).startswith(_ACTIVITY_FAILED):
        return None
    err = record.exc_info[1]
    policy = info.retry_policy
    max_attempts = policy.maximum_attempts if policy and policy.maximum_attempts else None
    last = max_attempts is not None and info.attempt >= max_attempts
    retry_in: timedelta | None = None
    if isinstance(err, ApplicationError) and (err.non_retryable or last):
        retry_in = None
    elif isinstance(err, ApplicationError) and err.next_retry_delay is not None:
        retry_in = err.next_retry_delay
    elif policy is not None and not last:
        ceiling = (policy.maximum_interval or policy.initial_interval * 100).total_seconds()
        # Capped in seconds first: a late attempt's raw backoff overflows a timedelta.
        growth = policy.backoff_coefficient ** min(info.attempt - 1, 64)
        retry_in = timedelta(seconds=min(policy.initial_interval.total_seconds() * growth, ceiling))
    reason = (err.message if isinstance(err, ApplicationError) else str(err)) or repr(err)
    return AttemptFailure(
        workflow_id=info.workflow_id or "",
        activity=info.activity_type,
        attempt=info.attempt,
        max_attempts=max_attempts,
        reason=reason.splitlines()[0],
        retry_in=retry_in,
        step=step_of(err),
    )


AttemptListener = Callable[[AttemptFailure], bool]
"""Shows a failed attempt (returns True), or declines it (False) to leave it to the log."""


class OneLineWorkerLog(logging.Handler):
    """Each warning or error of the hosted worker as one line; failed attempts of the task
    being followed go to the live view through `listener`."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(logging.WARNING)
        self.stream = stream or sys.stderr
        self.listener: AttemptListener | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if _said_elsewhere(record):
            return
        try:
            failure = attempt_failure(record)
            if failure is not None and self.listener is not None and self.listener(failure):
                return
            if failure is not None:
                line = f"{failure.activity} of {failure.workflow_id}: {failure.describe()}"
            else:
                line = (record.getMessage().splitlines() or [""])[0]
                if record.exc_info and record.exc_info[1] is not None:
                    line += f": {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            print(f"worker: {line} (--verbose for details)", file=self.stream, flush=True)
        except Exception:
            self.handleError(record)


# The SDK's note on the activation after a failed one (the run was evicted): a consequence.
_AFTER_EVICTION = "Missing initialize workflow"


def _said_elsewhere(record: logging.LogRecord) -> bool:
    """A payload this worker cannot decrypt (no key, an unknown one, the wrong one): the
    command that needed it says so itself, in one line (a failed query, or `status` showing
    the task stuck)."""
    err = record.exc_info[1] if record.exc_info else None
    said = str(err) if err is not None else record.getMessage()
    return _names_a_key(said) or _AFTER_EVICTION in said


_handler: OneLineWorkerLog | None = None


def configure(verbose: bool) -> None:
    """Set up logging for a command-line process; call once, before a worker starts."""
    global _handler
    # The SDK's core writes its own warnings to stdout, in the middle of a command's output
    # (`events` prints JSON lines there): hand them to Python's logging instead, and below
    # ERROR only with --verbose.
    core = TelemetryFilter(core_level="WARN" if verbose else "ERROR", other_level="ERROR")
    forwarded = LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER))
    telemetry = TelemetryConfig(logging=LoggingConfig(filter=core, forwarding=forwarded))
    Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)
    root = logging.getLogger()
    if verbose:
        logging.basicConfig(level=logging.WARNING, format=VERBOSE_FORMAT, stream=sys.stderr)
        return
    # The full activity info (attempt, retry policy) rides on the SDK's own log records.
    temporalio.activity.logger.full_activity_info_on_extra = True
    _handler = OneLineWorkerLog()
    root.addHandler(_handler)
    root.setLevel(logging.WARNING)


_SAID_ONCE_MAX = 10_000


class SaidOnce(logging.Filter):
    """A workflow task that fails on a payload the worker cannot decrypt fails again on each
    retry (until the keys change), and the SDK logs a traceback each time, the core a line:
    each such sentence becomes one line, said once (it names the task)."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if record.name.startswith(CORE_LOGGER) and _names_a_key(record.getMessage()):
            return False  # the SDK's own record of the same failure says it
        if not isinstance(err, UndecryptablePayloadError):
            return True
        said = str(err)
        if said in self._said or len(self._said) >= _SAID_ONCE_MAX:
            return False
        self._said.add(said)
        record.msg = f"{(record.getMessage().splitlines() or [''])[0]}: {said}"
        record.args, record.exc_info, record.exc_text = (), None, None
        return True


def _names_a_key(said: str) -> bool:
    return DISAGREE in said or UNKNOWN_KEY in said or WRONG_KEY in said


def configure_worker() -> None:
    """Logging for `python worker.py` (call before it connects): warnings and errors on
    stderr, the SDK core's among them, as Python shows them with no logging set up; a
    payload the worker cannot decrypt is one line (`SaidOnce`). Under a command that set
    logging up already (`starter.py worker`), only the filter is added."""
    root = logging.getLogger()
    if not root.handlers:
        forwarded = LogForwardingConfig(logger=logging.getLogger(CORE_LOGGER))
        core = TelemetryFilter(core_level="WARN", other_level="ERROR")
        telemetry = TelemetryConfig(logging=LoggingConfig(filter=core, forwarding=forwarded))
        Runtime.set_default(Runtime(telemetry=telemetry), error_if_already_set=False)
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.addFilter(SaidOnce())


def listen(listener: AttemptListener | None) -> None:
    """Hand failed attempts to `listener` (a live view), or stop doing so with None."""
    if _handler is not None:
        _handler.listener = listener


def redact_records(redactor: Redactor) -> None:
    """Known secrets out of every record the root logger's handlers write (a worker's;
    the latest worker built in a process sets the values)."""
    for handler in logging.getLogger().handlers:
        for earlier in [f for f in handler.filters if isinstance(f, RedactingLogFilter)]:
            handler.removeFilter(earlier)
        handler.addFilter(RedactingLogFilter(redactor))
