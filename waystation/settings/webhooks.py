"""WAYSTATION_WEBHOOKS: the endpoints a worker notifies, read and checked at its start.

The setting is a JSON list, or the path of a file holding one:

    [{"name": "ops", "url": "https://hooks.example.com/waystation",
      "events": ["approval_requested", "question_asked", "failed", "stuck"],
      "secret": "a long random string", "format": "json"}]

Every problem is one sentence naming the endpoint, and never quotes its URL or secret (a
Slack URL is a credential too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from waystation.vocabulary import NOTIFIABLE_KINDS, NotifiableKind

ENDPOINT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SETTING = "WAYSTATION_WEBHOOKS"
_FIELDS = ("name", "url", "events", "secret", "format")


class WebhookConfigError(ValueError):
    """WAYSTATION_WEBHOOKS (or WAYSTATION_CONSOLE_URL) cannot be used: one sentence why."""


class WebhookEndpoint(BaseModel):
    """One endpoint: where notices go, which kinds it wants, the secret that signs them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    events: list[NotifiableKind] = Field(min_length=1)
    secret: SecretStr | None = None
    format: Literal["json", "slack"] = "json"

    def shown(self) -> dict[str, Any]:
        """For `ws config`: the secret masked, and of the URL only its scheme and host (the
        path of a Slack incoming webhook is its credential)."""
        parts = urlsplit(self.url)
        masked = f"{parts.scheme}://{parts.netloc}/****" if parts.path.strip("/") else self.url
        return {
            "name": self.name,
            "url": masked,
            "events": list(self.events),
            "secret": "****" if self.secret is not None else None,
            "format": self.format,
        }


def is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def parse_webhooks(raw: str) -> list[WebhookEndpoint]:
    """The endpoints of the setting's value: JSON, or the path of a JSON file."""
    text = raw.strip()
    if not text:
        return []
    if text[0] not in "[{":
        path = Path(text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise WebhookConfigError(
                f"{SETTING} is neither JSON nor a file that can be read: {path}: {err.strerror}"
            ) from None
        source = f"webhooks file {path}"
    else:
        source = SETTING
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise WebhookConfigError(f"{source} is not JSON: {err}") from None
    if not isinstance(value, list):
        raise WebhookConfigError(
            f"{source} must be a JSON list of endpoints, each with name, url, events and secret"
        )
    endpoints = [endpoint_of(entry, index) for index, entry in enumerate(value, start=1)]
    names = [e.name for e in endpoints]
    if repeated := sorted({n for n in names if names.count(n) > 1}):
        raise WebhookConfigError(f"{source} names webhook endpoint {repeated[0]!r} twice")
    return endpoints


def endpoint_of(entry: object, index: int) -> WebhookEndpoint:
    """One checked endpoint; `index` (from 1) names it while its name is unknown."""
    if not isinstance(entry, dict):
        raise WebhookConfigError(f"webhook endpoint {index} is not a JSON object")
    name = entry.get("name")
    if not isinstance(name, str) or not ENDPOINT_NAME.match(name):
        raise WebhookConfigError(
            f"webhook endpoint {index} needs a name of 1 to 64 letters, digits, '.', '_' or '-'"
        )
    label = f"webhook endpoint {name!r}"
    unknown = [k for k in entry if k not in _FIELDS]
    if unknown:
        raise WebhookConfigError(
            f"{label} has an unknown field {unknown[0]!r}; known: {', '.join(_FIELDS)}"
        )
    url = entry.get("url")
    if not isinstance(url, str) or not is_http_url(url):
        raise WebhookConfigError(f"{label} needs a url that is an http:// or https:// URL")
    events = entry.get("events")
    if not isinstance(events, list) or not events:
        raise WebhookConfigError(
            f"{label} needs events, a list of some of: {', '.join(NOTIFIABLE_KINDS)}"
        )
    if strange := [e for e in events if e not in NOTIFIABLE_KINDS]:
        raise WebhookConfigError(
            f"{label} wants an unknown event {strange[0]!r}; known: {', '.join(NOTIFIABLE_KINDS)}"
        )
    fmt = entry.get("format", "json")
    if fmt not in ("json", "slack"):
        raise WebhookConfigError(f"{label} has format {fmt!r}; it is json or slack")
    secret = entry.get("secret")
    # A Slack incoming webhook checks no signature: its URL is the credential.
    if fmt == "json" and (not isinstance(secret, str) or not secret.strip()):
        raise WebhookConfigError(
            f"{label} has no secret: give one, so receivers can check the signature"
        )
    if secret is not None and not isinstance(secret, str):
        raise WebhookConfigError(f"{label} has a secret that is not a string")
    try:
        return WebhookEndpoint.model_validate(entry)
    except ValidationError as err:  # checked above: only a malformed value gets here
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise WebhookConfigError(f"{label}: {where}: {problem['msg']}") from None


def check_console_url(value: str | None) -> str | None:
    """WAYSTATION_CONSOLE_URL without a trailing slash, or None; refused unless http(s)."""
    if value is None or not value.strip():
        return None
    if not is_http_url(value.strip()):
        raise WebhookConfigError(
            "WAYSTATION_CONSOLE_URL must be an http:// or https:// URL, e.g. http://localhost:8000"
        )
    return value.strip().rstrip("/")
