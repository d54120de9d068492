"""The errors a newcomer meets first, each one sentence with no traceback and no library
text (issue 39): a wrong TEMPORAL_ADDRESS, a port held by a program that is not Temporal,
a model endpoint that cannot be reached, a model name the endpoint does not offer. And the
Makefile a newcomer starts with: two cold `make demo` at once, the ports it prints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.helpers import serving_api
from waystation.activities.openai_chat import classify_provider_error
from waystation.client.agent_runtime import AgentRuntime
from waystation.client.task_errors import TaskNotFoundError
from waystation.client.task_rights import TaskRefusedError
from waystation.client.temporal import _reason
from waystation.servers.http_api import create_app
from waystation.settings import ApiToken, Settings
from waystation.testing.fake_openai import FakeOpenAI, text
from waystation.testing.workers import REPO
from waystation.workflows.models import AgentTask, ModelSettings


async def ws(*args: str, env: dict[str, str], cwd: Path) -> tuple[int, list[str]]:
    """`ws ARGS` in a fresh process with only `env`'s settings: its exit code and the lines
    it wrote on stderr."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "WAYSTATION_", "TEMPORAL_"))
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from waystation.cli.starter import cli; cli()",
        *args,
        cwd=cwd,
        env={**clean, "WAYSTATION_DATA_DIR": str(cwd / "data"), **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, err.decode().splitlines()


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A port held by a listener that accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_host_that_does_not_resolve_is_one_sentence(tmp_path: Path) -> None:
    address = "nosuchhost.invalid:7233"
    code, lines = await ws("status", "task-1", env={"TEMPORAL_ADDRESS": address}, cwd=tmp_path)
    assert code == 1
    assert lines == [
        f"error: cannot connect to Temporal at {address} (TEMPORAL_ADDRESS): no host has that name"
    ]


async def test_an_address_without_a_port_is_one_sentence(tmp_path: Path) -> None:
    code, lines = await ws("list", env={"TEMPORAL_ADDRESS": "localhost:abc"}, cwd=tmp_path)
    assert code == 1
    assert lines == [
        "error: the Temporal address 'localhost:abc' (TEMPORAL_ADDRESS) has no port: "
        "write it as host:port"
    ]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
            'ConnectError(ConnectError("dns error", Custom { kind: Uncategorized, error: '
            '"failed to lookup address information: Name or service not known" })))',
            "no host has that name",
        ),
        ("Failed client connect: Timeout expired", "no answer in time"),
        ("h2 protocol error: http2 error", "what answers there is not a Temporal server"),
        (
            "grpc-status header missing, mapped from HTTP status code 404",
            "what answers there is not a Temporal server",
        ),
        (
            "tonic::transport::Error(Transport, hyper::Error(Io, Kind(Other)))",
            "the connection failed",
        ),
        (
            "Server connection error: tonic::transport::Error(Transport, ConnectError(Os { code: "
            '111, kind: ConnectionRefused, message: "Connection refused" }))',
            "Connection refused",
        ),
    ],
)
def test_connection_errors_are_said_in_words_not_in_rust(raw: str, reason: str) -> None:
    assert _reason(raw) == reason


async def test_a_grpc_port_held_by_another_program_names_the_setting(tmp_path: Path) -> None:
    with held_port() as port:
        code, lines = await ws(
            "status", "task-1", env={"WAYSTATION_DEV_SERVER_PORT": str(port)}, cwd=tmp_path
        )
    assert code == 1
    assert lines == [
        f"error: port {port} is held by a program that is not a Temporal server: "
        "set WAYSTATION_DEV_SERVER_PORT to a free port, or stop that program"
    ]


async def test_a_web_ui_port_held_by_another_program_names_the_setting(tmp_path: Path) -> None:
    with held_port() as ui_port:
        env = {
            "WAYSTATION_DEV_SERVER_PORT": str(free_port()),
            "WAYSTATION_DEV_SERVER_UI_PORT": str(ui_port),
        }
        code, lines = await ws("server", "start", env=env, cwd=tmp_path)
    assert code == 1
    assert lines == [
        f"error: port {ui_port} is held by another program, so the dev server's Web UI cannot "
        "listen there: set WAYSTATION_DEV_SERVER_UI_PORT to a free port, or stop that program"
    ]
    assert not (tmp_path / "data" / "temporal.pid").exists()  # no server was started


