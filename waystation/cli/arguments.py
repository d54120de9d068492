"""The commands' arguments: one function a group of commands, as `ws --help` lists them."""

from __future__ import annotations

import argparse

from waystation.vocabulary import STATUS_FILTERS


def event_seq(text: str) -> int:
    try:
        seq = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an event seq (a whole number)") from None
    if seq < 0:
        raise argparse.ArgumentTypeError(f"{seq} is not an event seq: seqs start at 0")
    return seq


def add_worker_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-worker",
        dest="worker",
        action="store_false",
        help="do not host a worker in this process (one runs elsewhere: ws worker)",
    )


def task_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that start, decide or move a task."""
    run_command(commands)
    respond_commands(commands)
    recovery_commands(commands)


def run_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="start a task and follow it live")
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--id", help="task id (default: generated); reusing one returns that task")
    task_options(run)
    run.add_argument("--no-wait", action="store_true", help="print the task id and exit")
    run.add_argument("--quiet", action="store_true", help="no live view: print only the result")
    run.add_argument("--json", action="store_true", help="stream items as JSON lines")
    run.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    run.add_argument(
        "--on-approval",
        choices=["ask", "exit", "wait"],
        default="ask",
        help="ask y/n on a terminal (default; without one: exit), exit with code 3, or wait",
    )
    add_worker_flag(run)


def task_options(parser: argparse.ArgumentParser) -> None:
    """The options of the task a command starts: `run`'s, and a schedule's firings'."""
    parser.add_argument("--model", help="ENDPOINT:MODEL, a bare model name, or 'offline'")
    parser.add_argument(
        "--fallback",
        action="append",
        dest="fallback_models",
        metavar="MODEL",
        help="a model a step moves to when the one before keeps failing with an outage "
        "(repeat for more, in order)",
    )
    parser.add_argument(
        "--fallback-after",
        dest="fallback_after_seconds",
        type=float,
        help="seconds a step retries a model through an outage before it moves on (default 60)",
    )
    parser.add_argument(
        "--reasoning-effort",
        choices=["minimal", "low", "medium", "high"],
        help="a reasoning model's effort (the Responses API's reasoning.effort)",
    )
    parser.add_argument(
        "--thinking-budget",
        dest="thinking_budget_tokens",
        type=int,
        metavar="TOKENS",
        help="Anthropic extended thinking: tokens a step may think with (1024 or more)",
    )
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--token-budget", type=int)
    parser.add_argument(
        "--cost-budget",
        type=float,
        metavar="USD",
        help="most US dollars the task and its sub-agents may spend (needs a priced model)",
    )
    parser.add_argument(
        "--tenant", help="who the task is for: workers and quotas are shared fairly by tenant"
    )
    parser.add_argument("--tools", help="comma-separated tool names the model may call")
    memory_options(parser)
    parser.add_argument("--temperature", type=float, help="sampling temperature (0-2)")
    parser.add_argument("--max-tokens", type=int, help="most tokens the model writes per step")
    parser.add_argument(
        "--tool-choice",
        help="auto, none, required, or the name of the one tool the model must call",
    )
    parser.add_argument(
        "--first-chunk-timeout",
        dest="first_chunk_timeout_seconds",
        type=float,
        help="seconds to wait for a model's first chunk (default 300: CPU-served models)",
    )
    parser.add_argument("--approval-timeout", type=float, help="seconds a request may wait")
    parser.add_argument(
        "--output-schema",
        metavar="FILE",
        help="a JSON Schema file: the task answers with data that fits it (validated)",
    )


