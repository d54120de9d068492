"""How the console reads, in a real browser against the real API and worker processes: long
unbroken words, a finished task's answer, the inbox before its first answer, the dark theme,
compact inbox cards, the task list's timestamps, a failed task's reason, the header without
tokens. Every wait is on a state the page or the task shows, never on the clock."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from playwright.async_api import Route, expect

from testing.fake_openai import FakeOpenAI, Reply, text, tools
from tests.browser.conftest import OpenConsole, sign_in
from tests.browser.pages import card, said, start
from tests.browser.stack import ALICE, ConsoleStack
from tests.helpers import pending_requests


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
