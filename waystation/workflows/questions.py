"""Questions the model asks a person (the built-in `ask_person` tool): who may answer what,
deadlines, and what the model is told.

Pure functions over the folded state, beside workflows/approval.py: a question is asked
with the step's approval requests and waits with them. Answers reach the workflow through
the `answer` Update and Signal; their handlers only record them, and the loop turns what
was recorded into events, in arrival order. The first answer wins; a repeat gets it back.
The same `answer_problem` answers the Update's validator, the Signal's absorption and the
client's check before it sends, so the three cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, ValidationError

from waystation.workflows import errors
from waystation.workflows.approval import Problem, repeats_recent_call, request_id_for
from waystation.workflows.events import (
    AgentEvent,
    AgentState,
    ErrorEvent,
    OpenStep,
    QuestionAnswered,
    QuestionAsked,
    draft,
)
from waystation.workflows.models import (
    ANSWER_CHARS,
    ASK_PERSON_TOOL,
    Answer,
    AnswerOutcome,
    Contract,
    QuestionSettings,
    ToolCall,
)

CHOICES_KEPT = 20
# Signalled answers for questions not asked yet are kept (and carried) up to this many.
EARLY_ANSWERS_KEPT = 100
KEEP: Final = "keep"  # absorb: wait for the question this answer is for


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
    via: Literal["update", "signal"]


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
    first = min(state.pending_questions[r].requested_at for r in request_ids)
    return first + timedelta(seconds=settings.timeout_seconds)


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
    if outcome_of(state, answer.request_id, recorded or []) is not None:
        return None
    pending = state.pending_questions.get(answer.request_id)
    if pending is not None:
        if chosen(pending.choices, answer.answer) is None:
            return Problem(
                errors.INVALID_CHOICE,
                f"{answer.answer!r} is not one of the choices of question "
                f"{answer.request_id}: " + ", ".join(repr(c) for c in pending.choices or []),
            )
        return None
    if state.finished or not state.pending_questions:
        return Problem(
            errors.TASK_NOT_WAITING,
            f"task is {state.status}, not waiting for an answer (question {answer.request_id})",
        )
    return Problem(
        errors.UNKNOWN_REQUEST,
        f"unknown question {answer.request_id}; pending: " + ", ".join(state.pending_questions),
    )


def absorb(
    state: AgentState, entry: RecordedAnswer, early: int
) -> AgentEvent | Literal["keep"] | None:
    """The event a recorded answer makes now, None for a waiting client's repeat, or KEEP
    to hold it until its question is asked (an answer may outrun the step that asks; past
    EARLY_ANSWERS_KEPT `early` ones a new one is refused)."""
    answer = entry.answer
    request_id = answer.request_id
    if (existing := state.answers.get(request_id)) is not None:
        if answer.answer_id is not None:
            return None  # a client that reads the outcome back: it sees the first answer
        return draft(
            ErrorEvent,
            state.step,
            kind="duplicate_answer",
            message=f"ignored an answer to question {request_id}, already answered"
            + (f" by {existing.answerer}" if existing.answerer else ""),
        )
    pending = state.pending_questions.get(request_id)
    if pending is None and early < EARLY_ANSWERS_KEPT:
        return KEEP
    problem = answer_problem(state, answer)
    if problem is not None or pending is None:
        reason = problem.message if problem is not None else f"no question {request_id}"
        return draft(ErrorEvent, state.step, kind="refused_answer", message=f"ignored: {reason}")
    return draft(
        QuestionAnswered,
        state.step,
        request_id=request_id,
        answer=chosen(pending.choices, answer.answer),
        answerer=answer.answerer,
        via=entry.via,
        answer_id=answer.answer_id,
    )


def timeout_events(
    state: AgentState, request_ids: list[str], now: datetime, settings: QuestionSettings
) -> list[QuestionAnswered]:
    """Questions nobody answered within their time."""
    late = timedelta(seconds=settings.timeout_seconds)
    return [
        draft(
            QuestionAnswered,
            state.step,
            request_id=request_id,
            timed_out=True,
            via="timeout",
        )
        for request_id in request_ids
        if request_id in state.pending_questions
        and state.pending_questions[request_id].requested_at + late <= now
    ]


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
