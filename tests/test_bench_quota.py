"""What the quota benchmark rests on, at a tiny size: both modes start their worker
processes, run every task of each scenario to its answer against a provider quota, and
report each figure (the figures themselves are in docs/performance.md, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from bench.common import Bench
from bench.quota import Options, endpoints, measure
from waystation.settings.model_endpoints import parse_endpoints
from waystation.testing.fake_openai import FakeOpenAI

# A quota far above what the tiny run asks: nothing is refused, so no call waits a minute.
SMOKE = Options(
    tasks=4, calls=2, workers=2, rpm=600, input_tpm=10**7, model_seconds=0.0, fair_a=4, fair_b=2
)


def test_only_the_with_mode_declares_the_quota_per_scenario_model() -> None:
    models, url = ["m1", "m2"], "http://127.0.0.1:9/v1"
    declared = endpoints(url, SMOKE, "with", models)["bench"]
    assert declared["base_url"] == url
    assert declared["limits"]["per_model"] == {m: SMOKE.quota() for m in models}
    assert "limits" not in endpoints(url, SMOKE, "without", models)["bench"]
    # What the workers are given parses as the settings' endpoints.
    assert parse_endpoints(json.dumps({"bench": declared}))["bench"].quotas_of("bench", "m1")


async def test_the_benchmark_runs_both_modes_and_reports_every_figure(
    dev_env: WorkflowEnvironment, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    bench = Bench(env=dev_env, fake=fake_openai, scratch=tmp_path)
    rows = {row.figure: row for row in await measure(bench, SMOKE)}
    for mode in ("with", "without"):
        label = f"quota, {mode} limits declared, 4 tasks on 2 workers"
        assert rows[f"{label}: failed tasks"].value == "0"
        assert rows[f"{label}: refused calls ÷ calls"].value == "0.000"
        throughput = rows[f"{label}: useful throughput a minute ÷ the quota"]
        assert float(throughput.value) > 0
        assert "(8 calls served for 8 needed, " in throughput.versus  # 4 tasks of 2 calls
        for tenant in ("a", "b"):
            latency = rows[f"{label}: task latency, tenant {tenant}, p50 / p95"]
            assert latency.versus == "2 tasks answered"
        fairness = rows[
            f"fairness, {mode} limits declared: tenant b's median latency beside a's "
            "4 tasks ÷ b's 2 alone"
        ]
        assert float(fairness.value) > 0 and "0 tasks failed" in fairness.versus
