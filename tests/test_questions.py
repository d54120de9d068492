"""The agent asks a person (the built-in `ask_person` tool): the task waits holding no
process, the answer and who gave it are the call's observation (real dev server and
time-skipping server, the real `openai` client against the fake server)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from tests.helpers import agent_task, of_type, wait_for_state
from waystation.client.agent_runtime import AgentRuntime, DecisionError
from waystation.testing.fake_openai import FakeOpenAI, text, tools
from waystation.workflows import errors, search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import Answer, Decision, QuestionSettings
from waystation.workflows.run import AgentOutcome


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def asking(fake: FakeOpenAI, **question: Any) -> str:
    """A model that asks one question, then answers with what it was told."""

    def reply(body: dict[str, Any]) -> Any:
        told = tool_results(body)
        if not told:
            return tools(("ask_person", question), content="I need to know something.")
        return text(f"so: {told[-1]}")

    return fake.script(reply)


async def test_a_question_waits_for_its_answer_and_the_answer_is_the_observation(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = asking(fake_openai, question="Which account?", details="the one to bill")
    handle = await dev_runtime.run(agent_task(model, task="bill the customer"))
    state = await wait_for_state(handle, lambda s: s.status == "waiting_input")
    [question] = state.pending_questions.values()
    assert (question.question, question.details) == ("Which account?", "the one to bill")
    # Findable without a worker: visibility and the memo.
    async with asyncio.timeout(30):  # Temporal's visibility lists it a moment later
        while handle.id not in {t.id for t in (await dev_runtime.list_tasks("waiting_input"))[0]}:
            await asyncio.sleep(0.1)
    overview = await handle.overview()
    [pending] = overview.memo[search.MEMO_PENDING]
    assert (pending["kind"], pending["question"]) == ("question", "Which account?")
    description = await handle.describe()
    assert description.typed_search_attributes.get(search.AGENT_WAITING_SINCE) is not None

    outcome = await handle.answer("ACME-42", answerer="alice")
    assert (outcome.answer, outcome.answerer, outcome.duplicate) == ("ACME-42", "alice", False)
    done = await handle.result()
    assert done.result == "so: alice answered: ACME-42"
    last = fake_openai.requests[model][-1]
    assert tool_results(last) == ["alice answered: ACME-42"]
    events = await handle.events()
    [answered] = of_type(events, "question_answered")
    assert (answered.answer, answered.answerer, answered.via) == ("ACME-42", "alice", "signal")
    # A repeat after the fact gets the first answer back.
    again = await handle.answer("something else", question.request_id, answerer="bob")
    assert (again.answer, again.answerer, again.duplicate) == ("ACME-42", "alice", True)


async def test_choices_refuse_an_answer_outside_them_and_take_one_of_them(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = asking(fake_openai, question="Which colour?", choices=["Red", "Dark blue"])
    handle = await dev_runtime.run(agent_task(model))
    state = await wait_for_state(handle, lambda s: bool(s.pending_questions))
    [request_id] = state.pending_questions
    with pytest.raises(DecisionError, match="not one of the choices") as refused:
        await handle.answer("green", request_id)
    assert refused.value.kind == errors.INVALID_CHOICE
    assert "'Red', 'Dark blue'" in str(refused.value)
    # The Update refuses it too, before anything enters history.
    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
        dev_runtime.client.get_workflow_handle_for(AgentWorkflow.run, handle.id)
    )
    with pytest.raises(WorkflowUpdateFailedError):
        await workflow.execute_update(
            AgentWorkflow.answer, Answer(request_id=request_id, answer="green")
        )
    # A choice is matched whatever its case and spacing, and taken as written.
    outcome = await handle.answer("  dark   BLUE ", request_id)
    assert outcome.answer == "Dark blue"
    assert (await handle.result()).result.endswith("answered: Dark blue")


async def test_two_people_answering_at_once_one_wins_and_both_learn_which(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = asking(fake_openai, question="Go or stop?")
    handle = await dev_runtime.run(agent_task(model))
    state = await wait_for_state(handle, lambda s: bool(s.pending_questions))
    [request_id] = state.pending_questions
    first, second = await asyncio.gather(
        dev_runtime.get(handle.id).answer("go", request_id, answerer="alice"),
        dev_runtime.get(handle.id).answer("stop", request_id, answerer="bob"),
    )
    assert first.answer == second.answer and first.answerer == second.answerer
    assert sorted([first.duplicate, second.duplicate]) == [False, True]
    winner = first.answer
    assert (await handle.result()).result.endswith(f"answered: {winner}")
    assert len(of_type(await handle.events(), "question_answered")) == 1


async def test_the_update_answers_and_refuses_an_unknown_question_naming_the_pending_ones(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = asking(fake_openai, question="Name?")
    handle = await dev_runtime.run(agent_task(model))
    state = await wait_for_state(handle, lambda s: bool(s.pending_questions))
    [request_id] = state.pending_questions
    workflow: WorkflowHandle[AgentWorkflow, AgentOutcome] = (
        dev_runtime.client.get_workflow_handle_for(AgentWorkflow.run, handle.id)
    )
    with pytest.raises(WorkflowUpdateFailedError) as unknown:
        await workflow.execute_update(AgentWorkflow.answer, Answer(request_id="9-nope", answer="x"))
    assert f"pending: {request_id}" in str(unknown.value.cause)
    outcome = await workflow.execute_update(
        AgentWorkflow.answer, Answer(request_id=request_id, answer="Ada", answerer="cli")
    )
    assert (outcome.answer, outcome.duplicate) == ("Ada", False)
    repeat = await workflow.execute_update(
        AgentWorkflow.answer, Answer(request_id=request_id, answer="Bob")
    )
    assert (repeat.answer, repeat.duplicate) == ("Ada", True)
    assert (await handle.result()).result == "so: cli answered: Ada"


async def test_a_question_and_an_approval_of_one_step_wait_together(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(
                ("ask_person", {"question": "Which file?"}),
                ("run_shell", {"command": "echo both"}),
            ),
            text("both done"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model))
    state = await wait_for_state(
        handle, lambda s: bool(s.pending_questions) and bool(s.pending_approvals)
    )
    assert state.status == "waiting_approval"
    overview = await handle.overview()
    kinds = sorted(p["kind"] for p in overview.memo[search.MEMO_PENDING])
    assert kinds == ["approval", "question"]
    await handle.approve(approver="alice")
    state = await wait_for_state(handle, lambda s: not s.pending_approvals)
    assert state.status == "waiting_input"
    await handle.answer("notes.txt", answerer="bob")
    assert (await handle.result()).result == "both done"
    [body] = fake_openai.requests[model][1:]
    answer, shell = tool_results(body)
    assert answer == "bob answered: notes.txt" and "both" in shell


async def test_one_respond_takes_a_decision_and_an_answer_and_refuses_both_alike(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(
        [
            tools(
                ("ask_person", {"question": "Which file?", "choices": ["a.txt", "b.txt"]}),
                ("run_shell", {"command": "echo both"}),
            ),
            text("both done"),
        ]
    )
    handle = await dev_runtime.run(agent_task(model))
    state = await wait_for_state(
        handle, lambda s: bool(s.pending_questions) and bool(s.pending_approvals)
    )
    [approval] = state.pending_approvals
    [question] = state.pending_questions
    with pytest.raises(DecisionError) as unknown:
        await handle.respond(Decision(request_id="nope", decision="approve"))
    assert unknown.value.kind == errors.UNKNOWN_REQUEST
    with pytest.raises(DecisionError) as wrong:
        await handle.respond(Answer(request_id=question, answer="c.txt"))
    assert wrong.value.kind == errors.INVALID_CHOICE
    decided = await handle.respond(Decision(request_id=approval, decision="approve"))
    assert (decided.decision, decided.duplicate) == ("approve", False)
    answered = await handle.respond(Answer(request_id=question, answer="b.txt", answerer="bob"))
    assert (answered.answer, answered.duplicate) == ("b.txt", False)
    assert (await handle.result()).result == "both done"
    again = await handle.respond(Answer(request_id=question, answer="a.txt"))
    assert (again.answer, again.answerer, again.duplicate) == ("b.txt", "bob", True)


async def test_a_question_nobody_answers_times_out_and_the_model_is_told(
    ts_runtime: AgentRuntime, fake_openai: FakeOpenAI, ts_env: Any
) -> None:
    model = asking(fake_openai, question="Anyone?")
    task = agent_task(model, questions=QuestionSettings(timeout_seconds=3600))
    handle = await ts_runtime.run(task)
    outcome = await handle.result()  # the time-skipping server skips the hour
    assert (
        outcome.result
        == "so: Nobody answered within 3600 s; decide without the answer or ask again."
    )
    [answered] = of_type(await handle.events(), "question_answered")
    assert answered.timed_out and answered.via == "timeout"
    assert json.loads(json.dumps(answered.model_dump(mode="json")))["answer"] is None


async def test_a_task_without_the_tool_is_not_offered_it(
    dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([text("fine")])
    await (await dev_runtime.run(agent_task(model, tools=["calculator"]))).result()
    offered = [t["function"]["name"] for t in fake_openai.requests[model][0]["tools"]]
    assert offered == ["calculator"]
    everything = fake_openai.script([text("fine")])
    await (await dev_runtime.run(agent_task(everything))).result()
    offered = [t["function"]["name"] for t in fake_openai.requests[everything][0]["tools"]]
    assert "ask_person" in offered
    system = fake_openai.requests[everything][0]["messages"][0]["content"]
    assert "ask_person" in system


def test_answers_are_checked_before_they_are_sent() -> None:
    with pytest.raises(ValueError):
        Answer(request_id="1-c", answer="   ")
    assert timedelta(seconds=QuestionSettings().timeout_seconds) == timedelta(days=7)
