"""What becomes of each tool call of a step: run it, or answer without running it.

Pure: the workflow runs what `verdict` says to run and logs the rest as observations.
"""

from __future__ import annotations

from dataclasses import dataclass

from waystation.workflows import questions
from waystation.workflows.approval import repeats_recent_call, request_id_for, run_outcome
from waystation.workflows.events import AgentState, call_signature
from waystation.workflows.models import (
    ASK_PERSON_TOOL,
    FINAL_ANSWER_TOOL,
    AgentSpec,
    QuestionSettings,
    ToolCall,
    ToolRequest,
    ToolResult,
    idempotency_key,
)


@dataclass(frozen=True)
class Delegation:
    """Run a sub-agent: its definition (as the worker had it) and the task the model gave."""

    call: ToolCall
    spec: AgentSpec
    instruction: str


@dataclass(frozen=True)
class Run:
    """Run the call as this request; `note` is added to its output (an approver's note)."""

    request: ToolRequest
    note: str
    local: bool
    retry_safe: bool


def verdict(
    task_id: str,
    step: int,
    call: ToolCall,
    state: AgentState,
    settings: QuestionSettings | None = None,
) -> Run | ToolResult | Delegation:
    """A call to run, or the observation of a call that is not run (a repeat of the last
    step's identical call, a malformed call, a call a person rejected or left undecided, a
    question to a person, whose answer is its observation)."""
    settings = settings or QuestionSettings()
    if repeats_recent_call(call, state):
        earlier = state.recent_calls[call_signature(call)]
        since = f" and again at step {earlier.step}" if earlier.ran_at is not None else ""
        return ToolResult(
            output=f"You made this exact {call.tool} call at step {earlier.result_step}{since}, "
            f"so it was not run again. Its result at step {earlier.result_step} began: "
            f"{earlier.output}\nUse that result, or do something different.",
            is_error=True,
        )
    if not call.runnable:
        return ToolResult(output=call.problem or "the call has no arguments", is_error=True)
    if call.tool == FINAL_ANSWER_TOOL:
        return ToolResult(output="Final answer accepted.")
    if call.agent is not None:
        instruction = str((call.arguments or {}).get("task", ""))
        return Delegation(call, call.agent, instruction)
    if call.tool == ASK_PERSON_TOOL:
        answered = state.answers.get(request_id_for(step, call.call_id))
        output, is_error = questions.observation(answered, settings)
        return ToolResult(output=output, is_error=is_error)
    outcome = (
        state.decisions.get(request_id_for(step, call.call_id)) if call.needs_approval else None
    )
    blocked, note = run_outcome(call, outcome)
    if blocked is not None:
        return ToolResult(output=blocked, is_error=True)
    edited = outcome.arguments if outcome is not None else None
    request = ToolRequest(
        call_id=call.call_id,
        tool=call.tool,
        arguments=edited if edited is not None else call.arguments or {},
        idempotency_key=idempotency_key(task_id, step, call.call_id),
    )
    return Run(request, note, local=call.local and call.retry_safe, retry_safe=call.retry_safe)


def verdicts(
    task_id: str,
    step: int,
    calls: list[ToolCall],
    state: AgentState,
    settings: QuestionSettings | None = None,
) -> tuple[dict[str, ToolResult], dict[str, Run], dict[str, Delegation]]:
    """(observations of the calls not run, the calls to run, the sub-agents to start), by
    call id."""
    results: dict[str, ToolResult] = {}
    runs: dict[str, Run] = {}
    delegations: dict[str, Delegation] = {}
    for call in calls:
        match verdict(task_id, step, call, state, settings):
            case ToolResult() as result:
                results[call.call_id] = result
            case Run() as run:
                runs[call.call_id] = run
            case Delegation() as delegation:
                delegations[call.call_id] = delegation
    return results, runs, delegations


def lost_call(tool: str, detail: str) -> ToolResult:
    """A call whose activity failed for good: the model is told it may or may not have run."""
    return ToolResult(
        output=f"{tool} did not complete ({detail}): it may or may not have taken effect; "
        "it was not run again",
        is_error=True,
    )
