"""What the Temporal SDK does today when an Update follows a query a cold worker answered.

This pins the behaviour of temporalio 1.35 (and the sdk-core it bundles) with a workflow
that has nothing of waystation: one activity, one search-attribute upsert after it, one
Update. It is the minimal reproduction of issue 12 (docs/never-stuck.md).

The mechanism. A query that arrives while no workflow task is pending goes straight to a
worker ("legacy query"). If that worker does not hold the run in its cache, it reads the
history, and by then the history may hold an activity result that no workflow task has
processed. The worker applies that result anyway, in an activation of its own that is not
marked as replaying, keeps the commands the workflow produced after it (the upsert), and
keeps the run cached. When the workflow task for the result then reaches the worker with
an Update in it, the completion sends the kept upsert first and the Update's acceptance
after it:

    ActivityTaskCompleted, WorkflowTaskScheduled, WorkflowTaskStarted,
    WorkflowTaskCompleted, UpsertWorkflowSearchAttributes, WorkflowExecutionUpdateAccepted

A replay delivers the activity result and the Update in one activation and the SDK runs
Update handlers before anything else, so it emits UpdateAccepted first: a nondeterminism
error ("Update machine does not handle this event"), and every later workflow task of the
run fails the same way.

How the test gets there without a kill or a sleep. One worker caches one run. Run A waits
on its activity (nobody polls that activity's queue; the test completes it by id); run B
starts and pushes A out of the cache. A query on A makes the worker evict B first; the
test holds that eviction at a gate in the workflow runner. While it is held the test
completes A's activity and has the Update admitted; the worker cannot take A's pending
workflow task meanwhile (its only cache slot is being freed). Then the gate opens.

WHEN THIS FAILS after an SDK or server upgrade, the behaviour changed:
- `test_update_after_cold_query_breaks_replay` replays cleanly: the SDK fixed the order
  (sdk-python #1591). Flip the expectation and keep the case; docs/never-stuck.md and the
  `decide` Update's docstring can then say Updates are safe after any query.
- a "precondition" fails: the SDK or server routes these tasks differently and the
  reproduction no longer reaches the state described above; rework it before concluding.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import (
    EventType,
    IndexedValueType,
    UpdateWorkflowExecutionLifecycleStage,
)
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.update.v1 import UpdateRef, WaitPolicy
from temporalio.api.workflowservice.v1 import PollWorkflowExecutionUpdateRequest
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    Replayer,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

PROBE_STAGE = SearchAttributeKey.for_keyword("SdkProbeStage")
NOBODY_POLLS = "sdk-probe-activities"  # the test completes the activity itself, by id
RESULT = "activity-result"
WAIT_SECONDS = 30.0  # bound of every wait on an observable state


@workflow.defn(name="SdkProbeQueryThenUpdate")
class ProbeWorkflow:
    """One activity, an upsert after it, then a wait for the `approve` Update."""

    def __init__(self) -> None:
        self.result: str | None = None
        self.applied_while_replaying: bool | None = None
        self.approved = False

    @workflow.run
    async def run(self) -> str:
        self.result = await workflow.execute_activity(
            "external_step",
            task_queue=NOBODY_POLLS,
            start_to_close_timeout=timedelta(minutes=5),
            result_type=str,
        )
        self.applied_while_replaying = workflow.unsafe.is_replaying()
        workflow.upsert_search_attributes([PROBE_STAGE.value_set("after-activity")])
        await workflow.wait_condition(lambda: self.approved)
        return self.result

    @workflow.query
    def seen(self) -> dict[str, Any]:
        return {"result": self.result, "replaying": self.applied_while_replaying}

    @workflow.update
    def approve(self, verdict: str) -> str:
        self.approved = True
        return verdict

    @approve.validator
    def _check(self, verdict: str) -> None:
        if verdict == "reject":
            raise ValueError("rejected by the validator")


class EvictionGate:
    """Holds the eviction of one run (in the worker's activation thread) until opened."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.reached = threading.Event()
        self.opened = threading.Event()


class _GatedInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, gate: EvictionGate) -> None:
        self._inner = inner
        self._gate = gate

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        evicting = any(job.HasField("remove_from_cache") for job in act.jobs)
        if evicting and act.run_id == self._gate.run_id:
            self._gate.reached.set()
            self._gate.opened.wait(WAIT_SECONDS)
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class GatedRunner(WorkflowRunner):
    """The unsandboxed runner, with an EvictionGate in front of every instance."""

    def __init__(self, gate: EvictionGate) -> None:
        self._inner = UnsandboxedWorkflowRunner()
        self._gate = gate

    def prepare_workflow(self, defn: workflow._Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _GatedInstance(self._inner.create_instance(det), self._gate)

    def set_worker_level_failure_exception_types(
        self, types: Sequence[type[BaseException]]
    ) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


@pytest.fixture(scope="module")
async def probe_client(dev_env: WorkflowEnvironment) -> AsyncIterator[Client]:
    client = dev_env.client
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={PROBE_STAGE.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
            )
        )
    except RPCError as err:
        if err.status != RPCStatusCode.ALREADY_EXISTS:
            raise
    yield client


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_SECONDS):
            while not await check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def _types(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        async for e in handle.fetch_history_events()
    ]


async def _scheduled(handle: WorkflowHandle[Any, Any]) -> bool:
    return "ACTIVITY_TASK_SCHEDULED" in await _types(handle)


async def _admitted(client: Client, workflow_id: str, update_id: str) -> bool:
    stage = UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
    ref = UpdateRef(
        workflow_execution=WorkflowExecution(workflow_id=workflow_id), update_id=update_id
    )
    try:
        await client.workflow_service.poll_workflow_execution_update(
            PollWorkflowExecutionUpdateRequest(
                namespace=client.namespace,
                update_ref=ref,
                wait_policy=WaitPolicy(lifecycle_stage=stage),
            )
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # the Update has not reached the server yet
            return False
        raise
    return True


async def _replay_failure(handle: WorkflowHandle[Any, Any]) -> Exception | None:
    replayer = Replayer(workflows=[ProbeWorkflow], workflow_runner=UnsandboxedWorkflowRunner())
    history = await handle.fetch_history()
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return replayed.replay_failure


async def _run_case(
    client: Client, *, query: bool, verdict: str
) -> tuple[WorkflowHandle[Any, Any], asyncio.Task[str], dict[str, Any] | None]:
    """Drive run A to the point described in the module docstring; returns A, the Update's
    call and the query's answer (None without a query)."""
    queue = f"sdk-probe-{uuid.uuid4().hex[:10]}"
    gate = EvictionGate()
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[ProbeWorkflow],
        workflow_runner=GatedRunner(gate),
        max_cached_workflows=1,
    )
    async with worker:
        try:
            run_a = await client.start_workflow(
                ProbeWorkflow.run, id=f"{queue}-a", task_queue=queue
            )
            await _until(lambda: _scheduled(run_a), "A schedules its activity")
            run_b = await client.start_workflow(
                ProbeWorkflow.run, id=f"{queue}-b", task_queue=queue
            )
            await _until(lambda: _scheduled(run_b), "B schedules its activity (A evicted)")
            gate.run_id = (await run_b.describe()).run_id

            activity = client.get_async_activity_handle(
                workflow_id=run_a.id, run_id=None, activity_id="1"
            )
            asked: asyncio.Task[dict[str, Any]] | None = None
            if query:
                asked = asyncio.create_task(run_a.query(ProbeWorkflow.seen))
            else:
                await activity.complete(RESULT)  # the task for it makes room for A the same way
            assert await asyncio.to_thread(gate.reached.wait, WAIT_SECONDS), (
                "precondition: the worker did not evict B to make room for A"
            )
            if query:
                await activity.complete(RESULT)
            update = asyncio.create_task(
                run_a.execute_update(ProbeWorkflow.approve, verdict, id="u1")
            )
            await _until(lambda: _admitted(client, run_a.id, "u1"), "the Update is admitted")
            if query:
                after = (await _types(run_a))[-2:]
                assert after == ["ACTIVITY_TASK_COMPLETED", "WORKFLOW_TASK_SCHEDULED"], (
                    f"precondition: the task for the result started while the gate held: {after}"
                )
            gate.opened.set()
            answer = await asyncio.wait_for(asked, WAIT_SECONDS) if asked else None
            if verdict == "reject":
                with pytest.raises(WorkflowUpdateFailedError):
                    await update

                async def upserted() -> bool:
                    return "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" in await _types(run_a)

                await _until(upserted, "the task for the result completes")
                await run_a.terminate("the test is done")
            else:
                assert await update == verdict
                assert await run_a.result() == RESULT
            await run_b.terminate("the test is done")
        finally:
            gate.opened.set()
    return run_a, update, answer


async def test_update_after_cold_query_breaks_replay(probe_client: Client) -> None:
    run_a, _, answer = await _run_case(probe_client, query=True, verdict="approve")
    # The cold worker applied the unprocessed result, outside replay, to answer the query.
    assert answer == {"result": RESULT, "replaying": False}
    types = await _types(run_a)
    upsert = types.index("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES")
    accepted = types.index("WORKFLOW_EXECUTION_UPDATE_ACCEPTED")
    assert upsert + 1 == accepted, types  # the kept command, then the Update, one completion
    failure = await _replay_failure(run_a)
    assert isinstance(failure, workflow.NondeterminismError), (
        f"the replay no longer fails (see the module docstring): {failure!r}; history: {types}"
    )
    assert "Update machine does not handle this event" in str(failure)
    assert f"HistoryEvent(id: {upsert + 1}, UpsertWorkflowSearchAttributes)" in str(failure)


async def test_update_without_the_query_replays(probe_client: Client) -> None:
    run_a, _, _ = await _run_case(probe_client, query=False, verdict="approve")
    types = await _types(run_a)
    # Whichever task the Update reached, no completion holds the upsert and then it.
    upsert = types.index("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES")
    assert types[upsert + 1] != "WORKFLOW_EXECUTION_UPDATE_ACCEPTED", types
    assert await _replay_failure(run_a) is None


async def test_update_rejected_after_cold_query_leaves_nothing_and_replays(
    probe_client: Client,
) -> None:
    run_a, _, answer = await _run_case(probe_client, query=True, verdict="reject")
    assert answer == {"result": RESULT, "replaying": False}
    types = await _types(run_a)
    assert not [t for t in types if "UPDATE" in t], types  # a rejection writes nothing
    assert await _replay_failure(run_a) is None
