"""Every benchmark in one run, one table: `python -m bench` (or `make bench`).

Each figure is measured beside its baseline in the same run, on one dev server, so the
ratios hold on a noisy shared machine where absolute times do not.
    python -m bench                 # all of them (four minutes on 2 cores, and the Temporal peers)
    python -m bench --only approval throughput
    python -m bench --only peers_temporal --peers-steps 20 --peers-limit-steps 300
Long ones run only when named (each also runs alone, with its own flags):
    python -m bench --only long_run parked heartbeats
    python -m bench --only many_tasks --many-parts sweep --many-tasks 20 --many-rounds 1
    python -m bench.many_tasks --help
    python -m bench.long_run --steps 10000
    python -m bench.parked --parked 10000 --caches 200
    python -m bench.heartbeats --timeouts 2 5
    python -m bench.conversation --turns 100
    python -m bench.one_shot --baseline-ref 5e55f18 --baseline-dir /tmp/ws-baseline
    python -m bench.subagents --model-seconds 1
    python -m bench.model_protocols --llama     # and llama.cpp's prompt cache (5 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time

from bench import (
    approval,
    cli_startup,
    conversation,
    durable_bytes,
    heartbeats,
    long_run,
    many_tasks,
    model_protocols,
    one_shot,
    parked,
    peers,
    peers_temporal,
    recovery,
    request_body,
    step_overhead,
    stream_latency,
    subagents,
    throughput,
    webhook_latency,
    worker_memory,
)
from bench.common import Measure, Row, bench_environment, print_table, say

SECTIONS: dict[str, Measure] = {
    "step_overhead": step_overhead.measure,
    "request_body": request_body.measure,
    "durable_bytes": durable_bytes.measure,
    "throughput": throughput.measure,
    "approval": approval.measure,
    "stream_latency": stream_latency.measure,
    "webhook_latency": webhook_latency.measure,
    "worker_memory": worker_memory.measure,
    "recovery": recovery.measure,
    "cli_startup": cli_startup.measure,
    "peers_temporal": peers_temporal.measure,
    "model_protocols": model_protocols.measure,
}
# Minutes each (an hour for many_tasks), two CPU burners in heartbeats: measured only when
# named in --only.
ON_REQUEST: dict[str, Measure] = {
    "long_run": long_run.measure,
    "parked": parked.measure,
    "heartbeats": heartbeats.measure,
    "conversation": conversation.measure,
    "one_shot": one_shot.with_baseline(one_shot.BASELINE_REF, None),
    "subagents": subagents.measure,
    "many_tasks": many_tasks.measure,
}


async def main(only: list[str], sections: dict[str, Measure]) -> None:
    if not peers.available():
        say("LangGraph is not installed: its columns stay empty (pip install -e '.[bench]')")
    for label in peers_temporal.missing_peers():
        say(f"{label} is not installed: its rows stay empty (pip install -e '.[bench]')")
    rows: list[Row] = []
    async with bench_environment() as bench:
        for name, measure in sections.items():
            if (only or name in ON_REQUEST) and name not in only:
                continue
            print(f"==> {name}", file=sys.stderr, flush=True)
            started = time.monotonic()
            rows += await measure(bench)
            say(f"{name} took {time.monotonic() - started:.0f} s")
    print_table(rows)


def peers_options(args: argparse.Namespace) -> peers_temporal.PeersOptions:
    return peers_temporal.PeersOptions(
        steps=args.peers_steps,
        rounds=args.peers_rounds,
        byte_steps=tuple(args.peers_byte_steps),
        limit_steps=args.peers_limit_steps,
        limit_seconds=args.peers_limit_seconds,
    )


if __name__ == "__main__":
    defaults = peers_temporal.PeersOptions()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=[*SECTIONS, *ON_REQUEST], default=[])
    parser.add_argument(
        "--peers-steps", type=int, default=defaults.steps, help="steps of each timing round"
    )
    parser.add_argument("--peers-rounds", type=int, default=defaults.rounds)
    parser.add_argument(
        "--peers-byte-steps",
        type=int,
        nargs="+",
        default=list(defaults.byte_steps),
        help="step counts at which history bytes are measured",
    )
    parser.add_argument(
        "--peers-limit-steps",
        type=int,
        default=defaults.limit_steps,
        help="drive each agent this far, or until it fails",
    )
    parser.add_argument(
        "--peers-limit-seconds",
        type=float,
        default=defaults.limit_seconds,
        help="wall-time bound on any one task",
    )
    many_tasks.add_arguments(parser, prefix="many-")
    args = parser.parse_args()
    sections = {**SECTIONS, **ON_REQUEST}
    sections["many_tasks"] = functools.partial(
        many_tasks.measure, options=many_tasks.options_from(args, prefix="many-")
    )
    sections["peers_temporal"] = functools.partial(
        peers_temporal.measure, options=peers_options(args)
    )
    asyncio.run(main(args.only, sections))
