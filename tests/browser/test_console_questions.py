"""Questions the model asks a person (the `ask_person` tool), in the console: listed in the
inbox beside approvals, answered there by text or by a choice, from the keyboard; a wrong
choice refused with the list; a reader who sees but cannot answer; a question in a task's
conversation, answered there, and one nobody answered. Real API and worker processes, the
Temporal dev server, the fake model; every wait is on a state the page or the task shows."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.async_api import expect

from tests.browser.conftest import OpenConsole
from tests.browser.pages import answer, card, decided, question_card, said, start
from tests.browser.stack import ALICE, BOB, RITA, ConsoleStack
from tests.helpers import pending_requests, wait_for_state
from waystation.client.agent_runtime import TaskHandle
from waystation.testing.fake_openai import FakeOpenAI, Reply, text, tools
from waystation.workflows.models import QuestionSettings

IMG = '<img src=x onerror="window.__xss=1;alert(1)">'
SCRIPT = "<script>window.__xss=2;alert(2)</script>"


def asking(fake: FakeOpenAI, **question: Any) -> str:
    """A model that asks one question, then answers with what it was told."""

    def reply(body: dict[str, Any]) -> Reply:
        if not said(body):
            return tools(("ask_person", question), content="I need to ask first.")
        return text(f"So: {said(body)[-1]}")

    return fake.script(reply)


async def asked(handle: TaskHandle) -> str:
    """The request id of the task's question, once it waits for it."""
    state = await wait_for_state(handle, lambda s: bool(s.pending_questions))
    [request_id] = state.pending_questions
    return request_id


