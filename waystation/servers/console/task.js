// A task's page: its state, the conversation turn by turn (what people said, the questions
// the agent asked them, the answers, each turn's work under it), the live stream (tokens as
// they come, then each event), the message box, the controls (cancel, resume with raised
// limits, fork from any event), its approvals, its sub-agents, and for a sub-agent the
// chain back to its parent. The stream is followed across turns: a follow-up from anywhere
// shows up.

import { ApiError, api, seg } from "./api.js";
import { approvalCard } from "./approval.js";
import { chainLine, chainOfTask } from "./chain.js";
import { MessageBox } from "./composer.js";
import { textIsData } from "./data.js";
import { count, h, moment, replace, statusBadge } from "./dom.js";
import { TaskFold } from "./fold.js";
import { LiveSteps } from "./live.js";
import { questionCard } from "./question.js";
import { TERMINAL, followStream } from "./stream.js";
import { eventRow, quotaWaitText } from "./timeline.js";
import { SubAgents } from "./tree.js";
import { Conversation } from "./turns.js";

const LOG_PAGE = 1000;
const WINDOW = 200; // rows rendered at once; earlier ones on request
// The stream is joined this many items before its head when the page loads: the log has
// the events, and these bring the tokens of a step that is streaming now.
const STREAM_OVERLAP = 500;
const RESUME_RETRY_MS = 500;
const RESUME_RETRIES = 20;
const STREAM_STATES = {
  connecting: "connecting…",
  waiting: "live · the task waits for a message",
  reconnecting: "reconnecting…",
  failed: "the task failed; a resume would show here",
  ended: "ended",
  quiet: "closed",
};

/** The task page; returns its unmount function. */
export function mountTask(main, { session }, taskId) {
  const page = new TaskPage(main, session, taskId);
  page.load();
  return () => page.stop();
}

/** What of the input the prompt cache served or took, in brackets ("" for none). */
function cachedNote(usage) {
  const parts = [
    usage.cacheRead ? `${count(usage.cacheRead)} cached` : null,
    usage.cacheWrite ? `${count(usage.cacheWrite)} to cache` : null,
  ].filter(Boolean);
  return parts.length ? ` (${parts.join(", ")})` : "";
}

/** What the priced calls cost, and the tokens of the others; null when none was priced. */
function costNote(usage, budget) {
  if (usage.cost == null) return null;
  const unpriced = usage.unpriced ? ` + ${count(usage.unpriced)} unpriced tokens` : "";
  return `$${usage.cost.toFixed(4)}${budget ? ` of $${budget}` : ""}${unpriced}`;
}

function percent(ratio) {
  return `${Math.round(ratio * 100)}%`;
}

class TaskPage {
  constructor(main, session, taskId) {
    this.main = main;
    this.session = session;
    this.taskId = taskId;
    this.canDecide = session.role === "approver";
    this.stopped = false;
    this.loads = 0;
  }

  reset() {
    this.follower?.stop();
    this.follower = null;
    this.tree?.stop();
    this.tree = new SubAgents();
    this.streamToken = null;
    this.followerState = null;
    this.events = [];
    this.turnAt = []; // seq -> the turn its event belongs to
    this.early = new Map(); // events that came ahead of a gap, by seq
    this.fold = new TaskFold();
    this.conversation = new Conversation();
    this.live = new LiveSteps({ onLateText: (seq) => {
      this.rerender.add(seq);
      this.queueRefresh();
    } });
    this.box = new MessageBox(this.taskId, {
      sender: this.session.name,
      canSend: this.canDecide,
      onRefused: () => this.catchUp(),
      onResume: (text) => this.openResume(text),
    });
    this.rerender = new Set(); // seqs of rows to draw again (void text came late, an answer came)
    this.cards = new Map(); // request id -> approval card
    this.questionCards = new Map(); // request id -> the answer box of a pending question
    this.chainShown = false;
    this.firstShown = 0;
    this.catchingUp = null;
    this.headQueued = false;
    this.controlsKey = null;
    this.outcomeKey = null;
    this.watchingFailure = false;
  }

