"""What the console's browser test modules share: the parts of a page they look for, what
the model has been told, and how a test starts a task and takes a screenshot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.async_api import Locator, Page

from runtime.agent_runtime import TaskHandle
from tests.browser.stack import ConsoleStack
from tests.helpers import agent_task

# `CONSOLE_SCREENSHOTS=docs pytest tests/browser` refreshes the screenshots in docs/.
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


def said(body: dict[str, Any]) -> list[str]:
    """What the tools answered so far in the conversation the model is sent."""
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def card(page: Page, task_id: str) -> Locator:
    return page.locator(f'article.approval[data-task-id="{task_id}"]')


def decided(page: Page, task_id: str) -> Locator:
    return page.locator(f'.decided-item[data-task-id="{task_id}"] .decided-text')


def answer(page: Page) -> Locator:
    """The text of the latest answer on a task's page (each turn's answer is shown once, in
    its own row)."""
    return page.locator("li.type-done .answer-text").last


def task_id_of(page: Page) -> str:
    return page.url.split("#/tasks/", 1)[1]


async def shoot(page: Page, name: str, tmp_path: Path) -> None:
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    await page.screenshot(path=folder / name, full_page=True, animations="disabled")


async def start(stack: ConsoleStack, model: str, task: str, **kw: Any) -> TaskHandle:
    kw.setdefault("timeout", 120)  # a gated stream must not time out and retry
    return await stack.runtime.run(agent_task(model, task, **kw))
