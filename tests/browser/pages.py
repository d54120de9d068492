"""What the console's browser test modules share: the parts of a page they look for, what
the model has been told, how a test starts a task and takes a screenshot, and how a page is
measured (nothing wider than its box, every text readable)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from playwright.async_api import Locator, Page

from tests.browser.stack import ConsoleStack
from tests.helpers import agent_task
from waystation.client.agent_runtime import TaskHandle

# `CONSOLE_SCREENSHOTS=docs pytest tests/browser` refreshes the screenshots in docs/.
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS")


def said(body: dict[str, Any]) -> list[str]:
    """What the tools answered so far in the conversation the model is sent."""
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def card(page: Page, task_id: str) -> Locator:
    return page.locator(f'article.approval[data-task-id="{task_id}"]')


def question_card(page: Page, task_id: str) -> Locator:
    return page.locator(f'article.question[data-task-id="{task_id}"]')


def decided(page: Page, task_id: str) -> Locator:
    return page.locator(f'.decided-item[data-task-id="{task_id}"] .decided-text')


def answer(page: Page) -> Locator:
    """The text of the latest answer on a task's page (each turn's answer is shown once, in
    its own row)."""
    return page.locator("li.type-done .answer-text").last


def task_id_of(page: Page) -> str:
    return page.url.split("#/tasks/", 1)[1]


async def shoot(page: Page, name: str, tmp_path: Path) -> None:
    path = (Path(SCREENSHOTS) if SCREENSHOTS else tmp_path) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=path, full_page=True, animations="disabled")


async def start(stack: ConsoleStack, model: str, task: str, **kw: Any) -> TaskHandle:
    kw.setdefault("timeout", 120)  # a gated stream must not time out and retry
    return await stack.runtime.run(agent_task(model, task, **kw))


def long_word(label: str) -> str:
    """3,000-odd characters without a break opportunity: a URL, a hash, base64."""
    return f"https://example.com/{label}/" + "Zm9vYmFyYmF6" * 250


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


# The text of every visible element that holds text, with its colour and the background it
# is drawn on (semi-transparent layers and opacity composed), and the WCAG contrast ratio.
CONTRAST = """() => {
  const parse = (value) => {
    const [r, g, b, a = 1] = value.match(/[\\d.]+/g).map(Number);
    return { r, g, b, a };
  };
  const over = (top, bottom) => ({
    r: top.r * top.a + bottom.r * (1 - top.a),
    g: top.g * top.a + bottom.g * (1 - top.a),
    b: top.b * top.a + bottom.b * (1 - top.a),
    a: 1,
  });
  const luminance = ({ r, g, b }) => {
    const linear = (c) =>
      c / 255 <= 0.03928 ? c / 255 / 12.92 : ((c / 255 + 0.055) / 1.055) ** 2.4;
    return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
  };
  const backdrop = (element) => {
    const layers = [];
    for (let at = element; at; at = at.parentElement) {
      const colour = parse(getComputedStyle(at).backgroundColor);
      if (colour.a > 0) layers.push(colour);
      if (colour.a >= 1) break;
    }
    const white = { r: 255, g: 255, b: 255, a: 1 };
    return layers.reverse().reduce((below, layer) => over(layer, below), white);
  };
  const found = [];
  for (const element of document.querySelectorAll("body *")) {
    const own = [...element.childNodes]
      .some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
    if (!own || !element.getClientRects().length || element.closest("button:disabled")) continue;
    const style = getComputedStyle(element);
    if (style.visibility === "hidden") continue;
    let opacity = 1;
    for (let at = element; at; at = at.parentElement) {
      opacity *= Number(getComputedStyle(at).opacity);
    }
    const background = backdrop(element);
    const colour = parse(style.color);
    const ink = over({ ...colour, a: colour.a * opacity }, background);
    const [light, dark] = [luminance(ink), luminance(background)].sort((x, y) => y - x);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    found.push({
      text: element.textContent.trim().slice(0, 40),
      selector: `${element.tagName.toLowerCase()}.${element.className}`,
      ratio: Math.round(((light + 0.05) / (dark + 0.05)) * 100) / 100,
      needed: large ? 3 : 4.5,
    });
  }
  return { background: getComputedStyle(document.documentElement).backgroundColor,
           paper: luminance(backdrop(document.body)), texts: found };
}"""


async def readable(page: Page, where: str) -> dict[str, Any]:
    """The page's background and its text colours; fails on text below WCAG AA contrast."""
    measured: dict[str, Any] = await page.evaluate(CONTRAST)
    faint = [t for t in measured["texts"] if t["ratio"] < t["needed"]]
    assert measured["texts"], f"{where}: no text measured"
    assert faint == [], f"{where}: text too faint to read: {faint}"
    return measured
