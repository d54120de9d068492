"""The notification activities: which kinds the worker's endpoints want (asked as each run
of a task begins), and one signed delivery of a notice to one endpoint.

A delivery is retried by Temporal with backoff (workflows/options.py); this activity only
says which failures are worth retrying: 408, 429 (Retry-After honoured), 5xx, timeouts and
connection errors are; any other answer but 2xx is a refusal. The endpoint's URL and secret
are read from the worker's settings here, and no error message quotes them.
"""

from __future__ import annotations

import email.utils
import json
import time
from datetime import timedelta

import httpx2
from temporalio import activity
from temporalio.exceptions import ApplicationError

from waystation.activities.heartbeat import keep_heartbeating
from waystation.activities.notify import signing
from waystation.activities.notify.payloads import json_body, slack_body
from waystation.settings import Settings
from waystation.settings.webhooks import WebhookEndpoint
from waystation.workflows import errors
from waystation.workflows.notice import Delivered, Delivery, DeliveryRetry, NotificationTargets
from waystation.workflows.options import DEFAULT_HEARTBEAT_TIMEOUT

RETRIED_STATUSES = frozenset({408, 429})
ANSWER_EXCERPT_CHARS = 200
USER_AGENT = "waystation-webhooks/1"


class NotificationActivities:
    """The worker's endpoints (WAYSTATION_WEBHOOKS) and the client that reaches them.
    Built once per worker (worker.py)."""

    def __init__(
        self,
        endpoints: list[WebhookEndpoint],
        retry: DeliveryRetry,
        console_url: str | None,
        *,
        serves_activities: bool = True,
    ) -> None:
        self._endpoints = {e.name: e for e in endpoints}
        self._serves_activities = serves_activities
        self._retry = retry
        self._console = console_url
        self._http: httpx2.AsyncClient | None = None

    @property
    def endpoints(self) -> list[WebhookEndpoint]:
        return list(self._endpoints.values())

    def targets(self) -> NotificationTargets:
        wanted = {e.name: list(e.events) for e in self._endpoints.values()}
        return NotificationTargets(endpoints=wanted, retry=self._retry)

    @activity.defn(name="notification_targets")
    async def notification_targets(self) -> NotificationTargets:
        """Which events each endpoint wants, by name, and how deliveries are retried: what
        a run needs to know, without I/O, to start a notification when one is due. Asked
        locally of a worker that serves no activities, it has no say (`settled` False)."""
        if activity.info().is_local and not self._serves_activities:
            return NotificationTargets(settled=False)
        return self.targets()

    @activity.defn(name="deliver_notification")
    async def deliver(self, delivery: Delivery) -> Delivered:
        """POST the notice to the endpoint, signed; the same idempotency key every attempt."""
        endpoint = self._endpoints.get(delivery.endpoint)
        if endpoint is None:
            raise ApplicationError(
                f"this worker has no webhook endpoint {delivery.endpoint!r} in WAYSTATION_WEBHOOKS",
                type=errors.WEBHOOK_NOT_CONFIGURED,
                non_retryable=True,
            )
        notice = delivery.notice
        shaped = slack_body if endpoint.format == "slack" else json_body
        body = json.dumps(shaped(notice, self._console), ensure_ascii=False).encode()
        attempt = activity.info().attempt
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            signing.IDEMPOTENCY_HEADER: notice.key,
            signing.TIMESTAMP_HEADER: timestamp,
            signing.EVENT_HEADER: notice.kind,
            signing.ATTEMPT_HEADER: str(attempt),
        }
        if endpoint.secret is not None:
            secret = endpoint.secret.get_secret_value()
            headers[signing.SIGNATURE_HEADER] = signing.signature(secret, timestamp, body)
        name = endpoint.name
        timeout = notice.retry.timeout_seconds
        try:
            async with keep_heartbeating():
                response = await self._client().post(
                    endpoint.url, content=body, headers=headers, timeout=timeout
                )
        except httpx2.TimeoutException:
            raise ApplicationError(
                f"endpoint {name!r} did not answer within {timeout:g} s",
                type=errors.WEBHOOK_UNAVAILABLE,
            ) from None
        except httpx2.HTTPError as err:
            # The class only: an HTTP error's text may quote the URL.
            raise ApplicationError(
                f"endpoint {name!r} could not be reached ({type(err).__name__})",
                type=errors.WEBHOOK_UNAVAILABLE,
            ) from None
        status = response.status_code
        if 200 <= status < 300:
            return Delivered(endpoint=name, status=status, attempt=attempt)
        said = " ".join(response.text.split())[:ANSWER_EXCERPT_CHARS]
        answer = f"HTTP {status}" + (f" ({said})" if said else "")
        if status in RETRIED_STATUSES or status >= 500:
            raise ApplicationError(
                f"endpoint {name!r} answered {answer}",
                type=errors.WEBHOOK_UNAVAILABLE,
                next_retry_delay=retry_after(response.headers),
            )
        raise ApplicationError(
            f"endpoint {name!r} refused the notification: {answer}; not retried",
            type=errors.WEBHOOK_REJECTED,
            non_retryable=True,
        )

    def _client(self) -> httpx2.AsyncClient:
        # Redirects are not followed: a signed notice goes where it was configured to go.
        if self._http is None:
            self._http = httpx2.AsyncClient(follow_redirects=False)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def retry_after(headers: httpx2.Headers) -> timedelta | None:
    """The wait an answer's Retry-After asks for: seconds, or an HTTP date."""
    value = headers.get("retry-after")
    if not value:
        return None
    if value.strip().isdigit():
        return timedelta(seconds=int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return timedelta(seconds=max(0.0, when.timestamp() - time.time()))


def webhook_retry(settings: Settings) -> DeliveryRetry:
    """How the deployment retries a webhook delivery (WAYSTATION_WEBHOOK_RETRY_*)."""
    heartbeat = settings.heartbeat_timeout_seconds or DEFAULT_HEARTBEAT_TIMEOUT.total_seconds()
    return DeliveryRetry(
        initial_seconds=settings.webhook_retry_initial_seconds,
        max_interval_seconds=settings.webhook_retry_max_seconds,
        hours=settings.webhook_retry_hours,
        timeout_seconds=settings.webhook_timeout_seconds,
        heartbeat_seconds=heartbeat,
    )
