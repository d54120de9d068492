"""What a notice looks like on the wire: the JSON body (format `json`) or a Slack
incoming-webhook message (format `slack`: `text` as the fallback, `blocks` of section,
context and actions blocks, mrkdwn).

Both say the task (id, text, the console's page for it), the event, for a request the tool
and arguments or the question and choices, and the API calls that act on it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from waystation.workflows.events import ApprovalRequested, Done, Failed, QuestionAsked
from waystation.workflows.notice import Notice, shortened

RESULT_CHARS = 2_000
# Slack's limits: a section's text, a button's label, a context block's elements.
SLACK_SECTION_CHARS = 3_000
SLACK_BUTTON_CHARS = 75
SLACK_CONTEXT_ELEMENTS = 10
# A message holds at most 50 blocks: the arguments of a call to approve take up to this many
# sections, and a tool's name shown beside them up to this many characters.
SLACK_ARGUMENT_SECTIONS = 40
SLACK_TOOL_NAME_CHARS = 200
NO_REPAIR_POINT = (
    "It has no repair point: its first workflow task fails, so a repair has nothing to reset "
    "it to. A worker that can run it (the code or the encryption keys it needs) moves it on."
)
_HEADLINES = {
    "approval_requested": "needs an approval",
    "question_asked": "asks a question",
    "done": "has answered",
    "failed": "failed",
    "stuck": "is stuck",
}


def task_url(console: str | None, task_id: str) -> str | None:
    """The console's page of the task (waystation/servers/console/app.js: `#/tasks/<id>`)."""
    return f"{console}/#/tasks/{quote(task_id, safe='')}" if console else None


def actions(notice: Notice) -> list[dict[str, Any]]:
    """The API calls that act on the notice: method, path (under the API's address) and
    JSON body. A question without choices needs `answer` added to its body."""
    path = f"/tasks/{quote(notice.task_id, safe='')}"
    event = notice.event

    def call(name: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "method": "POST", "path": f"{path}/{verb}", "body": body}

    if isinstance(event, ApprovalRequested):
        ids = {"request_id": event.request_id}
        return [call("approve", "approve", ids), call("reject", "reject", ids)]
    if isinstance(event, QuestionAsked):
        ids = {"request_id": event.request_id}
        if event.choices:
            return [call("answer", "answer", {**ids, "answer": c}) for c in event.choices]
        return [call("answer", "answer", ids)]
    if isinstance(event, Failed):
        return [call("resume", "resume", {})]
    if notice.stuck is not None:
        # Without a repair point a repair is refused: nothing a call can do.
        return [call("repair", "repair", {})] if notice.stuck.reset_to_event is not None else []
    return []


def request_view(notice: Notice) -> dict[str, Any] | None:
    event = notice.event
    if isinstance(event, ApprovalRequested):
        return {
            "kind": "approval",
            "request_id": event.request_id,
            "tool": event.tool,
            "arguments": event.arguments,
            "reason": event.reason,
            "model_reason": event.model_reason,
        }
    if isinstance(event, QuestionAsked):
        return {
            "kind": "question",
            "request_id": event.request_id,
            "question": event.question,
            "choices": event.choices,
            "details": event.details,
        }
    return None


def event_view(notice: Notice) -> dict[str, Any] | None:
    """The event as the task's log shows it, long results and reasons shortened."""
    event = notice.event
    if event is None:
        return None
    view = event.model_dump(mode="json")
    if isinstance(event, Done):
        view["result"] = shortened(event.result, RESULT_CHARS)
    if isinstance(event, Failed):
        view["reason"] = shortened(event.reason, RESULT_CHARS)
    return view


def json_body(notice: Notice, console: str | None) -> dict[str, Any]:
    """The body an endpoint of format `json` gets (see README, Notifications)."""
    event = notice.event
    stuck = notice.stuck
    return {
        "key": notice.key,
        "kind": notice.kind,
        "task": {
            "id": notice.task_id,
            "text": notice.task,
            "url": task_url(console, notice.task_id),
            "schedule": notice.schedule,
        },
        "event": event_view(notice),
        "request": request_view(notice),
        "result": shortened(event.result, RESULT_CHARS) if isinstance(event, Done) else None,
        "failure": (
            {"kind": event.kind, "reason": shortened(event.reason, RESULT_CHARS)}
            if isinstance(event, Failed)
            else None
        ),
        "stuck": stuck.model_dump(mode="json") if stuck is not None else None,
        "actions": actions(notice),
    }


