"""Model endpoints: where a model named `ENDPOINT:MODEL` is called, and in which protocol.

Three exist by default, each reading its provider's usual variables: `openai` (chat
completions: OPENAI_API_KEY, OPENAI_BASE_URL), `openai-responses` (the Responses API, the
same variables) and `anthropic` (the Messages API: ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL).
WAYSTATION_MODEL_ENDPOINTS declares more, or replaces one of these, as JSON:
`{"<name>": {"protocol": "chat" | "responses" | "anthropic", "base_url": "...",
"api_key_env": "VARIABLE", "headers": {...}}}`. A key is named by its variable, never
given: settings output, workflow inputs and history never hold it. `${VAR}` in a header is
expanded from the worker's environment when the endpoint is first called.

A bare model name (no known endpoint before a `:`) means what it always meant: the
OpenAI-compatible endpoint (or `offline`). `qwen2.5:7b`, as Ollama names a model, is bare.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from waystation.settings.validation import validation_sentence

EndpointProtocol = Literal["chat", "responses", "anthropic"]
ENDPOINT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
SEPARATOR = ":"


class ModelEndpointError(ValueError):
    """An endpoint declaration that cannot be used, in one sentence."""


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


def split_model_name(name: str, endpoints: Mapping[str, object]) -> tuple[str | None, str]:
    """(endpoint, model) of `ENDPOINT:MODEL`; (None, name) for a bare name."""
    endpoint, separator, model = name.partition(SEPARATOR)
    if separator and model and endpoint in endpoints:
        return endpoint, model
    return None, name
