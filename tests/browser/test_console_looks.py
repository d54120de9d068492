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

import pytest
from playwright.async_api import Route, expect

from testing.fake_openai import FakeOpenAI, Reply, text, tools
from tests.browser.conftest import OpenConsole, sign_in
from tests.browser.pages import card, said, start
from tests.browser.stack import ALICE, ConsoleStack
from tests.helpers import pending_requests


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
