// One question the model asked a person (the `ask_person` tool), as a card: the question,
// its details, and for an approver its choices as buttons (keys 1-9) and a box to type the
// answer. The first answer wins: whoever answers later is told whose answer took effect.
// An answer that is not one of the choices is refused by the API with the list, and the
// typed text stays for the next try.

import { ApiError, api, seg } from "./api.js";
import { cardHead, taskLines } from "./card.js";
import { h, moment, replace } from "./dom.js";

export const CHOICE_KEYS = 9; // choices 1-9 have a key each

/** "answered by you (alice): ACME-42", "answered by bob: Red", or that nobody answered. */
export function describeAnswer(outcome, me) {
  if (outcome.timed_out) return "nobody answered in time: the model decides without the answer";
  const by = outcome.answerer ?? "someone (no name: a Temporal signal?)";
  return `answered by ${by === me ? `you (${me})` : by}: ${outcome.answer}`;
}

/** How a question ended, read from the task's state (for one answered elsewhere). */
async function lookUpAnswer(taskId, requestId) {
  try {
    const view = await api(`/tasks/${seg(taskId)}`);
    return {
      outcome: view.state.answers?.[requestId] ?? null,
      pending: Boolean(view.state.pending_questions?.[requestId]),
      status: view.state.status,
    };
  } catch (error) {
    return { outcome: null, status: null, error };
  }
}

/** Why the API refused an answer, in its words (a bad choice names the choices). */
function refusal(error) {
  if (!(error instanceof ApiError)) return `Not answered: ${error.message}`;
  if (error.status === 403) return `Refused: ${error.message}`;
  const field = error.fields?.[0];
  return `Not answered: ${field ? field.msg : error.message}`;
}

/**
 * A card for `item` ({task_id, task, request_id, question, choices, details, requested_at,
 * step, chain}). `showTask`: the task line (the inbox); `showQuestion`: the question itself
 * (a task page shows it in the conversation, the card under it); `deadline`: when the
 * question times out, if known. `onAnswered(item, text, outcome)` is called once it is
 * answered, here or elsewhere. Returns {element, answer(), choose(n), gone(), refreshAge()}.
 */
export function questionCard(item, { me, canAnswer, showTask = true, showQuestion = true, deadline = null, onAnswered = () => {} }) {
  const id = `answer-${item.task_id}-${item.request_id}`;
  const choices = item.choices ?? [];
  const outcomeLine = h("p", { class: "outcome", role: "status" });
  const problem = h("p", { class: "error", role: "alert" });
  const head = cardHead(h("span", { class: "question-title" }, showQuestion ? "Question" : "Waiting for an answer"), item);
  let answered = false;
  let busy = false;

  const input = h("input", {
    id, type: "text", autocomplete: "off", spellcheck: "true",
    placeholder: choices.length ? "one of the choices" : "the answer the model needs",
  });
  const controls = canAnswer
    ? h("div", { class: "answer-controls" },
        choices.length
          ? h("div", { class: "choices actions", role: "group", "aria-label": "Choices" },
              choices.map((choice, i) => h("button", { type: "button", class: "choice", onclick: () => send(choice) },
                h("span", { class: "choice-text" }, choice), i < CHOICE_KEYS ? h("kbd", {}, String(i + 1)) : null)))
          : null,
        h("form", { class: "inline-form answer-form", onsubmit: (event) => {
          event.preventDefault();
          send(input.value);
        }, onkeydown: (event) => {
          if (event.key === "Escape") {
            event.preventDefault();
            element.focus();
          }
        } },
        h("label", { for: id }, choices.length ? "Or type one of the choices" : "Your answer"),
        input,
        h("div", { class: "actions" },
          h("button", { type: "submit", class: "primary answer" }, "Answer", h("kbd", {}, "Enter")))))
    : h("p", { class: "muted read-only" }, "Read-only: answering needs an approver token.");

  const element = h(
    "article",
    {
      class: "card question",
      tabindex: "-1",
      dataset: { taskId: item.task_id, requestId: item.request_id },
      "aria-label": `question on task ${item.task || item.task_id}`,
    },
    head.header,
    showTask ? taskLines(item) : null,
    showQuestion
      ? [h("p", { class: "question-text text" }, item.question),
         item.details ? h("p", { class: "details text muted" }, item.details) : null]
      : null,
    deadline ? h("p", { class: "deadline muted" }, "If nobody answers by ", moment(deadline), ", the model is told nobody answered.") : null,
    controls,
    problem,
    outcomeLine,
  );

  function settle(text, outcome) {
    if (answered) return;
    answered = true;
    element.classList.add("decided");
    element.dataset.outcome = !outcome ? "gone" : outcome.timed_out ? "timeout" : "answered";
    controls.remove();
    replace(problem);
    outcomeLine.textContent = text;
    onAnswered(item, text, outcome);
  }

  async function send(text) {
    if (answered || busy || !canAnswer) return;
    if (!text.trim()) {
      problem.textContent = "Write an answer first: an empty one is not sent.";
      input.focus();
      return;
    }
    busy = true;
    element.classList.add("busy");
    problem.textContent = "";
    outcomeLine.textContent = "answering…";
    try {
      const outcome = await api(`/tasks/${seg(item.task_id)}/answer`, {
        method: "POST",
        body: { request_id: item.request_id, answer: text },
      });
      settle(outcome.duplicate ? `Already ${describeAnswer(outcome, me)}` : describeAnswer(outcome, me), outcome);
    } catch (error) {
      outcomeLine.textContent = "";
      // Gone or no longer waiting: it may have been answered elsewhere, or timed out.
      if (error instanceof ApiError && [404, 409].includes(error.status)) await lookUp();
      if (!answered) {
        problem.textContent = refusal(error);
        input.focus(); // the typed text stays
      }
    } finally {
      busy = false;
      element.classList.remove("busy");
    }
  }

  /** The question left the pending list: say how it ended (not while our own answer is in
   * flight: its reply says whose answer won). */
  let looking = null;
  function gone() {
    if (busy) return Promise.resolve();
    looking ??= lookUp().finally(() => { looking = null; });
    return looking;
  }

  async function lookUp() {
    if (answered) return;
    const found = await lookUpAnswer(item.task_id, item.request_id);
    if (found.pending || found.error) return; // still waiting, or unknown for now
    if (found.outcome) settle(`Already ${describeAnswer(found.outcome, me)}`, found.outcome);
    else if (found.status) settle(`No longer pending: the task is ${found.status.replace("_", " ")}`, null);
    else settle("No longer pending", null);
  }

  return {
    element,
    item,
    kind: "question",
    /** Bring the answer box into focus (key `a` in the inbox). */
    answer() {
      if (answered || !canAnswer) return;
      input.focus();
      input.select();
    },
    /** Answer with choice `n` (1-based); false when there is none. */
    choose(n) {
      if (answered || !canAnswer || n < 1 || n > Math.min(choices.length, CHOICE_KEYS)) return false;
      send(choices[n - 1]);
      return true;
    },
    gone,
    get decided() { return answered; },
    refreshAge: head.refreshAge,
  };
}
