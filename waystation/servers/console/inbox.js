// The inbox: every pending approval and question across tasks, oldest first, worked from
// the keyboard. It polls GET /approvals; a request that leaves the list without us deciding
// or answering it is shown as settled elsewhere, with who settled it.

import { ApiError, api } from "./api.js";
import { approvalCard } from "./approval.js";
import { h, moment, replace, typing } from "./dom.js";
import { CHOICE_KEYS, questionCard } from "./question.js";

const POLL_MS = 1000;
const DECIDED_SHOWN = 20;
const DENSITY_KEY = "waystation.inbox.density"; // "compact" or "comfortable", kept per browser

/** Polls GET /approvals for every view that subscribes (one poll at a time). */
export class InboxFeed {
  constructor() {
    this.listeners = new Set();
    this.latest = null;
    this.error = null;
    this.timer = null;
    this.running = false;
    this.reading = null; // the poll under way
    this.again = false; // a poll was asked for while one was under way
  }

  subscribe(listener) {
    this.listeners.add(listener);
    if (this.latest) listener(this.latest, this.error);
    return () => this.listeners.delete(listener);
  }

  start() {
    if (this.running) return;
    this.running = true;
    this.poll();
  }

  stop() {
    this.running = false;
    clearTimeout(this.timer);
  }

  /** Poll now (after a decision, say) instead of waiting for the next tick; asked while a
   * poll is under way, polls again right after it (its answer may predate the decision). */
  poll() {
    if (this.reading) {
      this.again = true;
      return this.reading;
    }
    this.reading = this.read().finally(() => {
      this.reading = null;
      if (this.again) {
        this.again = false;
        this.poll();
      }
    });
    return this.reading;
  }

  async read() {
    clearTimeout(this.timer);
    if (!this.running) return;
    try {
      this.latest = await api("/approvals");
      this.error = null;
    } catch (error) {
      this.error = error;
      if (error instanceof ApiError && error.status === 401) return this.stop();
    }
    if (!this.running) return;
    for (const listener of this.listeners) listener(this.latest ?? EMPTY_INBOX, this.error);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.poll(), POLL_MS);
  }
}

const EMPTY_INBOX = { approvals: [], questions: [], unreachable: [] };
const QUESTION_SHOWN = 80; // characters of a question the decided list repeats

const key = (kind, item) => `${kind}\u0000${item.task_id}\u0000${item.request_id}`;

/** Every request of `inbox` as [kind, item], oldest first (approvals and questions alike). */
function requests(inbox) {
  const all = [
    ...inbox.approvals.map((item) => ["approval", item]),
    ...(inbox.questions ?? []).map((item) => ["question", item]),
  ];
  const order = ([, a], [, b]) => Date.parse(a.requested_at) - Date.parse(b.requested_at)
    || a.task_id.localeCompare(b.task_id) || a.request_id.localeCompare(b.request_id);
  return all.sort(order);
}

/** How many requests `inbox` holds, for the header's count. */
export function waitingCount(inbox) {
  return inbox.approvals.length + (inbox.questions?.length ?? 0);
}

/** What a settled request was, for the decided list: the tool, or the question. */
function settledLabel(kind, item) {
  if (kind === "approval") return h("span", { class: "tool" }, item.tool);
  const question = item.question.length > QUESTION_SHOWN ? `${item.question.slice(0, QUESTION_SHOWN - 1)}…` : item.question;
  return h("span", { class: "question-label" }, `question “${question}”`);
}

/** "2 requests wait for a decision." and "1 question waits for an answer." */
function summaryText(approvals, questions) {
  const parts = [];
  if (approvals || !questions) {
    parts.push(approvals === 1 ? "1 request waits for a decision." : `${approvals} requests wait for a decision.`);
  }
  if (questions) {
    parts.push(questions === 1 ? "1 question waits for an answer." : `${questions} questions wait for an answer.`);
  }
  return parts.join(" ");
}

