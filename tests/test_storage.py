"""The storage on both backends: ledger claims and leases, migrations, blobs, pruning, and the
start checks that keep a deployment's workers on one storage and one workspace."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from waystation.activities.storage import (
    ClaimLostError,
    DeploymentMismatchError,
    Ledger,
    SchemaTooNewError,
    Storage,
    digest_of,
)
from waystation.activities.storage import migrations as schema
from waystation.activities.storage.backend import Backend
from waystation.activities.storage.deployment import MARKER, check_workspace, hosts_polling
from waystation.activities.storage.postgres import PostgresBackend
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.settings import Settings
from waystation.testing.postgres import PostgresServer
from waystation.testing.workers import REPO, WorkerProcess, running_worker, worker_environment
from waystation.workflows.agent import AgentWorkflow

DAY = 86400.0


@dataclass
class Place:
    """Where one deployment's data lives; each `backend()` is another machine's connection."""

    kind: str
    path: Path
    url: str

    def backend(self, migrations: tuple[schema.Migration, ...] | None = None) -> Backend:
        if self.kind == "sqlite":
            return SqliteBackend(self.path, *([migrations] if migrations else []))
        return PostgresBackend(self.url, *([migrations] if migrations else []))

    def storage(self) -> Storage:
        return Storage(self.backend())

    def known_migrations(self) -> tuple[schema.Migration, ...]:
        return schema.SQLITE if self.kind == "sqlite" else schema.POSTGRES

    def sql(self, statement: str) -> list[Any]:
        """Run SQL on the database directly, as an operator would."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as db:
                return db.execute(statement).fetchall()
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement.encode())
            return cursor.fetchall() if cursor.description else []

    def backdate(self, table: str, column: str, days: float) -> None:
        if self.kind == "sqlite":
            self.sql(f"UPDATE {table} SET {column} = {column} - {days * DAY}")
        else:
            self.sql(f"UPDATE {table} SET {column} = {column} - interval '{days} days'")


@pytest.fixture(params=["sqlite", "postgresql"])
def place(request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer) -> Place:
    url = postgres.create_database() if request.param == "postgresql" else ""
    return Place(request.param, tmp_path / "storage.sqlite3", url)


@pytest.fixture
async def storage(place: Place) -> AsyncIterator[Storage]:
    async with place.storage() as storage:
        yield storage


async def test_the_ledger_records_start_and_finish(storage: Storage) -> None:
    first = storage.ledger.attempt()
    assert await first.claim("wf/1/c1", "charge") is None
    await first.start("wf/1/c1", {"amount": 42})
    entry = await storage.ledger.lookup("wf/1/c1")
    assert entry is not None and entry.state == "started" and entry.lease_live
    assert entry.detail == {"amount": 42} and entry.owner == first.owner
    await first.finish("wf/1/c1", "receipt 7")
    retry = await storage.ledger.attempt().claim("wf/1/c1", "charge")
    assert retry is not None and retry.state == "done" and retry.result == "receipt 7"
    assert not retry.is_error
    failing = storage.ledger.attempt()
    assert await failing.claim("wf/1/c2", "charge") is None
    await failing.finish("wf/1/c2", "card declined", is_error=True)
    declined = await storage.ledger.attempt().claim("wf/1/c2", "charge")
    assert declined is not None and declined.is_error and declined.result == "card declined"
    with pytest.raises(ClaimLostError):  # recording a start needs the claim
        await storage.ledger.attempt().start("wf/1/unclaimed", {})


async def test_a_recorded_fact_replaces_the_last_and_is_pruned_like_a_result(
    place: Place, storage: Storage
) -> None:
    first, second = storage.ledger.attempt(), storage.ledger.attempt()
    await first.record("spot", "write_file", {"key": "wf/1/a"})
    await second.record("spot", "write_file", {"key": "wf/1/b"})  # the later word wins
    entry = await storage.ledger.lookup("spot")
    assert entry is not None and entry.state == "done" and entry.detail == {"key": "wf/1/b"}
    assert entry.owner == second.owner and entry.result is None
    place.backdate("ledger", "updated_at", 40)
    assert (await storage.prune(timedelta(days=30))).ledger_entries == 1


