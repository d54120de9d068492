"""What is known of models by name: their context window and whether their endpoint honours
native structured output. Read when a task is created (client/starting.py) and when a
worker loads its sub-agents: the task then holds the values, and workflow code reads only
the task, so adding a model here never changes what a running task does when it replays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from waystation.settings.model_endpoints import (
    BARE_NAME_ENDPOINT,
    DEFAULT_ENDPOINTS,
    ModelEndpoint,
    split_model_name,
)

# The context window of well-known models (tokens), by prefix of the model id; an unknown
# model gets the safe default.
DEFAULT_CONTEXT_WINDOW = 16_000
CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("gpt-4.1", 1_000_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("claude", 200_000),
    ("gemini", 1_000_000),
    ("llama-3", 8_192),
    ("llama3", 8_192),
    ("qwen2.5", 32_768),
    ("qwen3", 32_768),
    ("mistral", 32_768),
)
# OpenAI's models that honour `response_format: json_schema` (strict structured output),
# on the chat and responses protocols.
NATIVE_STRUCTURED_OUTPUT = ("gpt-4o", "gpt-4.1", "gpt-5", "o3", "o4-mini", "o1")


class ModelFacts(Protocol):
    """The fields of ModelSettings (workflows/models.py) these facts fill in."""

    name: str
    fallback_models: list[str]
    context_window_tokens: int | None
    structured_output: Literal["auto", "tool", "native"]


def _model_id(name: str, endpoints: Mapping[str, ModelEndpoint]) -> tuple[ModelEndpoint, str]:
    endpoint, model = split_model_name(name, endpoints)
    return endpoints[endpoint or BARE_NAME_ENDPOINT], model.lower().rsplit("/", 1)[-1]


def context_window(name: str, endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS) -> int:
    """The window of a well-known model by its id's prefix (provider prefixes ignored)."""
    _, model = _model_id(name, endpoints)
    for prefix, window in CONTEXT_WINDOWS:
        if model.startswith(prefix):
            return window
    return DEFAULT_CONTEXT_WINDOW


def structured_output(
    name: str, endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS
) -> Literal["native", "tool"]:
    """`native` for OpenAI's models known to honour it on an OpenAI protocol, else `tool`."""
    endpoint, model = _model_id(name, endpoints)
    native = endpoint.protocol in ("chat", "responses") and model.startswith(
        NATIVE_STRUCTURED_OUTPUT
    )
    return "native" if native else "tool"


def fact_updates(
    model: ModelFacts, endpoints: Mapping[str, ModelEndpoint] = DEFAULT_ENDPOINTS
) -> dict[str, Any]:
    """What a model's settings leave to these facts, resolved over every model it may call
    (`name` and its fallbacks): the smallest window, and `native` only if all honour it."""
    names = [model.name, *model.fallback_models]
    updates: dict[str, Any] = {}
    if model.context_window_tokens is None:
        updates["context_window_tokens"] = min(context_window(n, endpoints) for n in names)
    if model.structured_output == "auto":
        ways = {structured_output(n, endpoints) for n in names}
        updates["structured_output"] = "native" if ways == {"native"} else "tool"
    return updates
