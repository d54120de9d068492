"""Fixtures of the console's browser tests: one chromium per session, one stack (Temporal
dev server, worker process, API process, encryption on) per module, a fresh browser
context per page, and a check that no page raised an error or opened a dialog."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Dialog, Error, Page, async_playwright
from playwright.async_api import expect as page_expect
from temporalio.testing import WorkflowEnvironment

from tests.browser.stack import CHROMIUM, CHROMIUM_FLAGS, TOKENS, ConsoleStack, running_stack
from waystation.activities.payload_codec import new_key
from waystation.client.agent_runtime import AgentRuntime, TaskEndedError
from waystation.testing.fake_openai import FakeOpenAI
from waystation.testing.servers import start_dev_env
from waystation.testing.settings import isolated_settings

# Pages are awaited on states, never on the clock; with both cores busy a state can take a
# while to come, so the wait for it is generous.
page_expect.set_options(timeout=30_000)


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium (apt), never a browser Playwright downloads."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Debian's chromium is not installed ({CHROMIUM}): `make test` installs it with apt"
            " (scripts/system-packages), or run `sudo apt-get install chromium`",
            pytrace=False,
        )
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        await chromium.close()


@pytest.fixture(scope="module")
async def console_temporal() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server of the console's own: its lists and inbox show only these tests' tasks."""
    env = await start_dev_env()
    async with env:
        yield env


@pytest.fixture(scope="module")
async def stack(
    console_temporal: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ConsoleStack]:
    """The API and a worker as real processes, on their own task queue."""
    settings = isolated_settings(
        tmp_path_factory.mktemp("console"), fake_openai.url, name="console", api_tokens=TOKENS
    )
    address = console_temporal.client.service_client.config.target_host
    async with running_stack(address, settings) as started:
        yield started


@pytest.fixture(scope="module")
async def encrypted_stack(
    console_temporal: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ConsoleStack]:
    """The same with payload encryption on (WAYSTATION_ENCRYPTION_KEYS) in both processes."""
    settings = isolated_settings(
        tmp_path_factory.mktemp("encrypted"),
        fake_openai.url,
        name="encrypted",
        api_tokens=TOKENS,
        encryption_keys={"k1": new_key()},
    )
    address = console_temporal.client.service_client.config.target_host
    async with running_stack(address, settings) as started:
        yield started


@pytest.fixture(autouse=True)
async def clean_slate(stack: ConsoleStack) -> AsyncIterator[None]:
    """Each test starts with nothing running or waiting: the inbox is its own."""
    yield
    left: list[str] = []
    for status in ("running", "waiting_approval", "waiting_input"):
        tasks, _ = await stack.runtime.list_tasks(status, 200)
        left += [task.id for task in tasks]
    await asyncio.gather(*(cancelled(stack.runtime, task_id) for task_id in left))


async def cancelled(runtime: AgentRuntime, task_id: str) -> None:
    """Cancel a task and wait until it has ended (it may end some other way first)."""
    handle = runtime.get(task_id)
    async with asyncio.timeout(30):
        with contextlib.suppress(TaskEndedError):
            await handle.cancel()
        # Any ending will do (a task of the encrypted stack cannot even be decoded here).
        with contextlib.suppress(Exception):
            await handle.result()


@dataclass
class PageWatch:
    """What a page did that no test may allow: a dialog (script ran) or an uncaught error."""

    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


OpenConsole = Callable[..., Awaitable[Page]]


@pytest.fixture
async def open_console(browser: Browser, stack: ConsoleStack) -> AsyncIterator[OpenConsole]:
    """Open the console in a fresh browser context, signed in with `token` (or not)."""
    contexts = []
    watch = PageWatch()

    async def on_dialog(dialog: Dialog) -> None:
        watch.dialogs.append(dialog.message)
        await dialog.dismiss()

    async def open_page(
        token: str | None = None,
        path: str = "/",
        at: ConsoleStack | None = None,
        **context_options: Any,
    ) -> Page:
        """`context_options` go to the browser context (color_scheme, timezone_id, ...)."""
        context_options.setdefault("viewport", {"width": 1200, "height": 900})
        context = await browser.new_context(**context_options)
        contexts.append(context)
        page = await context.new_page()
        page.on("dialog", on_dialog)
        page.on("pageerror", lambda error: watch.errors.append(str(error)))
        await page.goto((at or stack).url + path)
        if token is not None:
            await sign_in(page, token)
        return page

    yield open_page
    for context in contexts:
        with contextlib.suppress(Error):
            async with asyncio.timeout(30):
                await context.close()
    assert watch.dialogs == [], "a dialog opened: a script from data ran"
    assert watch.errors == [], "the page raised errors"


async def sign_in(page: Page, token: str) -> None:
    await page.get_by_label("API token").fill(token)
    await page.get_by_label("API token").press("Enter")
    await page_expect(page.locator(".who-name")).to_have_text(TOKENS[token]["name"])