  stop() {
    this.stopped = true;
    this.follower?.stop();
    this.tree?.stop();
  }

  async load() {
    const generation = ++this.loads; // a later load supersedes this one
    this.reset();
    const title = h("h1", { class: "task-title" }, this.taskId);
    replace(this.main, title, h("p", { class: "muted", role: "status" }, "loading…"));
    let head = 0;
    try {
      const timeline = await api(`/console/api/tasks/${seg(this.taskId)}/timeline`);
      if (generation !== this.loads) return;
      for (const event of timeline.events) this.take(event, false);
      head = timeline.head;
    } catch (error) {
      if (this.stopped || generation !== this.loads) return;
      replace(this.main, title, h("p", { class: "error", role: "alert" },
        error instanceof ApiError && error.status === 404 ? `No task ${this.taskId}.` : `The task could not be read: ${error.message}`),
        h("button", { type: "button", onclick: () => this.load() }, "Try again"));
      return;
    }
    if (this.stopped) return;
    performance.mark("ws:task-data-loaded");
    this.build();
    performance.mark("ws:timeline-rendered");
    const measure = performance.measure("ws:timeline-render", "ws:task-data-loaded", "ws:timeline-rendered");
    this.main.dataset.renderMs = String(Math.round(measure.duration));
    this.main.dataset.loadedMs = String(Math.round(performance.now()));
    // Followed even when the task has answered: the stream's latest items still tell which
    // attempts were void and what text they streamed, and it goes on across turns (only a
    // cancellation ends it).
    this.follow(Math.max(0, head - STREAM_OVERLAP));
  }

  /** The page's skeleton, then the rows of the latest events. */
  build() {
    this.title = h("h1", { class: "task-title text" });
    this.figures = h("dl", { class: "figures" });
    this.streamState = h("span", { class: "stream-state", role: "status", "aria-live": "polite" });
    this.controls = h("div", { class: "controls" });
    this.outcome = h("div", { class: "task-outcome" });
    this.chain = h("div", { class: "task-chain" });
    this.pendingList = h("div", { class: "pending-list", "aria-label": "Pending requests of this task" });
    this.earlier = h("button", { type: "button", class: "earlier", onclick: () => this.showEarlier() });
    this.notice = h("p", { class: "error", role: "alert" });
    replace(
      this.main,
      h("header", { class: "task-head" },
        this.title,
        h("p", { class: "muted ids" }, h("span", { class: "task-id" }, this.taskId), " · stream ", this.streamState),
        this.chain,
        this.figures),
      this.notice,
      this.outcome, // a failure's reason first, then what can be done about it
      this.controls,
      this.pendingList,
      this.tree.element,
      h("h2", {}, "Conversation"),
      this.earlier,
      this.conversation.element,
      this.live.element,
      this.box.element,
    );
    this.firstShown = Math.max(0, this.events.length - WINDOW);
    for (const event of this.events.slice(this.firstShown)) {
      this.conversation.append(this.row(event), this.turnAt[event.seq]);
    }
    this.refresh();
  }

  row(event) {
    const row = eventRow(event, {
      streamed: event.type === "thought" ? this.live.streamed(event.step) : null,
      answerBelow: this.isAnswer(event),
      questionTimeout: this.fold.task?.questions?.timeout_seconds,
      onFork: (e, slot) => this.openFork(e, slot),
    });
    row.dataset.turn = String(this.turnAt[event.seq]);
    return row;
  }

  /** Whether `event` is a thought whose text its turn's answer, the next event, repeats
   * (as text, or as the JSON of its data): the answer is shown once in full, in the
   * answer's row, and the thought refers to it. */
  isAnswer(event) {
    if (event?.type !== "thought") return false;
    const next = this.events[event.seq + 1];
    if (next?.type !== "done") return false;
    if (next.result === event.content) return true;
    return next.output !== null && next.output !== undefined && Boolean(event.content) && textIsData(event.content, next.output);
  }