async def test_an_unreachable_model_endpoint_is_named_by_its_url_without_its_password() -> None:
    url = f"http://someone:hunter22@127.0.0.1:{free_port()}/v1"
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=url, max_retries=0)
    with pytest.raises(openai.APIConnectionError) as raised:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    failure = classify_provider_error(raised.value)
    unseen = url.replace("someone:hunter22", "[redacted secret]")
    assert failure.message == (
        f"cannot reach the model endpoint at {unseen} (OPENAI_BASE_URL): nothing answers there"
    )
    assert not failure.non_retryable  # the endpoint may come up: the step is retried


@pytest.fixture
def listing_endpoint() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(lists_models=True)
    yield server
    server.close()


def runtime_for(env: WorkflowEnvironment, settings: Settings, endpoint: FakeOpenAI) -> AgentRuntime:
    return AgentRuntime(env.client, settings.model_copy(update={"openai_base_url": endpoint.url}))


async def test_an_unknown_model_is_refused_before_the_task_starts(
    ts_env: WorkflowEnvironment, settings: Settings, listing_endpoint: FakeOpenAI
) -> None:
    listing_endpoint.script([text("hi")], model="gpt-4")
    listing_endpoint.script([text("hi")], model="gpt-4o-mini")
    runtime = runtime_for(ts_env, settings, listing_endpoint)
    task = AgentTask(task="hello", model=ModelSettings(name="gpt4"))
    with pytest.raises(TaskRefusedError) as refused:
        await runtime.run(task, task_id="typo-task")
    assert str(refused.value) == (
        f"unknown model 'gpt4' (did you mean 'gpt-4'?): the endpoint {listing_endpoint.url} "
        "(OPENAI_BASE_URL) offers gpt-4, gpt-4o-mini, and 'offline' is always there"
    )
    assert (refused.value.status, refused.value.kind) == (400, "unknown_model")
    with pytest.raises(TaskNotFoundError):
        await runtime.find("typo-task")
    assert listing_endpoint.calls("gpt-4") == 0


async def test_a_model_served_after_the_list_was_read_is_known(
    ts_env: WorkflowEnvironment, settings: Settings, listing_endpoint: FakeOpenAI
) -> None:
    runtime = runtime_for(ts_env, settings, listing_endpoint)
    first = listing_endpoint.script([text("one")])
    await runtime.run(AgentTask(task="a", model=ModelSettings(name=first)))
    later = listing_endpoint.script([text("two")])  # not in the list this process read
    await runtime.run(AgentTask(task="b", model=ModelSettings(name=later)))
    await runtime.run(AgentTask(task="c", model=ModelSettings(name="offline")))


async def test_an_endpoint_that_cannot_list_its_models_starts_the_task_as_before(
    ts_env: WorkflowEnvironment, settings: Settings, fake_openai: FakeOpenAI
) -> None:
    runtime = AgentRuntime(ts_env.client, settings)  # the suite's fake: GET /models is a 404
    task = AgentTask(task="a", model=ModelSettings(name="never-scripted"))
    await runtime.run(task, task_id="unlisted-model")
    assert (await runtime.find("unlisted-model")) is not None


async def test_the_http_api_refuses_an_unknown_model_with_a_400(
    dev_env: WorkflowEnvironment, settings: Settings, listing_endpoint: FakeOpenAI
) -> None:
    listing_endpoint.script([text("hi")], model="gpt-4")
    settings = settings.model_copy(
        update={
            "openai_base_url": listing_endpoint.url,
            "api_tokens": {"approver-token-1234": ApiToken(role="approver", name="alice")},
        }
    )
    app = create_app(settings, AgentRuntime(dev_env.client, settings))
    async with (
        serving_api(app) as port,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": "Bearer approver-token-1234"},
        ) as api,
    ):
        answer = await api.post("/tasks", json={"task": "hi", "model": {"name": "gpt4"}})
    assert answer.status_code == 400
    body = answer.json()
    assert body["error"] == "unknown_model"
    assert body["detail"].startswith("unknown model 'gpt4' (did you mean 'gpt-4'?)")
    assert body["fields"][0]["loc"] == ["body", "model", "name"]