def respond_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that respond to a request the task put to a person."""
    approve = commands.add_parser("approve", help="approve (or --reject) a pending tool call")
    approve.add_argument("id")
    approve.add_argument("request", nargs="?", help="request id (default: the only pending one)")
    approve.add_argument("--reject", action="store_true")
    approve.add_argument("--message", help="told to the model with the decision")
    approve.add_argument("--arguments", help="edited arguments as a JSON object")
    approve.add_argument("--approver", help="who decides (default: user@cli)")
    approve.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(approve)

    answer = commands.add_parser("answer", help="answer a question the agent asked")
    answer.add_argument("id")
    answer.add_argument(
        "request", nargs="?", help="the question's request id (default: the only pending one)"
    )
    answer.add_argument("text", nargs="?", help="the answer (one of the choices, if it has some)")
    answer.add_argument("--answerer", help="who answers (default: user@cli)")
    answer.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(answer)


def recovery_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that move a failed or stuck task on, or start anew from one of its events."""
    resume = commands.add_parser("resume", help="resume a failed task from its last good point")
    resume.add_argument("id")
    resume.add_argument("--max-steps", type=int, help="raise the step limit")
    resume.add_argument("--token-budget", type=int, help="raise the token budget")
    resume.add_argument("--cost-budget", type=float, metavar="USD", help="raise the cost budget")
    resume.add_argument("--message", help="a user message for the model, e.g. what to do instead")
    resume.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(resume)

    repair = commands.add_parser(
        "repair", help="reset a stuck task to its last good workflow task (decisions kept)"
    )
    repair.add_argument("id")
    repair.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(repair)

    fork = commands.add_parser("fork", help="start a new task from the state after an event")
    fork.add_argument("id")
    fork.add_argument(
        "--at", type=event_seq, required=True, help="event seq to fork after (0 or more)"
    )
    fork.add_argument("--message", help="a user message to add first (an edited turn)")
    fork.add_argument("--new-id", help="id of the new task (default: ID-fork-xxxxxx)")
    fork.add_argument("--max-steps", type=int, help="the fork's step limit")
    fork.add_argument("--token-budget", type=int, help="the fork's token budget")
    fork.add_argument("--cost-budget", type=float, metavar="USD", help="the fork's cost budget")
    fork.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(fork)


def conversation_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that talk with a task: a follow-up after its answer, or a steer while it works."""
    say = commands.add_parser("say", help="send a task a message and follow it live to the answer")
    say.add_argument("id")
    say.add_argument("message", nargs="?", help="the message; - reads it from standard input")
    say.add_argument("--file", help="read the message from this file")
    say.add_argument(
        "--interrupt",
        action="store_true",
        help="cancel the model call in flight and start the step again with the message",
    )
    say.add_argument("--max-steps", type=int, help="the turn's step limit from now on")
    say.add_argument("--json", action="store_true", help="stream items as JSON lines")
    say.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    say.add_argument("--no-follow", dest="follow", action="store_false")
    add_worker_flag(say)

    chat = commands.add_parser(
        "chat", help="a conversation in the terminal: prompt, live view, answer (Ctrl-D leaves)"
    )
    chat.add_argument("id", nargs="?", help="the task to talk with (default: a new one)")
    chat.add_argument("--model", help="model of a new task, or 'offline'")
    chat.add_argument("--max-steps", type=int, help="step limit of each turn")
    add_worker_flag(chat)


def reading_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands that read tasks (and cancel one)."""
    stream = commands.add_parser("stream", help="follow a task's events and tokens")
    stream.add_argument("id")
    stream.add_argument("--since", type=int, default=0, help="stream offset to start from")
    stream.add_argument("--topics", help="events,tokens (default: both)")
    stream.add_argument("--json", action="store_true", help="JSON lines for programs")
    stream.add_argument(
        "--tree",
        action="store_true",
        help="with --json, the sub-agents' items too (the live view always shows them)",
    )
    stream.add_argument("--wait", type=float, help="seconds to wait for the task to start")
    add_worker_flag(stream)

    status = commands.add_parser(
        "status",
        help="a task's folded state and pending requests; without an id, the project, "
        "server, task queue and workers this side uses",
    )
    status.add_argument("id", nargs="?")
    status.add_argument("--json", action="store_true")
    status.add_argument("--timeout", type=float, default=10)
    add_worker_flag(status)

    events = commands.add_parser("events", help="the event log as JSON lines")
    events.add_argument("id")
    events.add_argument("--since", type=int, default=0)
    events.add_argument("--timeout", type=float, default=10)
    add_worker_flag(events)

    listing = commands.add_parser("list", help="tasks, newest first")
    listing.add_argument("--status", choices=STATUS_FILTERS, help="only tasks with this status")
    listing.add_argument("--tenant", help="only this tenant's tasks")
    listing.add_argument("--limit", type=int, default=50)

    cancel = commands.add_parser("cancel", help="cancel a task")
    cancel.add_argument("id")


