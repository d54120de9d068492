"""Agents that compose, in the console: a parent's page shows its sub-agents live, each
linking to the child's page, which links back; an approval raised inside a sub-agent is in
the inbox naming its chain and is approved there, and the tree finishes; a typed answer
shows as data. Real API and worker processes (the worker offers two sub-agents), the
Temporal dev server, the fake model; every wait is on a state the page or a task shows."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import quote

import pytest
from playwright.async_api import expect
from temporalio.testing import WorkflowEnvironment

from tests.browser.conftest import OpenConsole
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
from tests.browser.stack import ALICE, TOKENS, ConsoleStack, running_stack
from tests.helpers import pending_requests, wait_for_state
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.testing.settings import isolated_settings
from waystation.workflows.models import AgentTask, ModelSettings

IMG = '<img src=x onerror="window.__xss=1;alert(1)">'
SCRIPT = "<script>window.__xss=2;alert(2)</script>"
# The sub-agents' models: fixed names the worker is started with, scripted by each test.
RESEARCHER = f"fake-researcher-{uuid.uuid4().hex[:8]}"
SHELL = f"fake-shell-{uuid.uuid4().hex[:8]}"
AGENTS = [
    {"name": "researcher", "description": "looks things up", "model": {"name": RESEARCHER}},
    {"name": "shell", "description": "runs commands", "model": {"name": SHELL}},
]


@pytest.fixture(scope="module")
async def stack(
    console_temporal: WorkflowEnvironment,
    fake_openai: FakeOpenAI,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ConsoleStack]:
    """The console's stack, its worker and API offering the sub-agents (WAYSTATION_AGENTS)."""
    settings = isolated_settings(
        tmp_path_factory.mktemp("composed"),
        fake_openai.url,
        name="composed",
        api_tokens=TOKENS,
        agents=json.dumps(AGENTS),
    )
    address = console_temporal.client.service_client.config.target_host
    async with running_stack(address, settings) as started:
        yield started


def href(task_id: str) -> str:
    return "#/tasks/" + quote(task_id, safe="")


