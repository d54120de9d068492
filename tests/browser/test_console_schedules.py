"""The console's Schedules page in a real browser against the real API and worker
processes: each schedule with when it fires, its next run and links to its firings' tasks;
a reader may fire one now, an approver may also pause and resume it. Every wait is on a
state the page or the schedule shows, never on the clock."""

from __future__ import annotations

import uuid
from urllib.parse import quote

from playwright.async_api import expect

from tests.browser.conftest import OpenConsole
from tests.browser.stack import ALICE, RITA, ConsoleStack
from tests.helpers import agent_task, wait_for_state
from waystation.client.schedules import ScheduleSpec
from waystation.testing.fake_openai import FakeOpenAI, text


async def test_the_schedules_page_lists_runs_links_their_tasks_and_acts_by_role(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    model = fake_openai.script(lambda body: text("nothing new"))
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    task = agent_task(model, "Check the <b>deploy</b>", timeout=60)
    spec = ScheduleSpec(name=name, task=task, every_seconds=86400)
    await stack.runtime.create_schedule(spec)
    try:
        page = await open_console(RITA, "/#/schedules")
        row = page.locator(f'tr[data-schedule="{name}"]')
        await expect(row).to_contain_text("every 1 d")
        await expect(row).to_contain_text("Check the <b>deploy</b>")  # text, never markup
        await expect(row.locator("td.next time")).to_have_count(1)
        await expect(row.locator("td.last")).to_contain_text("none yet")
        await expect(row.get_by_role("button", name="Pause")).to_have_count(0)  # a reader

        await row.get_by_role("button", name="Run now").click()
        link = row.locator("td.last a")
        await expect(link).to_have_count(1)
        task_id = await link.inner_text()
        assert task_id.startswith(f"schedule:{name}-")
        await wait_for_state(stack.runtime.get(task_id), lambda s: s.status == "done")
        await link.click()
        await expect(page).to_have_url(f"{stack.url}/#/tasks/{quote(task_id, safe='')}")
        await expect(page.locator(".task-status")).to_have_text("done")

        approver = await open_console(ALICE, "/#/schedules")
        row = approver.locator(f'tr[data-schedule="{name}"]')
        await row.get_by_role("button", name="Pause").click()
        await expect(row.locator(".badge")).to_have_text("paused")
        await expect(row.locator("td.next")).to_have_text("—")
        await row.get_by_role("button", name="Resume").click()
        await expect(row.get_by_role("button", name="Pause")).to_have_count(1)
        assert not (await stack.runtime.schedules.describe(name)).paused
    finally:
        await stack.runtime.schedules.delete(name)
