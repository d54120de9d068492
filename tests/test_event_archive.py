"""A long task's log reads without replaying its closed runs: each run archives its events
as it hands over (and a large last run as it ends), so a page needs no worker at all."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task
from tests.test_cli import starter
from tests.test_long_runs import run_ids
from tests.test_resume_fork_edges import KEY_1, client_for, keys_env, with_keys
from waystation.activities.event_archive import archive_key
from waystation.activities.storage.storage import SQLITE_FILE
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_errors import NoWorkerError
from waystation.settings import Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.workers import running_worker
from waystation.workflows.events import AgentEvent

STEPS_PER_RUN = 8
RUNS = 3
# Big enough that the last run, too, passes the size at which a run archives as it ends.
CONTENT = "y" * 50_000
QUICK = timedelta(seconds=10)


def long_model(fake_openai: FakeOpenAI) -> str:
    def reply(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return text("summary")  # a compaction, should the context fill up
        # Step k asked for `k + 1`: the step is read from the last result, which survives
        # a compaction and a hand-over alike.
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        step = int(results[-1]) if results else 1
        if step == STEPS_PER_RUN * RUNS:  # the answer is the last run's last step
            return text("done at last")
        return tools(("calculator", {"expression": f"{step} + 1"}), content=CONTENT)

    return fake_openai.script(reply, record=False)


async def finished_long_task(
    client: Client, settings: Settings, fake_openai: FakeOpenAI
) -> tuple[str, list[AgentEvent]]:
    """A task of RUNS runs, run to the end; its whole log as a worker answers it."""
    model = long_model(fake_openai)
    async with running_worker(client, settings):
        runtime = AgentRuntime(client, settings)
        task = agent_task(
            model,
            continue_as_new_after_steps=STEPS_PER_RUN,
            context_limit_tokens=150_000,
            max_steps=100,
        )
        handle = await runtime.run(task)
        outcome = await handle.result()
        assert outcome.result == "done at last"
        events = await handle.events()
    assert [e.seq for e in events] == list(range(outcome.last_seq + 1))
    assert len(await run_ids(client, handle.id)) >= RUNS
    return handle.id, events


async def test_a_finished_long_tasks_log_reads_with_no_worker_running(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    task_id, events = await finished_long_task(dev_env.client, settings, fake_openai)

    # No worker polls the queue now: every page comes from the archive, none by replay.
    handle = AgentRuntime(dev_env.client, settings).get(task_id)
    assert await handle.events(within=QUICK) == events
    for since, limit in ((0, 5), (7, 30), (len(events) - 3, 10), (len(events), 10)):
        page = await handle.events(since, limit=limit, within=QUICK)
        assert page == events[since : since + limit]
    code, out, err = await starter(dev_env, settings, "events", task_id)
    assert code == 0, err
    assert "done at last" in out

    # A reader without the workers' storage (another machine's data directory) still needs
    # a worker, and says so.
    elsewhere = settings.model_copy(update={"data_dir": settings.data_dir / "elsewhere"})
    try:
        await AgentRuntime(dev_env.client, elsewhere).get(task_id).events(within=QUICK)
        raise AssertionError("a closed run read with no worker and no archive")
    except NoWorkerError as err:
        assert "no worker" in str(err)
    assert not (elsewhere.data_dir / SQLITE_FILE).exists()  # reading created no storage


async def test_where_the_archive_is_missing_the_log_reads_by_query(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    task_id, events = await finished_long_task(dev_env.client, settings, fake_openai)
    runs = await run_ids(dev_env.client, task_id)
    # The middle run's archive is lost (pruned, say): that run is replayed, the rest read.
    with sqlite3.connect(settings.data_dir / SQLITE_FILE) as db:
        gone = db.execute("DELETE FROM blobs WHERE digest = ?", (archive_key(task_id, runs[1]),))
        assert gone.rowcount == 1
    async with running_worker(dev_env.client, settings):
        handle = AgentRuntime(dev_env.client, settings).get(task_id)
        assert await handle.events() == events


async def test_an_encrypted_archive_holds_no_plain_text_and_reads_with_the_key(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    keyed = with_keys(settings, {"k1": KEY_1}, "k1")
    client = await client_for(dev_env, keyed)
    task_id, events = await finished_long_task(client, keyed, fake_openai)
    with sqlite3.connect(settings.data_dir / SQLITE_FILE) as db:
        stored = [bytes(row[0]) for row in db.execute("SELECT content FROM blobs")]
    archived = [b for b in stored if b"calculator" in b or b"done at last" in b or b"yyyyyyyy" in b]
    assert stored and not archived  # nothing readable at rest
    assert await AgentRuntime(client, keyed).get(task_id).events(within=QUICK) == events
    code, out, err = await starter(
        dev_env, settings, "events", task_id, extra_env=keys_env({"k1": KEY_1}, "k1")
    )
    assert code == 0 and "done at last" in out, err
