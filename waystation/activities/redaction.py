"""Known secret values taken out of what a worker says: tool outputs, error texts, logs.

The second line of defence behind a shell command's minimal environment: whatever reaches
a tool's output or an error's text (an endpoint echoing its Authorization header, a file
holding a password) is redacted before it becomes an event, a failure in Temporal's
history, a log line or a span. The worker builds one `Redactor` from every secret its
settings hold (waystation/client/known_secrets.py) and hands it to the activities.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

from temporalio.exceptions import ApplicationError, FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

REDACTED = "[redacted secret]"
# Shorter values are not secrets worth the noise: a 3-character password would blank out
# every occurrence of those letters in every output.
MIN_SECRET_CHARS = 4


def url_without_credentials(url: str) -> str:
    """`url` fit to print: a user name and password in it (`http://user:secret@host/v1`)
    become REDACTED; a query string, where keys ride too (`?key=...`), is dropped."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Redactor:
    """Replaces each known secret value in a text by REDACTED (the longest first, so a value
    containing another is taken whole)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        self._secrets = tuple(values)
        self._pattern = re.compile("|".join(map(re.escape, values))) if values else None

    @property
    def longest(self) -> int:
        return len(self._secrets[0]) if self._secrets else 0

    def __bool__(self) -> bool:
        return self._pattern is not None

    def redact(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def held_back(self, text: str) -> int:
        """How many characters at the end of `text` could begin a secret the next chunk
        completes: a stream must hold them until it knows."""
        for size in range(min(len(text), self.longest - 1), 0, -1):
            tail = text[-size:]
            if any(secret.startswith(tail) for secret in self._secrets):
                return size
        return 0

    def stream(self) -> StreamRedaction:
        return StreamRedaction(self)

    def error(self, err: BaseException) -> BaseException:
        """`err` with every message of its cause chain redacted; `err` itself when no message
        names a secret. Temporal keeps the type, retryability and delay of an
        ApplicationError; another exception becomes one of its class name, as Temporal's
        failure converter would make it."""
        if not self or not _names_a_secret(self, err):
            return err
        redacted = self._one(err)
        cause = err.__cause__
        if cause is not None:
            redacted.__cause__ = self.error(cause)
        redacted.__suppress_context__ = True
        redacted.__traceback__ = err.__traceback__
        return redacted

    def _one(self, err: BaseException) -> BaseException:
        copy = self._copy(err)
        for name, value in vars(err).items():  # what the code attached (attempt_step's step)
            if not name.startswith("_") and not hasattr(type(copy), name):
                setattr(copy, name, value)
        return copy

    def _copy(self, err: BaseException) -> ApplicationError:
        if isinstance(err, ApplicationError):
            return ApplicationError(
                self.redact(err.message),
                *err.details,
                type=err.type,
                non_retryable=err.non_retryable,
                next_retry_delay=err.next_retry_delay,
                category=err.category,
            )
        if isinstance(err, FailureError):  # Temporal's own kinds: their message, a new error
            return ApplicationError(self.redact(err.message), type=type(err).__name__)
        return ApplicationError(self.redact(str(err)), type=type(err).__name__)


def _names_a_secret(redactor: Redactor, err: BaseException | None) -> bool:
    while err is not None:
        text = err.message if isinstance(err, FailureError) else str(err)
        if redactor.redact(text) != text:
            return True
        err = err.__cause__
    return False


class StreamRedaction:
    """Redaction of a text that arrives in chunks: a secret split across two chunks is
    redacted too, since the end of a chunk that could begin one is held back until the
    next chunk (or `end`) tells."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = ""

    def feed(self, chunk: str) -> str:
        """What of the text so far can be passed on."""
        if not self._redactor:
            return chunk
        text = self._redactor.redact(self._held + chunk)
        keep = self._redactor.held_back(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def end(self) -> str:
        """The rest, once the text is complete."""
        rest, self._held = self._redactor.redact(self._held), ""
        return rest


class RedactingInterceptor(Interceptor):
    """Every activity of the worker fails with its error texts redacted: what Temporal
    records as the failure (message and causes), and so what the task, its notices and
    the worker's own log of the attempt show."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RedactingActivity(next, self._redactor)


class _RedactingActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, redactor: Redactor) -> None:
        super().__init__(next)
        self._redactor = redactor

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except Exception as err:
            redacted = self._redactor.error(err)
            if redacted is err:
                raise
            raise redacted from redacted.__cause__


_FORMATTER = logging.Formatter()


class RedactingLogFilter(logging.Filter):
    """A log record's text and traceback with known secrets redacted (set on handlers: a
    filter on a logger does not see its children's records)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self._redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._redactor:
            return True
        said = record.getMessage()
        if (redacted := self._redactor.redact(said)) != said:
            record.msg, record.args = redacted, ()
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            shown = self._redactor.error(err)
            if shown is not err:  # for handlers that read the exception itself
                record.exc_info = (type(shown), shown, shown.__traceback__)
            # Formatters print this text instead of formatting the exception again.
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redactor.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self._redactor.redact(record.stack_info)
        return True