async def test_ws_run_with_a_mistyped_model_is_one_sentence_and_starts_nothing(
    dev_env: WorkflowEnvironment, settings: Settings, listing_endpoint: FakeOpenAI, tmp_path: Path
) -> None:
    listing_endpoint.script([text("hi")], model="gpt-4")
    env = {
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "WAYSTATION_EMBEDDED_SERVER": "false",
        "WAYSTATION_TASK_QUEUE": settings.task_queue,
        "OPENAI_BASE_URL": listing_endpoint.url,
        "OPENAI_API_KEY": "sk-test",
    }
    code, lines = await ws(
        "run", "--model", "gpt4", "--id", "typo-cli", "--no-worker", "hi", env=env, cwd=tmp_path
    )
    assert code == 2
    assert lines == [
        f"error: unknown model 'gpt4' (did you mean 'gpt-4'?): the endpoint "
        f"{listing_endpoint.url} (OPENAI_BASE_URL) offers gpt-4, and 'offline' is always there"
    ]
    with pytest.raises(TaskNotFoundError):
        await AgentRuntime(dev_env.client, settings).find("typo-cli")


# Stands for python3 in a copy of the Makefile: `-m venv DIR` (the slow part of a cold
# set-up) is logged and waits for the test's go-ahead, then makes a venv whose pip and ws
# only log; anything else is the real Python (the Makefile's lock, the ports line).
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    echo "venv $3" >> "$SETUP_LOG"
    while [ ! -e "$SETUP_GO" ]; do sleep 0.05; done
    mkdir -p "$3/bin"
    printf '#!/bin/sh\nexec "{python}" "$@"\n' > "$3/bin/python"
    printf '#!/bin/sh\\necho "pip $*" >> "$SETUP_LOG"\\n' > "$3/bin/pip"
    printf '#!/bin/sh\\necho "ws $*" >> "$SETUP_LOG"\\n' > "$3/bin/ws"
    chmod +x "$3/bin/python" "$3/bin/pip" "$3/bin/ws"
    exit 0
fi
exec "{python}" "$@"
"""


def until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def makefile_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The Makefile and pyproject.toml in a folder of their own, and a stand-in python3."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(REPO / name, repo / name)
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    return repo, fake


def test_two_cold_make_setups_at_once_both_work(tmp_path: Path) -> None:
    """The second waits for the first's venv (it said so), then finds it ready: one venv,
    one install, and both exit 0 (issue 39: the second failed on a missing .venv/bin/pip)."""
    repo, fake = makefile_copy(tmp_path)
    log, go = tmp_path / "setup.log", tmp_path / "go"
    log.touch()
    env = {**os.environ, "SETUP_LOG": str(log), "SETUP_GO": str(go)}
    make = ["make", "--no-print-directory", "setup", f"PYTHON={fake}"]

    def started(out: Path) -> subprocess.Popen[bytes]:
        with out.open("wb") as sink:
            return subprocess.Popen(make, cwd=repo, env=env, stdout=sink, stderr=sink)

    first = started(tmp_path / "first.out")
    until(lambda: "venv" in log.read_text(), "the first make to create the venv")
    second = started(tmp_path / "second.out")
    until(lambda: "waiting for it" in (tmp_path / "second.out").read_text(), "the second to wait")
    go.touch()
    assert (first.wait(60), second.wait(60)) == (0, 0), (tmp_path / "second.out").read_text()
    assert log.read_text().splitlines() == [
        "venv .venv",
        "pip install --quiet --upgrade pip",
        "pip install --quiet --editable .[dev]",
    ]


def test_make_demo_says_the_ports_the_settings_give(tmp_path: Path) -> None:
    repo, fake = makefile_copy(tmp_path)
    (tmp_path / "go").touch()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WAYSTATION_")},
        "SETUP_LOG": str(tmp_path / "setup.log"),
        "SETUP_GO": str(tmp_path / "go"),
        "WAYSTATION_DEV_SERVER_PORT": "17233",
        "WAYSTATION_DEV_SERVER_UI_PORT": "18233",
    }
    done = subprocess.run(
        ["make", "--no-print-directory", "demo", f"PYTHON={fake}"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "==> running an agent task on the embedded Temporal dev server "
        "(Temporal on localhost:17233, Web UI: http://localhost:18233)"
    ) in done.stdout.splitlines()
