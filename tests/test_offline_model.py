"""The offline model asks a person and hands work to a sub-agent, as the docs show it doing
(README, "Questions" and "Sub-agents"): pure rules, tested without Temporal."""

from __future__ import annotations

import json
from collections.abc import Mapping

from waystation.activities.offline_model import LABEL, OfflineModel
from waystation.workflows.models import ChatMessage, ToolCallRequest

BUILT_INS = {"calculator", "list_files", "read_file", "write_file", "run_shell", "ask_person"}


def _task(text: str) -> list[ChatMessage]:
    return [ChatMessage(role="system", content="prompt"), ChatMessage(role="user", content=text)]


def _called(
    messages: list[ChatMessage], name: str, arguments: Mapping[str, object], output: str
) -> list[ChatMessage]:
    call = ToolCallRequest(id="call_1_0", name=name, arguments=json.dumps(arguments))
    return [
        *messages,
        ChatMessage(role="assistant", content="", tool_calls=[call]),
        ChatMessage(role="tool", tool_call_id="call_1_0", content=output),
    ]


def test_it_asks_with_the_choices_then_answers_with_the_answer() -> None:
    model = OfflineModel()
    task = _task("Ask me which environment to deploy to: staging or production")
    text, calls = model.respond(task, BUILT_INS)
    question = {"question": "Which environment to deploy to?", "choices": ["staging", "production"]}
    assert (text, calls) == (f"{LABEL} Asking you.", [("ask_person", question)])
    answered = _called(task, "ask_person", question, "alice answered: staging")
    assert model.respond(answered, BUILT_INS) == (f"{LABEL} alice answered: staging.", [])


def test_it_asks_for_a_fact_and_only_when_it_may() -> None:
    model = OfflineModel()
    task = _task("Ask me for the account id")
    assert model.respond(task, BUILT_INS)[1] == [
        ("ask_person", {"question": "What is the account id?"})
    ]
    text, calls = model.respond(task, BUILT_INS - {"ask_person"})
    assert calls == [] and "may not ask" in text


def test_it_hands_the_task_to_the_agent_it_names_and_answers_with_its_answer() -> None:
    model = OfflineModel()
    offered = BUILT_INS | {"agent__math"}
    task = _task("Have the math agent work out (12 + 30) * 7")
    text, calls = model.respond(task, offered)
    work = {"task": "Work out (12 + 30) * 7"}
    assert (text, calls) == (f"{LABEL} Asking the math agent.", [("agent__math", work)])
    done = _called(task, "agent__math", work, f"{LABEL} (12 + 30) * 7 = 294.")
    answer = f"{LABEL} The math agent answered: (12 + 30) * 7 = 294."
    assert model.respond(done, offered) == (answer, [])
    # An agent the task may not call: the model does the arithmetic itself.
    assert model.respond(task, BUILT_INS)[1] == [("calculator", {"expression": "(12 + 30) * 7"})]
