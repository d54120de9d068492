"""Model endpoints: where a model named `ENDPOINT:MODEL` is called, and in which protocol.

Three exist by default, each reading its provider's usual variables: `openai` (chat
completions: OPENAI_API_KEY, OPENAI_BASE_URL), `openai-responses` (the Responses API, the
same variables) and `anthropic` (the Messages API: ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL).
WAYSTATION_MODEL_ENDPOINTS declares more, or replaces one of these, as JSON:
`{"<name>": {"protocol": "chat" | "responses" | "anthropic", "base_url": "...",
"api_key_env": "VARIABLE", "headers": {...}, "limits": {...}, "prices": {...}}}` (limits:
a provider's quota, honoured by every worker together; prices: US dollars per million
tokens). A key is named by its variable, never given: settings output, workflow inputs and
history never hold it. `${VAR}` in a header is expanded from the worker's environment when
the endpoint is first called.

A bare model name (no known endpoint before a `:`) means what it always meant: the
OpenAI-compatible endpoint (or `offline`). `qwen2.5:7b`, as Ollama names a model, is bare.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from waystation.prices import ModelPrice
from waystation.settings.validation import validation_sentence

EndpointProtocol = Literal["chat", "responses", "anthropic"]
ENDPOINT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
SEPARATOR = ":"


class ModelEndpointError(ValueError):
    """An endpoint declaration that cannot be used, in one sentence."""


class QuotaLimits(BaseModel):
    """A provider's quota on one key: what every worker of the deployment honours together
    (activities/quotas.py). Unset: no limit of that kind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1, le=10**9)
    input_tokens_per_minute: int | None = Field(default=None, ge=1, le=10**12)
    output_tokens_per_minute: int | None = Field(default=None, ge=1, le=10**12)
    concurrent_requests: int | None = Field(default=None, ge=1, le=10**6)

    @property
    def limited(self) -> bool:
        """Whether any of these limits is set (an endpoint's `per_model` is no limit of its
        own: an endpoint with only those is no quota that its calls wait for)."""
        return any(getattr(self, name) is not None for name in QuotaLimits.model_fields)


class EndpointLimits(QuotaLimits):
    """An endpoint's quota, and (`per_model`) a quota of one of its models on top of it."""

    per_model: dict[str, QuotaLimits] = Field(default_factory=dict)


# The key of `prices` that prices every model the endpoint has no entry for.
ANY_MODEL = "*"


class ModelEndpoint(BaseModel):
    """One endpoint: its protocol, where it is, and the variable that holds its key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: EndpointProtocol
    base_url: str | None = Field(
        default=None, description="Default: the provider's own API (or base_url_env's value)."
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The environment variable that holds the key (on the worker).",
    )
    base_url_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="A variable whose value, when set, is the base URL (the defaults' way).",
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="Sent with every request; `${VAR}` is expanded."
    )
    limits: EndpointLimits | None = Field(
        default=None, description="The provider's quota, honoured by every worker together."
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description='US dollars per million tokens, by model; "*" prices the others.',
    )

    def price_of(self, model: str) -> ModelPrice | None:
        """The price of `model` (the name the endpoint knows it by): its own, else `*`'s."""
        return self.prices.get(model) or self.prices.get(ANY_MODEL)

    def quotas_of(self, endpoint: str, model: str) -> list[tuple[str, QuotaLimits]]:
        """The quotas a call of `model` counts against, each with its key (shared by every
        worker): the endpoint's, then the model's own."""
        if self.limits is None:
            return []
        quotas: list[tuple[str, QuotaLimits]] = []
        if self.limits.limited:
            quotas.append((endpoint, self.limits))
        own = self.limits.per_model.get(model)
        if own is not None and own.limited:
            quotas.append((f"{endpoint}{SEPARATOR}{model}", own))
        return quotas

    def shown(self) -> dict[str, object]:
        """As `ws config` shows it: a header's value may be a key, so only `${VAR}` ones show."""
        shown = self.model_dump(exclude_none=True)
        shown["headers"] = {
            name: value if _ONLY_VARIABLES.fullmatch(value) else "****"
            for name, value in self.headers.items()
        }
        if not self.prices:
            shown.pop("prices")
        return shown


