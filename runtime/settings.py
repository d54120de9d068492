"""One frozen settings model, read from the environment by worker.py, starter.py and the API.

Temporal's own connection settings (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY,
TOML profiles) are read by `temporalio.envconfig`, so an existing Temporal setup just works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from workflows.models import OFFLINE_MODEL

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"


class ApiToken(BaseModel):
    """A bearer token of the HTTP API: a reader starts and reads tasks, an approver decides."""

    role: Literal["reader", "approver"]
    name: str = Field(min_length=1, description="Recorded as the approver of its decisions.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WAYSTATION_", frozen=True, extra="ignore")

    task_queue: str = "waystation"
    data_dir: Path = Field(
        default=Path(".waystation"), description="Dev server database, workspace, logs."
    )
    workspace: Path | None = Field(
        default=None, description="Where file and shell tools work; default <data_dir>/workspace."
    )
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("WAYSTATION_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("WAYSTATION_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    model: str | None = Field(
        default=None,
        validation_alias=AliasChoices("WAYSTATION_MODEL", "OPENAI_MODEL"),
        description="Model for new tasks; default gpt-4o-mini with an endpoint, else offline.",
    )
    embedded_server: bool = Field(
        default=True,
        description="Start the Temporal dev server (SQLite under data_dir) when none is reachable "
        "at a local address.",
    )
    dev_server_port: int = 7233
    dev_server_ui_port: int = 8233
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_tokens: dict[str, ApiToken] = Field(
        default_factory=dict,
        description='JSON: {"<token>": {"role": "approver", "name": "alice"}}. None: the API '
        "binds to localhost only and lets every local caller in.",
    )

    @property
    def endpoint_configured(self) -> bool:
        return self.openai_api_key is not None or self.openai_base_url is not None

    @property
    def default_model(self) -> str:
        if self.model:
            return self.model
        return DEFAULT_OPENAI_MODEL if self.endpoint_configured else OFFLINE_MODEL

    @property
    def workspace_dir(self) -> Path:
        return (self.workspace or self.data_dir / "workspace").absolute()

    @property
    def api_key(self) -> str | None:
        return self.openai_api_key.get_secret_value() if self.openai_api_key else None
