"""Questions the model asks a person (the built-in `ask_person` tool): who may answer what,
deadlines, and what the model is told.

Pure functions over the folded state; a question is one kind of request a person answers
(workflows/requests.py has the rule every kind shares), asked with the step's approval
requests and waiting with them. Answers reach the workflow through
the `answer` Update and Signal; their handlers only record them, and the loop turns what
was recorded into events, in arrival order. The first answer wins; a repeat gets it back.
The same `answer_problem` answers the Update's validator, the Signal's absorption and the
client's check before it sends, so the three cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from waystation.workflows import errors, requests
from waystation.workflows.approval import repeats_recent_call, request_id_for
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    ErrorEvent,
    OpenStep,
    PendingQuestion,
    QuestionAnswered,
    QuestionAsked,
    draft,
)
from waystation.workflows.models import (
    ANSWER_CHARS,
    ASK_PERSON_TOOL,
    AgentTask,
    Answer,
    AnswerOutcome,
    Contract,
    QuestionSettings,
    ToolCall,
)
from waystation.workflows.requests import Problem, RequestKind, Via

CHOICES_KEPT = 20
# Signalled answers for questions not asked yet are kept (and carried) up to this many.
EARLY_ANSWERS_KEPT = 100


class AskPersonArgs(BaseModel):
    """What the model gives `ask_person`: the question, maybe choices and details."""

    question: str = Field(min_length=1, max_length=4_000, description="The question to ask.")
    choices: list[str] | None = Field(
        default=None,
        min_length=2,
        max_length=CHOICES_KEPT,
        description="The answers the person may pick from, when only these make sense.",
    )
    details: str | None = Field(
        default=None, max_length=10_000, description="What the person needs to know to answer."
    )


ASK_PERSON_DESCRIPTION = (
    "Ask the person you work for a question and wait for their answer: a fact only they "
    "know, a choice only they can make, or a confirmation. Give `choices` when only those "
    "answers make sense. The answer (and who gave it) comes back as the result."
)


class RecordedAnswer(Contract):
    """An answer as a handler recorded it, before the main loop turns it into an event."""

    answer: Answer
    via: Via


def asks_person(call: ToolCall) -> bool:
    """A call of the question tool that can be asked (a repeat is answered from before)."""
    return call.tool == ASK_PERSON_TOOL and call.runnable


def question_of(call: ToolCall) -> AskPersonArgs | None:
    try:
        return AskPersonArgs.model_validate(call.arguments or {})
    except ValidationError:
        return None


def to_ask(step: OpenStep, state: AgentState) -> list[ToolCall]:
    """Calls of the open step that ask a person and have not been asked yet."""
    return [
        c
        for c in step.calls
        if asks_person(c)
        and not repeats_recent_call(c, state)
        and request_id_for(step.step, c.call_id) not in state.pending_questions
        and request_id_for(step.step, c.call_id) not in state.answers
    ]


def unanswered(step: OpenStep, state: AgentState) -> list[str]:
    """Request ids of the open step's questions still waiting for an answer."""
    return [
        request_id_for(step.step, c.call_id)
        for c in step.calls
        if request_id_for(step.step, c.call_id) in state.pending_questions
    ]


def deadline(state: AgentState, request_ids: list[str], settings: QuestionSettings) -> datetime:
    return requests.deadline(QUESTIONS, state, request_ids, settings)


def question_events(step: int, calls: list[ToolCall]) -> list[QuestionAsked]:
    events: list[QuestionAsked] = []
    for call in calls:
        asked = question_of(call)
        if asked is None:
            continue  # the registry checked the arguments: never here
        events.append(
            draft(
                QuestionAsked,
                step,
                request_id=request_id_for(step, call.call_id),
                call_id=call.call_id,
                question=asked.question,
                choices=asked.choices,
                details=asked.details,
            )
        )
    return events


def chosen(choices: list[str] | None, answer: str) -> str | None:
    """The answer as taken: the choice it names (case and spaces aside), the text itself
    when the question offers no choices, or None when it is not one of them."""
    if not choices:
        return answer
    wanted = " ".join(answer.split()).casefold()
    return next((c for c in choices if " ".join(c.split()).casefold() == wanted), None)


def outcome_of(
    state: AgentState, request_id: str, recorded: list[RecordedAnswer]
) -> AnswerOutcome | None:
    """The answer that took effect: in the state, or recorded and not yet an event."""
    if (outcome := state.answers.get(request_id)) is not None:
        return outcome
    pending = state.pending_questions.get(request_id)
    if pending is None:
        return None
    for entry in recorded:
        a = entry.answer
        if a.request_id == request_id and (taken := chosen(pending.choices, a.answer)):
            return AnswerOutcome(
                request_id=request_id, answer=taken, answerer=a.answerer, answer_id=a.answer_id
            )
    return None