async def test_two_machines_claim_at_once_one_acts_the_other_gets_its_result(
    place: Place, storage: Storage
) -> None:
    async with place.storage() as other_machine:
        attempts = [
            ledger.attempt() for ledger in (storage.ledger, other_machine.ledger) for _ in range(3)
        ]
        acted: list[str] = []
        holding = asyncio.Event()
        go_on = asyncio.Event()

        async def call(index: int) -> str | None:
            attempt = attempts[index]
            earlier = await attempt.claim("wf/3/c1", "effect")
            if earlier is not None:
                return earlier.result
            acted.append(f"attempt {index}")
            await attempt.start("wf/3/c1", {"by": index})
            holding.set()
            await go_on.wait()
            await attempt.finish("wf/3/c1", f"done by {index}")
            return f"done by {index}"

        calls = [asyncio.create_task(call(i)) for i in range(len(attempts))]
        await holding.wait()
        # One holds the key; every other claimer is still waiting for its outcome.
        assert sum(not c.done() for c in calls) == len(attempts)
        go_on.set()
        results = await asyncio.gather(*calls)
    assert len(acted) == 1
    [winner] = acted
    assert results == [f"done by {winner.split()[1]}"] * len(attempts)


async def test_a_dead_attempts_key_is_taken_over_once_its_lease_lapses(
    place: Place, storage: Storage
) -> None:
    dead = Ledger(storage.backend, lease=timedelta(seconds=0.5)).attempt()
    assert await dead.claim("wf/4/c1", "write_file") is None
    await dead.start("wf/4/c1", {"offset": 10})
    async with place.storage() as other_machine:
        claimers = [storage.ledger.attempt(), other_machine.ledger.attempt()]
        taken = asyncio.Event()

        async def retry(attempt: Any) -> str | None:
            earlier = await attempt.claim("wf/4/c1", "write_file")
            if earlier.state == "started":  # the dead attempt's record: inspect, then finish
                assert earlier.detail == {"offset": 10} and earlier.owner == dead.owner
                taken.set()
                await attempt.finish("wf/4/c1", f"finished by {attempt.owner}")
                return "took over"
            return earlier.result  # type: ignore[no-any-return]

        outcomes = await asyncio.gather(*(retry(a) for a in claimers))
    assert taken.is_set() and sorted(outcomes, key=str)[-1] == "took over"
    assert outcomes.count("took over") == 1  # compare-and-set: one takes over
    with pytest.raises(ClaimLostError):  # the dead attempt, if it came back, may not act
        await dead.start("wf/4/c1", {"offset": 10})
    # A claim released by an attempt that ended (a tool error) is inspected at once.
    ended = Ledger(storage.backend, lease=timedelta(hours=1)).attempt()
    assert await ended.claim("wf/4/c2", "write_file") is None
    await ended.start("wf/4/c2", {"offset": 0})
    await ended.release()
    entry = await asyncio.wait_for(storage.ledger.attempt().claim("wf/4/c2", "write_file"), 60)
    assert entry is not None and entry.state == "started" and entry.detail == {"offset": 0}


async def test_a_held_attempt_renews_its_lease_while_it_runs(storage: Storage) -> None:
    # Renewed every half second (a third of the lease): only a process starved for 1.5 s
    # could lose the claim, not one that is merely slow.
    ledger = Ledger(storage.backend, lease=timedelta(seconds=1.5))
    async with ledger.attempt().held() as attempt:
        assert await attempt.claim("wf/5/c1", "run_shell") is None
        await attempt.start("wf/5/c1", {"command": "sleep"})
        waiting = asyncio.create_task(ledger.attempt().claim("wf/5/c1", "run_shell"))
        for _ in range(3):  # longer than a lease in all: renewals keep the claim
            await attempt.renew()
            entry = await ledger.lookup("wf/5/c1")
            assert entry is not None and entry.owner == attempt.owner and entry.lease_live
            await asyncio.sleep(0.75)
        assert not waiting.done()
        await attempt.finish("wf/5/c1", "exit code 0\n")
    finished = await waiting
    assert finished is not None and finished.result == "exit code 0\n"


async def test_migrations_are_idempotent_and_safe_when_workers_start_together(
    place: Place,
) -> None:
    storages = [place.storage() for _ in range(4)]
    await asyncio.gather(*(s.open() for s in storages))
    try:
        assert len({s.deployment_id for s in storages}) == 1
        async with place.storage() as again:
            assert again.deployment_id == storages[0].deployment_id
            assert (await again.backend.stats())["schema_version"] == len(place.known_migrations())
        versions = place.sql("SELECT version FROM schema_version ORDER BY version")
        assert versions == [(m.version,) for m in place.known_migrations()]
        assert len(place.sql("SELECT id FROM deployment")) == 1
    finally:
        await asyncio.gather(*(s.close() for s in storages))