  /** Bring the latest answer into view and focus. */
  showAnswer() {
    const row = this.fold.resultSeq === null ? null : this.conversation.row(this.fold.resultSeq);
    row?.scrollIntoView({ block: "start" });
    row?.focus({ preventScroll: true });
  }

  showEarlier() {
    const from = Math.max(0, this.firstShown - WINDOW);
    this.conversation.prepend(this.events.slice(from, this.firstShown)
      .map((event) => [this.row(event), this.turnAt[event.seq]]));
    this.firstShown = from;
    this.refreshEarlier();
  }

  refreshEarlier() {
    this.earlier.hidden = this.firstShown === 0;
    this.earlier.textContent = `Show ${Math.min(WINDOW, this.firstShown)} earlier events (${count(this.firstShown)} not shown)`;
  }

  follow(since) {
    this.follower?.stop();
    const mine = {}; // callbacks of a follower this page has since replaced are ignored
    this.streamToken = mine;
    this.follower = followStream(this.taskId, since, {
      onItem: (item) => {
        if (this.streamToken !== mine) return;
        // After the failure, anything new means the task was resumed: a reset may have
        // rewritten what followed its reset point, so the page reads it all again.
        if (this.watchingFailure) this.load();
        else this.onItem(item);
      },
      // An ending older than the last event the page has (a failure since resumed) is
      // history, not the end: the follower reads on past it.
      isLatest: (item) => item.data.seq >= this.events.length - 1,
      onState: (state) => {
        if (this.streamToken !== mine) return;
        this.watchingFailure = state === "failed";
        this.followerState = state;
        this.renderStreamState();
      },
      follow: true, // on across turns: a follow-up sent from anywhere shows here
    });
  }

  renderStreamState() {
    const state = this.followerState;
    if (!this.streamState || !state) return;
    // Past an answer the stream stays open for the next turn.
    const shown = state === "live" && this.fold.status === "done" ? "waiting" : state;
    this.streamState.textContent = STREAM_STATES[shown] ?? shown;
    this.streamState.dataset.state = state;
  }

  onItem({ type, data }) {
    if (type === "token") this.live.token(data);
    else if (type === "llm_retry") this.live.retry(data);
    else if (type === "gap") this.catchUp();
    else if ("seq" in data) this.take(data, true);
  }

  /** An event from the log or the stream: each seq once, in order; a jump is filled from the log. */
  take(event, live) {
    if (event.seq < this.events.length) return;
    if (event.seq > this.events.length) {
      this.early.set(event.seq, event);
      this.catchUp();
      return;
    }
    this.events.push(event);
    this.fold.apply(event);
    this.turnAt.push(this.fold.turn);
    if (event.type === "thought") this.live.closed(event);
    else if (event.type === "interrupted") this.live.interrupted(event);
    else if (event.type === "user_message" && event.message_id) this.box.taken(event.message_id);
    else if (event.type === "done" && live && this.isAnswer(this.events[event.seq - 1])) {
      this.rerender.add(event.seq - 1); // the thought now refers to the answer below it
    }
    if (live) {
      this.conversation.append(this.row(event), this.turnAt[event.seq]);
      this.queueRefresh();
    }
    const next = this.early.get(this.events.length);
    if (next) {
      this.early.delete(next.seq);
      this.take(next, live);
    }
  }

  catchUp() {
    this.catchingUp ??= (async () => {
      try {
        for (;;) {
          const since = this.events.length;
          const page = await api(`/tasks/${seg(this.taskId)}/log?since=${since}&limit=${LOG_PAGE}`);
          for (const event of page.events) this.take(event, true);
          if (page.events.length < LOG_PAGE) break;
        }
      } catch (error) {
        this.notice.textContent = `Some events could not be read: ${error.message}`;
      } finally {
        this.catchingUp = null;
      }
    })();
  }

  queueRefresh() {
    if (this.headQueued) return;
    this.headQueued = true;
    requestAnimationFrame(() => {
      this.headQueued = false;
      if (this.stopped) return;
      for (const seq of this.rerender) {
        const old = seq >= this.firstShown ? this.conversation.row(seq) : null;
        old?.replaceWith(this.row(this.events[seq]));
      }
      this.rerender.clear();
      this.refresh();
    });
  }

