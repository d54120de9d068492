"""waystation.testing as a user's tests use it: the pytest fixtures (a time-skipping server,
a worker with the test's tools, a runtime), TestModel calling a user's tools with arguments
that fit their schemas, ScriptedModel's replies (text, tool calls, errors, delays), and the
assertions on events. Also a model double served to a worker in another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from waystation import AgentRuntime, Settings, TaskFailedError, Tool, tool
from waystation.testing import (
    ModelServer,
    ScriptedModel,
    ServedModel,
    TestModel,
    assert_called,
    assert_not_called,
    call,
    calls,
    delay,
    error,
    fitting_value,
    text,
    tool_calls,
    until_status,
)
from waystation.testing.workers import WorkerProcess

SEEN: list[dict[str, Any]] = []


class Line(BaseModel):
    sku: Annotated[str, Field(min_length=3, max_length=8, pattern=r"^[a-z]+$")]
    quantity: Annotated[int, Field(gt=0, le=5)]


@tool
def book_room(
    guests: Annotated[int, Field(ge=10, le=20, description="How many people.")],
    size: Literal["small", "large"],
    lines: Annotated[list[Line], Field(min_length=2, max_length=3)],
    note: Annotated[str, Field(min_length=12)],
    budget: Annotated[float, Field(gt=100, lt=200, multiple_of=0.5)],
    discount: float | None = None,
) -> str:
    """Book a meeting room."""
    SEEN.append({"guests": guests, "size": size, "lines": lines, "note": note, "budget": budget})
    return f"booked for {guests}"


@tool
def weather(city: str) -> dict[str, object]:
    """Today's weather in a city."""
    return {"city": city, "sky": "clear"}


@tool(approval="always")
def send_invoice(customer: str, cents: Annotated[int, Field(ge=1)]) -> str:
    """Send an invoice (a person approves it first)."""
    return f"sent {cents} to {customer}"


@pytest.fixture
def waystation_tools() -> list[Tool[Any]]:
    return [book_room, weather, send_invoice]


def test_made_up_arguments_fit_the_schema_of_every_kind_of_parameter() -> None:
    arguments = fitting_value(book_room.arguments.model_json_schema())
    valid = book_room.arguments.model_validate(arguments)
    assert 10 <= valid.guests <= 20 and valid.size in ("small", "large")  # type: ignore[attr-defined]
    assert 100 < valid.budget < 200 and len(valid.lines) == 2  # type: ignore[attr-defined]
    for schema in (
        {"type": "string", "format": "date-time"},
        {"type": "array", "items": {"type": "integer"}, "minItems": 3, "uniqueItems": True},
        {"type": "integer", "exclusiveMinimum": 7, "multipleOf": 4},
        {"type": "integer", "minimum": 2.5, "maximum": 3.5},
        {"type": "number", "exclusiveMinimum": 100, "exclusiveMaximum": 200, "multipleOf": 0.5},
        {"type": "string", "pattern": "^[0-9]{3}$", "minLength": 3, "maxLength": 3},
        {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 2, "uniqueItems": True},
        {"anyOf": [{"type": "null"}, {"type": "number", "maximum": -3}]},
        {"type": "object", "properties": {"k": {"const": "v"}}, "required": ["k"]},
    ):
        fitting_value(schema)  # raises if the value it makes does not fit


@pytest.mark.asyncio(loop_scope="session")
async def test_test_model_calls_each_tool_with_fitting_arguments_then_answers(
    waystation_runtime: AgentRuntime, waystation_model: ServedModel
) -> None:
    SEEN.clear()
    double = waystation_model.use(TestModel(call_tools=["book_room", "weather"]))
    handle = await waystation_runtime.run("Book a room and look at the sky")
    answer = (await handle.result()).result
    events = await handle.events()
    booked = assert_called(events, "book_room")
    assert booked.output == f"booked for {SEEN[0]['guests']}" and not booked.is_error
    assert 10 <= SEEN[0]["guests"] <= 20 and len(SEEN[0]["note"]) >= 12
    assert all(line.sku.isalpha() and 3 <= len(line.sku) <= 8 for line in SEEN[0]["lines"])
    assert_called(events, "weather", {"city": "a"})
    assert_not_called(events, "send_invoice")
    assert json.loads(answer) == {
        "book_room": booked.output,
        "weather": json.dumps({"city": "a", "sky": "clear"}, separators=(",", ":")),
    }
    assert [c.tool for c in tool_calls(events)] == ["book_room", "weather"]
    assert len(double.requests) == 2


async def test_test_model_gives_a_typed_answer_given_or_made_up(
    waystation_runtime: AgentRuntime, waystation_model: ServedModel
) -> None:
    class Forecast(BaseModel):
        city: str
        degrees: Annotated[int, Field(ge=-40, le=50)]

    waystation_model.use(TestModel(call_tools=[], output=Forecast(city="Oslo", degrees=-3)))
    handle = await waystation_runtime.run("Forecast?", output_type=Forecast)
    assert await handle.output() == Forecast(city="Oslo", degrees=-3)

    waystation_model.use(TestModel(call_tools=[]))
    made_up = await (await waystation_runtime.run("Forecast?", output_type=Forecast)).output()
    assert isinstance(made_up, Forecast) and -40 <= made_up.degrees <= 50

    waystation_model.use(TestModel(call_tools=[], output=[1, 2]))
    assert await (await waystation_runtime.run("Numbers?", output_type=list[int])).output() == [
        1,
        2,
    ]


