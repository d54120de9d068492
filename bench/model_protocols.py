"""The prompt cache and each protocol's cost: `python -m bench.model_protocols`.

- Cache share: a task of `--steps` steps (50) whose model writes `--message-bytes` (2 KB) of
  text and a calculator call at each step, on `anthropic:` against the fake endpoint, which
  counts Anthropic's prompt cache as the API documents it. Reported: the share of input
  tokens of requests 2 to the last that the cache served (target >= 0.9).
- Cost of compaction: the same task with `context_window_tokens` = `--compact-window`, small
  enough that the conversation is compacted twice: the share then, and for each compaction
  what its summary call and the request after it read from the cache.
- Overhead of each protocol: ms per step of the same task on `openai-responses:` and
  `anthropic:`, against `openai:` in the same run (each against its protocol's fake).
- llama.cpp (`--llama`, off by default: ~5 minutes): the 0.5B Qwen model that
  `scripts/real_model.py` serves (it needs `pip install -e '.[real-model]'`; its first run
  fetches the model). A real model cannot be scripted, so the benchmark drives the
  conversation itself: each protocol's backend is called step by step with the conversation
  a task would send (each step adds the model's 2 KB message with a calculator call, and
  the call's result), and the share is llama.cpp's own count (`/v1/messages`:
  cache_read_input_tokens; `/v1/chat/completions`: cached_tokens). Its size is its own
  flags: `--llama-steps`, `--llama-context`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Bench, Row, bench_environment, median, print_table, say
from waystation.activities.anthropic_messages import AnthropicMessages
from waystation.activities.chat import ChatBackend
from waystation.activities.llm import SUMMARY_INSTRUCTIONS
from waystation.activities.openai_chat import OpenAIChat
from waystation.client.agent_runtime import AgentRuntime
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.typed_openai import CALCULATOR_TOOL
from waystation.workflows.events import AgentEvent, ContextCompacted, Thought
from waystation.workflows.models import (
    AgentTask,
    ApprovalSettings,
    ChatMessage,
    ModelSettings,
    ToolCallRequest,
    Usage,
)

STEPS = 50
MESSAGE_BYTES = 2048
# With 50 steps of 2 KB the conversation is compacted twice in a window of this many tokens.
COMPACT_WINDOW = 20_000
REPEATS = 3
ENDPOINTS = ("openai", "openai-responses", "anthropic")
TARGET_SHARE = 0.9

REPO = Path(__file__).resolve().parent.parent
# scripts/real_model.py's default model, and the name its server gives it.
LLAMA_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
LLAMA_MODEL_FILE = (
    Path(os.environ.get("WAYSTATION_MODEL_CACHE", Path.home() / ".cache/waystation/models"))
    / f"{LLAMA_MODEL}.gguf"
)
# The 50 steps of 2 KB: ~22,000 tokens by the last request, hence the context.
LLAMA_STEPS = 50
LLAMA_CONTEXT = 32768
LLAMA_PORT = 18_461
LLAMA_START_SECONDS = 120.0

WORDS = (
    "the agent reads each file it was given, notes what the tests expect, checks the "
    "build log for the failing step, compares the two versions of the parser, and writes "
    "down which function changed its output and why the fixture no longer matches"
).split()


@dataclass(frozen=True)
class Options:
    steps: int = STEPS
    message_bytes: int = MESSAGE_BYTES
    compact_window: int = COMPACT_WINDOW
    repeats: int = REPEATS
    llama: bool = False
    llama_steps: int = LLAMA_STEPS
    llama_context: int = LLAMA_CONTEXT
    llama_port: int = LLAMA_PORT


def prose(step: int, size: int) -> str:
    """`size` bytes of text that differ at each step (a real tokenizer's load, not `xxxx`)."""
    words = [f"Step {step}:"]
    length = len(words[0])
    index = step
    while length < size:
        word = WORDS[index % len(WORDS)]
        words.append(word)
        length += len(word) + 1
        index += 7
    return " ".join(words)[:size]


def counted(messages: list[dict[str, Any]]) -> int:
    """The calculator's last result: how many steps the task has counted so far."""
    for message in reversed(messages):
        if message["role"] == "tool":
            return int(float(str(message["content"]).split()[-1]))
    return 0


def counting_model(steps: int, size: int) -> Any:
    """A script: a `size`-byte message and a calculator call adding one, for `steps` steps;
    a short summary when asked to compact."""

    def reply(body: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = body["messages"]
        if any(SUMMARY_INSTRUCTIONS in str(m.get("content")) for m in messages[:1]):
            return text("The agent counts with the calculator, one step at a time.")
        done = counted(messages)
        if done >= steps - 1:
            return text(f"Counted to {done}.")
        return tools(("calculator", {"expression": f"{done} + 1"}), content=prose(done, size))

    return reply


def script_model(fake: FakeOpenAI, endpoint: str, options: Options) -> str:
    """The counting script under a model name of the endpoint's provider, so the task gets
    that model's context window by default (Claude's 200,000 tokens, GPT-4.1's 1,000,000),
    as a user's would: the unknown name's 16,000 would compact it three times."""
    family = "claude-bench" if endpoint == "anthropic" else "gpt-4.1-bench"
    return fake.script(
        counting_model(options.steps, options.message_bytes),
        f"{family}-{uuid.uuid4().hex[:8]}",
        record=False,
    )


def cache_share(usages: list[Usage]) -> float:
    total = sum(usages, Usage())
    return total.cache_read_tokens / total.input_tokens if total.input_tokens else 0.0


def best_share(usages: list[Usage]) -> float:
    """The share of requests 2 to the last if each read all its predecessor sent: what new
    messages leave to any cache (each step's own tokens are new)."""
    read = sum(min(a.input_tokens, b.input_tokens) for a, b in itertools.pairwise(usages))
    total = sum(u.input_tokens for u in usages[1:])
    return read / total if total else 0.0


@dataclass
class TaskRun:
    events: list[AgentEvent]
    seconds_per_step: float

    @property
    def thoughts(self) -> list[Thought]:
        return [e for e in self.events if isinstance(e, Thought)]

    @property
    def compactions(self) -> list[tuple[ContextCompacted, Thought | None]]:
        """Each compaction, with the model request right after it."""
        found: list[tuple[ContextCompacted, Thought | None]] = []
        for index, event in enumerate(self.events):
            if isinstance(event, ContextCompacted):
                after = (e for e in self.events[index:] if isinstance(e, Thought))
                found.append((event, next(after, None)))
        return found


async def run_task(
    runtime: AgentRuntime, model_name: str, options: Options, window: int | None = None
) -> TaskRun:
    task = AgentTask(
        task="Count with the calculator, one step at a time.",
        model=ModelSettings(name=model_name, context_window_tokens=window),
        max_steps=options.steps + 1,
        approval=ApprovalSettings(policy={"calculator": "never"}),
    )
    started = time.perf_counter()
    handle = await runtime.run(task)
    outcome = await handle.result()
    seconds = time.perf_counter() - started
    if outcome.steps != options.steps:
        raise RuntimeError(f"{model_name} took {outcome.steps} steps, not {options.steps}")
    return TaskRun(await handle.events(), seconds / outcome.steps)


@contextlib.contextmanager
def anthropic_environment(fake: FakeOpenAI) -> Iterator[None]:
    """The worker reads the Anthropic endpoint from its environment, as a user's does."""
    saved = {k: os.environ.get(k) for k in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")}
    os.environ["ANTHROPIC_BASE_URL"] = fake.anthropic_url
    os.environ["ANTHROPIC_API_KEY"] = "sk-ant-bench"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def share_of(label: str, usages: list[Usage]) -> tuple[float, str]:
    """The cache share of requests 2 to the last, and what it is made of."""
    later = usages[1:]
    total = sum(later, Usage())
    detail = (
        f"{total.cache_read_tokens:,} of {total.input_tokens:,} input tokens, "
        f"requests 2-{len(usages)}"
    )
    say(f"{label}: cache share {cache_share(later):.3f} ({detail})")
    return cache_share(later), detail


async def measure_fake(bench: Bench, options: Options) -> list[Row]:
    size = f"{options.steps} steps, {options.message_bytes} B per model message"
    settings = bench.settings("protocols")
    rows: list[Row] = []
    with anthropic_environment(bench.fake):
        async with bench.worker(settings):
            runtime = AgentRuntime(bench.client, settings)
            runs: dict[str, TaskRun] = {}
            seconds: dict[str, list[float]] = {endpoint: [] for endpoint in ENDPOINTS}
            # Round-robin, the first round a warm-up: the protocols share the machine's noise.
            for round in range(options.repeats + 1):
                for endpoint in ENDPOINTS:
                    model = script_model(bench.fake, endpoint, options)
                    runs[endpoint] = await run_task(runtime, f"{endpoint}:{model}", options)
                    if round:
                        seconds[endpoint].append(runs[endpoint].seconds_per_step)
                    say(f"{endpoint}: {runs[endpoint].seconds_per_step * 1000:.1f} ms per step")
            model = script_model(bench.fake, "anthropic", options)
            compacted = await run_task(
                runtime, f"anthropic:{model}", options, window=options.compact_window
            )

    usages = [t.usage for t in runs["anthropic"].thoughts]
    share, detail = share_of("anthropic fake", usages)
    rows.append(
        Row(
            f"cache share, anthropic fake, {size}, the model's default window",
            f"{share:.3f}",
            f"target >= {TARGET_SHARE}; at most {best_share(usages):.3f}; {detail}",
        )
    )
    share, detail = share_of("anthropic fake, compacted", [t.usage for t in compacted.thoughts])
    compactions = compacted.compactions
    rows.append(
        Row(
            f"cache share, anthropic fake, {size}, window {options.compact_window:,} tokens",
            f"{share:.3f}",
            f"{len(compactions)} compactions; {detail}",
        )
    )
    # What a step costs when nothing is compacted: its own new tokens.
    step_cost = median([_uncached(t) for t in runs["anthropic"].thoughts[2:]] or [0.0])
    for number, (event, after) in enumerate(compactions, 1):
        summary = event.usage
        cost = (
            f"the request after it read {after.usage.cache_read_tokens:,} of "
            f"{after.usage.input_tokens:,} from cache"
            if after is not None
            else "no request after it"
        )
        rows.append(
            Row(
                f"compaction {number} (step {event.step}): uncached input tokens",
                f"{summary.input_tokens - summary.cache_read_tokens + _uncached(after):,}",
                f"a step without one: {step_cost:,.0f}; the summary call read "
                f"{summary.cache_read_tokens:,} of {summary.input_tokens:,}; {cost}",
            )
        )
    baseline = median(seconds["openai"])
    for endpoint, values in seconds.items():
        rows.append(
            Row(
                f"ms per step, {endpoint}: against its fake, {size}",
                f"{median(values) * 1000:.1f}",
                f"{median(values) / baseline:.2f}x openai (median of {len(values)})",
            )
        )
    return rows


def _uncached(thought: Thought | None) -> int:
    return 0 if thought is None else thought.usage.input_tokens - thought.usage.cache_read_tokens


# ---- llama.cpp ----------------------------------------------------------------------------


def driven_conversation(steps: int, size: int, marker: str) -> list[list[ChatMessage]]:
    """The conversation of each request of a task of `steps` steps, as the task sends it."""
    messages = [
        ChatMessage(role="system", content=f"You are a careful agent ({marker})."),
        ChatMessage(role="user", content="Count with the calculator, one step at a time."),
    ]
    requests = [list(messages)]
    for step in range(steps - 1):
        call = ToolCallRequest(
            id=f"call_{step}", name="calculator", arguments=f'{{"expression": "{step} + 1"}}'
        )
        messages.append(ChatMessage(role="assistant", content=prose(step, size), tool_calls=[call]))
        messages.append(ChatMessage(role="tool", tool_call_id=call.id, content=str(step + 1)))
        requests.append(list(messages))
    return requests


async def drive(
    backend: ChatBackend, requests: list[list[ChatMessage]]
) -> tuple[list[Usage], float]:
    """Each request in turn, as the task's steps would send them: their usages, s per step."""
    # A few tokens of answer: the benchmark sends its own next message, not the model's.
    model = ModelSettings(name=LLAMA_MODEL, max_tokens=8)
    usages: list[Usage] = []
    started = time.perf_counter()
    for number, messages in enumerate(requests, 1):
        usage = Usage()
        async for delta in backend.stream(messages, [CALCULATOR_TOOL], model):
            usage = delta.usage or usage
        usages.append(usage)
        say(f"  request {number}: {usage.cache_read_tokens} of {usage.input_tokens} cached")
    return usages, (time.perf_counter() - started) / len(requests)


@contextlib.asynccontextmanager
async def llama_server(options: Options) -> AsyncIterator[str]:
    """scripts/real_model.py's server; yields its address (no `/v1`)."""
    command = [
        sys.executable,
        str(REPO / "scripts" / "real_model.py"),
        "--port",
        str(options.llama_port),
        "--context",
        str(options.llama_context),
    ]
    server = await asyncio.create_subprocess_exec(
        *command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    address = f"http://127.0.0.1:{options.llama_port}"
    try:
        deadline = time.monotonic() + LLAMA_START_SECONDS
        while not await asyncio.to_thread(_answers, f"{address}/health"):
            if server.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp's server did not start: {' '.join(command)}")
            await asyncio.sleep(0.5)
        yield address
    finally:
        if server.returncode is None:
            server.terminate()
        await server.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def measure_llama(options: Options) -> list[Row]:
    if not LLAMA_MODEL_FILE.exists():
        say(
            f"no llama.cpp model at {LLAMA_MODEL_FILE}: "
            "`python scripts/real_model.py --check-only` fetches it"
        )
        return [
            Row(
                "cache share, llama.cpp",
                "model absent",
                "python scripts/real_model.py --check-only",
            )
        ]
    size = (
        f"{options.llama_steps} steps, {options.message_bytes} B per model message, "
        f"context {options.llama_context}"
    )
    rows: list[Row] = []
    async with llama_server(options) as address:
        backends: dict[str, ChatBackend] = {
            "anthropic": AnthropicMessages("local", address),
            "openai": OpenAIChat("local", f"{address}/v1"),
        }
        for endpoint, backend in backends.items():
            say(f"llama.cpp, {endpoint} protocol: {size}")
            requests = driven_conversation(options.llama_steps, options.message_bytes, endpoint)
            try:
                usages, seconds = await drive(backend, requests)
            finally:
                await backend.close()  # type: ignore[attr-defined]
            share, detail = share_of(f"llama.cpp, {endpoint}", usages)
            rows.append(
                Row(
                    f"cache share, llama.cpp 0.5B over the {endpoint} protocol, {size}",
                    f"{share:.3f}",
                    f"at most {best_share(usages):.3f}; {detail}; {seconds:.1f} s per request",
                )
            )
    return rows


async def measure(bench: Bench, options: Options = Options()) -> list[Row]:
    rows = await measure_fake(bench, options)
    if options.llama:
        rows += await measure_llama(options)
    return rows


def main() -> None:
    defaults = Options()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--message-bytes", type=int, default=defaults.message_bytes)
    parser.add_argument(
        "--compact-window",
        type=int,
        default=defaults.compact_window,
        help="context_window_tokens of the compacted run",
    )
    parser.add_argument(
        "--repeats", type=int, default=defaults.repeats, help="timed runs per protocol"
    )
    parser.add_argument("--llama", action="store_true", help="also measure llama.cpp")
    parser.add_argument("--llama-steps", type=int, default=defaults.llama_steps)
    parser.add_argument("--llama-context", type=int, default=defaults.llama_context)
    parser.add_argument("--llama-port", type=int, default=defaults.llama_port)
    args = parser.parse_args()
    options = Options(
        steps=args.steps,
        message_bytes=args.message_bytes,
        compact_window=args.compact_window,
        repeats=args.repeats,
        llama=args.llama,
        llama_steps=args.llama_steps,
        llama_context=args.llama_context,
        llama_port=args.llama_port,
    )

    async def run() -> None:
        async with bench_environment() as bench:
            rows = await measure(bench, options)
        print_table(rows)

    asyncio.run(run())


if __name__ == "__main__":
    main()
