"""How the console reads, in a real browser against the real API and worker processes: long
unbroken words, a finished task's answer, the inbox before its first answer, the dark theme,
compact inbox cards, the task list's timestamps, a failed task's reason, the header without
tokens. Every wait is on a state the page or the task shows, never on the clock."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, Route, expect

from runtime.agent_runtime import TaskHandle
from testing.fake_openai import FakeOpenAI, Reply, text, tools
from tests.browser.conftest import OpenConsole, sign_in
from tests.browser.pages import card, decided, said, start
from tests.browser.stack import ALICE, ConsoleStack
from tests.helpers import pending_requests


def long_word(label: str) -> str:
    """3,000-odd characters without a break opportunity: a URL, a hash, base64."""
    return f"https://example.com/{label}/" + "Zm9vYmFyYmF6" * 250


async def finished(handle: TaskHandle) -> None:
    async with asyncio.timeout(60):
        await handle.result()


# Code blocks (tool output) keep their lines and may scroll sideways inside themselves, and a
# one-line preview may end in an ellipsis; nothing else may be wider than its box.
CODE_BLOCKS = "pre.code"
MEASURE_WIDTHS = """(codeBlocks) => {
  const root = document.documentElement;
  const wide = [];
  for (const element of document.querySelectorAll("body *")) {
    if (element.closest(codeBlocks) || element.clientWidth === 0) continue;
    if (getComputedStyle(element).textOverflow === "ellipsis") continue;
    if (element.scrollWidth > element.clientWidth + 1) {
      const name = `${element.tagName.toLowerCase()}.${element.className}`;
      wide.push(`${name}: ${element.scrollWidth} px in ${element.clientWidth} px`);
    }
  }
  return { page: root.scrollWidth, window: root.clientWidth, wide };
}"""


async def assert_fits(page: Page, where: str) -> None:
    widths = await page.evaluate(MEASURE_WIDTHS, CODE_BLOCKS)
    assert widths["page"] <= widths["window"], f"{where}: {widths}"
    assert widths["wide"] == [], f"{where}: {widths}"


async def test_long_unbroken_words_never_widen_a_page(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    argument, reason, answer = long_word("argument"), long_word("reason"), long_word("answer")

    def model(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"Fetched: {answer}")
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
    await expect(page.locator("section.result")).to_contain_text(answer)
    await assert_fits(page, "the task page")

    await page.get_by_role("link", name="Tasks", exact=True).click()
    await expect(page.locator(f'tr[data-task-id="{handle.id}"] a')).to_contain_text("Fetch https")
    await assert_fits(page, "the task list")


async def test_a_finished_task_shows_its_answer_once_in_full(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    gate = threading.Event()
    answer = f"The answer is 42 (mark {uuid.uuid4().hex})"

    def model(body: dict[str, Any]) -> Reply:
        if said(body):  # streamed, and held after a few words until the page shows them
            return text(answer, gate=gate, hold_after_chunks=3)
        return tools(("calculator", {"expression": "6 * 7"}), content="Computing")

    handle = await start(stack, fake_openai.script(model), "What is six times seven?")
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(page.locator(".live-step .live-text")).to_contain_text("The answer")
    gate.set()
    await expect(page.locator(".task-status")).to_have_text("done")
    mark = answer.rsplit(" ", 1)[1]

    async def shown_once() -> None:
        await expect(page.locator("section.result")).to_contain_text(answer)
        assert (await page.locator("main").inner_text()).count(mark) == 1
        final_thought = page.locator('li.type-thought[data-step="2"]')
        await expect(final_thought).to_contain_text("shown under Result")
        done = page.locator("li.type-done")
        await expect(done).to_contain_text("shown under Result")
        await done.get_by_role("button", name="Go to the result").click()
        await expect(page.locator("section.result")).to_be_focused()

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


pytestmark = pytest.mark.timeout(180)
