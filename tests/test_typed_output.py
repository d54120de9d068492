"""Typed results: a task with an output schema answers with data that fits it, the model
told the validation errors and asked again (real dev server, the real `openai` client
against the fake server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from tests.helpers import agent_task, of_type
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.workflows.models import AgentTask, ModelSettings


class Invoice(BaseModel):
    customer: str
    total_cents: int
    paid: bool


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


async def test_answers_that_do_not_fit_are_told_the_errors_until_one_does(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(("final_answer", {"customer": "ACME", "total_cents": "lots"})),
            text("The total is 1200 cents."),
            tools(("final_answer", {"customer": "ACME", "total_cents": 1200, "paid": False})),
        ]
    )
    task = agent_task(model, task="read the invoice")
    handle = await dev_runtime.run(task, output_type=Invoice)
    outcome = await handle.result()
    assert outcome.output == Invoice(customer="ACME", total_cents=1200, paid=False)
    assert isinstance(outcome.output, Invoice)
    assert await handle.output() == outcome.output
    assert json.loads(outcome.result) == {"customer": "ACME", "total_cents": 1200, "paid": False}
    # The model was offered a final_answer tool whose parameters are the schema ...
    first, second, third = fake_openai.requests[model]
    [final] = [t for t in first["tools"] if t["function"]["name"] == "final_answer"]
    assert final["function"]["parameters"]["required"] == ["customer", "total_cents", "paid"]
    # ... and told what was wrong each time: the bad arguments, then the plain-text answer.
    [told] = tool_results(second)
    assert "total_cents: 'lots' is not of type 'integer'" in told
    assert "'paid' is a required property" in told
    last_user = [m["content"] for m in third["messages"] if m["role"] == "user"][-1]
    assert "you answered in text instead of calling final_answer" in last_user
    events = await handle.events()
    [done] = of_type(events, "done")
    assert done.output == {"customer": "ACME", "total_cents": 1200, "paid": False}
    assert len(of_type(events, "output_rejected")) == 1
    state = await handle.state()
    assert state.output == done.output and state.output_rejections == 2


async def test_too_many_answers_that_do_not_fit_fail_the_task_and_a_resume_goes_on(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    wrong = tools(("final_answer", {"customer": 7}))
    model = fake_openai.script(
        [
            wrong,
            tools(("final_answer", {"customer": 8})),
            tools(("final_answer", {"customer": "ACME", "total_cents": 5, "paid": True})),
        ]
    )
    task = agent_task(model, output_retries=1)
    handle = await dev_runtime.run(task, output_type=Invoice)
    with pytest.raises(TaskFailedError) as failed:
        await handle.result()
    assert failed.value.kind == "invalid_output"
    assert "2 final answers that do not fit the output schema (output_retries=1)" in str(
        failed.value
    )
    events = await handle.events()
    assert [e.type for e in events].count("observation") == 2
    resumed = await dev_runtime.resume(handle.id, message="customer is a name, the rest too")
    outcome = await resumed.result()
    assert outcome.output == {"customer": "ACME", "total_cents": 5, "paid": True}


async def test_native_structured_output_sends_the_schema_and_validates_the_text(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            text("```json\n[1, 2]\n```"),
            text('{"value": [3, "four"]}'),
            text('{"value": [3, 4]}'),
        ]
    )
    task = AgentTask(
        task="two numbers",
        model=ModelSettings(name=model, structured_output="native"),
        output_schema={"type": "array", "items": {"type": "integer"}},
    )
    outcome = await (await dev_runtime.run(task)).result()
    assert outcome.output == [3, 4]
    first, second, third = fake_openai.requests[model]
    assert first["response_format"]["type"] == "json_schema"
    wrapped = first["response_format"]["json_schema"]["schema"]
    assert wrapped == {
        "type": "object",
        "properties": {"value": {"type": "array", "items": {"type": "integer"}}},
        "required": ["value"],
    }
    assert not any(t["function"]["name"] == "final_answer" for t in first.get("tools", []))
    told = [m["content"] for m in second["messages"] if m["role"] == "user"][-1]
    assert "[1, 2] is not of type 'object'" in told and "Answer with JSON only" in told
    told = [m["content"] for m in third["messages"] if m["role"] == "user"][-1]
    assert "value/1: 'four' is not of type 'integer'" in told


def test_an_invalid_schema_is_refused_with_the_schema_error() -> None:
    with pytest.raises(ValidationError, match="not a valid JSON Schema at type"):
        AgentTask(task="x", output_schema={"type": "thing"})
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        AgentTask(task="x", output_schema={"properties": {"a": {"minLength": "no"}}})
    assert AgentTask(task="x", output_schema={"type": "object"}).output_schema == {"type": "object"}


async def test_the_offline_model_answers_a_typed_task(
    dev_runtime: AgentRuntime,
) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "value": {"type": "integer"}},
        "required": ["answer", "value"],
    }
    task = AgentTask(task="What is 6 * 7?", output_schema=schema)
    outcome = await (await dev_runtime.run(task)).result()
    output = outcome.output
    assert isinstance(output, dict)
    assert output["value"] == 42 and "6 * 7 = 42" in output["answer"]
