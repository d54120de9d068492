"""Which backend calls a model: `ENDPOINT:MODEL` goes to that endpoint's protocol client
(settings/model_endpoints.py), a bare name where it always went (the offline model, a
backend named for it, else the `openai` endpoint).

A worker builds each endpoint's client once, on first use (a worker whose tasks never call
Anthropic never imports its SDK), from its own environment: keys and `${VAR}` in headers
are read here, never carried by a task. The clients close with the worker.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from temporalio.exceptions import ApplicationError

from waystation.activities.chat import ChatBackend
from waystation.activities.offline_model import OfflineModel
from waystation.activities.worker_offer import model_need
from waystation.settings.mcp_servers import McpConfigError, expand_mapping
from waystation.settings.model_endpoints import (
    BARE_NAME_ENDPOINT,
    EndpointProtocol,
    ModelEndpoint,
    all_endpoints,
    api_key_of,
    base_url_of,
    how_to_configure,
    is_configured,
    split_model_name,
)
from waystation.vocabulary import OFFLINE_MODEL
from waystation.workflows import errors

# Each protocol's client, by module and class: imported only when an endpoint needs it.
PROTOCOL_CLIENTS: dict[EndpointProtocol, tuple[str, str]] = {
    "chat": ("waystation.activities.openai_chat", "OpenAIChat"),
    "responses": ("waystation.activities.openai_responses", "OpenAIResponses"),
    "anthropic": ("waystation.activities.anthropic_messages", "AnthropicMessages"),
}


def client_class(protocol: EndpointProtocol) -> Any:
    module, name = PROTOCOL_CLIENTS[protocol]
    return getattr(importlib.import_module(module), name)


class ModelBackends:
    """Model name -> (backend, the model id the endpoint knows), for one worker."""

    def __init__(
        self,
        endpoints: Mapping[str, ModelEndpoint] | None = None,
        environ: Mapping[str, str] | None = None,
        named: Mapping[str, ChatBackend] | None = None,
    ) -> None:
        self._endpoints = all_endpoints(endpoints or {})
        self._environ = dict(environ or {})
        # Models served by something other than an endpoint, by their whole name.
        self._named = dict(named or {})
        self._offline = OfflineModel()
        self._built: dict[str, ChatBackend] = {}

    @property
    def offline(self) -> OfflineModel:
        return self._offline

    def configured(self) -> list[str]:
        """The endpoints this worker can call."""
        return sorted(n for n, e in self._endpoints.items() if is_configured(e, self._environ))

    def endpoint_of(self, model_name: str) -> tuple[str | None, str]:
        """(endpoint, model id) of a name; (None, name) for the offline model or a named one."""
        if model_name == OFFLINE_MODEL or model_name in self._named:
            return None, model_name
        endpoint, model = split_model_name(model_name, self._endpoints)
        return endpoint or BARE_NAME_ENDPOINT, model

    def need(self, model_name: str) -> str | None:
        """What this worker lacks to call `model_name` (None: nothing)."""
        endpoint, _ = self.endpoint_of(model_name)
        if endpoint is None or is_configured(self._endpoints[endpoint], self._environ):
            return None
        return model_need(model_name, self._endpoints)

    def route(self, model_name: str) -> tuple[ChatBackend, str]:
        """The backend that calls `model_name`, and the model id it is given."""
        if model_name == OFFLINE_MODEL:
            return self._offline, model_name
        if (named := self._named.get(model_name)) is not None:
            return named, model_name
        endpoint, model = self.endpoint_of(model_name)
        assert endpoint is not None
        if (built := self._built.get(endpoint)) is not None:
            return built, model
        declared = self._endpoints[endpoint]
        if not is_configured(declared, self._environ):
            bare = split_model_name(model_name, self._endpoints)[0] is None
            raise ApplicationError(
                _not_configured(model_name, endpoint, declared, bare),
                type=errors.LLM_NOT_CONFIGURED,
                non_retryable=True,
            )
        try:
            headers = expand_mapping(
                declared.headers, self._environ, f"model endpoint {endpoint!r} header"
            )
        except McpConfigError as err:
            raise ApplicationError(
                str(err), type=errors.LLM_NOT_CONFIGURED, non_retryable=True
            ) from None
        backend: ChatBackend = client_class(declared.protocol)(
            api_key_of(declared, self._environ), base_url_of(declared, self._environ), headers
        )
        self._built[endpoint] = backend
        return backend, model

    async def close(self) -> None:
        """Close the clients built (the worker does this as it shuts down)."""
        built, self._built = list(self._built.values()), {}
        for backend in built:
            if (close := getattr(backend, "close", None)) is not None:
                await close()


def _not_configured(model_name: str, endpoint: str, declared: ModelEndpoint, bare: bool) -> str:
    if bare:
        return (
            f"the task asks for model {model_name!r} but this worker has no model endpoint: "
            "set OPENAI_API_KEY (and OPENAI_BASE_URL for a non-OpenAI endpoint) on the "
            "worker, or use the 'offline' model"
        )
    lacked = how_to_configure(endpoint, declared)
    return f"the task asks for model {model_name!r} but this worker lacks {lacked}"