  /** The header, controls, outcome and pending approvals, from the fold. */
  refresh() {
    const f = this.fold;
    const text = f.task?.task ?? this.taskId;
    this.title.textContent = text.length > 200 ? `${text.slice(0, 199)}…` : text;
    this.title.title = text;
    document.title = `${f.status} · ${text.slice(0, 60)} · waystation`;
    const tokens = f.usage.input + f.usage.output;
    // max_steps is per turn: a follow-up's steps are counted from where its turn began.
    const turnSteps = f.turn > 0 ? `${f.step} · ${f.step - f.turnFirstStep} of ${f.maxSteps} in this turn` : `${f.step} of ${f.maxSteps}`;
    replace(this.figures,
      h("div", {}, h("dt", {}, "Status"), h("dd", { class: "task-status" }, statusBadge(f.status))),
      f.quotaWait
        ? h("div", {}, h("dt", {}, "Waiting"), h("dd", { class: "task-quota-wait" }, quotaWaitText(f.quotaWait)))
        : null,
      h("div", {}, h("dt", {}, "Step"), h("dd", { class: "task-step" }, f.maxSteps ? turnSteps : String(f.step))),
      f.turn > 0 ? h("div", {}, h("dt", {}, "Turns"), h("dd", { class: "task-turns" }, `${f.turn + 1} (${f.turn} follow-up${f.turn > 1 ? "s" : ""})`)) : null,
      h("div", {}, h("dt", {}, "Tokens"), h("dd", { class: "task-usage" },
        `${count(f.usage.input)} in${cachedNote(f.usage)} · ${count(f.usage.output)} out` +
        (f.usage.reasoning ? ` (${count(f.usage.reasoning)} reasoning)` : "") +
        ` · ${count(tokens)}` + (f.tokenBudget ? ` of ${count(f.tokenBudget)}` : ""))),
      costNote(f.usage, f.costBudget) !== null
        ? h("div", {}, h("dt", {}, "Cost"), h("dd", { class: "task-cost" }, costNote(f.usage, f.costBudget)))
        : null,
      // Only where the provider reported caching: an endpoint without a cache is no 0% hit.
      f.usage.cacheRead || f.usage.cacheWrite
        ? h("div", {}, h("dt", {}, "Cache hit"), h("dd", { class: "task-cache-hit" },
          percent(f.usage.input ? f.usage.cacheRead / f.usage.input : 0)))
        : null,
      f.model && f.model !== f.task?.model.name
        ? h("div", {}, h("dt", {}, "Model"), h("dd", { class: "task-model" }, f.model))
        : null,
      h("div", {}, h("dt", {}, "Events"), h("dd", { class: "task-events" }, count(this.events.length))),
      h("div", {}, h("dt", {}, "Started"), h("dd", {}, moment(this.events[0]?.at))));
    this.renderChain();
    this.renderControls();
    this.renderOutcome();
    this.renderPending();
    this.renderQuestions();
    this.tree.update(f.children);
    this.refreshEarlier();
    this.renderStreamState();
    this.box.update(f.status);
  }

  /** A sub-agent's page names its tree, linking back to its parent (`task.parent`). */
  renderChain() {
    if (this.chainShown || !this.fold.task) return;
    this.chainShown = true;
    replace(this.chain, chainLine(chainOfTask(this.fold.task)));
  }

  renderControls() {
    const f = this.fold;
    if (this.controlsKey === f.status) return; // keep what the user is typing
    this.controlsKey = f.status;
    const parts = [];
    if (this.canDecide && !TERMINAL.has(f.status)) {
      parts.push(h("button", { type: "button", class: "cancel danger", onclick: (event) => this.cancel(event.target) }, "Cancel task"));
    }
    if (this.canDecide && f.status === "failed") parts.push(this.resumeForm());
    if (!this.canDecide && !TERMINAL.has(f.status)) {
      parts.push(h("p", { class: "muted read-only" }, "Read-only: cancelling, resuming and deciding need an approver token."));
    }
    replace(this.controls, parts);
  }

