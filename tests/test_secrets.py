"""No secret of the worker reaches what a task shows: a shell command's environment, tool
outputs, error texts, the worker's log, spans, notices and Temporal's history."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from tests.helpers import agent_task, of_type, pending_requests, run_histories
from waystation.activities.builtin_tools import SHELL_RUNS_DIR
from waystation.activities.payload_codec import data_converter, new_key, payload_codec
from waystation.activities.redaction import MIN_SECRET_CHARS, REDACTED, RedactingLogFilter, Redactor
from waystation.activities.storage import Storage
from waystation.activities.storage.sqlite import SqliteBackend
from waystation.client.agent_runtime import AgentRuntime, TaskFailedError
from waystation.client.known_secrets import known_secrets
from waystation.client.reset import failure_of
from waystation.client.temporal import temporal_binary
from waystation.client.tracing import tracing_interceptors
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.postgres import PostgresServer
from waystation.testing.webhook_receiver import WebhookReceiver
from waystation.testing.workers import WorkerProcess, running_worker
from waystation.workflows.models import ApprovalSettings

# --- the redactor ----------------------------------------------------------------------------


def test_every_known_value_is_redacted_the_longest_first_and_short_ones_never() -> None:
    redactor = Redactor(["sk-live-abcdef", "sk-live-abcdef-and-more", "abc", ""])
    said = "key sk-live-abcdef-and-more, then sk-live-abcdef; abc stays"
    assert redactor.redact(said) == f"key {REDACTED}, then {REDACTED}; abc stays"
    assert Redactor(["x" * (MIN_SECRET_CHARS - 1)]).redact("xxx") == "xxx"
    assert Redactor().redact("anything") == "anything"


@pytest.mark.parametrize("cut", range(1, 30))
def test_a_secret_split_across_the_chunks_of_a_stream_is_redacted(cut: int) -> None:
    secret = "tok-0123456789abcdef"
    said = f"the token is {secret}, and {secret[:6]} alone is no secret."
    stream = Redactor([secret]).stream()
    shown = stream.feed(said[:cut]) + stream.feed(said[cut:]) + stream.end()
    assert shown == said.replace(secret, REDACTED)
    one_by_one = Redactor([secret]).stream()
    assert "".join(one_by_one.feed(c) for c in said) + one_by_one.end() == shown


def test_an_error_keeps_its_kind_and_loses_its_secrets_through_its_causes() -> None:
    try:
        try:
            raise ValueError("Error code: 401 - {'Authorization': 'Bearer sk-live-abcdef'}")
        except ValueError as inner:
            raise ApplicationError(
                "model endpoint answered 401: Bearer sk-live-abcdef",
                type="LlmRequestRejected",
                non_retryable=True,
            ) from inner
    except ApplicationError as raised:
        err = raised
    redacted = Redactor(["sk-live-abcdef"]).error(err)
    assert isinstance(redacted, ApplicationError)
    assert redacted.message == f"model endpoint answered 401: Bearer {REDACTED}"
    assert redacted.type == "LlmRequestRejected" and redacted.non_retryable
    assert "sk-live" not in str(redacted.__cause__) and REDACTED in str(redacted.__cause__)
    assert Redactor(["unrelated-value"]).error(err) is err


def test_the_log_filter_redacts_messages_arguments_and_tracebacks() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactingLogFilter(Redactor(["pw-0123456789"])))
    log = logging.getLogger("test_secrets.log_filter")
    log.addHandler(handler)
    log.propagate = False
    try:
        raise RuntimeError("cannot connect with pw-0123456789")
    except RuntimeError:
        log.error("connecting to %s failed", "postgresql://u:pw-0123456789@db/x", exc_info=True)
    log.removeHandler(handler)
    assert "pw-0123456789" not in out.getvalue() and out.getvalue().count(REDACTED) >= 2


# --- what counts as a secret: one test per kind ----------------------------------------------

TOKEN = "tok-" + secrets.token_hex(10)


def _kinds() -> dict[str, tuple[dict[str, Any], dict[str, str], str]]:
    """Each kind of secret: settings fields, environment, and the value that must not show."""
    key = new_key()
    header = {"headers": {"Authorization": "Bearer ${MCP_TOKEN}"}, "url": "https://mcp.example"}
    return {
        "model API key": ({"openai_api_key": TOKEN}, {}, TOKEN),
        "database password": (
            {"database_url": f"postgresql://app:{TOKEN}@db.example:5432/waystation"},
            {},
            TOKEN,
        ),
        "webhook secret": (
            {"webhooks": json.dumps([_endpoint("http://127.0.0.1:9/hook", TOKEN)])},
            {},
            TOKEN,
        ),
        "webhook URL path": (
            {
                "webhooks": json.dumps(
                    [_endpoint(f"https://hooks.example/{TOKEN}", "whsec-unrelated")]
                )
            },
            {},
            TOKEN,
        ),
        "API token": ({"api_tokens": {TOKEN: {"role": "reader", "name": "r"}}}, {}, TOKEN),
        "encryption key": ({"encryption_keys": {"k1": key}, "encryption_key_id": "k1"}, {}, key),
        "MCP server env": (
            {"mcp_servers": {"files": {"command": "srv", "env": {"API_KEY": "${MCP_TOKEN}"}}}},
            {"MCP_TOKEN": TOKEN},
            TOKEN,
        ),
        "MCP server header": ({"mcp_servers": {"docs": header}}, {"MCP_TOKEN": TOKEN}, TOKEN),
        "Temporal API key": ({}, {"TEMPORAL_API_KEY": TOKEN}, TOKEN),
    }


def _endpoint(url: str, secret: str) -> dict[str, Any]:
    return {"name": "ops", "url": url, "events": ["question_asked"], "secret": secret}


KINDS = _kinds()


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_secret_the_settings_hold_is_known(kind: str, tmp_path: Path) -> None:
    fields, environ, value = KINDS[kind]
    settings = Settings(data_dir=tmp_path, **fields)
    assert value in known_secrets(settings, environ)


@pytest.mark.parametrize("kind", list(KINDS))
async def test_each_kind_of_secret_a_command_prints_is_redacted_from_the_task(
    kind: str,
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The second line of defence: a deployment that passes a secret on to shell commands
    (WAYSTATION_SHELL_ENV) still never shows it in the task's events or workspace."""
    fields, environ, value = KINDS[kind]
    for name, variable in {**environ, "PASSED_ON": value}.items():
        monkeypatch.setenv(name, variable)
    deployment = Settings.model_validate(
        {**settings.model_dump(), **fields, "shell_env": ["PASSED_ON"]}
    )
    model = fake_openai.script(
        [tools(("run_shell", {"command": "printenv PASSED_ON"})), text("printed")]
    )
    client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        data_converter=data_converter(payload_codec(deployment)),
    )
    never = ApprovalSettings(policy={"run_shell": "never"})
    async with (
        Storage(SqliteBackend(tmp_path / "storage.sqlite3")) as storage,
        running_worker(client, deployment, storage=storage),
    ):
        # The client reads the storage it is given: the worker's is the SQLite one.
        reader = AgentRuntime(client, deployment.model_copy(update={"database_url": None}))
        handle = await reader.run(agent_task(model, approval=never))
        await handle.result()
        events = await handle.events()
    [observation] = of_type(events, "observation")
    assert observation.output == f"exit code 0\n{REDACTED}\n"
    # A variable passed on is the command's to use: its own record of what it printed
    # (.shell-runs/) holds it, as any file it writes would.
    shown = everything_shown(events, fake_openai, model, deployment, skip=SHELL_RUNS_DIR)
    assert value not in shown


