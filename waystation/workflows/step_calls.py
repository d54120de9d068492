"""A step's calls: pure local tools first, then the other tools and the sub-agents at
once (each sub-agent a child AgentWorkflow, workflows/agents.py), then one observation
per call.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import (
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)
from temporalio.workflow import ChildWorkflowCancellationType, ParentClosePolicy

from waystation.workflows import (
    activity_calls,
    agents,
    options,
    outputs,
    search,
)
from waystation.workflows.calls import Delegation, Run, verdicts
from waystation.workflows.events import (
    AgentStarted,
    Observation,
    draft,
)
from waystation.workflows.model_calls import ModelCalls
from waystation.workflows.models import (
    FINAL_ANSWER_TOOL,
    ToolCall,
    ToolResult,
)
from waystation.workflows.run import (
    WORKFLOW_TYPE,
    AgentOutcome,
    AgentRun,
)
from waystation.workflows.run_core import sample_clock

# Before it, a parent adopted any task it found under a child's id, even one it never started.
OWN_CHILD_PATCH = "adopt-own-child-only"


class StepCalls(ModelCalls):
    """Running a step's tool calls and sub-agents."""

    async def _run_calls(self, step: int, calls: list[ToolCall]) -> None:
        """Run the step's calls (pure local ones first, then the rest and the sub-agents, at
        once), then log every observation."""
        task_id = workflow.info().workflow_id
        questions_settings = self._task.questions
        results, runs, delegations = verdicts(task_id, step, calls, self._state, questions_settings)
        for index, key in enumerate(list(delegations)):
            if (refused := agents.refusal(self._task, delegations[key].call, index)) is not None:
                results[key] = refused
                del delegations[key]
        share = agents.budget_shares(self._task, self._state.usage, len(delegations))
        local = [(k, r) for k, r in runs.items() if r.local]
        ran = await asyncio.gather(
            *(activity_calls.run_tool(self._task, run, self._catalog) for _, run in local)
        )
        results.update({k: out for (k, _), out in zip(local, ran, strict=True)})
        remote = [(k, r) for k, r in runs.items() if not r.local]
        if remote or delegations:
            ran = await self._run_remote(step, remote, list(delegations.values()), share)
            keys = [k for k, _ in remote] + list(delegations)
            results.update(dict(zip(keys, ran, strict=True)))
            self._clock = sample_clock()
        for call in calls:
            result = results[call.call_id]
            observed = {
                "output": result.output,
                "is_error": result.is_error,
                "usage": result.usage,
                "agent_status": result.agent_status,
            }
            self._append(draft(Observation, step, call_id=call.call_id, tool=call.tool, **observed))
        self._relist([server for r in results.values() for server in r.stale_servers])
        schema = self._task.output_schema
        final = [c for c in calls if c.tool == FINAL_ANSWER_TOOL and c.runnable]
        if schema is not None and final and not results[final[0].call_id].is_error:
            value = outputs.unwrap(schema, final[0].arguments or {})
            self._answer(step, outputs.as_text(value), value)

    async def _run_remote(
        self,
        step: int,
        remote: list[tuple[str, Run]],
        delegations: list[Delegation],
        share: agents.BudgetShare,
    ) -> list[ToolResult]:
        """The step's tool activities and its sub-agents, all at once: the children are
        started together, logged in call order once Temporal has started them, then
        awaited with the tools. Cancelling the task cancels them all, and waits."""
        running = [
            asyncio.ensure_future(activity_calls.run_tool(self._task, run, self._catalog))
            for _, run in remote
        ]
        try:
            starts = await asyncio.gather(*(self._start_child(step, d, share) for d in delegations))
            for delegation, start in zip(delegations, starts, strict=True):
                call_id, name = delegation.call.call_id, delegation.spec.name
                if not start.foreign:
                    self._started(step, call_id, name, start.child_id)
            pairs = zip(delegations, starts, strict=True)
            answers = [self._child_answer(d, start) for d, start in pairs]
            return list(await asyncio.gather(*running, *answers))
        except asyncio.CancelledError:
            for call in running:
                call.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    async def _start_child(
        self, step: int, delegation: Delegation, share: agents.BudgetShare
    ) -> agents.ChildStart:
        """Start a sub-agent as a child task (or find the one a repaired or reset step
        started before: same id)."""
        task_id = workflow.info().workflow_id
        call_id = delegation.call.call_id
        at = agents.link(self._task, task_id, delegation.spec, call_id)
        task = agents.child_task(self._task, delegation.spec, delegation.instruction, share, at)
        child_id = agents.child_id(task_id, step, call_id)
        # Only a task with a tenant sets these, so a recorded run without one makes the
        # very commands it made.
        tenant = task.tenant
        try:
            handle = await workflow.start_child_workflow(
                WORKFLOW_TYPE,
                AgentRun(task=task),
                result_type=AgentOutcome,
                id=child_id,
                task_queue=workflow.info().task_queue,
                cancellation_type=ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                parent_close_policy=ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                task_timeout=options.WORKFLOW_TASK_TIMEOUT,
                static_summary=f"{delegation.spec.name}: {delegation.instruction[:180]}",
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(search.AGENT_TENANT, tenant)]
                )
                if tenant is not None
                else None,
                priority=Priority(fairness_key=tenant) if tenant is not None else Priority.default,
            )
        except WorkflowAlreadyStartedError:
            # Adopt it only if Temporal recorded this task as its parent: the id is
            # predictable, so anyone could have created a task under it first.
            if workflow.patched(OWN_CHILD_PATCH):
                seen = await activity_calls.child_outcome(self._task, child_id)
                self._clock = sample_clock()
                if seen.foreign:
                    return agents.ChildStart(child_id, None, foreign=True)
            return agents.ChildStart(child_id, None)
        return agents.ChildStart(child_id, handle)

    async def _child_answer(self, delegation: Delegation, start: agents.ChildStart) -> ToolResult:
        """The sub-agent's answer (or its end) as the call's observation."""
        name = delegation.spec.name
        if start.foreign:
            return agents.not_adopted(delegation.call, start.child_id)
        if start.handle is None:
            return await self._rejoin(start.child_id, name)
        try:
            outcome = await start.handle
        except ChildWorkflowError as err:
            if activity_calls.task_cancelling():
                raise asyncio.CancelledError() from None
            return agents.child_ended(name, err.cause)
        return agents.answered(outcome.output, outcome.result, outcome.usage)

    def _started(self, step: int, call_id: str, name: str, child_id: str) -> None:
        """The log says a sub-agent's task exists once Temporal has started it."""
        self._clock = sample_clock()
        self._append(draft(AgentStarted, step, call_id=call_id, agent=name, child_id=child_id))

    async def _rejoin(self, child_id: str, name: str) -> ToolResult:
        """A child that exists already (a repair or reset re-ran the step that started it):
        Temporal keeps it but no longer reports its end here, so ask now and then."""
        pause = agents.REJOIN_FIRST_PAUSE
        try:
            while True:
                seen = await activity_calls.child_outcome(self._task, child_id)
                if seen.closed:
                    return agents.rejoined(name, seen)
                await workflow.sleep(pause)
                pause = min(pause * 2, agents.REJOIN_LONGEST_PAUSE)
        except asyncio.CancelledError:
            await workflow.get_external_workflow_handle(child_id).cancel()
            raise
