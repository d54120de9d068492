"""The same agent on LangGraph, for side-by-side figures (a bench-only extra:
`pip install -e '.[bench]'`). An instant model node calls the calculator node until it
has taken the asked number of steps; state is LangGraph's MessagesState.

(No `from __future__ import annotations` here: LangGraph reads the node functions' type
hints, which must be real objects.)
"""

import sqlite3
import time
from pathlib import Path
from typing import Any

from waystation.activities.builtin_tools import evaluate


def available() -> bool:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        return False
    return True


def _graph(steps: int, size: int, checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def agent(state: MessagesState) -> dict[str, Any]:
        done = sum(isinstance(m, ToolMessage) for m in state["messages"])
        if done >= steps - 1:
            return {"messages": [AIMessage(content=f"done after {done + 1} steps")]}
        call = {"name": "calculator", "args": {"expression": f"{done} + 1"}, "id": f"call_{done}"}
        return {"messages": [AIMessage(content="x" * size, tool_calls=[call])]}

    def tools(state: MessagesState) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls  # type: ignore[union-attr]
        return {
            "messages": [
                ToolMessage(content=str(evaluate(c["args"]["expression"])), tool_call_id=c["id"])
                for c in calls
            ]
        }

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else END  # type: ignore[union-attr]

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def _run(steps: int, size: int, checkpointer: Any) -> float:
    """Run one task; seconds per step."""
    from langchain_core.messages import HumanMessage

    app = _graph(steps, size, checkpointer)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10}
    start = time.perf_counter()
    final = app.invoke({"messages": [HumanMessage(content="go")]}, config)
    elapsed = time.perf_counter() - start
    if not str(final["messages"][-1].content).startswith("done after"):
        raise RuntimeError("the LangGraph agent did not finish")
    return elapsed / steps


def seconds_per_step_in_memory(steps: int, size: int = 16) -> float:
    from langgraph.checkpoint.memory import InMemorySaver

    return _run(steps, size, InMemorySaver())


def seconds_per_step_sqlite(steps: int, database: Path, size: int = 16) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(database, check_same_thread=False)
    try:
        return _run(steps, size, SqliteSaver(connection))
    finally:
        connection.close()


def sqlite_bytes(steps: int, database: Path, size: int) -> int:
    """Bytes LangGraph's SQLite checkpointer holds after a task of `steps` steps."""
    seconds_per_step_sqlite(steps, database, size)
    return sum(p.stat().st_size for p in database.parent.glob(database.name + "*") if p.is_file())