def everything_shown(
    events: list[Any],
    fake: FakeOpenAI,
    model: str,
    settings: Settings,
    *more: str,
    skip: str | None = None,
) -> str:
    """What a reader of the task, the model provider and the shared workspace see."""
    workspace = [
        path.read_text(errors="replace")
        for path in settings.workspace_dir.rglob("*")
        if path.is_file() and skip not in path.relative_to(settings.workspace_dir).parts
    ]
    return "\n".join(
        [
            *(e.model_dump_json() for e in events),
            json.dumps(fake.requests[model]),
            *workspace,
            *more,
        ]
    )


# --- a shell command's environment ----------------------------------------------------------


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


# The worker is an ancestor of the shell that runs the command: its starting environment,
# base64 so that no redaction of the output hides what the command read.
READ_WORKERS_ENVIRON = (
    'p=$PPID; while [ "$p" -gt 1 ]; do '
    "if grep -q worker.py /proc/$p/cmdline; then base64 -w0 /proc/$p/environ; break; fi; "
    "p=$(cut -d' ' -f4 /proc/$p/stat); done\n"
)


@pytest.mark.parametrize("script", ["env\n", READ_WORKERS_ENVIRON], ids=["env", "proc-environ"])
async def test_an_approved_env_shows_none_of_the_workers_secrets(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    postgres: PostgresServer,
    script: str,
) -> None:
    """The issue's case: the model writes `env` into scratch/check.sh (no approval needed)
    and gets `sh scratch/check.sh` approved, on a worker holding every kind of secret; or
    the script reads the worker's own starting environment from /proc instead."""
    worker_secrets = {
        "model API key": "sk-live-" + secrets.token_hex(12),
        "database password": "pw-" + secrets.token_hex(8),
        "webhook secret": "whsec-" + secrets.token_hex(8),
        "reader token": "tok-r-" + secrets.token_hex(8),
        "approver token": "tok-a-" + secrets.token_hex(8),
        "encryption key": new_key(),
        "a variable of the worker's own": "ghp_" + secrets.token_hex(10),
    }
    s = worker_secrets
    env = {
        "OPENAI_API_KEY": s["model API key"],
        "WAYSTATION_DATABASE_URL": with_password(
            postgres.create_database(), s["database password"]
        ),
        "WAYSTATION_WEBHOOKS": json.dumps(
            [_endpoint("http://127.0.0.1:9/hooks/private", s["webhook secret"])]
        ),
        "WAYSTATION_API_TOKENS": json.dumps(
            {
                s["reader token"]: {"role": "reader", "name": "r"},
                s["approver token"]: {"role": "approver", "name": "a"},
            }
        ),
        "WAYSTATION_ENCRYPTION_KEYS": json.dumps({"k1": s["encryption key"]}),
        "WAYSTATION_ENCRYPTION_KEY_ID": "k1",
        "DEPLOY_TOKEN": s["a variable of the worker's own"],
        "WAYSTATION_SHELL_ENV": "TOOL_REGION",
        "TOOL_REGION": "eu-north-7",
    }
    secure = Settings.model_validate(
        {**settings.model_dump(), "encryption_keys": {"k1": s["encryption key"]}}
    )
    address = dev_env.client.service_client.config.target_host
    client = await Client.connect(address, data_converter=data_converter(payload_codec(secure)))

    def reply(body: dict[str, Any]) -> Reply:
        told = [m for m in body["messages"] if m["role"] == "tool"]
        if not told:
            return tools(("write_file", {"path": "scratch/check.sh", "content": script}))
        if len(told) == 1:
            return tools(("run_shell", {"command": "sh scratch/check.sh"}))
        return text("checked")

    model = fake_openai.script(reply)
    worker = WorkerProcess(address, settings, env)
    try:
        await worker.ready()
        handle = await AgentRuntime(client, secure).run(agent_task(model))
        await pending_requests(handle)
        await handle.approve()
        assert (await handle.result()).result == "checked"
        events = await handle.events()
        runs = await run_histories(client, handle.id)
        histories = [with_payloads_decoded(h.to_json()) for h in runs]
    finally:
        worker.kill()
    shell_output = of_type(events, "observation")[-1].output
    if script == READ_WORKERS_ENVIRON:
        assert shell_output.startswith("exit code 0\n"), shell_output
        read = base64.b64decode(shell_output.removeprefix("exit code 0\n").strip())
        shell_output = read.decode("utf-8", "replace")
        assert read and shell_output.strip("\0") == ""  # blank, not merely unreadable
    else:
        assert "WAYSTATION_WORKSPACE=" in shell_output
        assert "TOOL_REGION=eu-north-7" in shell_output and "PATH=" in shell_output
    shown = "\n".join(
        [shell_output, everything_shown(events, fake_openai, model, settings, *histories)]
    )
    leaked = [kind for kind, value in worker_secrets.items() if value in shown]
    assert leaked == []


