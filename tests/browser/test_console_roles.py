"""The start-task form offers each role only what it may choose (the API is the guard:
tests/test_roles.py); a real browser against the real API, worker and dev server."""

from __future__ import annotations

from playwright.async_api import expect

from tests.browser.conftest import OpenConsole
from tests.browser.stack import ALICE, RITA, ConsoleStack


async def test_the_form_offers_a_reader_only_stricter_rules_and_an_approver_every_one(
    stack: ConsoleStack, open_console: OpenConsole
) -> None:
    reader = await open_console(RITA)
    await reader.goto(f"{stack.url}/#/new")
    await expect(reader.locator("#new-rule-run_shell option")).to_have_text(
        ["default (always)", "always"]
    )
    await expect(reader.locator("#new-rule-write_file option")).to_have_text(
        ["default (outside scratch)", "always", "outside scratch"]
    )
    await expect(reader.locator("#new-max-steps")).to_have_attribute("max", "10000")

    approver = await open_console(ALICE)
    await approver.goto(f"{stack.url}/#/new")
    await expect(approver.locator("#new-rule-run_shell option")).to_have_text(
        ["default (always)", "always", "never", "outside scratch"]
    )
