"""The fake endpoint enforces a provider's quota as a provider does: requests and tokens per
minute over a sliding window, a 429 with `retry-after` and OpenAI's rate-limit headers over
it, and counts of what it accepted and refused (what bench.quota reports). The window moves
on a clock of the test's own."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from waystation.activities.openai_chat import retry_after
from waystation.testing.fake_openai import FakeOpenAI, text
from waystation.testing.provider_quota import ProviderQuota, QuotaCounts, prompt_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(content: str = "hello") -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def test_requests_per_minute_slide_with_the_window() -> None:
    clock = Clock()
    quota = ProviderQuota(requests_per_minute=2, clock=clock)
    assert quota.admit(request()) is None
    clock.now += 20
    assert quota.admit(request()) is None
    clock.now += 10
    refusal = quota.admit(request())
    assert refusal is not None and refusal.status == 429
    # The first request leaves the window 60 s after it came: 30 s from now.
    assert refusal.headers["retry-after"] == "30"
    assert refusal.headers["retry-after-ms"] == "30000"
    assert refusal.headers["x-ratelimit-remaining-requests"] == "0"
    clock.now += 29.9
    assert quota.admit(request()) is not None
    clock.now += 0.2
    assert quota.admit(request()) is None
    assert quota.counts == QuotaCounts(
        accepted=3, refused=2, input_tokens=3 * prompt_tokens(request())
    )


def test_input_tokens_are_counted_from_the_request_and_output_tokens_from_the_reply() -> None:
    clock = Clock()
    big = request("x" * 400)  # about 100 tokens and the JSON around them
    quota = ProviderQuota(
        input_tokens_per_minute=2 * prompt_tokens(big), output_tokens_per_minute=50, clock=clock
    )
    assert quota.admit(big) is None
    quota.served(text("a", usage=(prompt_tokens(big), 30)))
    clock.now += 5
    assert quota.admit(big) is None
    headers = quota.served(text("b", usage=(prompt_tokens(big), 30)))
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-limit-output-tokens"] == "50"
    assert headers["x-ratelimit-remaining-output-tokens"] == "0"  # 60 spent of 50
    clock.now += 5
    refusal = quota.admit(request("y"))
    assert refusal is not None
    assert refusal.headers["retry-after"] == "50"  # when the first request's tokens leave
    assert quota.counts == QuotaCounts(
        accepted=2, refused=1, input_tokens=2 * prompt_tokens(big), output_tokens=60
    )


def test_a_request_larger_than_the_whole_limit_is_refused_as_too_large() -> None:
    quota = ProviderQuota(requests_per_minute=100, input_tokens_per_minute=10, clock=Clock())
    refusal = quota.admit(request("x" * 400))
    assert refusal is not None and refusal.status == 429
    assert refusal.error_message.startswith("Request too large")
    assert "retry-after" not in refusal.headers


async def test_the_endpoint_answers_429_over_its_quota_and_counts_what_it_served(
    fake_openai: FakeOpenAI,
) -> None:
    clock = Clock()
    quota = ProviderQuota(requests_per_minute=1, clock=clock)
    model = fake_openai.script([text("one"), text("two")])
    fake_openai.enforce(quota, model)
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake_openai.url, max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    try:
        first = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, stream=True
        )
        assert first.headers["x-ratelimit-limit-requests"] == "1"
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        async for _ in first.parse():
            pass
        clock.now += 15
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=model, messages=messages)
        wait = retry_after(refused.value.response.headers)
        assert wait is not None and wait.total_seconds() == 45
        assert fake_openai.calls(model) == 1  # the refused request never reached the script
        clock.now += 45
        second = await client.chat.completions.create(model=model, messages=messages)
        assert second.choices[0].message.content == "two"
    finally:
        await client.close()
    assert quota.counts.accepted == 2 and quota.counts.refused == 1
    assert quota.counts.refused_share == pytest.approx(1 / 3)