def answer_problem(
    state: AgentState, answer: Answer, recorded: list[RecordedAnswer] | None = None
) -> Problem | None:
    """Why `answer` cannot be taken now, or None (an answer to a question already answered
    is no problem: it gets the first answer back)."""
    return requests.problem(QUESTIONS, state, answer, recorded or [])


class Questions(RequestKind[Answer, RecordedAnswer, AnswerOutcome, PendingQuestion]):
    """Questions: an answer resolves one (one of its choices, when it has them); the first
    answer wins."""

    name = "question"
    early_kept = EARLY_ANSWERS_KEPT
    awaiting = "an answer"
    noun = "question"
    unknown_noun = "question"

    def pending(self, state: AgentState) -> Mapping[str, PendingQuestion]:
        return state.pending_questions

    def settings(self, task: AgentTask) -> QuestionSettings:
        return task.questions

    def response(self, entry: RecordedAnswer) -> Answer:
        return entry.answer

    def recorded(self, response: Answer, via: Via) -> RecordedAnswer:
        return RecordedAnswer(answer=response, via=via)

    def outcome_of(
        self, state: AgentState, request_id: str, recorded: list[RecordedAnswer]
    ) -> AnswerOutcome | None:
        return outcome_of(state, request_id, recorded)

    def repeat_problem(self, response: Answer, existing: AnswerOutcome) -> Problem | None:
        return None  # the first answer wins: a later one gets it back

    def check(self, response: Answer, pending: PendingQuestion) -> Problem | None:
        if chosen(pending.choices, response.answer) is not None:
            return None
        return Problem(
            errors.INVALID_CHOICE,
            f"{response.answer!r} is not one of the choices of question "
            f"{response.request_id}: " + ", ".join(repr(c) for c in pending.choices or []),
        )

    def accepted(self, state: AgentState, response: Answer) -> AnswerOutcome:
        pending = state.pending_questions[response.request_id]
        return AnswerOutcome(
            request_id=response.request_id,
            answer=chosen(pending.choices, response.answer),
            answerer=response.answerer,
            answer_id=response.answer_id,
        )

    def on_resolved(
        self, state: AgentState, response: Answer, existing: AnswerOutcome
    ) -> AgentEvent | None:
        if response.answer_id is not None:
            return None  # a client that reads the outcome back: it sees the first answer
        return draft(
            ErrorEvent,
            state.step,
            kind="duplicate_answer",
            message=f"ignored an answer to question {response.request_id}, already answered"
            + (f" by {existing.answerer}" if existing.answerer else ""),
        )

    def refused(self, state: AgentState, response: Answer, problem: Problem) -> ErrorEvent:
        message = f"ignored: {problem.message}"
        return draft(ErrorEvent, state.step, kind="refused_answer", message=message)

    def unknown(self, state: AgentState, response: Answer) -> ErrorEvent:
        problem = answer_problem(state, response)
        reason = problem.message if problem is not None else f"no question {response.request_id}"
        return draft(ErrorEvent, state.step, kind="refused_answer", message=f"ignored: {reason}")

    def resolved(
        self, state: AgentState, entry: RecordedAnswer, pending: PendingQuestion
    ) -> QuestionAnswered:
        answer = entry.answer
        return draft(
            QuestionAnswered,
            state.step,
            request_id=answer.request_id,
            answer=chosen(pending.choices, answer.answer),
            answerer=answer.answerer,
            via=entry.via,
            answer_id=answer.answer_id,
        )

    def timed_out(self, state: AgentState, request_id: str, task: AgentTask) -> QuestionAnswered:
        return draft(
            QuestionAnswered, state.step, request_id=request_id, timed_out=True, via="timeout"
        )

    def to_ask(self, step: OpenStep, state: AgentState) -> list[ToolCall]:
        return to_ask(step, state)

    def unresolved(self, step: OpenStep, state: AgentState) -> list[str]:
        return unanswered(step, state)

    def request_events(
        self, step: int, calls: list[ToolCall], state: AgentState
    ) -> list[AgentEvent]:
        return list(question_events(step, calls))


QUESTIONS = Questions()


def observation(outcome: AnswerOutcome | None, settings: QuestionSettings) -> tuple[str, bool]:
    """(what the model is told, whether it is an error) for an asked question."""
    if outcome is None:
        return "The question was not asked.", True
    if outcome.timed_out or outcome.answer is None:
        waited = f"{settings.timeout_seconds:g} s"
        return f"Nobody answered within {waited}; decide without the answer or ask again.", True
    who = outcome.answerer or "the person"
    return f"{who} answered: {outcome.answer}", False


def pending_view(state: AgentState) -> list[dict[str, Any]]:
    """The pending questions as the memo shows them (what an answerer may act on)."""
    return [
        {
            "kind": "question",
            "request_id": q.request_id,
            "question": q.question[:ANSWER_CHARS],
            "choices": q.choices,
            "details": (q.details or "")[:300] or None,
            "requested_at": q.requested_at.isoformat(),
            "step": q.step,
        }
        for q in state.pending_questions.values()
    ]
