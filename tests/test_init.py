"""`ws init`: a project of one's own, whose test passes as generated, whose image extends
waystation's with the project's tools and agents, and whose compose file runs them; a file
of the user's is never overwritten without --force. (The same from the built wheel, in a
user's project: tests/test_package.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from waystation.cli.init_command import FILES, project_name

GENERATED = sorted(FILES.values())


def ws_init(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return ws("init", *args, cwd=cwd)


def ws(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "ws"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_init_creates_a_project_whose_test_passes_as_generated(tmp_path: Path) -> None:
    done = ws_init("Shop Two", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    project = tmp_path / "Shop Two"
    assert sorted(p.name for p in project.iterdir()) == GENERATED
    assert done.stdout.splitlines()[:2] == [
        "created the project shop-two in Shop Two:",
        "  tools.py",
    ]
    assert "  cd 'Shop Two'" in done.stdout

    # Its test, run as the user runs it: with pytest, in the project, nothing else set.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "3 passed" in tested.stdout


def test_the_image_extends_waystations_with_the_projects_tools_and_compose_runs_it(
    tmp_path: Path,
) -> None:
    assert ws_init("shop", cwd=tmp_path).returncode == 0
    project = tmp_path / "shop"
    dockerfile = (project / "Dockerfile").read_text().splitlines()
    assert "ARG WAYSTATION_IMAGE=waystation:latest" in dockerfile
    assert "FROM ${WAYSTATION_IMAGE}" in dockerfile
    assert "COPY tools.py agents.json ./" in dockerfile
    assert "    WAYSTATION_TOOLS=waystation.activities.builtin_tools,tools \\" in dockerfile
    assert "    WAYSTATION_AGENTS=/project/agents.json" in dockerfile

    compose = yaml.safe_load((project / "compose.yaml").read_text())
    assert compose["name"] == "shop"
    services = compose["services"]
    assert services["worker"]["build"] == "." and services["worker"]["command"] == ["ws", "worker"]
    assert services["setup"]["command"] == ["ws", "setup"]
    environment = services["worker"]["environment"]
    assert environment["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert environment["WAYSTATION_PROJECT"] == "${WAYSTATION_PROJECT:-shop}"
    assert services["temporal"]["command"][:3] == ["temporal", "server", "start-dev"]

    # .env.example's settings, as `set -a; . ./.env` gives them: the project's tools and
    # agent beside the built-in tools.
    settings = dict(
        line.split("=", 1)
        for line in (project / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert settings["WAYSTATION_PROJECT"] == "shop"
    listed = ws("tools", cwd=project, env={**os.environ, **settings})
    assert listed.returncode == 0, listed.stderr
    assert {"shipping_days", "agent__shipping_clerk", "run_shell"} <= {
        line.split()[0] for line in listed.stdout.splitlines() if line.strip()
    }


def test_init_writes_into_a_folder_with_other_files_but_overwrites_only_with_force(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "tools.py").write_text("# mine")
    (tmp_path / "Dockerfile").write_text("# mine")
    refused = ws_init(cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        "error: . already has tools.py, Dockerfile: init overwrites nothing without --force\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Dockerfile", "notes.txt", "tools.py"]

    forced = ws_init("--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "cd " not in forced.stdout  # already there
    assert (tmp_path / "tools.py").read_text().startswith(f'"""{project_name(tmp_path)}\'s tools')
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*GENERATED, "notes.txt"])


def test_init_is_listed_in_the_help(tmp_path: Path) -> None:
    helped = ws("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "    init " in helped.stdout
