"""How long the command line takes to start, as a multiple of `python -c pass` measured in
the same run: `python -m bench.cli_startup`.

Each figure is a fresh process, as a person at a terminal starts one: `ws --help`,
`ws status ID` of a finished task on the dev server (as typed: it hosts a worker; and with
`--no-worker`, answered by the benchmark's worker), and `import waystation`. The commands
take turns, REPEATS rounds of them, so a busy moment of the machine weighs on each alike.
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Bench, Row, median, run_alone, say
from waystation.client.agent_runtime import AgentRuntime
from waystation.settings import Settings
from waystation.workflows.models import AgentTask, ModelSettings

REPEATS = 7


def ws_command() -> list[str]:
    """The installed `ws` beside this Python (what a person types), else the same entry
    point through this Python."""
    installed = Path(sys.executable).parent / "ws"
    if installed.is_file():
        return [str(installed)]
    return [sys.executable, "-c", "from waystation.cli.starter import cli; cli()"]


@dataclass
class Timing:
    wall: list[float]
    cpu: list[float]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the child's user + system) of one run of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.decode()}")
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def command_env(bench: Bench, settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYSTATION_"))}
    env.update(
        TEMPORAL_ADDRESS=bench.address,
        WAYSTATION_TASK_QUEUE=settings.task_queue,
        WAYSTATION_DATA_DIR=str(settings.data_dir),
        WAYSTATION_WORKSPACE=str(settings.workspace_dir),
        WAYSTATION_EMBEDDED_SERVER="false",
    )
    return env


async def measure(bench: Bench, repeats: int = REPEATS) -> list[Row]:
    settings = bench.settings("cli-startup")
    env = command_env(bench, settings)
    ws = ws_command()
    async with bench.worker(settings):
        runtime = AgentRuntime(bench.client, settings)
        handle = await runtime.run(
            AgentTask(task="What is 2 + 3?", model=ModelSettings(name="offline"))
        )
        await handle.result()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import waystation": [sys.executable, "-c", "import waystation"],
            "ws --help": [*ws, "--help"],
            "ws status ID (hosts a worker)": [*ws, "status", handle.id],
            "ws status ID --no-worker": [*ws, "status", handle.id, "--no-worker"],
        }
        timings = {name: Timing([], []) for name in commands}
        for n in range(repeats):
            say(f"cli startup: round {n + 1}/{repeats}")
            for name, command in commands.items():
                # In a thread: the loop keeps serving the benchmark's worker meanwhile.
                wall, cpu = await asyncio.to_thread(timed, command, env)
                timings[name].wall.append(wall)
                timings[name].cpu.append(cpu)
    base = timings.pop("python -c pass")
    base_wall, base_cpu = median(base.wall), median(base.cpu)
    rows = [
        Row(
            "python -c pass (the baseline), median wall / CPU",
            f"{base_wall * 1000:.0f} / {base_cpu * 1000:.0f} ms",
            f"{repeats} runs, taking turns with the commands below",
        )
    ]
    for name, timing in timings.items():
        wall, cpu = median(timing.wall), median(timing.cpu)
        rows.append(
            Row(
                f"{name}, median wall (CPU)",
                f"{wall / base_wall:.1f} x ({cpu / base_cpu:.1f} x) python -c pass",
                f"{wall * 1000:.0f} ms wall, {cpu * 1000:.0f} ms CPU",
            )
        )
    return rows


if __name__ == "__main__":
    run_alone(measure)
