"""The request our chat backend sends is the one the typed `openai` client would send.

`OpenAIChat` skips the client's schema walk (bench.request_body); the endpoint must not see
the difference.
"""

from __future__ import annotations

from typing import Any

import openai

from waystation.activities.chat import tool_choice_option
from waystation.activities.openai_chat import OpenAIChat
from waystation.testing.fake_openai import FakeOpenAI, text
from waystation.testing.typed_openai import CALCULATOR_TOOL, typed_stream
from waystation.workflows.models import ChatMessage, ModelSettings, ToolCallRequest

CALL = ToolCallRequest(id="call_1", name="calculator", arguments='{"expression": "6 * 7"}')
CONVERSATION = [
    ChatMessage(role="system", content="You are terse."),
    ChatMessage(role="user", content="What is 6 * 7? Ünïcödé ✓"),
    ChatMessage(role="assistant", content=None, tool_calls=[CALL]),
    ChatMessage(role="tool", tool_call_id="call_1", content="42"),
    ChatMessage(role="assistant", content="It is 42."),
    ChatMessage(role="user", content="And written out?"),
]


async def bodies(fake_openai: FakeOpenAI, model: ModelSettings) -> tuple[Any, Any]:
    """(what `OpenAIChat` sent, what the typed client sent) for the same conversation."""
    name = fake_openai.script([text("ours"), text("typed")])
    model = model.model_copy(update={"name": name})
    chat = OpenAIChat("sk-test", fake_openai.url)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake_openai.url, max_retries=0)
    try:
        answer = [d.text async for d in chat.stream(CONVERSATION, [CALCULATOR_TOOL], model)]
        assert "".join(answer) == "ours"
        options: dict[str, Any] = {}
        if model.tool_choice is not None:
            options["tool_choice"] = tool_choice_option(model.tool_choice)
        if model.temperature is not None:
            options["temperature"] = model.temperature
        if model.max_tokens is not None:
            options["max_tokens"] = model.max_tokens
        await typed_stream(client, name, CONVERSATION, [CALCULATOR_TOOL], **options)
    finally:
        await chat.close()
        await client.close()
    (mine, _, _), (theirs, _, _) = fake_openai.request_log(name)
    return mine, theirs


async def test_the_body_is_the_typed_clients_with_default_settings(
    fake_openai: FakeOpenAI,
) -> None:
    mine, theirs = await bodies(fake_openai, ModelSettings(name="any"))
    assert mine == theirs
    assert [m["role"] for m in mine["messages"]] == [m.role for m in CONVERSATION]
    assert mine["messages"][1]["content"] == "What is 6 * 7? Ünïcödé ✓"
    assert mine["tools"] == [CALCULATOR_TOOL] and mine["stream"] is True


async def test_the_body_is_the_typed_clients_with_every_option_set(
    fake_openai: FakeOpenAI,
) -> None:
    model = ModelSettings(name="any", temperature=0.2, max_tokens=64, tool_choice="required")
    mine, theirs = await bodies(fake_openai, model)
    assert mine == theirs
    assert (mine["temperature"], mine["max_tokens"], mine["tool_choice"]) == (0.2, 64, "required")