@pytest.mark.asyncio(loop_scope="session")
async def test_test_model_told_to_call_a_tool_the_task_lacks_fails_it_saying_so(
    waystation_runtime: AgentRuntime, waystation_model: ServedModel
) -> None:
    waystation_model.use(TestModel(call_tools=["book_room"]))
    handle = await waystation_runtime.run(
        waystation_runtime.new_task("Only the weather", tools=["weather"])
    )
    with pytest.raises(TaskFailedError) as failed:
        await handle.result()
    assert "TestModel: book_room not offered to this task (offered: weather)" in str(failed.value)


@pytest.mark.asyncio(loop_scope="session")
async def test_scripted_model_drives_an_approval_and_a_follow_up(
    waystation_runtime: AgentRuntime, waystation_model: ServedModel
) -> None:
    script = waystation_model.use(
        ScriptedModel(
            [
                call("send_invoice", {"customer": "ACME", "cents": 1200}, content="Invoicing."),
                "Sent.",
                error(503, "overloaded", retry_after=0),
                delay(0.2, "Twelve euros, to ACME."),
            ]
        )
    )
    handle = await waystation_runtime.run("Invoice ACME 12 EUR")
    state = await until_status(handle, "waiting_approval")
    [request] = state.pending_approvals
    await handle.approve(request, approver="kim")
    assert (await handle.result()).result == "Sent."
    assert assert_called(await handle.events(), "send_invoice").output == "sent 1200 to ACME"

    await handle.send("What did you send, and to whom?")
    assert (await handle.result()).result == "Twelve euros, to ACME."
    assert len(script.requests) == 4  # the 503 was retried
    assert script.requests[-1]["messages"][-1]["content"] == "What did you send, and to whom?"


async def test_a_scripted_model_out_of_replies_fails_the_task_saying_so(
    waystation_runtime: AgentRuntime, waystation_model: ServedModel
) -> None:
    waystation_model.use(
        ScriptedModel([calls(("weather", {"city": "Rome"}), ("weather", '{"city": "Oslo"}'))])
    )
    handle = await waystation_runtime.run("Weather in Rome and Oslo?")
    with pytest.raises(TaskFailedError) as failed:
        await handle.result()
    assert "ScriptedModel: request 2 came, but the script has 1 replies" in str(failed.value)
    made = tool_calls(await handle.events(), "weather")
    assert [c.arguments for c in made] == [{"city": "Rome"}, {"city": "Oslo"}]


def test_assertions_on_events_say_which_calls_were_made() -> None:
    events: list[dict[str, Any]] = [
        {"type": "action", "call_id": "c1", "tool": "weather", "arguments": {"city": "Rome"}},
        {"type": "observation", "call_id": "c1", "tool": "weather", "output": "sun", "is_error": 0},
    ]
    assert assert_called(events, "weather", {"city": "Rome"}).output == "sun"
    with pytest.raises(AssertionError, match=r"no call of weather with \{'city': 'Oslo'\}; the "):
        assert_called(events, "weather", {"city": "Oslo"})
    with pytest.raises(AssertionError, match="weather was called 1 times"):
        assert_not_called(events, "weather")
    assert text("hi").content == "hi"


async def test_a_model_double_answers_a_worker_in_another_process(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: ModelServer,
    spawn_worker: Callable[[], Awaitable[WorkerProcess]],
) -> None:
    await spawn_worker()
    model = fake_openai.serve(TestModel(call_tools=["calculator"], text="done"))
    handle = await AgentRuntime(dev_env.client, settings).run(agent_task(model, "Compute"))
    assert (await handle.result()).result == "done"
    assert assert_called(await handle.events(), "calculator").output is not None


LEFT_WAITING = """
import asyncio

from waystation import AgentTask, ModelSettings, QuestionSettings
from waystation.testing import ScriptedModel, call, until_status


def asking(model, timeout_seconds):
    return AgentTask(
        task="Ask, then answer",
        model=ModelSettings(name=model.name),
        questions=QuestionSettings(timeout_seconds=timeout_seconds),
    )


async def test_one_leaves_a_question_waiting(waystation_runtime, waystation_model):
    waystation_model.use(ScriptedModel([call("ask_person", {"question": "Anyone?"}), "x"]))
    handle = await waystation_runtime.run(asking(waystation_model, 60))
    await until_status(handle, "waiting_input")


async def test_two_waits_an_hour_at_once(waystation_runtime, waystation_model):
    waystation_model.use(ScriptedModel([call("ask_person", {"question": "Hello?"}), "told"]))
    handle = await waystation_runtime.run(asking(waystation_model, 3600))
    outcome = await asyncio.wait_for(handle.result(), 60)
    assert outcome.result == "told"
"""


def test_a_task_one_test_leaves_waiting_does_not_stop_the_next_tests_clock(
    tmp_path: Path,
) -> None:
    """The time-skipping server stops skipping while any workflow task waits for a worker: the
    first test's question times out (a minute) in the second test's skipped hour, with the
    first test's worker gone. Each test has its own server, so the second still passes."""
    (tmp_path / "test_order.py").write_text(LEFT_WAITING)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout
