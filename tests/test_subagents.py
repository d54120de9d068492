"""Sub-agents as child tasks: offered as agent__<name> tools, run in parallel as child
workflows whose ids derive from the parent's, their answers the parent's observations, the
tree's usage counted against the parent's budget (real dev server, a worker in this
process, the fake OpenAI server)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, wait_for_state
from waystation.activities.agent_tools import agent_tool
from waystation.activities.builtin_tools import builtin_registry
from waystation.activities.tools import ToolRegistry
from waystation.client.agent_runtime import AgentRuntime, TaskCancelledError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.mcp import CallLog, demo_stdio
from waystation.testing.workers import running_worker
from waystation.worker.child_outcomes import started_by
from waystation.workflows import agents, search
from waystation.workflows.agent import AgentWorkflow
from waystation.workflows.models import AgentSpec, AgentTask, ApprovalSettings, ModelSettings
from waystation.workflows.run import AgentRun


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def registry_with(*specs: AgentSpec) -> ToolRegistry:
    registry = builtin_registry()
    for spec in specs:
        registry.register(agent_tool(spec))
    return registry


def agent(name: str, model: str, **fields: Any) -> AgentSpec:
    settings = ModelSettings(name=model, request_timeout_seconds=30)
    return AgentSpec(name=name, description=f"the {name}", model=settings, **fields)


@pytest.fixture
def tree(dev_env: WorkflowEnvironment, settings: Settings) -> Any:
    """`async with tree(*specs) as runtime`: a worker and runtime offering these agents."""

    class Tree:
        def __call__(self, *specs: AgentSpec) -> Any:
            return self._serve(registry_with(*specs))

        async def _gen(self, registry: ToolRegistry) -> AsyncIterator[AgentRuntime]:
            async with running_worker(dev_env.client, settings, registry=registry):
                yield AgentRuntime(dev_env.client, settings, tools=registry)

        def _serve(self, registry: ToolRegistry) -> Any:
            import contextlib

            return contextlib.asynccontextmanager(self._gen)(registry)

    return Tree()


async def test_two_sub_agents_called_in_one_step_run_in_parallel_and_answer(
    tree: Any, fake_openai: FakeOpenAI
) -> None:
    gates = {"one": threading.Event(), "two": threading.Event()}
    children = {
        name: fake_openai.script(
            [Reply(content=f"{name} found it", hold_after_chunks=1, gate=gates[name])]
        )
        for name in gates
    }
    parent = fake_openai.script(
        [
            tools(
                ("agent__one", {"task": "look in the attic"}),
                ("agent__two", {"task": "look in the cellar"}),
            ),
            text("both looked"),
        ]
    )
    async with tree(agent("one", children["one"]), agent("two", children["two"])) as runtime:
        handle = await runtime.run(agent_task(parent, task="find the key"))
        try:
            # Both children's requests reach the model before either answers.
            await fake_openai.until_streaming(children["one"], 1, request=0)
            await fake_openai.until_streaming(children["two"], 1, request=0)
        finally:
            for gate in gates.values():
                gate.set()
        outcome = await handle.result()
        events = await handle.events()
        state = await handle.state()
        child_ids = sorted(e.child_id for e in of_type(events, "agent_started"))
        child_states = [await runtime.get(c).state() for c in child_ids]
        child_overview = await runtime.get(child_ids[0]).overview()
    assert outcome.result == "both looked"
    assert sorted(tool_results(fake_openai.requests[parent][1])) == [
        "one found it",
        "two found it",
    ]
    # The children are tasks of their own, with ids derived from the parent's.
    assert sorted(child_ids) == [f"{handle.id}/1/call_1_0", f"{handle.id}/1/call_1_1"]
    assert [s.status for s in child_states] == ["done", "done"]
    [started] = [e for e in events if e.type == "task_started"]
    assert started.task_id == handle.id
    assert {c.agent: c.status for c in state.children.values()} == {"one": "done", "two": "done"}
    assert child_overview.memo[search.MEMO_PARENT] == {
        "task_id": handle.id,
        "root_id": handle.id,
        "path": ["one"],
    }
    # The tree's usage counts: the parent's two calls (11 + 7 each) and each child's one.
    assert state.usage.input_tokens == 4 * 11 and state.usage.output_tokens == 4 * 7
    # The instruction is what the child was asked.
    assert [m["content"] for m in fake_openai.requests[children["one"]][0]["messages"]][
        1
    ] == "look in the attic"


async def test_a_sub_agent_with_a_schema_answers_with_data_and_a_failed_one_is_told(
    tree: Any, fake_openai: FakeOpenAI
) -> None:
    typed = fake_openai.script([tools(("final_answer", {"city": "Oslo", "people": 709037}))])
    broken = fake_openai.script([tools(("calculator", {"expression": "1+1"}))] * 3)
    parent = fake_openai.script(
        [
            tools(("agent__census", {"task": "Oslo?"}), ("agent__loop", {"task": "go"})),
            text("noted"),
        ]
    )
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
        "required": ["city", "people"],
    }
    specs = (
        agent("census", typed, output_schema=schema),
        agent("loop", broken, max_steps=1),
    )
    async with tree(*specs) as runtime:
        outcome = await (await runtime.run(agent_task(parent))).result()
    assert outcome.result == "noted"
    census, loop = tool_results(fake_openai.requests[parent][1])
    assert json.loads(census) == {"city": "Oslo", "people": 709037}
    assert loop.startswith("the sub-agent loop failed without an answer: reached max_steps=1")


async def test_depth_and_fan_out_limits_stop_a_runaway_tree(
    tree: Any, fake_openai: FakeOpenAI
) -> None:
    def recursive(body: dict[str, Any]) -> Reply:
        told = tool_results(body)
        if not told:
            return tools(("agent__self", {"task": "again"}))
        return text(f"below me: {told[-1]}")

    model = fake_openai.script(recursive)
    async with tree(agent("self", model)) as runtime:
        task = agent_task(model, task="recurse", max_agent_depth=2)
        outcome = await (await runtime.run(task)).result()
    assert outcome.result == (
        "below me: below me: below me: agent__self was not started: sub-agents may nest 2 "
        "deep and this one would be deeper; do the work yourself"
    )
    fan = fake_openai.script(
        [tools(*(("agent__leaf", {"task": f"part {i}"}) for i in range(3))), text("fanned")]
    )
    leaf = fake_openai.script(lambda body: text("leaf done"))
    async with tree(agent("leaf", leaf)) as runtime:
        task = agent_task(fan, max_agent_calls=2)
        await (await runtime.run(task)).result()
    results = tool_results(fake_openai.requests[fan][1])
    assert results[:2] == ["leaf done", "leaf done"]
    assert "a step may call 2 sub-agents at most" in results[2]


async def test_cancelling_the_parent_cancels_its_children_and_no_tool_runs_after(
    tree: Any, fake_openai: FakeOpenAI, settings: Settings
) -> None:
    gate = threading.Event()
    child = fake_openai.script(
        [
            Reply(content="thinking", hold_after_chunks=1, gate=gate),
            tools(("write_file", {"path": "scratch/late.txt", "content": "x"})),
        ]
    )
    parent = fake_openai.script([tools(("agent__worker", {"task": "work"}))])
    async with tree(agent("worker", child)) as runtime:
        handle = await runtime.run(agent_task(parent))
        try:
            await fake_openai.until_streaming(child, 1, request=0)
            state = await wait_for_state(handle, lambda s: bool(s.children))
            [started] = state.children.values()
            await handle.cancel()
            with pytest.raises(TaskCancelledError):
                await handle.result()
        finally:
            gate.set()
        description = await runtime.get(started.task_id).describe()
    assert description.status == WorkflowExecutionStatus.CANCELED
    assert not (settings.workspace_dir / "scratch" / "late.txt").exists()


async def test_a_token_budget_is_shared_across_the_tree(tree: Any, fake_openai: FakeOpenAI) -> None:
    spender = fake_openai.script(
        lambda body: tools(("calculator", {"expression": f"{len(body['messages'])}+1"}))
    )
    parent = fake_openai.script(
        [tools(("agent__spender", {"task": "a"}), ("agent__spender", {"task": "b"})), text("x")]
    )
    async with tree(agent("spender", spender, max_steps=100)) as runtime:
        task = agent_task(parent, token_budget=200)
        handle = await runtime.run(task)
        with pytest.raises(Exception) as failed:
            await handle.result()
        state = await handle.state()
    assert "token_budget" in str(failed.value)
    # Each child had half of what was left (200 - 18 tokens of the first call) and stopped
    # when it had used it; the parent counts every token of its tree.
    assert state.usage.total >= 200
    assert all(c.status == "failed" for c in state.children.values())


async def test_an_approval_inside_a_child_is_in_the_inbox_naming_its_parent(
    tree: Any, fake_openai: FakeOpenAI
) -> None:
    child = fake_openai.script([tools(("run_shell", {"command": "echo child"})), text("ran")])
    parent = fake_openai.script([tools(("agent__shell", {"task": "run echo"})), text("done")])
    async with tree(agent("shell", child)) as runtime:
        handle = await runtime.run(agent_task(parent, approval=ApprovalSettings()))
        state = await wait_for_state(handle, lambda s: bool(s.children))
        [started] = state.children.values()
        kid = runtime.get(started.task_id)
        await wait_for_state(kid, lambda s: bool(s.pending_approvals))
        overview = await kid.overview()
        assert overview.memo[search.MEMO_PARENT]["task_id"] == handle.id
        await kid.approve(approver="alice")
        outcome = await asyncio.wait_for(handle.result(), 60)
    assert outcome.result == "done"


async def test_a_task_with_mcp_servers_calls_its_sub_agents(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, settings: Settings, tmp_path: Path
) -> None:
    """agent__<name> is no MCP tool, though its name looks like one (`agent` is reserved)."""
    child = fake_openai.script([text("the attic is empty")])
    parent = fake_openai.script(
        [tools(("agent__looker", {"task": "look in the attic"})), text("looked")]
    )
    served = settings.model_copy(
        update={"mcp_servers": {"demo": demo_stdio(CallLog(tmp_path / "calls.jsonl"))}}
    )
    registry = registry_with(agent("looker", child))
    async with running_worker(dev_env.client, served, registry=registry):
        runtime = AgentRuntime(dev_env.client, served, tools=registry)
        handle = await runtime.run(agent_task(parent, mcp_servers=["demo"]))
        outcome = await handle.result()
        state = await handle.state()
    assert outcome.result == "looked"
    assert tool_results(fake_openai.requests[parent][1]) == ["the attic is empty"]
    assert [c.status for c in state.children.values()] == ["done"]


async def test_a_task_created_under_a_sub_agents_id_is_not_adopted(
    tree: Any, fake_openai: FakeOpenAI, dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A sub-agent's id is predictable: a task created under it first (here straight
    through Temporal, as the API and MCP refuse such ids) is not its parent's child, and its
    answer is never taken for the sub-agent's. The step's other sub-agent is."""
    squatter = fake_openai.script([text("the squatter's answer")])
    child = fake_openai.script([text("the real child's answer")])
    parent = fake_openai.script(
        [
            tools(("agent__one", {"task": "look"}), ("agent__one", {"task": "look too"})),
            text("went on"),
        ]
    )
    parent_id = f"victim-{uuid.uuid4().hex[:8]}"
    async with tree(agent("one", child)) as runtime:
        squatting = await dev_env.client.start_workflow(
            AgentWorkflow.run,
            AgentRun(task=runtime.with_defaults(agent_task(squatter))),
            id=f"{parent_id}/1/call_1_0",
            task_queue=settings.task_queue,
        )
        await squatting.result()
        handle = await runtime.run(agent_task(parent), task_id=parent_id)
        outcome = await handle.result()
        events = await handle.events()
        # What the parent asks of a task under a child's id: Temporal's record of who
        # started it.
        starters = [await started_by(dev_env.client, f"{parent_id}/1/call_1_{i}") for i in (0, 1)]
    assert outcome.result == "went on"
    assert tool_results(fake_openai.requests[parent][1]) == [
        f"agent__one was not started: a task with its id {parent_id}/1/call_1_0 exists that "
        "this task did not start, so its answer is not this call's; do the work another way",
        "the real child's answer",
    ]
    assert [e.child_id for e in of_type(events, "agent_started")] == [f"{parent_id}/1/call_1_1"]
    assert starters == ["", parent_id]


