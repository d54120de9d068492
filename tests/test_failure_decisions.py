"""Pure decisions after something went wrong, without Temporal: a context-length error
from the endpoint, a resumption of a failed task, calls that are not run."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ApplicationError

from waystation.activities.payload_codec import EncryptionCodec, data_converter, failure_detail
from waystation.vocabulary import FailureKind
from waystation.workflows import errors
from waystation.workflows.agents import child_ended
from waystation.workflows.calls import Run, lost_call, verdicts
from waystation.workflows.conversation import RunMessages, ref_of, task_messages, tool_message
from waystation.workflows.events import AgentState, ErrorEvent, apply, draft
from waystation.workflows.models import (
    AgentTask,
    ChatMessage,
    FailureDetail,
    Resumption,
    ToolCall,
    Usage,
)
from waystation.workflows.plan import Fail, context_budget
from waystation.workflows.recovery import after_context_overflow, resumed
from waystation.workflows.tool_catalog import McpServerTools, ToolCatalog

TASK = AgentTask(task="do it", max_steps=5)


def state_with_tokens(*sizes: int) -> AgentState:
    refs = [ref_of(ChatMessage(role="user", content="x" * (4 * n))) for n in sizes]
    return AgentState(conversation=refs)


def test_an_overflow_compacts_while_it_shrinks_then_fails_with_a_sentence() -> None:
    state = state_with_tokens(6_000, 4_000)
    total = sum(r.tokens for r in state.conversation)
    first = after_context_overflow(state, 3, "context length exceeded")
    assert isinstance(first, ErrorEvent) and first.kind == "context_length_exceeded"
    assert first.context_limit == int(total * 0.7) and "retrying" in first.message
    stamped = first.model_copy(update={"seq": 0})
    capped = apply(state, stamped)
    assert capped.context_limit_cap == first.context_limit
    assert context_budget(capped, TASK) == first.context_limit
    # Nothing was compacted since: the same conversation cannot shrink below the cap.
    again = after_context_overflow(capped, 3, "context length exceeded")
    assert isinstance(again, Fail) and again.kind == "context_too_long"
    assert "does not fit the model's context even after compacting" in again.reason


def test_a_resumption_raises_only_the_limits_it_names() -> None:
    resumption = Resumption(failure="step limit", failure_kind="max_steps", max_steps=9)
    task, event = resumed(TASK, resumption, step=5)
    assert (task.max_steps, task.token_budget) == (9, TASK.token_budget)
    assert event.failure_kind == "max_steps" and event.max_steps == 9


def test_calls_split_into_runs_and_answers_and_a_lost_call_says_it_may_have_run() -> None:
    good = ToolCall(call_id="a", tool="calculator", raw_arguments='{"expression": "1+1"}')
    good = good.model_copy(update={"arguments": {"expression": "1+1"}})
    broken = ToolCall(call_id="b", tool="calculator", raw_arguments="{", problem="bad JSON")
    answers, runs, delegations = verdicts("task", 1, [good, broken], AgentState())
    assert not delegations
    assert set(runs) == {"a"} and isinstance(runs["a"], Run)
    assert runs["a"].request.idempotency_key.startswith("task/1/a")
    assert answers["b"].is_error and answers["b"].output == "bad JSON"
    lost = lost_call("write_file", "worker lost")
    assert lost.is_error and "may or may not have taken effect" in lost.output


def test_a_run_knows_which_messages_only_it_holds() -> None:
    task_text = task_messages("system", "task")
    messages = RunMessages(task_text)
    refs = [ref_of(m) for m in task_text]
    assert not messages.added_to(refs)  # the task's own text travels in every run's input
    reply = tool_message("c1", "42")
    messages.add([reply])
    assert messages.added_to([*refs, ref_of(reply)])
    assert messages.of([refs[0].digest, "unknown"]) == {refs[0].digest: task_text[0]}


def test_a_catalog_names_each_server_that_could_not_be_listed() -> None:
    catalog = ToolCatalog(
        servers=[McpServerTools(server="git", error="exited: no git"), McpServerTools(server="ok")]
    )
    assert catalog.problems() == ["the tools of MCP server 'git' are missing: exited: no git"]
    assert draft(ErrorEvent, 1, kind="mcp_server", message=catalog.problems()[0]).step == 1


USED = Usage(input_tokens=7, output_tokens=2)
# A failed task's ApplicationError details: the model, and the positions of runs recorded
# before it, (kind, usage) and, earlier still, (kind,).
SHAPES = [
    (FailureDetail(kind=FailureKind.MAX_STEPS, usage=USED).as_details(), "max_steps", USED),
    (("max_steps", USED), "max_steps", USED),
    (("llm_error",), "llm_error", None),
    (("stuck", USED), "repeated_calls", USED),  # the repeat guard's name before its own
]


@pytest.mark.parametrize(("details", "kind", "usage"), SHAPES)
async def test_every_reader_reads_a_failure_detail_in_either_shape(
    details: tuple[Any, ...], kind: str, usage: Usage | None
) -> None:
    # The client's and the workers' readers meet the details encoded, maybe encrypted.
    for codec in (None, EncryptionCodec({"k": b"k" * 32}, "k")):
        converter = data_converter(codec)
        failure = Failure()
        raised = ApplicationError("it failed", *details, type=errors.AGENT_FAILED)
        await converter.encode_failure(raised, failure)
        assert await failure_detail(converter, failure) == FailureDetail(kind=kind, usage=usage)
        decoded = await converter.decode_failure(failure)
        assert isinstance(decoded, ApplicationError)
        assert FailureDetail.of(decoded.details) == FailureDetail(kind=kind, usage=usage)
    # A parent workflow reads its child's failure to tell its model (and count the tokens).
    observed = child_ended("helper", ApplicationError("it failed", *details))
    assert observed.agent_status == "failed" and observed.usage == usage


@pytest.mark.parametrize("details", [(), (42,), ({"other": 1},), (None, USED)])
def test_details_of_another_failure_are_no_failure_detail(details: tuple[Any, ...]) -> None:
    assert FailureDetail.of(details) is None
