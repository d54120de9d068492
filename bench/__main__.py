"""Every benchmark in one run, one table: `python -m bench` (or `make bench`).

Each figure is measured beside its baseline in the same run, on one dev server, so the
ratios hold on a noisy shared machine where absolute times do not.
    python -m bench                 # all of them (about four minutes on 2 cores)
    python -m bench --only approval throughput
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench import (
    approval,
    durable_bytes,
    peers,
    recovery,
    step_overhead,
    stream_latency,
    throughput,
    worker_memory,
)
from bench.common import Measure, Row, bench_environment, print_table, say

SECTIONS: dict[str, Measure] = {
    "step_overhead": step_overhead.measure,
    "durable_bytes": durable_bytes.measure,
    "throughput": throughput.measure,
    "approval": approval.measure,
    "stream_latency": stream_latency.measure,
    "worker_memory": worker_memory.measure,
    "recovery": recovery.measure,
}


async def main(only: list[str]) -> None:
    if not peers.available():
        say("LangGraph is not installed: its columns stay empty (pip install -e '.[bench]')")
    rows: list[Row] = []
    async with bench_environment() as bench:
        for name, measure in SECTIONS.items():
            if only and name not in only:
                continue
            print(f"==> {name}", file=sys.stderr, flush=True)
            started = time.monotonic()
            rows += await measure(bench)
            say(f"{name} took {time.monotonic() - started:.0f} s")
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), default=[])
    asyncio.run(main(parser.parse_args().only))
