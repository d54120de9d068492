"""Beyond one machine: encryption, codec server, visibility, tracing, scale-out, compose."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.converter import ActivitySerializationContext
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner

from tests.helpers import agent_task, pending_requests
from waystation.activities.payload_codec import EncryptionCodec, data_converter, new_key
from waystation.client.agent_runtime import WORKFLOW_TASK_TIMEOUT, AgentRuntime
from waystation.client.temporal import temporal_binary
from waystation.client.tracing import tracing_interceptors
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.proc import pid_with_local_port
from waystation.testing.workers import REPO, WorkerProcess, running_worker
from waystation.worker import STICKY_SCHEDULE_TO_START, build_worker
from waystation.workflows import search

SECRET = "the-launch-code-is-HUNTER2-and-the-plan-is-ZEBRA"


async def test_codec_round_trip_and_key_rotation() -> None:
    old, new = base64.b64decode(new_key()), base64.b64decode(new_key())
    before = EncryptionCodec({"k1": old}, "k1")
    [sealed] = await before.encode([Payload(metadata={"encoding": b"json/plain"}, data=b'"hi"')])
    assert sealed.metadata["encryption-key-id"] == b"k1" and b"hi" not in sealed.data
    after = EncryptionCodec({"k1": old, "k2": new}, "k2")
    [opened] = await after.decode([sealed])  # an old payload still reads after rotation
    assert opened.data == b'"hi"'
    [resealed] = await after.encode([opened])
    assert resealed.metadata["encryption-key-id"] == b"k2"
    with pytest.raises(ValueError, match="unknown key 'k2'"):
        await before.decode([resealed])
    with pytest.raises(ValueError, match="32 bytes"):
        EncryptionCodec({"short": b"x" * 16}, "short")


async def test_a_converter_in_a_task_context_names_the_task_and_reads_what_the_others_write() -> (
    None
):
    key = base64.b64decode(new_key())
    workers_side = data_converter(EncryptionCodec({"k1": key}, "k1"), "worker")
    keyless = data_converter(None, "worker")
    in_task = ActivitySerializationContext(
        namespace="default",
        workflow_id="task-7",
        workflow_type="AgentWorkflow",
        activity_type="call_llm",
        activity_task_queue="q",
        is_local=False,
        activity_id="1",
    )
    sealed = await workers_side.with_context(in_task).encode([{"step": 1}])
    assert await workers_side.decode(sealed) == [{"step": 1}]
    with pytest.raises(ValueError, match="payload of task 'task-7' is encrypted with key 'k1'"):
        await keyless.with_context(in_task).decode(sealed)
    with pytest.raises(ValueError) as context_free:
        await keyless.decode(sealed)
    assert "task-7" not in str(context_free.value)  # the context stays on its copy


async def test_encrypted_history_holds_no_plaintext_and_everything_still_works(
    encrypted_client: tuple[Client, Settings], fake_openai: FakeOpenAI
) -> None:
    client, secure = encrypted_client
    model = fake_openai.script(
        [
            tools(("calculator", {"expression": "6*7"}), content=f"thinking about {SECRET}"),
            text(f"done: {SECRET}"),
        ]
    )
    runtime = AgentRuntime(client, secure)
    async with running_worker(client, secure):
        handle = await runtime.run(agent_task(model, task=f"keep this secret: {SECRET}"))
        streamed = [item async for item in runtime.stream(handle.id)]
        outcome = await handle.result()
        state = await handle.state()
    assert outcome.result == f"done: {SECRET}"
    assert streamed[-1].data.type == "done" and state.status == "done"
    assert any(SECRET in str(i.data) for i in streamed)
    # The model saw the plaintext conversation (decrypted in the activity).
    assert SECRET in json.dumps(fake_openai.requests[model][0]["messages"])

    address = client.service_client.config.target_host
    process = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "show",
        "--workflow-id",
        handle.id,
        "--address",
        address,
        "--output",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    raw, _ = await process.communicate()
    assert process.returncode == 0, raw.decode()
    decoded = [
        base64.b64decode(m).decode("utf-8", "replace")
        for m in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', raw.decode())
    ]
    assert "HUNTER2" not in raw.decode()
    assert not [d for d in decoded if "HUNTER2" in d]
    assert len(decoded) > 10  # the payloads are there, encrypted

    # The codec server decrypts for authorised users (the Web UI's codec endpoint).
    app = create_app(
        secure.model_copy(update={"api_tokens": {"t": ApiToken(role="reader", name="ui")}}), runtime
    )
    history = await client.get_workflow_handle(handle.id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes.input.payloads[0]
    body = {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in started.metadata.items()},
                "data": base64.b64encode(started.data).decode(),
            }
        ]
    }
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as api:
        denied = await api.post("/codec/decode", json=body)
        assert denied.status_code == 401
        answer = await api.post("/codec/decode", json=body, headers={"Authorization": "Bearer t"})
    assert answer.status_code == 200, answer.text
    plaintext = base64.b64decode(answer.json()["payloads"][0]["data"]).decode()
    assert SECRET in plaintext


async def test_waiting_tasks_are_listed_by_the_temporal_cli(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script([tools(("run_shell", {"command": "true"})), text("ok")])
    handle = await dev_runtime.run(agent_task(model))
    await pending_requests(handle)
    address = dev_env.client.service_client.config.target_host
    async with asyncio.timeout(60):
        while True:  # visibility is eventually consistent
            process = await asyncio.create_subprocess_exec(
                temporal_binary(),
                "workflow",
                "list",
                "--address",
                address,
                "--query",
                'AgentStatus="waiting_approval"',
                "--output",
                "json",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await process.communicate()
            if handle.id in out.decode():
                break
            await asyncio.sleep(0.2)
    execution = await dev_env.client.get_workflow_handle(handle.id).describe()
    attrs = execution.typed_search_attributes
    assert attrs.get(search.AGENT_MODEL) == model
    assert attrs.get(search.AGENT_WAITING_SINCE) is not None
    memo = await execution.memo()
    assert memo["status"] == "waiting_approval"
    assert [p["tool"] for p in memo["pending"]] == ["run_shell"]
    await handle.approve()
    await handle.result()
    done = await dev_env.client.get_workflow_handle(handle.id).describe()
    assert done.typed_search_attributes.get(search.AGENT_WAITING_SINCE) is None


async def test_tracing_spans_for_llm_and_tool_calls(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    traced = settings.model_copy(update={"tracing": True})
    client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        data_converter=data_converter(None),
        interceptors=tracing_interceptors(traced),
    )
    model = fake_openai.script(
        [tools(("calculator", {"expression": "2+2"})), text("4", usage=(30, 5))]
    )
    async with running_worker(client, traced):
        handle = await AgentRuntime(client, traced).run(agent_task(model))
        await handle.result()
    provider.force_flush()
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    assert "RunActivity:call_llm" in by_name and "RunActivity:run_tool" in by_name
    llm = by_name["llm call"]
    assert len(llm) == 2 and {s.attributes["model"] for s in llm} == {model}
    assert llm[-1].attributes["llm.output_tokens"] == 5
    [tool] = by_name["tool call"]
    assert tool.attributes["tool"] == "calculator" and tool.attributes["tool.is_error"] is False
    activity_spans = {s.context.span_id for s in by_name["RunActivity:call_llm"]}
    assert all(s.parent is not None and s.parent.span_id in activity_spans for s in llm)
    assert len({s.context.trace_id for s in [*llm, tool]}) == 1  # one trace per task


async def held_by_each(fake: FakeOpenAI, model: str, pids: list[int]) -> None:
    """Until every one of `pids` holds a final answer's stream open (bounded)."""

    owners: dict[int, int | None] = {}  # client port -> worker pid, looked up once each

    def holders() -> set[int | None]:
        for body, sent, port in fake.request_log(model):
            final = sum(m["role"] == "tool" for m in body["messages"]) >= 2
            if sent >= 1 and final and port not in owners:
                owners[port] = pid_with_local_port(port, pids)
        return set(owners.values())

    async with asyncio.timeout(120):
        while not set(pids) <= holders():
            await asyncio.sleep(0.05)  # the workers are other processes: nothing to await


