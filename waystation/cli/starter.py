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
import asyncio
import os
import sys

from pydantic import ValidationError
from temporalio.service import RPCError

from waystation.activities.storage.errors import StorageError
from waystation.activities.tools import ToolDefinitionError
from waystation.cli import (
    admin_commands,
    arguments,
    init_command,
    project_commands,
    reading_commands,
    task_commands,
)
from waystation.cli.terminal import EXIT_CANCELLED, EXIT_FAILED, UsageError, say
from waystation.client.agent_runtime import (
    DecisionError,
    TaskError,
    UnknownToolsError,
)
from waystation.client.hidden_environment import hide_starting_environment
from waystation.client.task_rights import TaskRefusedError
from waystation.client.temporal import TemporalUnavailableError
from waystation.settings import commands as hints
from waystation.settings.errors import SettingsProblem, load_settings
from waystation.settings.validation import validation_sentence
from waystation.settings.webhooks import WebhookConfigError
from waystation.worker import log as worker_log


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="ws", description=__doc__.split("\n\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    arguments.task_commands(commands)
    arguments.conversation_commands(commands)
    arguments.reading_commands(commands)
    arguments.admin_commands(commands)
    init_command.add_parser(commands)
    for command in commands.choices.values():
        command.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="the hosted worker's full log (tracebacks of failed attempts) on stderr",
        )
    return root


COMMANDS = {
    "run": task_commands.cmd_run,
    "approve": task_commands.cmd_approve,
    "say": task_commands.cmd_say,
    "answer": task_commands.cmd_answer,
    "chat": task_commands.cmd_chat,
    "stream": reading_commands.cmd_stream,
    "resume": task_commands.cmd_resume,
    "repair": task_commands.cmd_repair,
    "fork": task_commands.cmd_fork,
    "status": reading_commands.cmd_status,
    "events": reading_commands.cmd_events,
    "list": reading_commands.cmd_list,
    "cancel": reading_commands.cmd_cancel,
    "mcp": admin_commands.cmd_mcp,
    "tools": admin_commands.cmd_tools,
    "worker": admin_commands.cmd_worker,
    "config": admin_commands.cmd_config,
    "doctor": project_commands.cmd_doctor,
    "setup": admin_commands.cmd_setup,
    "server": admin_commands.cmd_server,
    "storage": admin_commands.cmd_storage,
    "init": init_command.cmd_init,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
    try:
        return asyncio.run(COMMANDS[args.command](args, settings))
    except (TaskError, DecisionError, TemporalUnavailableError, StorageError) as err:
        say(f"error: {err}")
        return EXIT_FAILED
    except RPCError as err:
        say(f"error from Temporal: {err}")
        return EXIT_FAILED
    except TimeoutError:
        say(
            "error: no answer in time from Temporal or a worker (is a worker running? "
            f"{hints.command('worker')})"
        )
        return EXIT_FAILED
    except ValidationError as err:
        say(f"error: {validation_sentence(err)}")
        return 2
    except (
        UnknownToolsError,
        ToolDefinitionError,
        UsageError,
        WebhookConfigError,
        TaskRefusedError,
    ) as err:
        say(f"error: {err}")
        return 2
    except KeyboardInterrupt:
        say("interrupted; the task goes on in Temporal")
        return EXIT_CANCELLED
    except BrokenPipeError:
        # The reader left (`ws events ID | head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


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
