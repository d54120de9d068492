"""Question asked → its webhook arrives, and answer → the next model call:
`python -m bench.webhook_latency`.

Each task asks a person a question (the `ask_person` tool); a worker whose
WAYSTATION_WEBHOOKS names a receiver on this machine starts the notification workflow,
whose activity posts the signed notice. Measured from the `question_asked` event's time
(the workflow task that asked) to the receiver reading the request's body, then from the
moment `TaskHandle.answer` is called to the fake endpoint receiving the model call that
carries the answer, one task at a time so nothing else is in flight.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from bench.common import Bench, Row, median, percentile, run_alone, say
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import Reply, text, tools
from waystation.testing.webhook_receiver import WebhookReceiver
from waystation.workflows.events import QuestionAsked
from waystation.workflows.models import AgentTask, ModelSettings

REPEATS = 20


@dataclass
class Latencies:
    """Of one question, in seconds."""

    to_webhook: float
    answer_to_model: float


async def one_question(bench: Bench, runtime: AgentRuntime, receiver: WebhookReceiver) -> Latencies:
    answered_call: list[float] = []  # when the call that carries the answer arrived

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            answered_call.append(time.perf_counter())
            return text("thanks")
        return tools(("ask_person", {"question": "Which account?"}))

    model = bench.fake.script(reply)
    handle = await runtime.run(AgentTask(task="ask me", model=ModelSettings(name=model)))
    asked: QuestionAsked | None = None
    async for item in runtime.stream(handle.id, topics=["events"]):
        if isinstance(item.data, QuestionAsked):
            asked = item.data
            break
    assert asked is not None
    key = f"{handle.id}:{asked.request_id}"
    seen = await receiver.until(lambda rs: any(r.key == key for r in rs))
    arrived = next(r for r in seen if r.key == key)
    answering = time.perf_counter()
    await handle.answer("ACME-42", answerer="bench")
    await handle.result()
    return Latencies(arrived.arrived - asked.at.timestamp(), answered_call[0] - answering)


async def measure(bench: Bench, repeats: int = REPEATS) -> list[Row]:
    receiver = WebhookReceiver()
    ops = {
        "name": "ops",
        "url": receiver.url("ops"),
        "events": ["question_asked"],
        "secret": "bench-secret",
    }
    settings = bench.settings("webhooks").model_copy(
        update={"webhooks": SecretStr(json.dumps([ops]))}
    )
    latencies: list[Latencies] = []
    try:
        async with bench.worker(settings):
            runtime = AgentRuntime(bench.client, settings)
            for n in range(repeats):
                say(f"question → webhook: repeat {n + 1}/{repeats}")
                latencies.append(await one_question(bench, runtime, receiver))
    finally:
        receiver.close()
    to_webhook = [one.to_webhook for one in latencies]
    to_model = [one.answer_to_model for one in latencies]
    return [
        Row(
            "question_asked → its webhook arrives, median / p95",
            f"{median(to_webhook) * 1000:.0f} / {percentile(to_webhook, 0.95) * 1000:.0f} ms",
            f"over {repeats} tasks, one at a time",
        ),
        Row(
            "answer → the model call that carries it, median / p95",
            f"{median(to_model) * 1000:.0f} / {percentile(to_model, 0.95) * 1000:.0f} ms",
            f"over {repeats} tasks, one at a time",
        ),
    ]


if __name__ == "__main__":
    run_alone(measure)
