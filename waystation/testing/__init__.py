"""Testing one's own tools and agents (docs/testing.md): model doubles that answer the real
worker over the OpenAI protocol (`TestModel`, `ScriptedModel`), assertions on a task's
events, and pytest fixtures (`pytest_plugins = ["waystation.testing.pytest_plugin"]`).

The rest of the package is what waystation's own tests, benchmarks and history recorder
share: real servers, real workers, a fake OpenAI-protocol endpoint and the settings that
wire them together. Nothing here imports `tests`; tests and `bench/` import this."""

from waystation.testing.events import (
    ToolCallSeen,
    assert_called,
    assert_not_called,
    tool_calls,
    until_status,
)
from waystation.testing.fake_openai import FakeOpenAI as ModelServer
from waystation.testing.models import (
    ModelDouble,
    ScriptedModel,
    ServedModel,
    TestModel,
    call,
    calls,
    delay,
    error,
    text,
)
from waystation.testing.schema_values import fitting_value

__all__ = [
    "ModelDouble",
    "ModelServer",
    "ScriptedModel",
    "ServedModel",
    "TestModel",
    "ToolCallSeen",
    "assert_called",
    "assert_not_called",
    "call",
    "calls",
    "delay",
    "error",
    "fitting_value",
    "text",
    "tool_calls",
    "until_status",
]
