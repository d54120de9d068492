"""The command line: run, approve/reject, stream, status, events, list, resume, fork, cancel,
tools, and `mcp` (waystation's tools for an MCP client, over stdio).

    ws run "What is 12 * 7? Write it to scratch/answer.txt"
    ws approve TASK_ID [REQUEST_ID] [--reject --message "why"]
    ws status TASK_ID

`ws` is this module's `cli` (pyproject's [project.scripts]); `python starter.py` is the same
from a source tree.

Commands that make a task progress (run, approve, resume, stream, mcp) host a worker in this
process unless --no-worker is given, so a fresh machine needs nothing else running.
Exit codes: 0 done, 1 failed or error, 2 usage, 3 waiting for approval, 4 nothing to do
(the task has already ended: cancel), 130 cancelled.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from waystation.cli import arguments, deploy, init_command, schedule_arguments

if TYPE_CHECKING:
    from waystation.settings import Settings

# What `ws --help`, a command's `--help` and an argument error load is argparse and the
# arguments: no Temporal, pydantic or openai (tests/test_cli_startup.py). A command's module,
# and what it imports, load once the command is known.
COMMANDS = {
    "run": ("task_commands", "cmd_run"),
    "approve": ("task_commands", "cmd_approve"),
    "say": ("task_commands", "cmd_say"),
    "answer": ("task_commands", "cmd_answer"),
    "chat": ("task_commands", "cmd_chat"),
    "stream": ("reading_commands", "cmd_stream"),
    "resume": ("task_commands", "cmd_resume"),
    "repair": ("task_commands", "cmd_repair"),
    "fork": ("task_commands", "cmd_fork"),
    "status": ("reading_commands", "cmd_status"),
    "events": ("reading_commands", "cmd_events"),
    "list": ("reading_commands", "cmd_list"),
    "cancel": ("reading_commands", "cmd_cancel"),
    "mcp": ("admin_commands", "cmd_mcp"),
    "tools": ("admin_commands", "cmd_tools"),
    "worker": ("admin_commands", "cmd_worker"),
    "config": ("admin_commands", "cmd_config"),
    "doctor": ("project_commands", "cmd_doctor"),
    "init": ("init_command", "cmd_init"),
    "setup": ("admin_commands", "cmd_setup"),
    "server": ("admin_commands", "cmd_server"),
    "storage": ("admin_commands", "cmd_storage"),
    "memory": ("memory_command", "cmd_memory"),
    "deploy": ("deploy", "cmd_deploy"),
    "schedule": ("schedule_commands", "cmd_schedule"),
}


class CommandParser(argparse.ArgumentParser):
    """`ws`'s parser: a mistyped command is answered with the closest one."""

    commands: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
    words: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        given = next((word for word in self.words if not word.startswith("-")), None)
        if self.commands is not None and given is not None and given not in self.commands.choices:
            names = list(self.commands.choices)
            close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
            if close:
                message = f"unknown command {given!r}: did you mean `{close[0]}`?"
            else:
                message = f"unknown command {given!r} (the commands: {', '.join(names)})"
        super().error(message)


def parser() -> CommandParser:
    root = CommandParser(prog="ws", description=__doc__.split("\n\n")[0])
    commands = root.commands = root.add_subparsers(
        dest="command", required=True, parser_class=argparse.ArgumentParser
    )

    arguments.task_commands(commands)
    arguments.conversation_commands(commands)
    arguments.reading_commands(commands)
    arguments.admin_commands(commands)
    init_command.add_parser(commands)
    deploy.add_parser(commands)
    schedule_arguments.schedule_commands(commands)
    for command in commands.choices.values():
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="the hosted worker's full log (tracebacks of failed attempts) on stderr",
        )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from waystation.cli.terminal import say
    from waystation.client.hidden_environment import hide_starting_environment
    from waystation.settings.errors import SettingsProblem, load_settings
    from waystation.worker import log as worker_log

    worker_log.configure(args.verbose)
    try:
        settings = load_settings()
    except SettingsProblem as err:
        say(f"error: {err}")
        return 2
    hide_starting_environment()  # a command may host a worker: its secrets stay off /proc
    if args.command == "api":
        from waystation.servers.http_api import main as serve

        return serve(settings)  # uvicorn runs its own event loop
    return run_command(args, settings)


def run_command(args: argparse.Namespace, settings: Settings) -> int:
    """The command's function, its errors said in one sentence with their exit code."""
    import asyncio

    from waystation.cli.terminal import EXIT_CANCELLED, say

    module, function = COMMANDS[args.command]
    command = getattr(importlib.import_module(f"waystation.cli.{module}"), function)
    try:
        return int(asyncio.run(command(args, settings)))
    except KeyboardInterrupt:
        say("interrupted; the task goes on in Temporal")
        return EXIT_CANCELLED
    except BrokenPipeError:
        # The reader left (`ws events ID | head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:
        sentence = error_sentence(err)
        if sentence is None:
            raise
        say(sentence[0])
        return sentence[1]


def error_sentence(err: Exception) -> tuple[str, int] | None:
    """What a command says of an error it ends with, and its exit code; None for a bug.

    The error classes are imported here, when one is raised, so that a command loads only
    the modules it uses."""
    from pydantic import ValidationError
    from temporalio.service import RPCError

    from waystation.activities.storage.errors import StorageError
    from waystation.activities.storage.memory import MemoryRequestError
    from waystation.activities.tools import ToolDefinitionError
    from waystation.cli.terminal import EXIT_FAILED, UsageError
    from waystation.client.task_errors import DecisionError, TaskError, UnknownToolsError
    from waystation.client.task_rights import TaskRefusedError
    from waystation.client.temporal import TemporalUnavailableError
    from waystation.settings import commands as hints
    from waystation.settings.validation import validation_sentence
    from waystation.settings.webhooks import WebhookConfigError

    if isinstance(err, TaskError | DecisionError | TemporalUnavailableError | StorageError):
        return f"error: {err}", EXIT_FAILED
    if isinstance(err, MemoryRequestError):
        return f"error: {err}", EXIT_FAILED
    if isinstance(err, RPCError):
        return f"error from Temporal: {err}", EXIT_FAILED
    if isinstance(err, TimeoutError):
        hint = hints.command("worker")
        return (
            f"error: no answer in time from Temporal or a worker (is a worker running? {hint})",
            EXIT_FAILED,
        )
    if isinstance(err, ValidationError):
        return f"error: {validation_sentence(err)}", 2
    usage = (
        UnknownToolsError,
        ToolDefinitionError,
        UsageError,
        WebhookConfigError,
        TaskRefusedError,
    )
    if isinstance(err, usage):
        return f"error: {err}", 2
    return None


def cli() -> None:
    """The `ws` command: main(), then leave at once."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Temporal's core threads may still call back after a cancelled long poll; letting the
    # interpreter finalize under them can abort the process. Everything is flushed: leave.
    os._exit(code)


if __name__ == "__main__":
    cli()