  resumeForm() {
    const f = this.fold;
    const steps = h("input", { id: "resume-max-steps", type: "number", min: "1", step: "1",
      value: String(f.failureKind === "max_steps" ? (f.maxSteps ?? 20) + 10 : (f.maxSteps ?? 20)) });
    const budget = h("input", { id: "resume-token-budget", type: "number", min: "1", step: "1",
      value: f.tokenBudget ? String(f.failureKind === "token_budget" ? f.tokenBudget * 2 : f.tokenBudget) : "" });
    const message = h("textarea", { id: "resume-message", rows: "2" });
    const problem = h("p", { class: "error", role: "alert" });
    const submit = h("button", { type: "submit", class: "primary" }, "Resume");
    return h("form", { class: "resume inline-form", onsubmit: async (event) => {
      event.preventDefault();
      submit.disabled = true;
      problem.textContent = "";
      const body = {};
      if (steps.value) body.max_steps = Number(steps.value);
      if (budget.value) body.token_budget = Number(budget.value);
      if (message.value.trim()) body.message = message.value;
      try {
        const view = await this.resume(body, problem);
        problem.textContent = "resumed; reading the task again…";
        await this.untilResumed(view);
        await this.load();
      } catch (error) {
        problem.textContent = `Not resumed: ${error.message}`;
        submit.disabled = false;
      }
    } },
    h("h2", {}, "Resume from the last good point"),
    h("div", { class: "field" }, h("label", { for: "resume-max-steps" }, "Max steps"), steps),
    h("div", { class: "field" }, h("label", { for: "resume-token-budget" }, "Token budget"), budget),
    h("div", { class: "field" }, h("label", { for: "resume-message" }, "Message to add (optional)"), message),
    submit, problem);
  }

  /** Bring the resume form into focus, with the message typed in the box (nothing is lost). */
  openResume(text) {
    const form = this.main.querySelector("form.resume");
    const message = form?.querySelector("#resume-message");
    if (message && !message.value.trim() && text.trim()) message.value = text;
    form?.querySelector("input")?.focus();
  }

