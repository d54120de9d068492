"""The test suite with every core kept busy: proof that no test races the clock.

    python scripts/stress.py                      # the suite beside one burner per core
    python scripts/stress.py --burners 4          # more burners than cores
    python scripts/stress.py -- -q tests/chaos    # pytest arguments after `--`

It starts N processes that spin on the CPU (default: as many as the machine has cores),
runs the suite with this Python's pytest from the repository (`make test-stress` passes
`-n 4`, the pytest-xdist processes `make test` uses), stops the burners however the run
ends, and exits with pytest's exit code. A burner also stops by itself when this script is
gone (even after a SIGKILL), so none outlives a run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Spins, and looks up now and then whether the process that started it is still there.
BURNER = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""


def start_burners(count: int) -> list[subprocess.Popen[bytes]]:
    parent = str(os.getpid())
    return [
        subprocess.Popen(
            [sys.executable, "-c", BURNER, parent],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, not them
        )
        for _ in range(count)
    ]


def stop_burners(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        if burner.poll() is None:
            burner.kill()
    for burner in burners:
        burner.wait()


@contextmanager
def burning(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` CPU burners for the duration of the block."""
    burners = start_burners(count)
    try:
        yield burners
    finally:
        stop_burners(burners)


def run_suite(command: list[str]) -> int:
    """Run pytest to its end. A Ctrl-C reaches pytest itself (same process group); a SIGTERM
    to this script is passed on as SIGINT, so pytest stops its servers before it exits."""
    suite = subprocess.Popen(command, cwd=REPO)
    previous = signal.signal(signal.SIGTERM, lambda *_: suite.send_signal(signal.SIGINT))
    try:
        while True:
            try:
                code = suite.wait()
                return 128 - code if code < 0 else code  # killed by a signal: as a shell says
            except KeyboardInterrupt:
                continue  # pytest got the same Ctrl-C: wait for it to wind down
    finally:
        signal.signal(signal.SIGTERM, previous)


def pytest_command(extra: list[str]) -> list[str]:
    """The suite as `make test` runs it: the pytest beside this Python (the venv's)."""
    beside = Path(sys.executable).parent / "pytest"
    runner = [str(beside)] if beside.exists() else [sys.executable, "-m", "pytest"]
    return [*runner, *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--burners",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU-burning processes to run alongside (default: one per core)",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    command = pytest_command(args.pytest_args)
    cores = os.cpu_count()
    with burning(max(0, args.burners)) as burners:
        pids = ", ".join(str(b.pid) for b in burners) or "none"
        print(
            f"stress: {len(burners)} CPU burner(s) on {cores} core(s) (pids {pids}); "
            f"running: {' '.join(command)}",
            flush=True,
        )
        started = time.monotonic()
        code = run_suite(command)
        minutes = (time.monotonic() - started) / 60
    print(
        f"stress: pytest exited with {code} after {minutes:.1f} min; burners stopped",
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