def test_a_typed_sub_agent_keeps_its_callers_output_retries_and_every_inherited_setting() -> None:
    """The child's task is the caller's with the agent's own fields over it: a setting the
    agent does not name (output_retries of a typed agent, and any field added later) is
    inherited, never lost to a hand-written copy."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    caller = AgentTask(
        task="count",
        output_retries=0,
        max_repeated_calls=7,
        heartbeat_timeout_seconds=9,
        continue_as_new_after_steps=11,
        context_limit_tokens=5_000,
        max_agent_depth=5,
        max_agent_calls=2,
        token_budget=1_000,
        approval=ApprovalSettings(timeout_seconds=60),
        mcp_servers=["files"],
    )
    spec = agent("counter", "m", output_schema=schema)
    at = agents.link(caller, "root", spec, "c1")
    child = agents.child_task(caller, spec, "count the files", agents.BudgetShare(tokens=400), at)
    assert child.output_retries == 0
    assert child.output_schema == schema
    assert (child.task, child.parent, child.token_budget) == ("count the files", at, 400)
    for name in AgentTask.model_fields.keys() - agents.AGENT_OWNS:
        assert getattr(child, name) == getattr(caller, name), name


def test_what_a_sub_agent_sets_itself_names_task_fields() -> None:
    assert agents.AGENT_OWNS <= AgentTask.model_fields.keys()


def test_a_task_holds_the_sub_agents_its_tools_reach_as_deep_as_its_tree_may_grow() -> None:
    math = AgentSpec(name="math", description="works out sums", tools=["calculator"])
    planner = AgentSpec(name="planner", description="plans", tools=["agent__math"])
    anyone = AgentSpec(name="anyone", description="calls every tool")  # tools None
    specs = [math, planner, anyone]
    assert agents.reachable(specs, ["agent__planner"], 1) == [planner]
    assert agents.reachable(specs, ["agent__planner"], 2) == [math, planner]
    assert agents.reachable(specs, ["agent__planner"], 0) == []
    assert agents.reachable(specs, ["calculator"], 3) == []
    assert agents.reachable(specs, None, 1) == specs
    assert agents.reachable(specs, ["agent__anyone"], 2) == specs
    # A child holds what it may call in turn; at the depth limit, the level past it (its
    # model is offered them and told the limit); a task created before tasks held them, None.
    parent = agent_task("offline", tools=["agent__planner"], max_agent_depth=1)
    held = parent.model_copy(update={"agents": [math, planner]})
    at = agents.link(held, "t", planner, "c")
    child = agents.child_task(held, planner, "plan", agents.BudgetShare(), at)
    assert child.agents == [math] and child.requires is None
    needs = held.model_copy(update={"requires": ["calculator"]})
    assert agents.child_task(needs, planner, "plan", agents.BudgetShare(), at).requires == []
    old = parent.model_copy(update={"requires": ["calculator"]})
    unheld = agents.child_task(old, planner, "plan", agents.BudgetShare(), at)
    assert unheld.agents is None and unheld.requires == ["agent__math"]
