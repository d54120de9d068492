"""Following a task live: its stream shown until it ends or waits, the approvals and
questions it asks put to the person at the terminal, and the exit code of how it ended."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from temporalio.service import RPCError

from waystation.cli.render import LiveView, visible, visible_json
from waystation.cli.terminal import EXIT_CANCELLED, EXIT_FAILED, EXIT_WAITING, approver, say
from waystation.client.agent_runtime import (
    AgentRuntime,
    DecisionError,
    TaskError,
    TaskHandle,
)
from waystation.client.tree_stream import TreeItem
from waystation.settings import commands as hints
from waystation.worker import log as worker_log
from waystation.workflows import errors
from waystation.workflows.events import (
    ApprovalRequested,
    QuestionAsked,
    UserMessage,
    request_digest,
)


async def follow_from(runtime: AgentRuntime, handle: TaskHandle, since: int) -> int:
    """The live view of what a command set going, until the task ends or waits."""
    return await follow(
        runtime, handle, since=since, as_json=False, interactive=False, on_approval="exit"
    )


async def follow(
    runtime: AgentRuntime,
    handle: TaskHandle,
    *,
    since: int,
    as_json: bool,
    interactive: bool,
    on_approval: str,
    answer_to: str | None = None,
    tree: bool | None = None,
) -> int:
    """Show the task's stream until it ends (or waits, as `on_approval` says); with
    `answer_to`, until the answer to that message (earlier answers are shown and passed).
    The live view shows the sub-agents' items too (`tree`: by default for people, not for
    --json), and their approvals and questions are asked or named like the task's own."""
    view = LiveView()
    taken = answer_to is None
    following = answer_to is not None
    whole = not as_json if tree is None else tree
    with shows_failed_attempts(view, handle.id, enabled=not as_json, tree=whole):
        async for item in runtime.stream(handle.id, since=since, follow=following, tree=whole):
            if as_json:
                print(visible_json(item.model_dump_json()), flush=True)
            else:
                view.show(item)
            below = item if isinstance(item, TreeItem) and item.path else None
            owner = handle if below is None else runtime.get(below.task_id)
            if isinstance(item.data, UserMessage) and item.data.message_id == answer_to:
                taken = taken or below is None
            if item.terminal and (taken or item.data.type != "done"):
                break
            waiting = f"task {handle.id}" if below is None else _whose(handle, below)
            if isinstance(item.data, ApprovalRequested):
                request = item.data
                if not await _still_pending(owner, request.request_id):
                    continue  # decided since (a replayed stream of an older task)
                if interactive:
                    await _ask(owner, request)
                elif on_approval == "exit":
                    say(
                        f"{waiting} waits for approval of [{request.request_id}]; it holds "
                        "no process while it waits. Decide with:\n"
                        f"  {hints.command('approve', owner.id, request.request_id)}\n"
                        f"  {hints.command('approve', owner.id, request.request_id, '--reject')} "
                        "--message 'why'"
                    )
                    return EXIT_WAITING
            if isinstance(item.data, QuestionAsked):
                question = item.data
                if not await _still_asked(owner, question.request_id):
                    continue  # answered since
                if interactive:
                    await _ask_question(owner, question)
                elif on_approval == "exit":
                    say(
                        f"{waiting} waits for an answer to [{question.request_id}]; it "
                        "holds no process while it waits. Answer with:\n"
                        f"  {hints.command('answer', owner.id, question.request_id)} 'the answer'"
                    )
                    return EXIT_WAITING
    return await final_status(handle)


def _whose(handle: TaskHandle, item: TreeItem) -> str:
    """Who waits, for a request of a sub-agent: the task followed, through its sub-agent."""
    return f"task {handle.id}: its sub-agent {' > '.join(item.path)} ({item.task_id})"


async def _still_asked(handle: TaskHandle, request_id: str) -> bool:
    try:
        return request_id in (await handle.state()).pending_questions
    except (TaskError, RPCError):
        return True


async def _ask_question(handle: TaskHandle, question: QuestionAsked) -> None:
    """Ask the person at the terminal; a wrong choice is asked again."""
    if question.details:
        say(f"  {question.details}")
    choices = f" [{' / '.join(question.choices)}]" if question.choices else ""
    while True:
        text = await asyncio.to_thread(input, visible(f"answer{choices}> "))
        if not text.strip():
            continue
        try:
            outcome = await handle.answer(text, question.request_id, answerer=approver())
        except DecisionError as err:
            if err.kind == errors.INVALID_CHOICE:
                say(str(err))
                continue
            raise
        if outcome.duplicate:
            say(f"question {outcome.request_id} was already answered: {outcome.answer}")
        return


async def _still_pending(handle: TaskHandle, request_id: str) -> bool:
    """A decision sent early (or re-applied by a repair) resolves a request at once; when
    the state cannot be read, the request counts as pending."""
    try:
        return request_id in (await handle.state()).pending_approvals
    except (TaskError, RPCError):
        return True


MODEL_ACTIVITIES = frozenset({"call_llm", "summarize_context"})


@contextlib.contextmanager
def shows_failed_attempts(
    view: LiveView, task_id: str, *, enabled: bool, tree: bool = False
) -> Iterator[None]:
    """While following a task, its failed model attempts are one line in the live view (with
    `tree`, its sub-agents' too)."""
    if not enabled:
        yield
        return

    def show(failure: worker_log.AttemptFailure) -> bool:
        ours = failure.workflow_id == task_id or (
            tree and failure.workflow_id.startswith(task_id + "/")
        )
        mine = ours and failure.activity in MODEL_ACTIVITIES
        return mine and view.attempt_failed(failure)

    worker_log.listen(show)
    try:
        yield
    finally:
        worker_log.listen(None)


async def _ask(handle: TaskHandle, request: ApprovalRequested) -> None:
    # The live view has shown the call, with every argument in full when its summary cut one.
    prompt = f"approve {visible(request.tool)}? [y/N/message to reject] "
    answer = await asyncio.to_thread(input, prompt)
    answer = answer.strip()
    approve = answer.lower() in {"y", "yes"}
    message = None if approve or answer.lower() in {"", "n", "no"} else answer
    # Bound to the call this prompt showed: a decision for any other call is refused.
    outcome = await handle.approve(
        request.request_id,
        reject=not approve,
        message=message,
        approver=approver(),
        shown=request_digest(request.tool, request.arguments),
    )
    if outcome.duplicate:
        say(f"request {outcome.request_id} was already decided: {outcome.decision}")


async def final_status(handle: TaskHandle) -> int:
    from waystation.client.agent_runtime import TaskCancelledError, TaskFailedError

    try:
        outcome = await handle.result()
    except TaskFailedError as err:
        say(f"task {handle.id} failed: {err}")
        return EXIT_FAILED
    except TaskCancelledError:
        return EXIT_CANCELLED
    say(f"task {handle.id} done in {outcome.steps} step(s), {outcome.usage.total} tokens")
    return 0
