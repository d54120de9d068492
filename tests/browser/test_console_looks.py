"""How the console reads, in a real browser against the real API and worker processes: long
unbroken words, a finished task's answer, the inbox before its first answer, the dark theme,
compact inbox cards, the task list's timestamps, a failed task's reason, the header without
tokens, every page on a phone (390 px wide) and on a desktop (1,280 px). Every wait is on a
state the page or the task shows, never on the clock."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, Route, expect

from tests.browser import pages
from tests.browser.conftest import OpenConsole, sign_in
from tests.browser.pages import (
    answer,
    assert_fits,
    card,
    decided,
    long_word,
    question_card,
    readable,
    said,
    start,
)
from tests.browser.stack import ALICE, ApiProcess, ConsoleStack
from tests.helpers import pending_requests, wait_for_state
from waystation.client.agent_runtime import TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.proc import free_port


async def finished(handle: TaskHandle) -> None:
    async with asyncio.timeout(60):
        await handle.result()


async def test_long_unbroken_words_never_widen_a_page(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    argument, reason, reply = long_word("argument"), long_word("reason"), long_word("answer")

    def model(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"Fetched: {reply}")
        return tools(("run_shell", {"command": f"echo {argument}"}), content=f"Fetching {reason}")

    task = f"Fetch {long_word('task')} and say what it holds"
    handle = await start(stack, fake_openai.script(model), task)
    [request] = await pending_requests(handle)
    page = await open_console(ALICE, viewport={"width": 1280, "height": 900})
    pending = card(page, handle.id)
    await expect(pending.locator("pre.arguments")).to_contain_text(argument)
    await expect(pending.locator(".model-reason")).to_contain_text(reason)
    await assert_fits(page, "the inbox with a request waiting")

    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as http:
        message = long_word("message")
        approved = await http.post(
            f"/tasks/{handle.id}/approve", json={"request_id": request, "message": message}
        )
        assert approved.status_code == 200
    await expect(decided(page, handle.id)).to_contain_text(message)
    await assert_fits(page, "the inbox with the request decided")

    await finished(handle)
    await page.goto(f"{stack.url}/#/tasks/{handle.id}")
    await expect(page.locator(".task-status")).to_have_text("done")
    output = page.locator("li.type-observation")
    await output.get_by_role("button", name=re.compile("^show all")).click()
    await expect(output.locator("pre")).to_contain_text(argument)
    await expect(page.locator("li.type-approval_resolved")).to_contain_text(message)
    await expect(answer(page)).to_contain_text(reply)
    await assert_fits(page, "the task page")

    await page.get_by_role("link", name="Tasks", exact=True).click()
    await expect(page.locator(f'tr[data-task-id="{handle.id}"] a')).to_contain_text("Fetch https")
    await assert_fits(page, "the task list")


async def test_a_finished_task_shows_its_answer_once_in_full(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    gate = threading.Event()
    reply = f"The answer is 42 (mark {uuid.uuid4().hex})"

    def model(body: dict[str, Any]) -> Reply:
        if said(body):  # streamed, and held after a few words until the page shows them
            return text(reply, gate=gate, hold_after_chunks=3)
        return tools(("calculator", {"expression": "6 * 7"}), content="Computing")

    handle = await start(stack, fake_openai.script(model), "What is six times seven?")
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(page.locator(".live-step .live-text")).to_contain_text("The answer")
    gate.set()
    await expect(page.locator(".task-status")).to_have_text("done")
    mark = reply.rsplit(" ", 1)[1]

    async def shown_once() -> None:
        await expect(answer(page)).to_have_text(reply)
        final_thought = page.locator('li.type-thought[data-step="2"]')
        await expect(final_thought).to_contain_text("This is the answer, shown in full below.")
        # Counted in all the page's text, shown or folded away.
        assert (await page.locator("main").text_content() or "").count(mark) == 1
        await page.get_by_role("button", name="Go to the answer").click()
        await expect(page.locator("li.type-done")).to_be_focused()

    await shown_once()  # as it came in live
    await page.reload()
    await expect(page.locator(".task-status")).to_have_text("done")
    await shown_once()  # and as read from the log


async def test_the_inbox_says_it_is_reading_until_its_first_answer(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        return text("ok") if said(body) else tools(("run_shell", {"command": "true"}))

    handle = await start(stack, fake_openai.script(model), "Wait for a decision")
    await pending_requests(handle)
    answer = asyncio.Event()

    async def held(route: Route) -> None:  # every read of the inbox waits for the test
        await answer.wait()
        await route.continue_()

    page = await open_console()
    await page.route(re.compile(r"/approvals$"), held)
    await sign_in(page, ALICE)
    await expect(page.locator(".summary")).to_have_text("Reading the inbox…")
    await expect(page.locator(".inbox-list")).to_have_attribute("aria-busy", "true")
    await expect(page.locator(".empty")).to_be_hidden()
    answer.set()
    await expect(page.locator(".summary")).to_have_text("1 request waits for a decision.")
    await expect(card(page, handle.id)).to_be_visible()
    await expect(page.locator(".inbox-list")).to_have_attribute("aria-busy", "false")
    await expect(page.locator("#inbox-count")).to_have_text("1")


async def test_the_dark_theme_follows_the_system_and_every_text_stays_readable(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        task = body["messages"][1]["content"]
        if said(body):
            return text(f"Checked: {said(body)[0]}")
        if task.startswith("Rotate"):
            return tools(("run_shell", {"command": "logrotate -f web-1.conf"}), content="Rotating")
        return tools(("calculator", {"expression": "12 * 7"}), content="Multiplying")

    name = fake_openai.script(model)
    waiting = await start(stack, name, "Rotate the logs on web-1")
    done = await start(stack, name, "Multiply twelve by seven")
    failed = await start(stack, name, "Multiply, with one step only", max_steps=1)
    await pending_requests(waiting)
    await finished(done)

    seen: dict[str, dict[str, Any]] = {}
    for scheme in ("light", "dark"):
        # No transitions mid-measure: the arrival highlight is a colour too.
        page = await open_console(ALICE, color_scheme=scheme, reduced_motion="reduce")
        await expect(card(page, waiting.id)).to_be_visible()
        seen[scheme] = await readable(page, f"the inbox, {scheme}")
        await shoot(page, f"inbox-{scheme}.png", tmp_path)
        await page.goto(f"{stack.url}/#/tasks/{done.id}")
        await expect(answer(page)).to_contain_text("Checked:")
        await readable(page, f"a finished task, {scheme}")
        await shoot(page, f"task-{scheme}.png", tmp_path)
        await page.goto(f"{stack.url}/#/tasks/{failed.id}")
        await expect(page.locator("form.resume")).to_be_visible()
        await readable(page, f"a failed task, {scheme}")
        await shoot(page, f"failed-{scheme}.png", tmp_path)
        await page.get_by_role("link", name="Tasks", exact=True).click()
        await expect(page.locator(f'tr[data-task-id="{done.id}"]')).to_be_visible()
        await readable(page, f"the task list, {scheme}")
        await shoot(page, f"tasks-{scheme}.png", tmp_path)
    assert seen["dark"]["background"] != seen["light"]["background"]
    assert seen["dark"]["paper"] < 0.05 < seen["light"]["paper"]


async def shoot(page: Page, name: str, tmp_path: Path) -> None:
    """Screenshots to look at go to the test's own folder (`pytest --basetemp=DIR`)."""
    await page.screenshot(path=tmp_path / name, full_page=True, animations="disabled")