def admin_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Commands for the deployment: tools, workers, settings, storage, the dev server."""
    mcp = commands.add_parser("mcp", help="serve waystation's tools to an MCP client over stdio")
    add_worker_flag(mcp)

    commands.add_parser(
        "tools", help="the deployment's tools and MCP tools, with approval and retry defaults"
    )
    commands.add_parser("worker", help="run a worker in the foreground")
    config = commands.add_parser("config", help="the effective settings, secrets masked")
    config.add_argument("name", nargs="?", help="one setting's value alone (e.g. task_queue)")
    commands.add_parser(
        "doctor",
        help="the project, server, task queue and workers, and how the workers' settings "
        "differ from this side's",
    )
    commands.add_parser("setup", help="register the search attributes on the namespace")
    commands.add_parser("api", help="serve the HTTP API (WAYSTATION_API_HOST/PORT/TOKENS)")

    storage = commands.add_parser(
        "storage", help="the ledger and blob storage: info, prune, forget-workspace"
    )
    storage.add_argument("action", choices=["info", "prune", "forget-workspace"])
    storage.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="prune: finished ledger entries older than this (default: "
        "WAYSTATION_RETENTION_DAYS); saved conversations go after "
        "WAYSTATION_CONVERSATION_RETENTION_DAYS",
    )

    memory_command(commands)

    server = commands.add_parser("server", help="the embedded Temporal dev server")
    server.add_argument("action", choices=["start", "stop", "status"])


def memory_options(run: argparse.ArgumentParser) -> None:
    """`ws run`'s memory across tasks (docs/memory.md)."""
    run.add_argument(
        "--recall",
        metavar="QUERY",
        help="start with the items of the task's memory that best match QUERY in its prompt",
    )
    run.add_argument(
        "--memory-namespace",
        metavar="NAMESPACE",
        help="the memory the task remembers in and recalls from (default: TENANT:main)",
    )


def memory_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    memory = commands.add_parser(
        "memory", help="memory kept across tasks: namespaces, list, search, show, put, delete"
    )
    actions = memory.add_subparsers(dest="action", required=True)
    namespaces = actions.add_parser("namespaces", help="the namespaces holding items")
    namespaces.add_argument("--tenant", help="only this tenant's")
    listing = actions.add_parser("list", help="a namespace's items, by key")
    search = actions.add_parser("search", help="full-text search, best matches first")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=5, help="most items (default 5)")
    show = actions.add_parser("show", help="one item")
    put = actions.add_parser("put", help="write an item (replaces what its key held)")
    put.add_argument("key")
    put.add_argument("value", help="the text ('-': read it from stdin)")
    put.add_argument("--ttl", type=float, metavar="SECONDS", help="gone after this long")
    put.add_argument("--metadata", metavar="JSON", help="a JSON object kept with it")
    delete = actions.add_parser("delete", help="delete an item")
    for action in (show, delete):
        action.add_argument("key")
    for action in (listing, search, show, put, delete):
        action.add_argument(
            "--namespace", "-n", default="main", help="TENANT:AGENT, or AGENT without a tenant"
        )
        action.add_argument("--json", action="store_true", help="items as JSON lines")