@pytest.mark.long(minutes=0.7)
async def test_two_worker_processes_share_fifty_tasks_and_one_survives_the_other(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    address = dev_env.client.service_client.config.target_host
    first = await WorkerProcess(address, settings).ready()
    second = await WorkerProcess(address, settings).ready()
    # Final answers wait behind a gate until the first worker is gone: the kill provably
    # lands while it holds work, and its held calls are retried by the survivor.
    gate = threading.Event()
    model = fake_openai.script(
        lambda body: (
            Reply(content="finished", hold_after_chunks=1, gate=gate)
            if sum(m["role"] == "tool" for m in body["messages"]) >= 2
            else tools(("calculator", {"expression": "1 + 1"}), chunk_delay=0.01)
        )
    )
    runtime = AgentRuntime(dev_env.client, settings)
    try:
        handles = [
            await runtime.run(agent_task(model, timeout=60), task_id=f"scale-{i}")
            for i in range(50)
        ]
        await held_by_each(fake_openai, model, [first.pid, second.pid])
        first.kill()
        gate.set()
        outcomes = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        assert [o.result for o in outcomes] == ["finished"] * 50
        identities = set()
        for h in handles:
            history = await dev_env.client.get_workflow_handle(h.id).fetch_history()
            for e in history.events:
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    identities.add(e.activity_task_started_event_attributes.identity)
        assert len(identities) == 2, identities  # both shared the work before the kill
    finally:
        gate.set()
        first.kill()
        second.kill()


OWN_IMAGE = "waystation:"


def test_docker_compose_file_is_complete_and_pinned() -> None:
    """There is no Docker engine here: the file is checked as data."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgresql", "temporal", "temporal-ui", "setup", "worker", "api"} <= set(services)
    for name, service in services.items():
        if service.get("image", "").startswith(OWN_IMAGE):
            # waystation's own builds, tagged so that the next deploy can keep one draining.
            assert service.get("build", ".") == ".", name
        elif "image" in service:
            image, _, tag = service["image"].rpartition(":")
            assert image and re.fullmatch(r"\d+(\.\d+)+", tag), (
                f"{name}: unpinned {service['image']}"
            )
        else:
            assert service["build"] == ".", name
    assert services["temporal"]["environment"]["DB"] == "postgres12"
    assert services["temporal"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    for name in ("postgresql", "temporal", "api"):
        assert "healthcheck" in services[name], name
    for name in ("setup", "worker", "worker-previous", "api"):
        env = services[name]["environment"]
        assert (
            env["TEMPORAL_ADDRESS"] == "temporal:7233"
            and env["WAYSTATION_EMBEDDED_SERVER"] == "false"
        )
        # The project names the task queue (waystation-<project>), as for `ws` on the host.
        assert env["WAYSTATION_PROJECT"] == "${WAYSTATION_PROJECT:-waystation}", name
        assert "WAYSTATION_TASK_QUEUE" not in env, name
    # Workers on any number of machines share the storage (waystation's own database on the
    # compose PostgreSQL) and the workspace volume; no data volume.
    worker_env = services["worker"]["environment"]
    assert services["postgresql"]["environment"]["POSTGRES_DB"] == "waystation"
    url = worker_env["WAYSTATION_DATABASE_URL"]
    assert url.startswith("postgresql://temporal:") and url.endswith("@postgresql:5432/waystation")
    mounts = dict(volume.split(":", 1)[::-1] for volume in services["worker"]["volumes"])
    assert mounts == {worker_env["WAYSTATION_WORKSPACE"]: "workspace"}
    assert worker_env["WAYSTATION_DATA_DIR"] not in mounts
    assert set(compose["volumes"]) == {"postgres-data", "workspace"}
    assert services["worker"]["depends_on"]["postgresql"]["condition"] == "service_healthy"
    # Workers scale: no fixed name, no published port.
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]
    assert (
        services["worker"]["depends_on"]["setup"]["condition"] == "service_completed_successfully"
    )
    assert services["api"]["ports"] == ["8000:8000"]
    check_two_versions(services)
    assert "WAYSTATION_API_TOKENS" in services["api"]["environment"]
    # The commands are the image's `ws` (the package's console script), each a real command.
    assert services["worker"]["command"] == ["ws", "worker"]
    starter = (REPO / "waystation" / "cli" / "starter.py").read_text()
    for name in ("setup", "api", "worker"):
        command = services[name]["command"]
        assert command[0] == "ws" and f'"{command[1]}"' in starter
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile and "pip install" in dockerfile
    # The image holds the package alone: what `pip install` puts into site-packages.
    assert "COPY waystation waystation" in dockerfile and 'CMD ["ws", "worker"]' in dockerfile


def check_two_versions(services: dict[str, Any]) -> None:
    """A deploy keeps the build before beside the new one (docs/production.md, "Deploys"):
    both are workers of one Worker Deployment, each its own version, the old one only with
    the `draining` profile and from the image the deploy before built and tagged."""
    current, previous = services["worker"], services["worker-previous"]
    assert current["image"] == OWN_IMAGE + "${IMAGE_TAG:-latest}"
    assert previous["image"] == OWN_IMAGE + "${PREVIOUS_IMAGE_TAG:-previous}"
    assert "build" not in previous and previous["profiles"] == ["draining"]
    assert previous["command"] == current["command"] == ["ws", "worker"]
    assert previous["volumes"] == current["volumes"]
    assert previous["depends_on"] == current["depends_on"]
    old_env, new_env = previous["environment"], current["environment"]
    assert old_env["WAYSTATION_DEPLOYMENT"] == new_env["WAYSTATION_DEPLOYMENT"]
    assert old_env["WAYSTATION_DEPLOYMENT"] == "${WAYSTATION_DEPLOYMENT:-waystation}"
    # Empty: the image derives its version from its own workflow code.
    assert new_env["WAYSTATION_BUILD_ID"] == "${WAYSTATION_BUILD_ID:-}"
    assert old_env["WAYSTATION_BUILD_ID"] == "${PREVIOUS_BUILD_ID:-}"
    assert {k: v for k, v in old_env.items() if k != "WAYSTATION_BUILD_ID"} == {
        k: v for k, v in new_env.items() if k != "WAYSTATION_BUILD_ID"
    }


async def test_worker_tuning_comes_from_settings(
    dev_env: WorkflowEnvironment, settings: Settings
) -> None:
    tuned = settings.model_copy(update={"worker_cached_tasks": 7})
    config = build_worker(dev_env.client, tuned).config()
    assert config["max_cached_workflows"] == 7
    assert config["task_queue"] == settings.task_queue
    assert config["sticky_queue_schedule_to_start_timeout"] == STICKY_SCHEDULE_TO_START
    assert isinstance(config["workflow_runner"], UnsandboxedWorkflowRunner)
    assert not config["disable_eager_activity_execution"]
    # A worker that must not take calls from the server still runs pure tools locally.
    local_only = build_worker(
        dev_env.client, settings, activities=False, task_queue=settings.task_queue + "-local"
    ).config()
    assert local_only["no_remote_activities"] and local_only["activities"]


async def test_tasks_and_forks_retry_a_dead_workers_workflow_task_within_seconds(
    dev_env: WorkflowEnvironment, dev_runtime: AgentRuntime, fake_openai: FakeOpenAI
) -> None:
    model = fake_openai.script(lambda body: text("hi"))
    handle = await dev_runtime.run(agent_task(model))
    await handle.result()
    fork = await dev_runtime.fork(handle.id, 0)
    await fork.result()
    for task_id in (handle.id, fork.id):
        described = await dev_env.client.get_workflow_handle(task_id).describe()
        config = described.raw_description.execution_config
        assert config.default_workflow_task_timeout.ToTimedelta() == WORKFLOW_TASK_TIMEOUT
    assert WORKFLOW_TASK_TIMEOUT.total_seconds() <= 5