async def heights(page: Page) -> list[float]:
    """The inbox's cards' heights, in px, top to bottom."""
    measured: list[float] = await page.locator("article.approval").evaluate_all(
        "cards => cards.map((card) => card.getBoundingClientRect().height)"
    )
    return measured


async def test_compact_inbox_cards_are_kept_and_worked_from_the_keyboard(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole, tmp_path: Path
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        if said(body):
            return text("done")
        task = body["messages"][1]["content"]
        return tools(("run_shell", {"command": f"echo {task}"}), content=f"Running {task}")

    name = fake_openai.script(model)
    handles = []
    for chore in ["Rotate the logs on web-1", "Clear the build cache on ci-2", "Restart db-3"]:
        handles.append(await start(stack, name, chore))  # one after the other: oldest first
        await pending_requests(handles[-1])
    page = await open_console(ALICE)
    cards = page.locator("article.approval")
    await expect(cards).to_have_count(3)
    roomy = await heights(page)

    toggle = page.get_by_role("button", name="Compact cards")
    await expect(toggle).to_have_attribute("aria-pressed", "false")
    for _ in range(30):  # Tab to the toggle, as a keyboard user would
        if await toggle.evaluate("button => button === document.activeElement"):
            break
        await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await expect(toggle).to_have_attribute("aria-pressed", "true")

    async def compact_but_the_selected(selected: int) -> None:
        approve = cards.nth(selected).get_by_role("button", name=re.compile("^Approve"))
        await expect(approve).to_be_visible()
        tight = await heights(page)
        for at, (before, now) in enumerate(zip(roomy, tight, strict=True)):
            if at != selected:
                assert now <= before / 3, f"card {at}: {now} px, was {before} px"
                await expect(cards.nth(at).get_by_role("button")).to_have_count(0)
                await expect(cards.nth(at).locator(".arguments-line")).to_contain_text("echo")

    await compact_but_the_selected(0)
    await shoot(page, "inbox-compact.png", tmp_path)
    await page.keyboard.press("j")  # the first key goes to the selected card itself
    await expect(cards.first).to_be_focused()
    await page.keyboard.press("j")
    await expect(cards.nth(1)).to_be_focused()
    await compact_but_the_selected(1)
    await page.keyboard.press("a")
    await expect(decided(page, handles[1].id)).to_have_text("approved by you (alice)")

    await page.reload()  # the choice is kept
    await expect(cards).to_have_count(2)
    await expect(toggle).to_have_attribute("aria-pressed", "true")
    roomy = [roomy[0], roomy[2]]
    await compact_but_the_selected(0)
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-pressed", "false")
    assert await heights(page) == pytest.approx(roomy, abs=2)


async def test_task_list_timestamps_are_one_line_with_the_time_zone(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    name = fake_openai.script([text("listed")])
    # Ordinary words, enough of them to want the Task column's room.
    words = "Summarise the release notes of every service in the payments cluster " * 3
    handle = await start(stack, name, words.strip())
    await finished(handle)
    page = await open_console(ALICE, "/#/tasks", timezone_id="America/New_York", locale="en-US")
    row = page.locator(f'tr[data-task-id="{handle.id}"]')
    await expect(row).to_be_visible()
    for column in (4, 5):  # Started, Finished
        shown = row.locator(f"td:nth-child({column}) time")
        await expect(shown).to_have_text(re.compile(r"\b(EDT|EST)$"))
        assert await shown.evaluate("time => time.getClientRects().length") == 1
        assert re.search(r"\d{4}-\d\d-\d\dT", await shown.get_attribute("title") or "")


async def test_a_failed_task_says_why_above_the_resume_form(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    name = fake_openai.script(lambda body: tools(("calculator", {"expression": "1 + 1"})))
    handle = await start(stack, name, "Add forever", max_steps=1)
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    failure, form = page.locator("section.failure"), page.locator("form.resume")
    await expect(failure).to_contain_text("max_steps")
    await expect(form).to_be_visible()
    why, resume = await failure.bounding_box(), await form.bounding_box()
    assert why and resume
    assert why["y"] + why["height"] <= resume["y"]


async def test_without_api_tokens_the_header_says_there_is_no_sign_in(
    stack: ConsoleStack, open_console: OpenConsole
) -> None:
    env = {**stack.api.env, "WAYSTATION_API_TOKENS": json.dumps({})}
    open_api = ApiProcess(env, free_port(), stack.settings.data_dir / "api-open.log")
    await open_api.start()
    try:
        page = await open_console(at=dataclasses.replace(stack, api=open_api))
        who = page.locator(".who")
        await expect(who.locator(".who-name")).to_have_text("local")
        note = who.locator(".open-access")
        await expect(note).to_have_text("no sign-in · localhost only")
        explained = re.compile(r"^The API runs without API tokens")
        await expect(note).to_have_attribute("title", explained)
    finally:
        open_api.kill()


PHONE, DESKTOP = 390, 1280
# The smallest box a finger hits reliably (Apple's 44 pt; WCAG 2.5.5's 44 CSS px).
TAPPABLE_PX = 44

# The lines each piece of the header's text takes (a word broken letter by letter takes many).
HEADER_LINES = """() => {
  const parts = document.querySelectorAll(
    "header.top .brand, header.top nav a, .who-name, .who .badge, .who button");
  return [...parts].filter((part) => part.getClientRects().length).map((part) => {
    const range = document.createRange();
    range.selectNodeContents(part);
    const rects = [...range.getClientRects()].sort((a, b) => a.top - b.top);
    let lines = 0;
    let bottom = -Infinity;
    for (const rect of rects) {
      if (rect.top >= bottom - 1) lines += 1;
      bottom = rect.top >= bottom - 1 ? rect.bottom : Math.max(bottom, rect.bottom);
    }
    return { text: part.textContent.trim(), lines };
  });
}"""

# Every visible button and button-like link in the page, with its size.
TAP_TARGETS = """() => [...document.querySelectorAll("button, a.button, header.top nav a")]
  .filter((element) => element.getClientRects().length)
  .map((element) => {
    const box = element.getBoundingClientRect();
    return { text: element.textContent.trim().slice(0, 30), width: box.width, height: box.height };
  })"""


async def fits_the_window(page: Page, width: int, where: str) -> None:
    """Nothing wider than the window (nor than its own box) on the page."""
    page_width = await page.evaluate("document.documentElement.scrollWidth")
    assert page_width <= width, f"{where}: the page is {page_width} px wide in {width} px"
    await assert_fits(page, where)


async def header_reads(page: Page, width: int) -> None:
    parts = await page.evaluate(HEADER_LINES)
    assert {p["text"] for p in parts} >= {"waystation", "Tasks", "New task", "alice"}, parts
    assert [p for p in parts if p["lines"] != 1] == [], f"header words wrap at {width} px"
    header = await page.locator("header.top").bounding_box()
    assert header and header["height"] <= 110, f"the header takes {header} at {width} px"


async def tappable(page: Page, where: str) -> None:
    targets = await page.evaluate(TAP_TARGETS)
    assert targets, f"{where}: no buttons"
    small = [t for t in targets if min(t["width"], t["height"]) < TAPPABLE_PX - 0.5]
    assert small == [], f"{where}: buttons too small to tap"


async def shown_at(page: Page, width: int, name: str, tmp_path: Path) -> None:
    await pages.shoot(page, f"screenshots/console-{width}-{name}.png", tmp_path)


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
async def test_header_inbox_task_list_and_task_page_fit_a_phone_and_a_desktop(
    width: int,
    stack: ConsoleStack,
    fake_openai: FakeOpenAI,
    open_console: OpenConsole,
    tmp_path: Path,
) -> None:
    # A conversation of two turns, finished; then a task waiting for an approval.
    replies = iter([text("Paris is the capital of France."), text("Berlin, of Germany.")])
    chat = await start(stack, fake_openai.script(lambda body: next(replies)), "Capital of France?")
    await chat.result()
    await (await chat.send("And Germany?", sender="alice")).result()

    def shell(body: dict[str, Any]) -> Reply:
        if said(body):
            return text("Listed.")
        return tools(("run_shell", {"command": "ls -la /srv/releases"}), content="Let me look.")

    waiting = await start(
        stack, fake_openai.script(shell), "List the releases on the server and say which is newest"
    )
    await pending_requests(waiting)

    def asking(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"Deploying to {said(body)[-1]}.")
        question = {"question": "Where do I deploy?", "choices": ["staging", "production"]}
        return tools(("ask_person", question), content="I need to ask first.")

    deploy = await start(stack, fake_openai.script(asking), "Deploy the release")
    await wait_for_state(deploy, lambda state: bool(state.pending_questions))

    # The API lists them with their turns and when each last did something: a running one's
    # latest history event, a closed one's close.
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    ) as http:
        listed = {t["id"]: t for t in (await http.get("/tasks")).json()["tasks"]}
    assert listed[chat.id]["turns"] == 2
    assert listed[chat.id]["last_activity_at"] == listed[chat.id]["closed_at"]
    assert listed[waiting.id]["turns"] == 1 and listed[waiting.id]["closed_at"] is None
    assert listed[waiting.id]["last_activity_at"] >= listed[waiting.id]["started_at"]

    page = await open_console(ALICE, viewport={"width": width, "height": 844})
    approval = card(page, waiting.id)
    await expect(approval.get_by_role("button", name=re.compile("^Approve"))).to_be_visible()
    await expect(question_card(page, deploy.id).locator("button.choice")).to_have_count(2)
    await header_reads(page, width)
    await fits_the_window(page, width, f"the inbox at {width} px")
    if width == PHONE:
        await tappable(page, "the inbox")
    await shown_at(page, width, "inbox", tmp_path)

    await page.get_by_role("link", name="Tasks", exact=True).click()
    row = page.locator(f'[data-task-id="{chat.id}"]')
    await expect(row.locator(".turns")).to_have_text("2 turns")
    latest = row.locator(".latest")
    await expect(latest).to_have_text(re.compile(r"^(\d+ s|\d+ min) ago$"))
    # The words follow the clock while the list stays open (the list itself is unchanged).
    await expect(latest).not_to_have_text(await latest.text_content() or "")
    await expect(page.locator(f'[data-task-id="{waiting.id}"] .turns')).to_have_text("1 turn")
    await header_reads(page, width)
    await fits_the_window(page, width, f"the task list at {width} px")
    if width == PHONE:
        await tappable(page, "the task list")
    await shown_at(page, width, "tasks", tmp_path)

    await page.locator(f'[data-task-id="{waiting.id}"] a').first.click()
    await expect(page.locator(".task-status")).to_have_text("waiting approval")
    await expect(page.locator("li.type-approval_requested")).to_be_visible()
    await expect(page.get_by_label("Message to the task")).to_be_visible()
    await header_reads(page, width)
    await fits_the_window(page, width, f"a task page at {width} px")
    if width == PHONE:
        await tappable(page, "a task page")
    await shown_at(page, width, "task", tmp_path)

    await page.goto(f"{stack.url}/#/tasks/{chat.id}")
    await expect(page.locator(".task-turns")).to_have_text("2 (1 follow-up)")
    await fits_the_window(page, width, f"a conversation's page at {width} px")

    await page.get_by_role("link", name="New task", exact=True).first.click()
    await expect(page.get_by_role("button", name="Start task")).to_be_visible()
    await fits_the_window(page, width, f"the new task form at {width} px")
    if width == PHONE:
        await tappable(page, "the new task form")


pytestmark = pytest.mark.timeout(180)
