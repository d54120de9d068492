"""What the peers benchmark rests on: the scripted workload plays N steps and counts each
run's requests, and a task's history is summed over its chain of continue-as-new."""

from __future__ import annotations

import json
import uuid
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam
from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.peer_workload import (
    MESSAGE_BYTES,
    Job,
    ScriptedWorkload,
    answer,
    failure_text,
    history_bytes,
    prompt,
)
from waystation.testing.fake_openai import FakeOpenAI


async def _play(client: openai.AsyncOpenAI, model: str, job: Job) -> list[Any]:
    """An agent loop over the fake: call the calculator until the model answers."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt(job)}]
    replies = []
    while True:
        reply = (await client.chat.completions.create(model=model, messages=messages)).choices[0]
        replies.append(reply.message)
        if not reply.message.tool_calls:
            return replies
        call = reply.message.tool_calls[0]
        messages.append(reply.message.model_dump(exclude_none=True))  # type: ignore[arg-type]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "1"})


async def test_the_workload_answers_after_its_steps_and_counts_each_run(
    fake_openai: FakeOpenAI,
) -> None:
    workload = ScriptedWorkload(fake_openai, f"workload-{uuid.uuid4().hex[:6]}")
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake_openai.url, max_retries=0)
    short, long = Job(run_id="short", steps=2), Job(run_id="long", steps=4)
    replies = await _play(client, workload.model, long)
    await _play(client, workload.model, short)
    await client.close()

    assert [len(r.content) for r in replies[:-1]] == [MESSAGE_BYTES] * 3
    assert [json.loads(r.tool_calls[0].function.arguments) for r in replies[:-1]] == [
        {"expression": f"{n} + 1"} for n in range(3)
    ]
    assert replies[-1].content == answer(4)
    assert (workload.served("long"), workload.served("short")) == (4, 2)
    assert fake_openai.requests[workload.model] == []  # bodies are not kept


@workflow.defn(sandboxed=False)
class Chain:
    @workflow.run
    async def run(self, left: int) -> int:
        if left:
            workflow.continue_as_new(left - 1)
        return left


async def test_history_bytes_sum_every_run_of_a_chain(dev_env: WorkflowEnvironment) -> None:
    client = dev_env.client
    queue = f"chain-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[Chain], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        handle = await client.start_workflow(Chain.run, 2, id=queue, task_queue=queue)
        assert await handle.result() == 0
    # Walk the chain forwards, from the first run to the one each continued as: three runs.
    sizes: list[int] = []
    run_id: str | None = handle.first_execution_run_id
    while run_id:
        run = client.get_workflow_handle(queue, run_id=run_id)
        sizes.append((await run.describe()).raw_info.history_size_bytes)
        last = (await run.fetch_history()).events[-1]
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    expected = sum(sizes)
    assert len(sizes) == 3 and min(sizes) > 0
    assert await history_bytes(client, queue) == (expected, 3)


def test_a_failure_is_told_by_its_innermost_cause() -> None:
    try:
        try:
            raise TimeoutError("history size exceeds limit")
        except TimeoutError as inner:
            raise RuntimeError("workflow failed") from inner
    except RuntimeError as outer:
        assert failure_text(outer) == "TimeoutError: history size exceeds limit"
