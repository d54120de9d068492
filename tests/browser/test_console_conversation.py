"""A task's page as a conversation, in a real browser against the real API and worker
processes: a message that steers a task waiting for an approval, a follow-up after the
answer, an interrupting message during a held model stream, the box of a task that takes no
messages, and markup in a message. Every wait is on a state the page, the task or the fake
model's request log shows, never on the clock."""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import OpenConsole
from tests.browser.pages import answer, said, start
from tests.browser.stack import ALICE, RITA, ConsoleStack
from tests.helpers import of_type, pending_requests, wait_for_state
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools


def user_texts(body: dict[str, Any]) -> list[str]:
    """What the person said so far, in the conversation the model is sent."""
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


async def shoot(page: Page, name: str, tmp_path: Path) -> None:
    """Screenshots to look at go to the test's own folder (`pytest --basetemp=DIR`)."""
    await page.screenshot(path=tmp_path / name, full_page=True, animations="disabled")


async def send(page: Page, message: str) -> None:
    """Type a message in the task's box and press Enter, as a person would."""
    box = page.get_by_label("Message to the task")
    await box.fill(message)
    await box.press("Enter")


async def test_a_message_sent_while_an_approval_waits_is_queued_then_reaches_the_model(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    steer = "and say\nwhich shell ran it"

    def model(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"Ran it; you said: {user_texts(body)[-1]}")
        return tools(("run_shell", {"command": "echo steered"}), content="Running echo")

    name = fake_openai.script(model)
    handle = await start(stack, name, "Echo something")
    await pending_requests(handle)
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(page.locator(".task-status")).to_have_text("waiting approval")
    await expect(page.locator(".message-hint")).to_contain_text("waits for an approval")
    box = page.get_by_label("Message to the task")
    await box.press_sequentially("and say")
    await box.press("Shift+Enter")  # a new line; Enter sends
    await box.press_sequentially("which shell ran it")
    await box.press("Enter")

    queued = page.locator(".queued-messages li.queued")
    await expect(queued.locator(".text")).to_have_text(steer)
    await expect(queued.locator(".queued-note")).to_have_text(
        "queued: kept until the approval is decided"
    )
    await expect(box).to_have_value("")
    # Kept for after the decision: the task has not taken it, and the tab still shows it
    # queued after a reload.
    assert of_type(await handle.events(), "user_message") == []
    await page.reload()
    await expect(queued.locator(".text")).to_have_text(steer)
    await shoot(page, "queued.png", tmp_path)

    await page.locator(".pending-list").get_by_role("button", name=re.compile("^Approve")).click()
    message = page.locator('li.turn[data-turn="0"] li.type-user_message')
    await expect(message.locator(".text")).to_have_text(steer)
    await expect(message.locator(".sender")).to_have_text("from alice")
    await expect(queued).to_have_count(0)
    await expect(answer(page)).to_have_text(f"Ran it; you said: {steer}")

    # It reached the next model call once, after the step's tool result.
    [first, second] = fake_openai.requests[name]
    assert user_texts(first) == ["Echo something"]
    assert user_texts(second) == ["Echo something", steer]
    assert [m["role"] for m in second["messages"]][-2:] == ["tool", "user"]


async def test_a_follow_up_goes_on_in_the_same_task_and_each_answer_shows_once(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    marks = [uuid.uuid4().hex for _ in range(2)]

    def model(body: dict[str, Any]) -> Reply:
        if len(user_texts(body)) == 1:
            return text(f"Paris ({marks[0]})")
        return text(f"Berlin ({marks[1]})")

    name = fake_openai.script(model)
    handle = await start(stack, name, "Capital of France?")
    await handle.result()
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(answer(page)).to_have_text(f"Paris ({marks[0]})")
    await expect(page.locator(".message-hint")).to_contain_text("Follows up")
    # The stream stays open past the answer, and is joined again after the API restarts:
    # the next turn shows up without a reload.
    waiting = "live · the task waits for a message"
    await expect(page.locator(".stream-state")).to_have_text(waiting)
    stack.api.kill()
    await expect(page.locator(".stream-state")).to_have_attribute("data-state", "reconnecting")
    await stack.api.start()
    await expect(page.locator(".stream-state")).to_have_text(waiting)
    await page.get_by_label("Max steps from now on (optional)").fill("3")
    await send(page, "And Germany?")

    follow_up = page.locator('li.turn[data-turn="1"]')
    await expect(follow_up.locator("li.type-user_message")).to_contain_text("And Germany?")
    await expect(follow_up.locator("li.type-user_message .sender")).to_have_text("from alice")
    await expect(answer(page)).to_have_text(f"Berlin ({marks[1]})")
    await expect(page.locator(".task-status")).to_have_text("done")
    await expect(page.locator(".task-turns")).to_have_text("2 (1 follow-up)")
    # max_steps is per turn, and the message gave this one its own.
    await expect(follow_up.locator("li.type-user_message")).to_contain_text(
        "max steps from now on: 3"
    )
    await expect(page.locator(".task-step")).to_have_text("2 · 1 of 3 in this turn")
    # The same task: its page and id, its log going on.
    assert page.url.endswith(f"#/tasks/{handle.id}")
    log = await handle.events()
    assert [e.seq for e in log] == list(range(len(log)))
    assert [e.type for e in log].count("done") == 2
    # The model was sent the whole conversation, the first answer in it.
    last = fake_openai.requests[name][-1]
    assert user_texts(last) == ["Capital of France?", "And Germany?"]
    assert {"role": "assistant", "content": f"Paris ({marks[0]})"}.items() <= next(
        m for m in last["messages"] if m["role"] == "assistant"
    ).items()

    first = page.locator('li.turn[data-turn="0"]')

    async def each_answer_once() -> None:
        rows = page.locator("ol.timeline > li")
        await expect(rows).to_have_count(len(log))
        shown = await rows.evaluate_all("rows => rows.map((row) => Number(row.dataset.seq))")
        assert shown == list(range(len(log)))
        for turn, mark in enumerate(marks):
            thought = page.locator(f'li.turn[data-turn="{turn}"] li.type-thought')
            await expect(thought).to_contain_text("This is the answer, shown in full below.")
            # In all the page's text, shown or folded away: once.
            assert (await page.locator("main").text_content() or "").count(mark) == 1
        # The answered turn before the latest is folded: its answer shows, its work does not.
        await expect(first).to_have_class(re.compile(r"\bfolded\b"))
        await expect(first.locator("li.type-done")).to_be_visible()
        await expect(first.locator("li.type-thought")).to_be_hidden()
        await expect(follow_up.locator("li.type-thought")).to_be_visible()

    await each_answer_once()  # as it came in live
    await shoot(page, "follow-up.png", tmp_path)
    await page.reload()
    await expect(page.locator(".task-status")).to_have_text("done")
    await each_answer_once()  # and as read from the log
    toggle = first.get_by_role("button", name=re.compile("^Show its work"))
    await expect(toggle).to_have_attribute("aria-expanded", "false")
    await toggle.click()
    await expect(first.locator("li.type-thought")).to_be_visible()


async def test_an_interrupting_message_voids_the_text_streamed_so_far(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    held, restarted = threading.Event(), threading.Event()
    story = "Once upon a time there was a very long story that went on and on"
    name = fake_openai.script(
        [
            Reply(content=story, hold_after_chunks=4, gate=held),
            text("Hi there, briefly.", hold_after_chunks=3, gate=restarted),
        ]
    )
    try:
        handle = await start(stack, name, "Tell me a long story")
        page = await open_console(ALICE, f"/#/tasks/{handle.id}")
        live = page.locator(".live-step")
        await expect(live.locator(".live-text")).to_contain_text("Once upon")
        await page.get_by_label("Interrupt the model call in flight").check()
        await send(page, "stop, just say hi")

        # The held call is cancelled; what it streamed is void, struck through, while the
        # step's new attempt streams (held too, so this is seen mid-stream).
        void = live.locator('.retracted[data-why="interrupted"]')
        await expect(void.locator("del")).to_contain_text("Once upon")
        await expect(void).to_contain_text("interrupted by a message · its text is void")
        await expect(live.locator(".live-text")).to_have_text("Hi there, ")
        await expect(live.locator(".event-head")).to_contain_text("restarted after a message")
        await shoot(page, "interrupted-live.png", tmp_path)
        restarted.set()

        thought = page.locator('li.type-thought[data-step="1"]')
        await expect(thought.locator(".retracted del")).to_contain_text("Once upon")
        await expect(thought.locator(".retry-mark").first).to_have_text(
            "a message interrupted the model call; the step started again with it"
        )
        await expect(page.locator("li.type-interrupted")).to_have_count(1)
        message = page.locator("li.type-user_message")
        await expect(message).to_contain_text("it interrupted the model call in flight")
        await expect(answer(page)).to_have_text("Hi there, briefly.")
        assert "Once upon" not in (await answer(page).text_content() or "")
        await shoot(page, "interrupted.png", tmp_path)
    finally:
        held.set()
        restarted.set()
    [_, second] = fake_openai.requests[name]
    assert user_texts(second) == ["Tell me a long story", "stop, just say hi"]


async def test_the_box_says_who_and_which_task_cannot_send_and_keeps_the_text(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    gate = threading.Event()
    call = tools(("calculator", {"expression": "1 + 1"}), gate=gate, hold_after_chunks=2)
    adding = fake_openai.script([call])
    failing = await start(stack, adding, "Add with one step only", max_steps=1)
    await fake_openai.until_streaming(adding, 2)  # the task has started: its log says so
    page = await open_console(ALICE)
    # The page is not told the task failed (its stream is cut), so it offers to send: the
    # API's 409 says why not, and the page then reads the log and says which way goes on.
    await page.route(re.compile(r"/tasks/[^/]+/events"), lambda route: route.abort())
    await page.goto(f"{stack.url}/#/tasks/{failing.id}")
    await expect(page.locator(".task-status")).to_have_text("running")
    gate.set()
    await wait_for_state(failing, lambda s: s.status == "failed")
    await send(page, "please go on")
    box = page.locator("form.message-box")
    await expect(box.locator(".error")).to_contain_text(
        f"Not sent: task {failing.id} failed: a message cannot continue it; resume it"
    )
    await expect(page.locator(".task-status")).to_have_text("failed")
    await expect(box.locator(".message-hint")).to_have_text(
        "This task failed, so it takes no messages: resume it first (Resume, above), with a "
        "message if you like."
    )
    field = page.get_by_label("Message to the task")
    await expect(field).to_be_disabled()
    await expect(field).to_have_value("please go on")  # nothing is lost
    await box.get_by_role("button", name="Go to Resume").click()
    await expect(page.get_by_label("Max steps", exact=True)).to_be_focused()
    resume = page.locator("form.resume")
    await expect(resume.get_by_label("Message to add (optional)")).to_have_value("please go on")
    await shoot(page, "failed.png", tmp_path)
    assert of_type(await failing.events(), "user_message") == []

    def asks(body: dict[str, Any]) -> Reply:
        return text("ok") if said(body) else tools(("run_shell", {"command": "true"}))

    waiting = await start(stack, fake_openai.script(asks), "Wait, then be cancelled")
    await pending_requests(waiting)
    reader = await open_console(RITA, f"/#/tasks/{waiting.id}")
    await expect(reader.locator(".task-status")).to_have_text("waiting approval")
    await expect(reader.locator(".message-hint")).to_have_text(
        "Read-only: your token may read this task but not send it messages; that needs an "
        "approver token."
    )
    await expect(reader.get_by_label("Message to the task")).to_be_disabled()
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {RITA}"}
    ) as http:
        forced = await http.post(f"/tasks/{waiting.id}/messages", json={"content": "hi"})
    assert forced.status_code == 403

    approver = await open_console(ALICE, f"/#/tasks/{waiting.id}")
    await approver.get_by_role("button", name="Cancel task").click()
    await expect(approver.locator(".task-status")).to_have_text("cancelled")
    await expect(approver.locator(".message-hint")).to_have_text(
        "This task was cancelled, so it takes no messages: to go on, fork it from any event "
        "(Fork from here)."
    )
    await expect(approver.get_by_label("Message to the task")).to_be_disabled()


IMG = '<img src=x onerror="window.__xss=1;alert(1)">'
SCRIPT = "<script>window.__xss=2;alert(2)</script>"


async def test_markup_in_a_message_stays_text(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"You said: {user_texts(body)[-1]}")
        return tools(("run_shell", {"command": "true"}))

    handle = await start(stack, fake_openai.script(model), "Say back what I write")
    [request] = await pending_requests(handle)
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    markup = f"{IMG} and {SCRIPT}"
    await send(page, markup)
    queued = page.locator(".queued-messages li.queued .text")
    await expect(queued).to_have_text(markup)
    await page.reload()  # kept by the tab as data, shown again as text
    await expect(queued).to_have_text(markup)
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {ALICE}"}
    ) as http:
        approved = await http.post(f"/tasks/{handle.id}/approve", json={"request_id": request})
        assert approved.status_code == 200
    await expect(page.locator("li.type-user_message .text")).to_have_text(markup)
    await expect(answer(page)).to_have_text(f"You said: {markup}")
    await page.reload()  # and as read from the log
    await expect(page.locator("li.type-user_message .text")).to_have_text(markup)
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.__xss") is None  # and no dialog (the fixture checks)


pytestmark = pytest.mark.timeout(180)
