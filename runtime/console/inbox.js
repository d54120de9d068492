// The inbox: every pending approval across tasks, oldest first, worked from the keyboard.
// It polls GET /approvals; a request that leaves the list without us deciding it is shown
// as decided elsewhere, with who decided.

import { ApiError, api } from "./api.js";
import { approvalCard } from "./approval.js";
import { h, moment, replace, typing } from "./dom.js";

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
    for (const listener of this.listeners) listener(this.latest ?? { approvals: [], unreachable: [] }, this.error);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.poll(), POLL_MS);
  }
}

const key = (item) => `${item.task_id}\u0000${item.request_id}`;

/** The inbox view; returns its unmount function. */
export function mountInbox(main, { session, feed }) {
  const canDecide = session.role === "approver";
  const cards = new Map(); // key -> card, pending ones in the order shown
  const list = h("div", { class: "inbox-list", role: "list", "aria-label": "Pending approvals" });
  const empty = h("p", { class: "empty muted", hidden: true }, "Nothing waits for a decision.");
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
      ? [h("kbd", {}, "a"), " approve · ", h("kbd", {}, "r"), " reject with a message · ",
         h("kbd", {}, "e"), " edit the arguments and approve · "]
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
    const at = open.findIndex((card) => key(card.item) === selected);
    if (at >= 0 && !open[at].element.contains(document.activeElement)) {
      select(selected); // the first key press goes to the selected card itself
      return;
    }
    const next = at < 0 ? 0 : Math.min(open.length - 1, Math.max(0, at + step));
    select(key(open[next].item));
  }

  function onDecided(item, text, outcome) {
    const cardKey = key(item);
    const card = cards.get(cardKey);
    cards.delete(cardKey);
    settled.set(cardKey, item.requested_at);
    const wasSelected = selected === cardKey;
    const focusWasInside = card?.element.contains(document.activeElement);
    card?.element.remove();
    decidedList.prepend(
      h("li", { class: "decided-item", dataset: { taskId: item.task_id, requestId: item.request_id, outcome: outcome?.decision ?? "gone" } },
        h("span", { class: "tool" }, item.tool), " on ",
        h("a", { href: `#/tasks/${encodeURIComponent(item.task_id)}` }, item.task || item.task_id),
        " — ", h("span", { class: "decided-text" }, text), " · ", moment(new Date().toISOString())),
    );
    while (decidedList.children.length > DECIDED_SHOWN) decidedList.lastElementChild.remove();
    decidedTitle.hidden = false;
    if (wasSelected) {
      const open = pending();
      if (open.length) select(key(open[0].item), focusWasInside || document.activeElement === document.body);
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
    summary.textContent = open.length === 1 ? "1 request waits for a decision." : `${open.length} requests wait for a decision.`;
    document.title = open.length ? `(${open.length}) Inbox · waystation` : "Inbox · waystation";
  }

  function update(inbox, error) {
    trouble.textContent = error ? `The inbox could not be read: ${error.message}` : "";
    if (error) return;
    answered = true;
    const wanted = new Set(inbox.approvals.map(key));
    const unreachable = new Set(inbox.unreachable ?? []);
    for (const [cardKey, card] of cards) {
      // Left the list: decided elsewhere (the card finds out by whom), unless its task
      // just did not answer this time.
      if (!wanted.has(cardKey) && !card.decided && !unreachable.has(card.item.task_id)) card.gone();
    }
    let previous = null;
    for (const item of inbox.approvals) {
      const cardKey = key(item);
      if (settled.get(cardKey) === item.requested_at) continue;
      let card = cards.get(cardKey);
      if (!card) {
        card = approvalCard(item, { me: session.name, canDecide, onDecided });
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
      if (open.length) select(key(open[0].item), false);
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
        card.approve();
        break;
      case "r":
        if (!card || !canDecide) return;
        card.reject();
        break;
      case "e":
        if (!card || !canDecide) return;
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
        return;
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