/** The inbox view; returns its unmount function. */
export function mountInbox(main, { session, feed }) {
  const canDecide = session.role === "approver"; // decides approvals and answers questions
  const cards = new Map(); // key -> card, pending ones in the order shown
  const list = h("div", { class: "inbox-list", role: "list", "aria-label": "Pending approvals and questions" });
  const empty = h("p", { class: "empty muted", hidden: true }, "Nothing waits for a decision or an answer.");
  const summary = h("p", { class: "summary", role: "status", "aria-live": "polite" });
  const trouble = h("p", { class: "error", role: "alert" });
  const decidedList = h("ol", { class: "decided-list", "aria-label": "Decided" });
  const decidedTitle = h("h2", { hidden: true }, "Decided");
  let selected = null; // key of the selected card
  let answered = false; // until the first answer the page knows nothing, not "nothing waits"
  let compact = localStorage.getItem(DENSITY_KEY) === "compact";
  // Requests this page has seen settled, with when they were asked: a poll that was already
  // under way when one was decided must not bring it back.
  const settled = new Map();

  const help = h("p", { class: "keys muted" },
    h("kbd", {}, "j"), "/", h("kbd", {}, "k"), " or arrows move · ",
    ...(canDecide
      ? [h("kbd", {}, "a"), " approve, or answer a question · ", h("kbd", {}, "r"), " reject with a message · ",
         h("kbd", {}, "e"), " edit the arguments and approve · ", h("kbd", {}, "1"), "–", h("kbd", {}, String(CHOICE_KEYS)),
         " pick a choice · "]
      : []),
    h("kbd", {}, "o"), " open the task");
  const density = h("button", { type: "button", class: "density", onclick: () => setCompact(!compact) },
    "Compact cards");

  replace(
    main,
    h("h1", {}, "Inbox"),
    summary,
    trouble,
    h("div", { class: "inbox-tools" }, help, density),
    list,
    empty,
    decidedTitle,
    decidedList,
  );

  /** Compact: each card but the selected one shrinks to a line or two (kept per browser). */
  function setCompact(on) {
    compact = on;
    list.classList.toggle("compact", on);
    density.setAttribute("aria-pressed", String(on));
    localStorage.setItem(DENSITY_KEY, on ? "compact" : "comfortable");
  }

  function pending() {
    return [...cards.values()].filter((card) => !card.decided);
  }

  function select(cardKey, focus = true) {
    selected = cardKey;
    for (const [k, card] of cards) {
      const on = k === cardKey;
      card.element.classList.toggle("selected", on);
      card.element.tabIndex = on ? 0 : -1;
      card.element.setAttribute("aria-current", on ? "true" : "false");
      if (on && focus) card.element.focus();
    }
  }

  function move(step) {
    const open = pending();
    if (!open.length) return;
    const at = open.findIndex((card) => key(card.kind, card.item) === selected);
    if (at >= 0 && !open[at].element.contains(document.activeElement)) {
      select(selected); // the first key press goes to the selected card itself
      return;
    }
    const next = at < 0 ? 0 : Math.min(open.length - 1, Math.max(0, at + step));
    select(key(open[next].kind, open[next].item));
  }

  /** A card was decided or answered, here or elsewhere: it moves to the decided list. */
  function onSettled(kind, item, text, outcome) {
    const cardKey = key(kind, item);
    const card = cards.get(cardKey);
    cards.delete(cardKey);
    settled.set(cardKey, item.requested_at);
    const wasSelected = selected === cardKey;
    const focusWasInside = card?.element.contains(document.activeElement);
    card?.element.remove();
    const ended = kind === "approval"
      ? outcome?.decision ?? "gone"
      : !outcome ? "gone" : outcome.timed_out ? "timeout" : "answered";
    decidedList.prepend(
      h("li", { class: "decided-item", dataset: { kind, taskId: item.task_id, requestId: item.request_id, outcome: ended } },
        settledLabel(kind, item), " on ",
        h("a", { href: `#/tasks/${encodeURIComponent(item.task_id)}` }, item.task || item.task_id),
        " — ", h("span", { class: "decided-text" }, text), " · ", moment(new Date().toISOString())),
    );
    while (decidedList.children.length > DECIDED_SHOWN) decidedList.lastElementChild.remove();
    decidedTitle.hidden = false;
    if (wasSelected) {
      const open = pending();
      if (open.length) select(key(open[0].kind, open[0].item), focusWasInside || document.activeElement === document.body);
      else selected = null;
    }
    render();
    feed.poll();
  }

  function render() {
    list.setAttribute("aria-busy", String(!answered));
    if (!answered) {
      summary.textContent = "Reading the inbox…";
      return;
    }
    const open = pending();
    empty.hidden = open.length > 0;
    const questions = open.filter((card) => card.kind === "question").length;
    summary.textContent = summaryText(open.length - questions, questions);
    document.title = open.length ? `(${open.length}) Inbox · waystation` : "Inbox · waystation";
  }

  function update(inbox, error) {
    trouble.textContent = error ? `The inbox could not be read: ${error.message}` : "";
    if (error) return;
    answered = true;
    const waiting = requests(inbox);
    const wanted = new Set(waiting.map(([kind, item]) => key(kind, item)));
    const unreachable = new Set(inbox.unreachable ?? []);
    for (const [cardKey, card] of cards) {
      // Left the list: decided elsewhere (the card finds out by whom), unless its task
      // just did not answer this time.
      if (!wanted.has(cardKey) && !card.decided && !unreachable.has(card.item.task_id)) card.gone();
    }
    let previous = null;
    for (const [kind, item] of waiting) {
      const cardKey = key(kind, item);
      if (settled.get(cardKey) === item.requested_at) continue;
      let card = cards.get(cardKey);
      if (!card) {
        const onDone = (done, text, outcome) => onSettled(kind, done, text, outcome);
        card = kind === "approval"
          ? approvalCard(item, { me: session.name, canDecide, onDecided: onDone })
          : questionCard(item, { me: session.name, canAnswer: canDecide, onAnswered: onDone });
        card.element.setAttribute("role", "listitem");
        card.element.addEventListener("focus", () => select(cardKey, false));
        cards.set(cardKey, card);
        card.element.classList.add("new");
      } else {
        card.refreshAge();
      }
      if (card.decided) continue;
      // Oldest first: put each card right after the one before it (moves only when needed).
      const after = previous ? previous.element.nextElementSibling : list.firstElementChild;
      if (after !== card.element) {
        if (previous) previous.element.after(card.element);
        else list.prepend(card.element);
      }
      previous = card;
    }
    if (inbox.unreachable?.length) {
      trouble.textContent = `${inbox.unreachable.length} waiting task(s) did not answer in time (is a worker running?): ${inbox.unreachable.join(", ")}`;
    }
    if (selected === null || !cards.has(selected)) {
      const open = pending();
      if (open.length) select(key(open[0].kind, open[0].item), false);
    }
    render();
  }

  function onKey(event) {
    if (typing(event) || event.ctrlKey || event.metaKey || event.altKey) return;
    const card = selected ? cards.get(selected) : null;
    switch (event.key) {
      case "j":
      case "ArrowDown":
        move(1);
        break;
      case "k":
      case "ArrowUp":
        move(-1);
        break;
      case "a":
        if (!card || !canDecide) return;
        if (card.kind === "question") card.answer();
        else card.approve();
        break;
      case "r":
        if (!card || !canDecide || card.kind !== "approval") return;
        card.reject();
        break;
      case "e":
        if (!card || !canDecide || card.kind !== "approval") return;
        card.edit();
        break;
      case "o":
        if (!card) return;
        location.hash = `#/tasks/${encodeURIComponent(card.item.task_id)}`;
        break;
      case "Enter":
        if (!card || event.target !== card.element) return;
        location.hash = `#/tasks/${encodeURIComponent(card.item.task_id)}`;
        break;
      default:
        // 1-9 answer a question with that choice.
        if (!/^[1-9]$/.test(event.key) || !card || !canDecide || card.kind !== "question") return;
        if (!card.choose(Number(event.key))) return;
    }
    event.preventDefault();
  }

  setCompact(compact);
  document.addEventListener("keydown", onKey);
  const unsubscribe = feed.subscribe(update);
  feed.poll();
  render();
  return () => {
    document.removeEventListener("keydown", onKey);
    unsubscribe();
  };
}