# A header value made only of `${VAR}` references (and spaces, `Bearer `-like words) holds
# no secret itself.
_ONLY_VARIABLES = re.compile(r"(?:[A-Za-z-]+ )?(?:\$\{[A-Za-z_][A-Za-z0-9_]*\})+")

DEFAULT_ENDPOINTS: dict[str, ModelEndpoint] = {
    "openai": ModelEndpoint(
        protocol="chat", api_key_env="OPENAI_API_KEY", base_url_env="OPENAI_BASE_URL"
    ),
    "openai-responses": ModelEndpoint(
        protocol="responses", api_key_env="OPENAI_API_KEY", base_url_env="OPENAI_BASE_URL"
    ),
    "anthropic": ModelEndpoint(
        protocol="anthropic", api_key_env="ANTHROPIC_API_KEY", base_url_env="ANTHROPIC_BASE_URL"
    ),
}
# The endpoint a bare model name is called at.
BARE_NAME_ENDPOINT = "openai"


def parse_endpoints(text: str) -> dict[str, ModelEndpoint]:
    """The endpoints WAYSTATION_MODEL_ENDPOINTS declares (ModelEndpointError: one sentence)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelEndpointError(f"WAYSTATION_MODEL_ENDPOINTS is not JSON: {err.msg}") from None
    if not isinstance(raw, dict):
        raise ModelEndpointError(
            'WAYSTATION_MODEL_ENDPOINTS must be a JSON object: {"<name>": {"protocol": ...}}'
        )
    declared: dict[str, ModelEndpoint] = {}
    for name, entry in raw.items():
        if not ENDPOINT_NAME.match(name):
            raise ModelEndpointError(
                f"model endpoint name {name!r} must be 1-40 lower-case letters, digits, '-' "
                "or '_', starting with a letter or a digit"
            )
        try:
            declared[name] = ModelEndpoint.model_validate(entry)
        except ValidationError as err:
            raise ModelEndpointError(
                f"model endpoint {name!r}: {validation_sentence(err)}"
            ) from None
    return declared


def all_endpoints(declared: Mapping[str, ModelEndpoint]) -> dict[str, ModelEndpoint]:
    """The default endpoints with the declared ones over them."""
    return {**DEFAULT_ENDPOINTS, **declared}


def split_model_name(name: str, endpoints: Container[str]) -> tuple[str | None, str]:
    """(endpoint, model) of `ENDPOINT:MODEL`; (None, name) for a bare name."""
    endpoint, separator, model = name.partition(SEPARATOR)
    if separator and model and endpoint in endpoints:
        return endpoint, model
    return None, name


def is_configured(endpoint: ModelEndpoint, environ: Mapping[str, str]) -> bool:
    """Whether `environ` (a worker's, or a client's) says where or with which key to call it."""
    named = (endpoint.api_key_env, endpoint.base_url_env)
    return endpoint.base_url is not None or any(environ.get(name) for name in named if name)


def base_url_of(endpoint: ModelEndpoint, environ: Mapping[str, str]) -> str | None:
    """Its base URL: the declared one, else its base_url_env's value (None: the provider's)."""
    if endpoint.base_url is not None:
        return endpoint.base_url
    return environ.get(endpoint.base_url_env) or None if endpoint.base_url_env else None


def api_key_of(endpoint: ModelEndpoint, environ: Mapping[str, str]) -> str | None:
    return environ.get(endpoint.api_key_env) or None if endpoint.api_key_env else None


def how_to_configure(name: str, endpoint: ModelEndpoint) -> str:
    """What a worker sets to have the endpoint, as a need names it."""
    variables = [v for v in (endpoint.api_key_env, endpoint.base_url_env) if v]
    how = f"set {' or '.join(variables)} on the worker" if variables else "declare it"
    return f"the model endpoint {name!r} ({how})"
