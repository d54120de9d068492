"""pytest fixtures to test one's own tools and agents on waystation, enabled in a test
module or the root conftest.py by

    pytest_plugins = ["waystation.testing.pytest_plugin"]

- `waystation_env`: Temporal's time-skipping test server (one per session), where timers
  and timeouts pass at once when nothing else happens;
- `waystation_model_server`: the OpenAI-protocol endpoint the model doubles answer on;
- `waystation_model`: this test's model (the settings' default model), answered by a
  `TestModel()` until the test says `waystation_model.use(ScriptedModel([...]))`;
- `waystation_tools`, `waystation_agents`: what the worker serves, by default what
  WAYSTATION_TOOLS and WAYSTATION_AGENTS say; override them as fixtures of your own;
- `waystation_settings`: this test's settings (its own task queue, data folder and
  workspace under `tmp_path`; the model server as the endpoint);
- `waystation_worker`: a real worker in the test's process serving those tools and agents;
- `waystation_runtime`: an AgentRuntime on it: `await waystation_runtime.run("...")`.

The fixtures run in pytest-asyncio's session event loop (the server is shared by the
session's tests), so a test that uses them runs there too: mark it
`@pytest.mark.asyncio(loop_scope="session")`, or set `asyncio_default_test_loop_scope =
"session"` in pytest's configuration (docs/testing.md).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from waystation.activities.tool_modules import load_tools
from waystation.activities.tools import Tool, ToolRegistry
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.temporal import ensure_search_attributes
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply
from waystation.testing.models import ModelDouble, TestModel
from waystation.testing.servers import start_time_skipping_env
from waystation.testing.settings import isolated_settings
from waystation.testing.workers import running_worker
from waystation.worker import AgentWorker


class ServedModel:
    """This test's model on the model server: `name` is what a task names; the double
    (`use`) answers its requests."""

    def __init__(self, server: FakeOpenAI) -> None:
        self.double: ModelDouble = TestModel()
        self.name = server.serve(self._answer, f"test-model-{uuid.uuid4().hex[:10]}")

    def use(self, double: ModelDouble) -> ModelDouble:
        """Answer from now on with `double` (returned, to keep a handle on it)."""
        self.double = double
        return double

    def _answer(self, body: dict[str, Any]) -> Reply:
        return self.double(body)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def waystation_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server, for the session."""
    env = await start_time_skipping_env()
    async with env:
        await ensure_search_attributes(env.client)
        yield env


@pytest.fixture(scope="session")
def waystation_model_server() -> Iterator[FakeOpenAI]:
    """The OpenAI-protocol endpoint model doubles answer on, for the session (`serve` a
    double under a model name of its own)."""
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def waystation_model(waystation_model_server: FakeOpenAI) -> ServedModel:
    """This test's default model: a TestModel() unless the test `use`s another double."""
    return ServedModel(waystation_model_server)


@pytest.fixture
def waystation_tools() -> Sequence[str | Tool[Any]]:
    """The tools the worker serves: modules (as WAYSTATION_TOOLS names them) or Tools.
    Default: WAYSTATION_TOOLS."""
    return Settings().tools


@pytest.fixture
def waystation_agents() -> str | None:
    """The sub-agents the worker offers, as WAYSTATION_AGENTS holds them (a JSON list, or
    a file's path). Default: WAYSTATION_AGENTS."""
    return Settings().agents


@pytest.fixture
def waystation_settings(
    tmp_path: Path,
    waystation_model_server: FakeOpenAI,
    waystation_model: ServedModel,
    waystation_tools: Sequence[str | Tool[Any]],
    waystation_agents: str | None,
) -> Settings:
    """This test's settings: its own task queue and folders, the model double as the
    default model, the tools' modules and the agents."""
    modules = [entry for entry in waystation_tools if isinstance(entry, str)]
    return isolated_settings(
        tmp_path,
        waystation_model_server.url,
        name="test",
        WAYSTATION_MODEL=waystation_model.name,
        agents=waystation_agents,
        **({"tools": modules} if modules else {}),
    )


@pytest.fixture
def waystation_registry(
    waystation_settings: Settings, waystation_tools: Sequence[str | Tool[Any]]
) -> ToolRegistry:
    """The tools' registry: the modules' tools and the agents, then the Tools given as such."""
    modules = [entry for entry in waystation_tools if isinstance(entry, str)]
    given = [entry for entry in waystation_tools if not isinstance(entry, str)]
    loaded = load_tools(modules, waystation_settings.agents)
    return ToolRegistry([*loaded.allowed(None), *given])


@pytest_asyncio.fixture(loop_scope="session")
async def waystation_worker(
    waystation_env: WorkflowEnvironment,
    waystation_settings: Settings,
    waystation_registry: ToolRegistry,
) -> AsyncIterator[AgentWorker]:
    """A worker in this process on the test's task queue, for the test."""
    async with running_worker(
        waystation_env.client, waystation_settings, registry=waystation_registry
    ) as worker:
        yield worker


@pytest_asyncio.fixture(loop_scope="session")
async def waystation_runtime(
    waystation_env: WorkflowEnvironment,
    waystation_settings: Settings,
    waystation_registry: ToolRegistry,
    waystation_worker: AgentWorker,
) -> AgentRuntime:
    """An AgentRuntime whose tasks run on `waystation_worker` with `waystation_model`."""
    return AgentRuntime(waystation_env.client, waystation_settings, tools=waystation_registry)
