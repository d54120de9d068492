"""Every secret value a worker's settings hold: what its Redactor takes out of what it says."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import unquote, urlsplit

from temporalio.envconfig import ClientConfig

from waystation.activities.redaction import Redactor
from waystation.settings import Settings
from waystation.settings.mcp_servers import McpConfigError, McpServerConfig, expand, variables_named
from waystation.settings.webhooks import WebhookConfigError

# A path this long may be a credential (a Slack webhook's token); a shorter one ("/notify")
# is a route, and redacting it would only blank out a word.
CREDENTIAL_PATH_CHARS = 16


def known_secrets(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """The model endpoints' keys and headers, the database URL and its password, the
    webhooks' secrets and URLs, the API tokens, the encryption keys, the Temporal API key,
    and what the MCP servers' env, headers and `${NAME}` references hold (as the worker
    expands them)."""
    found: list[str] = []
    if settings.openai_api_key is not None:
        found.append(settings.openai_api_key.get_secret_value())
    if settings.database_url is not None:
        found += _url_secrets(settings.database_url.get_secret_value())
    try:
        endpoints = settings.webhook_endpoints()
    except WebhookConfigError:
        endpoints = []  # the worker refuses to start on it, with a sentence of its own
    for endpoint in endpoints:
        found += _url_secrets(endpoint.url, path_credential=True)
        if endpoint.secret is not None:
            found.append(endpoint.secret.get_secret_value())
    found += list(settings.api_tokens)
    found += [key.get_secret_value() for key in settings.encryption_keys.values()]
    try:
        servers = settings.mcp_server_configs()
    except McpConfigError:
        servers = {}  # the first call to the server says what is wrong
    for config in servers.values():
        found += _mcp_secrets(config, environ)
    variables = settings.model_environment(environ)
    for model_endpoint in settings.endpoints().values():
        if model_endpoint.api_key_env and (key := variables.get(model_endpoint.api_key_env)):
            found.append(key)
        for value in model_endpoint.headers.values():
            found += _credential(_expanded(value, environ))
    api_key = ClientConfig.load_client_connect_config(override_env_vars=dict(environ)).get(
        "api_key"
    )
    if isinstance(api_key, str):
        found.append(api_key)
    return [value for value in found if value]


def redactor_for(settings: Settings, environ: Mapping[str, str]) -> Redactor:
    """The worker's one Redactor (activities/redaction.py)."""
    return Redactor(known_secrets(settings, environ))


def _url_secrets(url: str, *, path_credential: bool = False) -> Iterator[str]:
    """The URL, its password, and with `path_credential` its path (a Slack webhook's path
    is its credential; a database's name is none)."""
    yield url
    parts = urlsplit(url)
    if parts.password:
        yield parts.password
        yield unquote(parts.password)
    if not path_credential:
        return
    path = parts.path.strip("/")
    for part in (path, path.rsplit("/", 1)[-1]):  # the last part may be quoted alone
        if len(part) >= CREDENTIAL_PATH_CHARS:
            yield part


def _mcp_secrets(config: McpServerConfig, environ: Mapping[str, str]) -> Iterator[str]:
    # Not the command: `${HOME}/bin/server` names no secret.
    written = [*config.args, config.url or ""]
    for value in (*config.env.values(), *config.headers.values()):
        yield from _credential(_expanded(value, environ))
        written.append(value)
    for text in written:
        yield from (environ[name] for name in variables_named(text) if name in environ)


def _expanded(value: str, environ: Mapping[str, str]) -> str:
    try:
        return expand(value, environ, "a secret")
    except McpConfigError:
        return value


def _credential(value: str) -> Iterator[str]:
    """The value, and the credential of `<scheme> <credential>` (an Authorization header)."""
    yield value
    scheme, _, credential = value.partition(" ")
    if credential.strip() and scheme.isalpha():
        yield credential.strip()
