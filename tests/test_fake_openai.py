"""The fake endpoint answers a request that does not stream (as the benchmarks' peers ask)
with the reply the stream would have given, and can count requests without keeping them."""

from __future__ import annotations

import json

import openai
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam

from waystation.testing.fake_openai import FakeOpenAI, text, tools


async def test_a_request_without_stream_gets_the_reply_as_one_completion(
    fake_openai: FakeOpenAI,
) -> None:
    model = fake_openai.script(
        [tools(("calculator", {"expression": "1 + 1"}), content="thinking"), text("two")]
    )
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake_openai.url, max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "1 + 1?"}]
    first = await client.chat.completions.create(model=model, messages=messages)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "thinking"
    (call,) = choice.message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert (call.id, call.function.name) == ("call_1_0", "calculator")
    assert json.loads(call.function.arguments) == {"expression": "1 + 1"}
    assert first.usage is not None and first.usage.total_tokens == 18

    second = await client.chat.completions.create(model=model, messages=messages)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "two"
    assert not second.choices[0].message.tool_calls
    await client.close()


async def test_an_unrecorded_script_counts_requests_without_keeping_them(
    fake_openai: FakeOpenAI,
) -> None:
    model = fake_openai.script(lambda body: text("ok"), record=False)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake_openai.url, max_retries=0)
    for _ in range(3):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x" * 10_000}]
        )
    await client.close()
    assert fake_openai.calls(model) == 3
    assert fake_openai.requests[model] == []