async def test_questions_are_answered_in_the_inbox_by_text_and_by_choice_from_the_keyboard(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    account = asking(fake_openai, question="Which account do I bill?", details="one of ours")
    colour = asking(
        fake_openai, question=f"Which colour {IMG}?", choices=[f"Red {SCRIPT}", "Dark blue"]
    )

    def shell(body: dict[str, Any]) -> Reply:
        if said(body):
            return text("ran it")
        return tools(("run_shell", {"command": "echo between"}))

    billing = await start(stack, account, "Bill the customer")
    await asked(billing)
    between = await start(stack, fake_openai.script(shell), "Run between")  # an approval
    await pending_requests(between)
    painting = await start(stack, colour, f"Paint {SCRIPT}")
    await asked(painting)

    page = await open_console(ALICE)
    # Questions beside approvals, oldest first.
    cards = page.locator("article.card")
    await expect(cards).to_have_count(3)
    order = await cards.evaluate_all("cards => cards.map(c => c.dataset.taskId)")
    assert order == [billing.id, between.id, painting.id]
    await expect(page.locator(".summary")).to_have_text(
        "1 request waits for a decision. 2 questions wait for an answer."
    )
    await expect(page.locator("#inbox-count")).to_have_text("3")
    first = question_card(page, billing.id)
    await expect(first.locator(".question-text")).to_have_text("Which account do I bill?")
    await expect(first.locator(".details")).to_have_text("one of ours")

    # A text answer: `a` opens the box, Enter sends it.
    await page.keyboard.press("j")
    await expect(first).to_be_focused()
    await page.keyboard.press("a")
    await expect(first.get_by_label("Your answer")).to_be_focused()
    await page.keyboard.type("ACME-42")
    await page.keyboard.press("Enter")
    await expect(decided(page, billing.id)).to_have_text("answered by you (alice): ACME-42")
    assert (await billing.result()).result == "So: alice answered: ACME-42"
    # The model's next request holds the answer and who gave it.
    assert said(fake_openai.requests[account][-1]) == ["alice answered: ACME-42"]

    # The approval is next; then the question with choices.
    await expect(card(page, between.id)).to_be_focused()
    await page.keyboard.press("j")
    choosing = question_card(page, painting.id)
    await expect(choosing).to_be_focused()
    await expect(choosing.locator(".question-text")).to_have_text(f"Which colour {IMG}?")
    choices = choosing.locator("button.choice .choice-text")
    await expect(choices).to_have_text([f"Red {SCRIPT}", "Dark blue"])
    # A typed answer that is not one of the choices is refused with the list; it stays typed.
    await page.keyboard.press("a")
    typed = choosing.get_by_label("Or type one of the choices")
    await expect(typed).to_be_focused()
    await page.keyboard.type("green")
    await page.keyboard.press("Enter")
    refused = choosing.locator(".error")
    await expect(refused).to_contain_text("not one of the choices")
    await expect(refused).to_contain_text(f"'Red {SCRIPT}', 'Dark blue'")
    await expect(typed).to_have_value("green")
    assert (await painting.state()).status == "waiting_input"
    # Escape goes back to the card; its key 2 picks the second choice.
    await page.keyboard.press("Escape")
    await expect(choosing).to_be_focused()
    await page.keyboard.press("2")
    await expect(decided(page, painting.id)).to_have_text("answered by you (alice): Dark blue")
    await expect(page.locator(f'.decided-item[data-task-id="{painting.id}"]')).to_contain_text(
        f"question “Which colour {IMG}?”"
    )
    assert (await painting.result()).result == "So: alice answered: Dark blue"
    assert said(fake_openai.requests[colour][-1]) == ["alice answered: Dark blue"]
    assert await page.locator("main img, main script").count() == 0
    assert await page.evaluate("window.__xss") is None  # and no dialog (the fixture checks)


async def test_a_reader_sees_a_question_and_cannot_answer_and_a_late_answer_names_the_first(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    model = asking(fake_openai, question="Ship today?", choices=["Yes", "No"])
    handle = await start(stack, model, "Ship the order")
    request_id = await asked(handle)
    reader = await open_console(RITA)
    seen = question_card(reader, handle.id)
    await expect(seen.locator(".question-text")).to_have_text("Ship today?")
    await expect(seen.locator(".read-only")).to_have_text(
        "Read-only: answering needs an approver token."
    )
    assert await seen.get_by_role("button").count() == 0
    assert await seen.locator("input").count() == 0
    await reader.keyboard.press("1")  # no key answers for a reader
    status = await reader.evaluate(
        """async ([task, request]) => (await fetch(`/tasks/${task}/answer`, {
             method: "POST",
             headers: {"Authorization": `Bearer ${sessionStorage.getItem("waystation.token")}`,
                       "Content-Type": "application/json"},
             body: JSON.stringify({request_id: request, answer: "Yes"}),
           })).status""",
        [handle.id, request_id],
    )
    assert status == 403
    assert (await handle.state()).status == "waiting_input"

    # Bob answers through the API while alice has the card open: whether alice's key comes
    # first (the API hands back bob's answer) or her inbox sees it leave, she is told bob's.
    alice = await open_console(ALICE)
    mine = question_card(alice, handle.id)
    await expect(mine).to_have_class(re.compile(r"\bselected\b"))
    async with httpx.AsyncClient(
        base_url=stack.url, headers={"Authorization": f"Bearer {BOB}"}
    ) as http:
        first = await http.post(
            f"/tasks/{handle.id}/answer", json={"request_id": request_id, "answer": "no"}
        )
    assert first.json()["answer"] == "No" and first.json()["answerer"] == "bob"
    await alice.keyboard.press("1")
    await expect(decided(alice, handle.id)).to_have_text("Already answered by bob: No")
    await expect(decided(reader, handle.id)).to_have_text("Already answered by bob: No")
    assert (await handle.result()).result == "So: bob answered: No"


async def test_a_task_page_shows_its_question_in_the_conversation_and_takes_the_answer(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    model = asking(fake_openai, question=f"Which branch {SCRIPT}?", details=f"not {IMG}")
    handle = await start(stack, model, "Deploy")
    await asked(handle)
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(page.locator(".task-status")).to_have_text("waiting input")
    row = page.locator("li.type-question_asked")
    await expect(row.locator(".question-text")).to_have_text(f"Which branch {SCRIPT}?")
    await expect(row.locator(".details")).to_have_text(f"not {IMG}")
    await expect(row.locator(".deadline")).to_contain_text("If nobody answers by")
    await expect(page.locator(".message-hint")).to_contain_text("waits for an answer")
    box = row.get_by_label("Your answer")
    await box.fill(f"main {IMG}")
    await box.press("Enter")
    given = page.locator("li.type-question_answered")
    await expect(given.locator(".answer-given")).to_have_text(f"main {IMG}")
    await expect(given.locator(".sender")).to_have_text("from alice")
    await expect(row.locator(".question-slot input")).to_have_count(0)
    await expect(page.locator(".task-status")).to_have_text("done")
    await expect(answer(page)).to_have_text(f"So: alice answered: main {IMG}")
    assert said(fake_openai.requests[model][-1]) == [f"alice answered: main {IMG}"]
    assert await page.locator("main img, main script").count() == 0

    # A reader sees the question on the page, and no box to answer it in.
    late = await start(stack, asking(fake_openai, question="Tag it?"), "Tag")
    await asked(late)
    reader = await open_console(RITA, f"/#/tasks/{late.id}")
    await expect(reader.locator("li.type-question_asked .question-text")).to_have_text("Tag it?")
    await expect(reader.locator("li.type-question_asked .read-only")).to_be_visible()
    assert await reader.locator("li.type-question_asked input").count() == 0


async def test_a_question_nobody_answers_times_out_in_the_conversation(
    stack: ConsoleStack, fake_openai: FakeOpenAI, open_console: OpenConsole
) -> None:
    model = asking(fake_openai, question="Anyone there?")
    handle = await start(
        stack, model, "Wait for nobody", questions=QuestionSettings(timeout_seconds=1)
    )
    outcome = await handle.result()
    assert outcome.result.startswith("So: Nobody answered within")
    page = await open_console(ALICE, f"/#/tasks/{handle.id}")
    await expect(page.locator(".task-status")).to_have_text("done")
    timed_out = page.locator("li.type-question_answered")
    await expect(timed_out).to_contain_text(
        "Nobody answered within 1 s: the model decides without the answer."
    )
    await expect(page.locator("li.type-question_asked .question-slot *")).to_have_count(0)


pytestmark = pytest.mark.timeout(180)