async def test_a_parent_page_shows_its_sub_agents_live_and_a_child_page_links_back(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    gate = threading.Event()
    cellar = f"look in the cellar {IMG}"

    def researcher(body: dict[str, Any]) -> Reply:
        where = body["messages"][1]["content"].removeprefix("look in the ")
        return text(f"found it in the {where}", gate=gate, hold_after_chunks=1)

    def parent(body: dict[str, Any]) -> Reply:
        if said(body):
            return text("both looked: " + " / ".join(sorted(said(body))))
        return tools(
            ("agent__researcher", {"task": "look in the attic"}),
            ("agent__researcher", {"task": cellar}),
        )

    fake_openai.script(researcher, model=RESEARCHER)
    handle = await start(stack, fake_openai.script(parent), "Find the key")
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    children = page.locator(".sub-agents li.child")
    try:
        await expect(children).to_have_count(2)
        await expect(page.locator(".sub-agents h2")).to_have_text("Sub-agents (2)")
        await expect(children.locator(".badge")).to_have_text(["running", "running"])
    finally:
        gate.set()
    await expect(children.locator(".badge")).to_have_text(["done", "done"])
    await expect(page.locator(".task-status")).to_have_text("done")
    await expect(answer(page)).to_contain_text("both looked: found it in the attic")
    # Listed in the order of their calls (they may start in either order).
    child_ids = [f"{handle.id}/1/call_1_0", f"{handle.id}/1/call_1_1"]
    assert {c.task_id for c in (await handle.state()).children.values()} == set(child_ids)
    await expect(children.locator(".agent-name")).to_have_text(["researcher", "researcher"])
    links = children.locator("a.child-link")
    await expect(links).to_have_text(["look in the attic", cellar])
    assert [await link.get_attribute("href") for link in await links.all()] == [
        href(i) for i in child_ids
    ]
    # The conversation says where each sub-agent went, with a link to it.
    started = page.locator("li.type-agent_started a.child-link")
    await expect(started).to_have_count(2)
    assert sorted(await started.all_text_contents()) == child_ids

    # A child's page: its own answer, and its chain back to the parent.
    await links.first.click()
    await expect(page).to_have_url(stack.url + "/" + href(child_ids[0]))
    await expect(page.locator(".task-status")).to_have_text("done")
    await expect(answer(page)).to_have_text("found it in the attic")
    chain = page.locator(".task-chain .chain")
    await expect(chain).to_have_text(f"Sub-agent of {handle.id} → researcher")
    await chain.locator("a.chain-root").click()
    await expect(page).to_have_url(stack.url + "/" + href(handle.id))
    await expect(page.locator(".sub-agents li.child")).to_have_count(2)
    # A child's address with its slashes as they are opens its page too.
    await page.goto(f"{stack.url}/#/tasks/{child_ids[1]}")
    await expect(page.locator("h1.task-title")).to_have_text(cellar)
    await expect(page.locator(".task-status")).to_have_text("done")
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.__xss") is None


async def test_an_approval_inside_a_sub_agent_names_its_chain_and_is_approved_in_the_inbox(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    def shell(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"the shell said {said(body)[0].split()[-1]}")
        return tools(("run_shell", {"command": "echo cleaned"}), content="cleaning")

    def parent(body: dict[str, Any]) -> Reply:
        if said(body):
            return text(f"tidied: {said(body)[-1]}")
        return tools(("agent__shell", {"task": f"clean scratch {SCRIPT}"}))

    fake_openai.script(shell, model=SHELL)
    task = f"Tidy up {IMG}"
    handle = await start(stack, fake_openai.script(parent), task)
    state = await wait_for_state(handle, lambda s: bool(s.children))
    [child] = state.children.values()
    await pending_requests(stack.runtime.get(child.task_id))

    page = await open_console(ALICE)
    pending = card(page, child.task_id)
    await expect(pending.locator(".task-link")).to_have_text(f"shell: clean scratch {SCRIPT}")
    chain = pending.locator(".chain")
    await expect(chain).to_have_text(f"Sub-agent of {task} → shell")
    root = chain.locator("a.chain-root")
    assert await root.get_attribute("href") == href(handle.id)

    # The parent's page shows the child waiting for the approval (the child's own state).
    await root.click()
    await expect(page).to_have_url(stack.url + "/" + href(handle.id))
    waiting = page.locator(f'.sub-agents li.child[data-task-id="{child.task_id}"]')
    await expect(waiting.locator(".badge")).to_have_text("waiting approval")

    await page.get_by_role("link", name=re.compile("^Inbox")).click()
    await pending.get_by_role("button", name=re.compile("^Approve")).click()
    await expect(decided(page, child.task_id)).to_have_text("approved by you (alice)")
    outcome = await handle.result()
    assert outcome.result == "tidied: the shell said cleaned"
    await page.goto(stack.url + "/" + href(handle.id))  # the tree has finished
    await expect(waiting.locator(".badge")).to_have_text("done")
    await expect(page.locator(".task-status")).to_have_text("done")
    await expect(answer(page)).to_have_text("tidied: the shell said cleaned")
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.__xss") is None


INVOICE = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "total_cents": {"type": "integer"},
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["customer", "total_cents", "paid", "note"],
}
ORDER = {
    "type": "object",
    "properties": {
        "lines": {"type": "array", "items": {"type": "object"}},
        "total": {"type": "integer"},
    },
    "required": ["lines", "total"],
}


def typed(
    model: str, task: str, schema: dict[str, Any], way: Literal["tool", "native"]
) -> AgentTask:
    settings = ModelSettings(
        name=model,
        structured_output=way,
        request_timeout_seconds=120,
        first_chunk_timeout_seconds=120,
    )
    return AgentTask(task=task, model=settings, output_schema=schema)


async def test_a_typed_answer_shows_as_a_table_or_as_json(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    invoice = {"customer": f"ACME {IMG}", "total_cents": 1200, "paid": False, "note": None}
    native = fake_openai.script([text(json.dumps(invoice))])
    flat = await stack.runtime.run(typed(native, "Read the invoice", INVOICE, "native"))
    order = {"lines": [{"sku": "A1", "qty": 2}, {"sku": f"B{SCRIPT}", "qty": 1}], "total": 3}
    tool = fake_openai.script([tools(("final_answer", order))])
    nested = await stack.runtime.run(typed(tool, "Read the order", ORDER, "tool"))
    assert (await flat.result()).output == invoice
    assert (await nested.result()).output == order

    page = await open_console(ALICE, f"/#/tasks/{flat.id}")
    table = page.locator("li.type-done table.answer-table")
    await expect(table.locator("th")).to_have_text(["customer", "total_cents", "paid", "note"])
    await expect(table.locator("td")).to_have_text([f"ACME {IMG}", "1200", "false", "null"])
    # The model's JSON is the answer: its thought refers to the table instead of repeating it.
    thought = page.locator("li.type-thought")
    await expect(thought.locator(".answer-ref")).to_have_text(
        "This is the answer, shown in full below."
    )
    await expect(page.locator("li.type-done .answer-text")).to_have_count(0)

    await page.goto(f"{stack.url}/#/tasks/{nested.id}")
    shown = page.locator("li.type-done pre.answer-json")
    await expect(shown).to_have_text(json.dumps(order, indent=2))
    await expect(page.locator("li.type-done table")).to_have_count(0)
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.__xss") is None


async def test_long_words_never_widen_and_both_themes_stay_readable_in_trees_and_questions(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    root, instruction = long_word("root-task"), long_word("child-task")
    question, choice, value = long_word("question"), long_word("choice"), long_word("value")

    def shell(body: dict[str, Any]) -> Reply:
        if said(body):
            return text("picked")
        return tools(("ask_person", {"question": question, "choices": [choice, "short"]}))

    def parent(body: dict[str, Any]) -> Reply:
        if said(body):
            return tools(("final_answer", {"summary": value, "count": 2}))
        return tools(("agent__shell", {"task": instruction}))

    fake_openai.script(shell, model=SHELL)
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["summary", "count"],
    }
    handle = await stack.runtime.run(typed(fake_openai.script(parent), root, schema, "tool"))
    state = await wait_for_state(handle, lambda s: bool(s.children))
    [child] = state.children.values()
    kid = stack.runtime.get(child.task_id)
    asking = await wait_for_state(kid, lambda s: bool(s.pending_questions))
    [request_id] = asking.pending_questions

    pages = {}
    for scheme in ("light", "dark"):
        page = await open_console(ALICE, color_scheme=scheme, reduced_motion="reduce")
        pages[scheme] = page
        chain = question_card(page, child.task_id).locator(".chain")
        await expect(chain).to_contain_text(root[:150])  # a task text is shortened
        await assert_fits(page, f"the inbox with a sub-agent's question, {scheme}")
        await readable(page, f"the inbox with a sub-agent's question, {scheme}")
        await page.goto(stack.url + "/" + href(handle.id))
        tree = page.locator(".sub-agents li.child")
        await expect(tree.locator(".badge")).to_have_text("waiting input")
        await assert_fits(page, f"a parent's page with its tree, {scheme}")
        await readable(page, f"a parent's page with its tree, {scheme}")
        await page.goto(stack.url + "/" + href(child.task_id))
        await expect(page.locator("li.type-question_asked button.choice")).to_have_count(2)
        await expect(page.locator(".task-chain .chain")).to_be_visible()
        await assert_fits(page, f"a sub-agent's page with its question, {scheme}")
        await readable(page, f"a sub-agent's page with its question, {scheme}")

    await kid.answer("short", request_id, answerer="alice")
    assert (await handle.result()).output == {"summary": value, "count": 2}
    for scheme, page in pages.items():
        await page.goto(stack.url + "/" + href(handle.id))
        await expect(page.locator("li.type-done table.answer-table td").first).to_have_text(value)
        await assert_fits(page, f"a typed answer, {scheme}")
        await readable(page, f"a typed answer, {scheme}")


pytestmark = pytest.mark.timeout(180)
