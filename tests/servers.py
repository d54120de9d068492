"""The Temporal dev server as tests, the history recorder and the benchmarks start it."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from runtime.temporal import DEV_SERVER_TUNING, temporal_binary
from workflows import search


async def start_dev_env() -> WorkflowEnvironment:
    """The pip-installed dev server, in memory, tuned and with our search attributes."""
    return await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_binary(),
        search_attributes=search.ALL,
        dev_server_extra_args=list(DEV_SERVER_TUNING),
    )
