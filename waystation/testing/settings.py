"""Settings for a test, a benchmark or a recording: its own task queue and data directory,
the fake endpoint, and never the user's own model key or Temporal."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from waystation.settings import Settings

# Variables of the user's environment that must not leak into tests or worker processes.
USER_ENV_PREFIXES = ("OPENAI_", "WAYSTATION_", "TEMPORAL_")


def scrub_user_environment() -> None:
    """Real model calls are impossible from tests: no key or endpoint of the user's leaks in."""
    for name in list(os.environ):
        if name.startswith(USER_ENV_PREFIXES):
            del os.environ[name]


def isolated_settings(base: Path, endpoint: str, *, name: str = "tq", **fields: object) -> Settings:
    """Settings on a fresh task queue under `base`, pointed at a fake OpenAI endpoint."""
    queue = f"{name}-{uuid.uuid4().hex[:10]}"
    values: dict[str, object] = {
        "task_queue": queue,
        "data_dir": base / queue / "data",
        "workspace": base / queue / "workspace",
        "openai_api_key": "sk-test",
        "openai_base_url": endpoint,
        "embedded_server": False,
        **fields,
    }
    return Settings(**values)  # type: ignore[arg-type]