async def test_a_new_migration_applies_once_and_an_older_worker_refuses_a_newer_schema(
    place: Place,
) -> None:
    known = place.known_migrations()
    extra = len(known) + 1
    later = (*known, schema.Migration(extra, "extra", ("CREATE TABLE extra (id INTEGER)",)))
    async with place.storage() as first:
        deployment = first.deployment_id
    upgraded = [Storage(place.backend(later)) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in upgraded))
    assert {s.deployment_id for s in upgraded} == {deployment}
    await asyncio.gather(*(s.close() for s in upgraded))
    versions = place.sql("SELECT version FROM schema_version ORDER BY version")
    assert versions == [(version,) for version in range(1, extra + 1)]
    assert place.sql("SELECT count(*) FROM extra") == [(0,)]
    with pytest.raises(SchemaTooNewError, match="upgrade waystation"):
        await place.storage().open()


async def test_the_blob_store_keeps_the_first_write_of_a_key(storage: Storage) -> None:
    small, big = b"a message", bytes(range(256)) * 4096
    items = {digest_of(small): small, digest_of(big): big}
    await storage.blobs.put_many(items)
    await storage.blobs.put_many({digest_of(small): small})  # again: left alone
    missing = digest_of(b"never stored")
    found = await storage.blobs.get_many([digest_of(big), missing, digest_of(small)])
    assert found == items
    assert await storage.blobs.get_many([]) == {}
    # The key names the content: a second write under it changes nothing.
    await storage.blobs.put_many({digest_of(small): b"other bytes"})
    assert await storage.blobs.get_many([digest_of(small)]) == {digest_of(small): small}
    assert (await storage.backend.stats())["blobs"] == 2


async def test_pruning_removes_old_finished_entries_and_unused_blobs(
    place: Place, storage: Storage
) -> None:
    attempt = storage.ledger.attempt()
    for key in ("old-done", "new-done", "old-started"):
        assert await attempt.claim(key, "write_file") is None
    await attempt.finish("old-done", "ok")
    read, unread = b"read lately", b"untouched"
    await storage.blobs.put_many({digest_of(read): read, digest_of(unread): unread})
    place.backdate("ledger", "updated_at", 40)
    place.backdate("blobs", "used_at", 40)
    await attempt.finish("new-done", "ok")  # finished now, started 40 days ago
    assert await storage.blobs.get_many([digest_of(read)]) == {digest_of(read): read}
    report = await storage.prune(timedelta(days=30))
    assert (report.ledger_entries, report.blobs) == (1, 1)
    assert await storage.ledger.lookup("old-done") is None
    assert await storage.ledger.lookup("old-started") is not None  # never pruned unfinished
    assert await storage.ledger.lookup("new-done") is not None
    assert await storage.blobs.get_many([digest_of(read), digest_of(unread)]) == {
        digest_of(read): read
    }


