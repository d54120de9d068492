"""What the protocols benchmark rests on, at a tiny size: its scripted task counts to the
end on each endpoint, and a small window compacts it twice (the figures themselves are in
docs/performance.md, never asserted)."""

from __future__ import annotations

from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from bench.common import Bench
from bench.model_protocols import Options, measure
from waystation.testing.fake_openai import FakeOpenAI


async def test_the_benchmark_runs_each_protocol_and_compacts_twice(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    bench = Bench(env=dev_env, fake=fake_openai, scratch=tmp_path)
    options = Options(steps=6, message_bytes=2048, compact_window=3000, repeats=1)
    rows = {row.figure: row for row in await measure(bench, options)}
    size = "6 steps, 2048 B per model message"
    default_window = rows[f"cache share, anthropic fake, {size}, the model's default window"]
    assert 0 < float(default_window.value) <= 1
    compacted = rows[f"cache share, anthropic fake, {size}, window 3,000 tokens"]
    assert compacted.versus.startswith("2 compactions")
    for endpoint in ("openai", "openai-responses", "anthropic"):
        assert float(rows[f"ms per step, {endpoint}: against its fake, {size}"].value) > 0
