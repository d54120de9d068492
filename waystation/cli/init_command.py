"""`ws init [DIR]`: a project of one's own on waystation, from the templates in
waystation/project_template/ (shipped in the wheel as package data): a tools module with
one tool, an agents file, `.env.example`, a test that uses waystation.testing, a Dockerfile
that extends waystation's image, a compose file that runs them, and a `.gitignore`.

DIR (default: the current folder) may hold other files: they are left alone. A file `init`
would write that exists already is never overwritten without `--force`; the command then
writes nothing and names them.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

# Each template and the file it becomes in the project.
FILES = {
    "tools.py.tmpl": "tools.py",
    "agents.json.tmpl": "agents.json",
    "test_tools.py.tmpl": "test_tools.py",
    "env.example.tmpl": ".env.example",
    "Dockerfile.tmpl": "Dockerfile",
    "compose.yaml.tmpl": "compose.yaml",
    "gitignore.tmpl": ".gitignore",
}
PLACEHOLDER = "__project__"
TEMPLATES = "waystation.project_template"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser(
        "init", help="start a project: a tool, an agent, a test, a Dockerfile and compose file"
    )
    init.add_argument("dir", nargs="?", default=".", help="the project's folder (default: here)")
    init.add_argument("--force", action="store_true", help="overwrite files init would write")


def project_name(folder: Path) -> str:
    """The project's name (its compose project and task queue): the folder's name, in the
    letters, digits, '-' and '_' both allow."""
    name = re.sub(r"[^a-z0-9_-]+", "-", folder.resolve().name.lower()).strip("-_")
    return name or "project"


def create_project(folder: Path, *, force: bool = False) -> list[Path]:
    """Write the project's files into `folder` (created if missing); the files written.
    FileExistsError naming the files that exist, unless `force`."""
    from importlib.resources import files

    targets = {template: folder / name for template, name in FILES.items()}
    existing = [path.name for path in targets.values() if path.exists()]
    if existing and not force:
        raise FileExistsError(
            f"{folder} already has {', '.join(existing)}: init overwrites nothing without --force"
        )
    folder.mkdir(parents=True, exist_ok=True)
    name = project_name(folder)
    source = files(TEMPLATES)
    for template, target in targets.items():
        text = source.joinpath(template).read_text(encoding="utf-8")
        target.write_text(text.replace(PLACEHOLDER, name), encoding="utf-8")
    return list(targets.values())


async def cmd_init(args: argparse.Namespace, settings: object) -> int:
    """`ws init` (the commands' shape: nothing in it waits on anything)."""
    return init(args)


def init(args: argparse.Namespace) -> int:
    """Create the project, then say what to do next."""
    from waystation.cli.terminal import say
    from waystation.settings.commands import command

    folder = Path(args.dir)
    try:
        written = create_project(folder, force=args.force)
    except FileExistsError as err:
        say(f"error: {err}")
        return 2
    except OSError as err:
        say(f"error: cannot write the project into {folder}: {err.strerror}")
        return 2
    here = folder.resolve() == Path.cwd().resolve()
    print(f"created the project {project_name(folder)} in {folder}:")
    for path in written:
        print(f"  {path.name}")
    print("next:")
    if not here:
        print(f"  cd {shlex.quote(str(folder))}")
    print("  python -m pytest                 # its test: a real worker and a model double")
    print("  cp .env.example .env             # the model endpoint, tools, agents, queue")
    print(f"  set -a; . ./.env; set +a; {command('worker')}")
    print("  docker compose up --build        # the same, in containers")
    return 0