def starter(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "starter.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_the_prune_command_and_storage_info(place: Place, storage: Storage) -> None:
    attempt = storage.ledger.attempt()
    for key in ("a", "b", "c"):
        assert await attempt.claim(key, "write_file") is None
    await attempt.finish("a", "ok")
    await attempt.finish("b", "ok")
    place.backdate("ledger", "updated_at", 3)
    env = worker_environment(
        "127.0.0.1:1",
        Settings(data_dir=place.path.parent, database_url=place.url or None),  # type: ignore[arg-type]
    )
    info = starter(env, "storage", "info")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["deployment_id"] == storage.deployment_id
    kept = starter(env, "storage", "prune")  # default age: 30 days
    assert "pruned 0 finished ledger entries older than 30 days" in kept.stderr, kept.stderr
    pruned = starter(env, "storage", "prune", "--older-than", "2")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 2 finished ledger entries older than 2 days" in pruned.stderr
    assert await storage.ledger.lookup("c") is not None


def test_the_database_password_is_never_shown(tmp_path: Path) -> None:
    url = "postgresql://agent:hunter2-secret@db.internal:6543/waystation"
    env = worker_environment("127.0.0.1:1", Settings(data_dir=tmp_path))
    config = starter({**env, "WAYSTATION_DATABASE_URL": url}, "config")
    assert config.returncode == 0, config.stderr
    shown = json.loads(config.stdout)
    assert shown["database_url"] == "postgresql://agent@db.internal:6543/waystation"
    assert "hunter2" not in config.stdout + config.stderr


async def test_a_workspace_belongs_to_one_deployment(tmp_path: Path) -> None:
    workspace = tmp_path / "shared-ws"
    async with (
        Storage(SqliteBackend(tmp_path / "a.sqlite3")) as one,
        Storage(SqliteBackend(tmp_path / "b.sqlite3")) as other,
    ):
        marker = await check_workspace(one, workspace)
        assert await check_workspace(one, workspace) == marker  # a restart: the same
        assert json.loads((workspace / MARKER).read_text())["deployment"] == one.deployment_id
        with pytest.raises(DeploymentMismatchError, match="belongs to another deployment"):
            await check_workspace(other, workspace)
        await check_workspace(other, tmp_path / "own-ws")  # its own workspace is fine


async def test_on_postgresql_every_machine_must_see_the_same_workspace(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.create_database()
    shared, local = tmp_path / "shared", tmp_path / "per-machine"
    async with Storage(PostgresBackend(url)) as a, Storage(PostgresBackend(url)) as b:
        await asyncio.gather(check_workspace(a, shared), check_workspace(b, shared))
        with pytest.raises(DeploymentMismatchError, match="must share one workspace"):
            await check_workspace(b, local)
        await b.backend.forget_workspace()  # the operator moved the workspace on purpose
        await check_workspace(b, local)
        with pytest.raises(DeploymentMismatchError, match="must share one workspace"):
            await check_workspace(a, shared)


async def exit_of(worker: WorkerProcess) -> tuple[int, str]:
    code = await asyncio.to_thread(worker.process.wait, 120)
    return code, worker.log.read_text()


async def test_a_worker_refuses_another_deployments_workspace(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    address = dev_env.client.service_client.config.target_host
    first = await WorkerProcess(address, settings).ready()
    try:
        intruder = settings.model_copy(update={"data_dir": settings.data_dir.parent / "other"})
        code, log = await exit_of(WorkerProcess(address, intruder))
    finally:
        first.kill()
    assert code == 1
    [line] = log.strip().splitlines()
    assert line.startswith("worker cannot start: the workspace ") and "another deployment" in line


@activity.defn(name="elsewhere")
async def elsewhere_activity() -> None:
    """What a worker on another machine serves: it polls for activities, like tool calls."""


def worker_elsewhere(client: Client, task_queue: str, identity: str) -> Worker:
    """A worker that polls `task_queue` under `identity`, as a machine of that name would."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[AgentWorkflow],
        activities=[elsewhere_activity],
        identity=identity,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def test_an_sqlite_worker_refuses_a_queue_served_from_another_machine(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> None:
    address = dev_env.client.service_client.config.target_host
    elsewhere = worker_elsewhere(dev_env.client, settings.task_queue, "4242@another-machine")
    async with elsewhere:
        while "another-machine" not in await hosts_polling(dev_env.client, settings.task_queue):
            await asyncio.sleep(0.1)
        code, log = await exit_of(WorkerProcess(address, settings))
        assert code == 1
        [line] = log.strip().splitlines()
        assert "another machine (another-machine)" in line and "WAYSTATION_DATABASE_URL" in line
        # On PostgreSQL, workers of every machine are welcome.
        shared = with_database(settings, postgres.create_database())
        joined = await WorkerProcess(address, shared).ready()
        joined.kill()


async def test_a_postgresql_worker_refuses_a_queue_that_an_sqlite_worker_serves(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> None:
    address = dev_env.client.service_client.config.target_host
    local = await WorkerProcess(address, settings).ready()
    try:
        shared = with_database(settings, postgres.create_database())
        code, log = await exit_of(WorkerProcess(address, shared))
    finally:
        local.kill()
    assert code == 1, log
    [line] = log.strip().splitlines()
    assert line.startswith("worker cannot start: workers on SQLite"), line
    assert f"{local.pid}@" in line and "storage=sqlite" in line, line
    assert "WAYSTATION_DATABASE_URL" in line, line


async def test_an_sqlite_worker_refuses_a_queue_that_a_postgresql_worker_serves(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> None:
    """On one machine too: a worker on PostgreSQL does not see the SQLite worker's ledger."""
    address = dev_env.client.service_client.config.target_host
    shared = WorkerProcess(address, with_database(settings, postgres.create_database()))
    await shared.ready()
    try:
        code, log = await exit_of(WorkerProcess(address, settings))
    finally:
        shared.kill()
    assert code == 1, log
    [line] = log.strip().splitlines()
    assert line.startswith("worker cannot start: workers on PostgreSQL"), line
    assert f"{shared.pid}@" in line and "WAYSTATION_DATABASE_URL" in line, line


async def test_an_sqlite_worker_stops_when_a_worker_on_another_machine_joins_its_queue(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    """A worker that joins after the SQLite worker's start check (at the same moment, or a
    version that checks nothing) still never shares the queue for long: the SQLite worker
    looks again while it runs, and stops with one sentence."""
    address = dev_env.client.service_client.config.target_host
    local = await WorkerProcess(address, settings).ready()
    try:
        joining = worker_elsewhere(
            dev_env.client, settings.task_queue, "4242@another-machine storage=postgresql"
        )
        async with joining:
            code, log = await exit_of(local)
    finally:
        local.kill()
    assert code == 1, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("worker stopped: workers on another machine (another-machine)"), log
    assert "WAYSTATION_DATABASE_URL" in last, last


def with_database(settings: Settings, url: str) -> Settings:
    return Settings.model_validate({**settings.model_dump(), "database_url": url})


async def test_a_worker_whose_postgresql_is_unreachable_exits_with_one_sentence(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> None:
    address = dev_env.client.service_client.config.target_host
    nowhere = (
        postgres.url("ledger")
        .replace(str(postgres.port), "1")
        .replace("waystation@", "waystation:hunter2@")
    )
    code, log = await exit_of(WorkerProcess(address, with_database(settings, nowhere)))
    assert code == 1
    [line] = log.strip().splitlines()
    assert line.startswith(
        "worker cannot start: cannot reach PostgreSQL at waystation@127.0.0.1:1/ledger "
        "(WAYSTATION_DATABASE_URL): "
    ), line
    assert "hunter2" not in log


def malformed_urls(port: int) -> dict[str, str]:
    """Database URLs whose password (each holds "S3cret") libpq cannot read as one, by what
    is wrong with them; before the fix, each showed a piece of the password somewhere."""
    host = f"127.0.0.1:{port}"
    return {
        "a space": f"postgresql://ws:S3cret 9@{host}/waystation",
        "an @": f"postgresql://ws:p@ss-S3cret@{host}/waystation",
        "a slash": f"postgresql://ws:1234/S3cret@{host}/waystation",
        "a bad escape": f"postgresql://ws:S3cret%zz@{host}/waystation",
        "an @ and a colon": f"postgresql://ws:p@S3cret:9@{host}/waystation",
        "key=value, unquoted": f"host=127.0.0.1 port={port} password=S3cret 9",
    }


async def shown_by(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`starter.py ARGS` in `env`: exit code, stdout, stderr."""
    done = await asyncio.to_thread(starter, env, *args)
    return done.returncode, done.stdout, done.stderr


async def test_a_database_url_that_does_not_parse_never_shows_its_password(
    dev_env: WorkflowEnvironment, settings: Settings, postgres: PostgresServer
) -> None:
    address = dev_env.client.service_client.config.target_host
    for flaw, url in malformed_urls(postgres.port).items():
        broken = with_database(settings, url)
        env = worker_environment(address, broken)
        worker = WorkerProcess(address, broken)
        config, info, (code, log) = await asyncio.gather(
            shown_by(env, "config"), shown_by(env, "storage", "info"), exit_of(worker)
        )
        for surface, (exit_code, out, err) in {
            "config": config,
            "storage info": info,
            "worker": (code, "", log),
        }.items():
            assert "S3cret" not in out + err, (flaw, surface, out + err)
            assert exit_code == 1, (flaw, surface, out + err)
            [line] = err.strip().splitlines()
            assert "WAYSTATION_DATABASE_URL" in line and "percent-encode" in line, (flaw, line)
        assert log.startswith("worker cannot start: WAYSTATION_DATABASE_URL"), (flaw, log)

    # Percent-encoded, the same password connects (this server trusts local connections)
    # and is shown nowhere: not by the command, nor in the worker's start line.
    encoded = with_database(settings, postgres.create_database().replace("@", ":p%40ss-S3cret@"))
    env = worker_environment(address, encoded)
    code, out, err = await shown_by(env, "storage", "info")
    assert code == 0, err
    assert json.loads(out)["location"].startswith("PostgreSQL at waystation@127.0.0.1:")
    worker = await WorkerProcess(address, encoded).ready()
    worker.kill()
    assert "S3cret" not in out + err + worker.log.read_text()


async def test_a_worker_prunes_the_storage_when_it_starts(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    async with Storage.from_settings(settings) as storage:
        attempt = storage.ledger.attempt()
        for key in ("old", "recent"):
            assert await attempt.claim(key, "write_file") is None
            await attempt.finish(key, "ok")
    place = Place("sqlite", settings.data_dir.absolute() / "storage.sqlite3", "")
    place.sql("UPDATE ledger SET updated_at = updated_at - 40 * 86400 WHERE key = 'old'")
    async with running_worker(dev_env.client, settings) as worker:
        async with asyncio.timeout(60):
            while await worker.storage.ledger.lookup("old") is not None:
                await asyncio.sleep(0.05)
        assert await worker.storage.ledger.lookup("recent") is not None