# --- an endpoint that echoes the API key -----------------------------------------------------

# Every request answered so (a task may ask more than once).
ECHOING = Reply(status=400, error_message="bad request", echo_request=True)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver()
    yield server
    server.close()


@pytest.fixture
def span_exporter() -> Iterator[InMemorySpanExporter]:
    """Spans of this process (a provider set once per process: another test's is reused)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
def worker_log() -> Iterator[io.StringIO]:
    """The worker's log as a handler of the root logger writes it (the worker adds its
    redacting filter to the handlers present when it is built)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    yield out
    root.removeHandler(handler)


async def test_a_key_the_endpoint_puts_into_a_calls_arguments_is_redacted_before_it_runs(
    dev_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    api_key = "sk-live-" + secrets.token_hex(16)
    keyed = Settings.model_validate({**settings.model_dump(), "openai_api_key": api_key})
    client = dev_env.client

    def reply(body: dict[str, Any]) -> Reply:
        if not [m for m in body["messages"] if m["role"] == "tool"]:
            note = {"path": "scratch/note.txt", "content": f"Authorization: Bearer {api_key}"}
            return tools(("write_file", note))
        return text("noted")

    model = fake_openai.script(reply)
    async with running_worker(client, keyed):
        handle = await AgentRuntime(client, keyed).run(agent_task(model))
        assert (await handle.result()).result == "noted"
        events = await handle.events()
    [action] = of_type(events, "action")
    assert action.arguments is not None
    assert action.arguments["content"] == f"Authorization: Bearer {REDACTED}"
    written = (keyed.workspace_dir / "scratch" / "note.txt").read_text()
    assert written == f"Authorization: Bearer {REDACTED}"  # what ran is what was shown
    histories = [with_payloads_decoded(h.to_json()) for h in await run_histories(client, handle.id)]
    assert not [h for h in histories if api_key in h]


async def test_an_endpoint_echoing_the_api_key_shows_it_nowhere(
    dev_env: WorkflowEnvironment,
    settings: Settings,
    fake_openai: FakeOpenAI,
    receiver: WebhookReceiver,
    span_exporter: InMemorySpanExporter,
    worker_log: io.StringIO,
) -> None:
    api_key = "sk-live-" + secrets.token_hex(16)
    endpoint = _endpoint(receiver.url("ops"), "whsec-" + secrets.token_hex(8))
    endpoint["events"] = ["failed"]
    echoed = Settings.model_validate(
        {
            **settings.model_dump(),
            "openai_api_key": api_key,
            "tracing": True,
            "webhooks": json.dumps([endpoint]),
        }
    )
    client = await Client.connect(
        dev_env.client.service_client.config.target_host,
        data_converter=data_converter(None),
        interceptors=tracing_interceptors(echoed),
    )
    model = fake_openai.script(lambda body: ECHOING)
    async with running_worker(client, echoed):
        handle = await AgentRuntime(client, echoed).run(agent_task(model))
        with pytest.raises(TaskFailedError) as failed:
            await handle.result()
        [notice] = await receiver.until(lambda rs: len(rs) >= 1, "ops")
        events = await handle.events()
    histories = [with_payloads_decoded(h.to_json()) for h in await run_histories(client, handle.id)]
    spans = [
        json.dumps([dict(s.attributes or {}), str(s.status.description), s.to_json()])
        for s in span_exporter.get_finished_spans()
    ]
    [failure] = of_type(events, "failed")
    assert "bad request" in str(failed.value) and REDACTED in str(failed.value)
    assert "bad request" in failure.reason
    assert f"Bearer {REDACTED}" in notice.body.decode()
    shown = everything_shown(
        events,
        fake_openai,
        model,
        echoed,
        str(failed.value),
        *histories,
        worker_log.getvalue(),
        *spans,
        notice.body.decode(),
    )
    assert api_key not in shown
    assert "RunActivity:call_llm" in "".join(spans)  # the spans were there to look at


def with_payloads_decoded(history_json: str) -> str:
    """A history's JSON and the text of its payloads (base64 in the JSON)."""
    payloads = re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', history_json)
    decoded = [base64.b64decode(p).decode("utf-8", "replace") for p in payloads]
    return "\n".join([history_json, *decoded])


# --- failure texts under encryption ----------------------------------------------------------

PROMPT_SECRET = "the-launch-code-is-HUNTER2"


async def test_an_error_quoting_the_prompt_is_encrypted_in_history_and_still_read(
    encrypted_client: tuple[Client, Settings], fake_openai: FakeOpenAI
) -> None:
    client, secure = encrypted_client
    model = fake_openai.script(lambda body: ECHOING)
    runtime = AgentRuntime(client, secure)
    async with running_worker(client, secure):
        handle = await runtime.run(agent_task(model, task=f"remember {PROMPT_SECRET}"))
        with pytest.raises(TaskFailedError) as failed:
            await handle.result()
        events = await handle.events()
    # Those with the key read the failure as before: the task's error, its `failed` event.
    assert PROMPT_SECRET in str(failed.value)
    [event] = of_type(events, "failed")
    assert PROMPT_SECRET in event.reason
    history = await client.get_workflow_handle(handle.id).fetch_history()
    message, _ = await failure_of(client, list(history.events))
    assert message is not None and PROMPT_SECRET in message

    # A history read without the key shows no plaintext, encoded or not.
    raw = await temporal_show(client, handle.id)
    assert "HUNTER2" not in raw
    decoded = [
        base64.b64decode(m).decode("utf-8", "replace")
        for m in re.findall(r'"data":\s*"([A-Za-z0-9+/=]+)"', raw)
    ]
    assert not [d for d in decoded if "HUNTER2" in d]
    failed_activity = next(
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    )
    failure = failed_activity.activity_task_failed_event_attributes.failure
    assert failure.message == "Encoded failure" and failure.stack_trace == ""

    # The Web UI decodes it through the codec endpoint, as any payload.
    sealed = failure.encoded_attributes
    body = {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
                "data": base64.b64encode(sealed.data).decode(),
            }
        ]
    }
    app = create_app(
        secure.model_copy(update={"api_tokens": {"t": ApiToken(role="reader", name="ui")}}),
        runtime,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as api:
        answer = await api.post("/codec/decode", json=body, headers={"Authorization": "Bearer t"})
    assert answer.status_code == 200, answer.text
    opened = json.loads(base64.b64decode(answer.json()["payloads"][0]["data"]))
    assert PROMPT_SECRET in opened["message"]


async def temporal_show(client: Client, task_id: str) -> str:
    process = await asyncio.create_subprocess_exec(
        temporal_binary(),
        "workflow",
        "show",
        "--workflow-id",
        task_id,
        "--address",
        client.service_client.config.target_host,
        "--output",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    raw, _ = await process.communicate()
    assert process.returncode == 0, raw.decode()
    return raw.decode()