def mrkdwn_escaped(text: str) -> str:
    """Slack reads &, < and > as markup (`<!channel>` pings everyone): escaped as it asks."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code_sections(text: str) -> list[str]:
    """`text` as escaped code blocks, each fitting a section, so the whole of it is in the
    message (a person may decide on it from there); past SLACK_ARGUMENT_SECTIONS, a last
    section says how much is left out and where to read it whole."""
    room = SLACK_SECTION_CHARS - len("*Tool:* ``\n``````") - SLACK_TOOL_NAME_CHARS
    sections: list[str] = []
    piece: list[str] = []
    used = 0
    for at, char in enumerate(text):
        escaped = mrkdwn_escaped(char)
        if used + len(escaped) > room:
            if len(sections) == SLACK_ARGUMENT_SECTIONS - 1:
                left = len(text) - at
                sections.append(
                    f"_The arguments go on for {left:,} more characters, not shown here: "
                    "read them whole in the console or the API before deciding._"
                )
                return sections
            sections.append("```" + "".join(piece) + "```")
            piece, used = [], 0
        piece.append(escaped)
        used += len(escaped)
    sections.append("```" + "".join(piece) + "```")
    return sections


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:SLACK_SECTION_CHARS]}}


def _what(notice: Notice) -> list[str]:
    """The mrkdwn paragraphs that say what happened."""
    event = notice.event
    if isinstance(event, ApprovalRequested):
        arguments = json.dumps(event.arguments, ensure_ascii=False, indent=1)
        first, *more = _code_sections(arguments)
        tool = mrkdwn_escaped(shortened(event.tool, SLACK_TOOL_NAME_CHARS // 5))
        said = [f"*Tool:* `{tool}`\n{first}", *more]
        if event.reason:
            said.append(f"*Why it asks:* {mrkdwn_escaped(shortened(event.reason, 1_000))}")
        return said
    if isinstance(event, QuestionAsked):
        said = [f"*Question:* {mrkdwn_escaped(shortened(event.question, 2_800))}"]
        if event.details:
            said.append(mrkdwn_escaped(shortened(event.details, 2_800)))
        if event.choices:
            said.append("*Choices:* " + " · ".join(mrkdwn_escaped(c) for c in event.choices))
        return said
    if isinstance(event, Done):
        return [mrkdwn_escaped(shortened(event.result, 2_800))]
    if isinstance(event, Failed):
        return [f"*{mrkdwn_escaped(event.kind)}:* {mrkdwn_escaped(shortened(event.reason, 2_800))}"]
    if notice.stuck is not None:
        problem = shortened(notice.stuck.problem, 2_500)
        said = [
            f"Its workflow task failed {notice.stuck.attempts} times in a row: "
            f"{mrkdwn_escaped(problem)}"
        ]
        if notice.stuck.reset_to_event is None:
            said.append(NO_REPAIR_POINT)
        return said
    return []


def slack_body(notice: Notice, console: str | None) -> dict[str, Any]:
    """A Slack incoming-webhook message: `text` (the notification's fallback) and blocks
    with what happened, the API calls that act on it, and a button to the console."""
    headline = f"Task {notice.task_id} {_HEADLINES[notice.kind]}"
    if notice.schedule is not None:
        headline += f" (schedule {notice.schedule})"
    blocks: list[dict[str, Any]] = [
        _section(f"*{mrkdwn_escaped(headline)}*\n>{mrkdwn_escaped(shortened(notice.task, 300))}"),
        *(_section(paragraph) for paragraph in _what(notice)),
    ]
    calls = [
        f"{mrkdwn_escaped(a['name'].capitalize())}: `{a['method']} {mrkdwn_escaped(a['path'])}` "
        f"`{mrkdwn_escaped(json.dumps(a['body'], ensure_ascii=False))}`"
        for a in actions(notice)
    ][:SLACK_CONTEXT_ELEMENTS]
    if calls:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": c} for c in calls]}
        )
    url = task_url(console, notice.task_id)
    if url is not None:
        label = "Open in the console"[:SLACK_BUTTON_CHARS]
        button = {"type": "button", "text": {"type": "plain_text", "text": label}, "url": url}
        blocks.append({"type": "actions", "elements": [button]})
    fallback = headline
    if isinstance(notice.event, QuestionAsked):
        fallback += f": {shortened(notice.event.question, 200)}"
    elif isinstance(notice.event, ApprovalRequested):
        fallback += f": {notice.event.tool}"
    return {"text": mrkdwn_escaped(fallback), "blocks": blocks}
