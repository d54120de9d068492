"""`ws --help`, a command's `--help` and an argument error load argparse and the commands'
arguments, nothing heavy: no Temporal, openai, pydantic, pydantic-settings or FastAPI
(issue 39: `ws --help` took seconds). A mistyped command is answered with the closest one."""

from __future__ import annotations

import json
import subprocess
import sys

from waystation.cli.starter import COMMANDS, parser

HEAVY = {"temporalio", "openai", "pydantic", "pydantic_core", "pydantic_settings", "fastapi"}

# Parses each argument list in one fresh interpreter, in order, and prints after each the
# heavy top-level packages loaded so far (the first list that loads one is the culprit).
PROBE = """
import json, sys
from waystation.cli.starter import main
heavy = set(json.loads(sys.argv[1]))
for argv in json.loads(sys.argv[2]):
    try:
        main(argv)
    except SystemExit:
        pass
    loaded = sorted({name.split(".")[0] for name in sys.modules} & heavy)
    print(json.dumps([argv, loaded]), flush=True)
"""


def loaded_after(argument_lists: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(HEAVY)), json.dumps(argument_lists)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [tuple(json.loads(line)) for line in done.stdout.splitlines() if line.startswith("[")]


def test_help_and_argument_errors_load_nothing_heavy() -> None:
    commands = list(parser().commands.choices)  # type: ignore[union-attr]
    argument_lists = [
        ["--help"],
        [],
        ["stauts", "x"],
        ["events"],
        ["run", "--max-steps", "many", "x"],
        *([command, "--help"] for command in commands),
    ]
    results = loaded_after(argument_lists)
    assert [argv for argv, _ in results] == argument_lists
    assert [(argv, loaded) for argv, loaded in results if loaded] == []


def test_every_command_of_the_parser_has_its_function() -> None:
    commands = set(parser().commands.choices)  # type: ignore[union-attr]
    assert commands - {"api"} == set(COMMANDS)


def ws(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from waystation.cli.starter import cli; cli()", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_mistyped_command_is_answered_with_the_closest_one() -> None:
    done = ws("stauts", "task-1")
    assert done.returncode == 2
    assert (
        done.stderr.splitlines()[-1]
        == "ws: error: unknown command 'stauts': did you mean `status`?"
    )
    assert "Traceback" not in done.stderr


def test_a_word_like_no_command_lists_the_commands() -> None:
    done = ws("frobnicate")
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert last.startswith("ws: error: unknown command 'frobnicate' (the commands: run, ")