  /** POST /resume; right after a limit the run stays open a moment to meet a resume, and
   * the API refuses until it has closed: ask again for a few seconds. */
  async resume(body, problem) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await api(`/tasks/${seg(this.taskId)}/resume`, { method: "POST", body });
      } catch (error) {
        const closing = error instanceof ApiError && error.status === 409 && /has not failed/.test(error.message);
        if (!closing || attempt >= RESUME_RETRIES) throw error;
        problem.textContent = "waiting for the failed run to close…";
        await new Promise((resolve) => setTimeout(resolve, RESUME_RETRY_MS));
      }
    }
  }

  /** Wait (briefly) until the reset task has taken the resumption in. */
  async untilResumed(view) {
    for (let attempt = 0; view.state.status === "failed" && attempt < RESUME_RETRIES; attempt++) {
      await new Promise((resolve) => setTimeout(resolve, RESUME_RETRY_MS));
      view = await api(`/tasks/${seg(this.taskId)}`);
    }
  }

  async cancel(button) {
    button.disabled = true;
    try {
      await api(`/tasks/${seg(this.taskId)}/cancel`, { method: "POST" });
      button.textContent = "cancelling…";
    } catch (error) {
      this.notice.textContent = `Not cancelled: ${error.message}`;
      button.disabled = false;
    }
  }

  renderOutcome() {
    const f = this.fold;
    const key = JSON.stringify([f.status, f.resultSeq, f.failureKind, f.failure]);
    if (this.outcomeKey === key) return; // keep focus where it is
    this.outcomeKey = key;
    if (f.status === "done") {
      // The answer itself is shown once, in its turn; here only the way to it.
      replace(this.outcome, h("p", { class: "answered" },
        f.turn > 0 ? `Answered follow-up ${f.turn}. ` : "Answered. ",
        h("button", { type: "button", class: "link", onclick: () => this.showAnswer() }, "Go to the answer"),
        " · ",
        h("button", { type: "button", class: "link", onclick: () => this.box.focus() }, "Write a follow-up")));
    } else if (f.status === "failed" || f.status === "cancelled") {
      replace(this.outcome, h("section", { class: `failure status-${f.status}` }, h("h2", {}, f.status === "failed" ? "Failed" : "Cancelled"),
        h("p", { class: "text" }, f.failureKind ? h("strong", {}, `${f.failureKind}: `) : null, f.failure ?? "")));
    } else {
      replace(this.outcome);
    }
  }

  renderPending() {
    const pending = this.fold.pending;
    for (const [requestId, card] of this.cards) {
      if (!pending.has(requestId) && !card.decided) {
        card.element.remove();
        this.cards.delete(requestId);
      }
    }
    for (const [requestId, request] of pending) {
      if (this.cards.has(requestId)) {
        this.cards.get(requestId).refreshAge();
        continue;
      }
      const card = approvalCard({ ...request, task_id: this.taskId }, {
        me: this.session.name, canDecide: this.canDecide, showTask: false,
      });
      this.cards.set(requestId, card);
      this.pendingList.append(card.element);
    }
  }

  /** Each pending question's answer box, under the question in the conversation (or with
   * the approvals, when its row is not drawn); gone once it is answered or timed out. */
  renderQuestions() {
    const asked = this.fold.questions;
    for (const [requestId, card] of this.questionCards) {
      if (asked.has(requestId)) continue;
      card.element.remove();
      this.questionCards.delete(requestId);
    }
    for (const [requestId, question] of asked) {
      let card = this.questionCards.get(requestId);
      if (card) card.refreshAge();
      else {
        card = questionCard({ ...question, task_id: this.taskId }, {
          me: this.session.name, canAnswer: this.canDecide, showTask: false, showQuestion: false,
          deadline: this.fold.deadline(question),
        });
        this.questionCards.set(requestId, card);
      }
      const home = this.conversation.row(question.seq)?.querySelector(".question-slot") ?? this.pendingList;
      if (card.element.parentElement !== home) home.append(card.element);
    }
  }

  openFork(event, slot) {
    if (slot.firstChild) {
      replace(slot);
      return;
    }
    const id = `fork-${event.seq}`;
    const message = h("textarea", { id: `${id}-message`, rows: "3" });
    const steps = h("input", { id: `${id}-max-steps`, type: "number", min: "1", step: "1" });
    const budget = h("input", { id: `${id}-token-budget`, type: "number", min: "1", step: "1" });
    const problem = h("p", { class: "error", role: "alert" });
    const submit = h("button", { type: "submit", class: "primary" }, "Start the fork");
    replace(slot, h("form", { class: "fork-form inline-form", onsubmit: async (e) => {
      e.preventDefault();
      submit.disabled = true;
      const body = { at_seq: event.seq };
      if (message.value.trim()) body.message = message.value;
      if (steps.value) body.max_steps = Number(steps.value);
      if (budget.value) body.token_budget = Number(budget.value);
      try {
        const created = await api(`/tasks/${seg(this.taskId)}/fork`, { method: "POST", body });
        location.hash = `#/tasks/${seg(created.id)}`;
      } catch (error) {
        problem.textContent = `Not forked: ${error.message}`;
        submit.disabled = false;
      }
    }, onkeydown: (e) => { if (e.key === "Escape") replace(slot); } },
    h("p", { class: "muted" }, `A new task starts from the state just after event #${event.seq}; this one is left as it is.`),
    h("div", { class: "field" }, h("label", { for: `${id}-message` }, "Message to add (optional)"), message),
    h("div", { class: "field" }, h("label", { for: `${id}-max-steps` }, "Max steps (optional)"), steps),
    h("div", { class: "field" }, h("label", { for: `${id}-token-budget` }, "Token budget (optional)"), budget),
    submit, problem));
    message.focus();
  }
}
