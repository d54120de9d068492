"""The floor for the benchmarks: bare workflows, nothing of ours.

BareLoop and BareLocalLoop run no-op activities. FloorAgent is the least a durable agent
step costs (bench.many_tasks compares with it): one activity that streams the model's
reply, one local activity for the tool, constant-size payloads, nothing else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from bench.instant_model import INSTANT_MODEL, InstantModel, instant_task_text, so_far
    from waystation.activities.builtin_tools import evaluate
    from waystation.activities.chat import ChatBackend
    from waystation.testing.typed_openai import CALCULATOR_TOOL
    from waystation.workflows.models import ChatMessage, ModelSettings


@activity.defn(name="bench_noop")
async def noop(index: int) -> int:
    return index


@workflow.defn(name="BareLoop")
class BareLoop:
    """What Temporal costs with nothing of ours: activities one after another."""

    @workflow.run
    async def run(self, activities: int) -> int:
        for index in range(activities):
            await workflow.execute_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
        return activities


@workflow.defn(name="BareLocalLoop")
class BareLocalLoop:
    """The shape of an agent step with a pure tool: an activity, then a local activity."""

    @workflow.run
    async def run(self, steps: int) -> int:
        for index in range(steps):
            await workflow.execute_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
            await workflow.execute_local_activity(
                noop, index, start_to_close_timeout=timedelta(seconds=30)
            )
        return steps


@dataclass(frozen=True)
class FloorCall:
    """One model request of the floor: which model, and where the task stands. Constant
    size: the floor sends the model no conversation, only the count of steps done."""

    model: str
    steps: int
    size: int
    step: int


@dataclass(frozen=True)
class FloorReply:
    """What the model said: its text, and the calculator call (None for the answer)."""

    text: str
    expression: str | None


def floor_messages(call: FloorCall) -> list[ChatMessage]:
    """The floor's constant-size request: the task, and how many tool results came so far
    (the instant model and the bench's fake script read both)."""
    return [
        ChatMessage(role="user", content=instant_task_text(call.steps, call.size)),
        ChatMessage(role="user", content=so_far(call.step)),
    ]


class FloorModel:
    """The floor's model activity: one streamed reply, from the instant model in this
    process or from an OpenAI-compatible endpoint, assembled into text and one call."""

    def __init__(self, endpoint: ChatBackend | None = None) -> None:
        self._instant = InstantModel()
        self._endpoint = endpoint

    @activity.defn(name="floor_model")
    async def reply(self, call: FloorCall) -> FloorReply:
        backend = self._instant if call.model == INSTANT_MODEL else self._endpoint
        if backend is None:
            raise ApplicationError(f"no endpoint serves model {call.model!r}", non_retryable=True)
        text: list[str] = []
        arguments: list[str] = []
        model = ModelSettings(name=call.model)
        async for delta in backend.stream(floor_messages(call), [CALCULATOR_TOOL], model):
            text.append(delta.text)
            arguments.append(delta.tool_arguments)
        called = "".join(arguments)
        expression = json.loads(called)["expression"] if called else None
        return FloorReply(text="".join(text), expression=expression)


@activity.defn(name="floor_tool")
async def floor_tool(expression: str) -> str:
    return str(evaluate(expression))


@workflow.defn(name="FloorAgent")
class FloorAgent:
    """The least a durable agent step on Temporal can cost: one activity that streams the
    model's reply, one local activity for the tool, constant-size payloads, nothing else."""

    @workflow.run
    async def run(self, call: FloorCall) -> int:
        for step in range(call.steps):
            reply = await workflow.execute_activity_method(
                FloorModel.reply,
                dataclasses.replace(call, step=step),
                start_to_close_timeout=timedelta(seconds=60),
            )
            if reply.expression is None:
                return step + 1
            await workflow.execute_local_activity(
                floor_tool, reply.expression, start_to_close_timeout=timedelta(seconds=10)
            )
        return call.steps


RELEASE_SIGNAL = "release"


@workflow.defn(name="FloorWaiting")
class FloorWaiting:
    """The floor of a task that asks a person at its first step: one model activity, then a
    wait for a signal (the start-rate baseline)."""

    def __init__(self) -> None:
        self._released = False

    @workflow.run
    async def run(self, call: FloorCall) -> None:
        await workflow.execute_activity_method(
            FloorModel.reply, call, start_to_close_timeout=timedelta(seconds=60)
        )
        await workflow.wait_condition(lambda: self._released)

    @workflow.signal(name=RELEASE_SIGNAL)
    def release(self) -> None:
        self._released = True
