"""The console's Memory page: an approver writes and deletes items, a reader only reads, and
a token bound to another tenant is refused the namespace (the API is the guard:
tests/test_memory_access.py); a real browser against the real API, worker and dev server."""

from __future__ import annotations

from playwright.async_api import expect

from tests.browser.conftest import OpenConsole
from tests.browser.stack import ALICE, RITA, TINA, ConsoleStack


async def test_the_memory_page_writes_reads_and_holds_each_token_to_its_tenant(
    stack: ConsoleStack, open_console: OpenConsole
) -> None:
    approver = await open_console(ALICE)
    await approver.goto(f"{stack.url}/#/memory")
    await approver.get_by_role("textbox", name="Namespace").fill("acme:main")
    await approver.get_by_label("Key").fill("timezone")
    await approver.get_by_label("Value").fill("<b>Europe/Paris</b>")  # data stays text
    await approver.get_by_role("button", name="Save").click()
    await expect(approver.get_by_role("status")).to_have_text("Saved timezone (revision 1).")
    await approver.get_by_role("link", name="acme:main").click()
    row = approver.locator("tr[data-key='timezone']")
    await expect(row.locator("td.text")).to_have_text("<b>Europe/Paris</b>")
    await approver.get_by_label("Search").fill("paris")
    await approver.get_by_role("button", name="Search").click()
    await expect(approver.locator("tr[data-key]")).to_have_count(1)

    reader = await open_console(RITA)
    await reader.goto(f"{stack.url}/#/memory/acme:main")
    await expect(reader.locator("tr[data-key='timezone'] td.text")).to_have_text(
        "<b>Europe/Paris</b>"
    )
    await expect(reader.get_by_role("button", name="Save")).to_have_count(0)
    await expect(reader.get_by_role("button", name="Delete")).to_have_count(0)

    foreign = await open_console(TINA)
    await foreign.goto(f"{stack.url}/#/memory/acme:main")
    await expect(foreign.get_by_role("alert")).to_contain_text(
        "bound to tenant 'globex' and reaches only its namespaces"
    )
    await expect(foreign.locator("tr[data-key]")).to_have_count(0)
    await expect(foreign.locator(".namespaces")).to_have_text("No memory yet.")

    await approver.get_by_role("button", name="Delete").click()
    await expect(approver.locator("tr[data-key]")).to_have_count(0)
