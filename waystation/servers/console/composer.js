// A task's message box. A message typed while the task works steers it: the model reads it
// at its next call, after the step's tool calls ("interrupt" cancels the model call in
// flight instead). One typed after the answer follows up: the same task goes on. A message
// the API accepted shows as queued until its `user_message` event comes; the tab keeps the
// queue (sessionStorage), so a reload still shows what has not been taken yet.

import { ApiError, api, idempotencyKey, seg } from "./api.js";
import { count, h, replace } from "./dom.js";

const MESSAGE_CHARS = 200_000; // the API's bound on a message, as on a task's text
const QUEUE_KEPT = 50;

// What sending does now, per status of the task.
const WHAT_SENDING_DOES = {
  pending: "Steers the task: the model reads your message at its next call.",
  running: "Steers the task: the model reads your message at its next call, after the current step's tool calls.",
  waiting_approval: "The task waits for an approval: your message is kept, and the model reads it after the decision.",
  waiting_input: "The task waits for an answer to its question (answer it above): your message is kept, and the model reads it after the answer.",
  waiting_quota: "Steers the task: its model call waits for its turn under the quota; the model reads your message at its next call (\"interrupt\" cancels the waiting call).",
  done: "Follows up: the same task goes on, with the whole conversation so far.",
};
// Why nothing can be sent, and which way goes on.
const CLOSED = {
  failed: "This task failed, so it takes no messages: resume it first (Resume, above), with a message if you like.",
  cancelled: "This task was cancelled, so it takes no messages: to go on, fork it from any event (Fork from here).",
};
const READ_ONLY = "Read-only: your token may read this task but not send it messages; that needs an approver token.";

function queueKey(taskId) {
  return `waystation.queued.${taskId}`;
}

/** A queued message's state, in words. */
function queuedNote(message, status) {
  if (status === "failed") return "not taken: the task failed before reading it";
  if (status === "cancelled") return "not taken: the task was cancelled before reading it";
  if (message.followUp || status === "done") return "queued: it starts the next turn once the task takes it";
  if (status === "waiting_approval") return "queued: kept until the approval is decided";
  if (status === "waiting_input") return "queued: kept until the question is answered";
  return message.interrupt
    ? "queued: interrupting the model call in flight"
    : "queued: the model reads it at its next call";
}

export class MessageBox {
  /**
   * The box of task `taskId`. `sender`: who sends (the token's name); `canSend`: the token
   * may send; `onRefused()`: the API said the task takes no messages (read the log to see
   * why); `onResume(text)`: bring the resume form into focus, with the text typed here.
   */
  constructor(taskId, { sender, canSend, onRefused, onResume }) {
    this.taskId = taskId;
    this.sender = sender;
    this.canSend = canSend;
    this.onRefused = onRefused;
    this.status = "pending";
    this.busy = false;
    this.sending = null; // {signature, key}: a message sent again after a failure keeps its key
    this.queue = this.readQueue();
    this.takenIds = new Set(); // ids of messages whose event came

    this.text = h("textarea", {
      id: "message-text", name: "message", rows: "3", spellcheck: "true",
      "aria-describedby": "message-hint message-keys",
      onkeydown: (event) => this.onKey(event),
    });
    this.interrupt = h("input", { id: "message-interrupt", type: "checkbox" });
    this.interruptField = h("div", { class: "check" }, this.interrupt,
      h("label", { for: "message-interrupt" }, "Interrupt the model call in flight"),
      h("span", { class: "muted" }, " (its streamed text is void; a tool call in flight always finishes)"));
    this.maxSteps = h("input", { id: "message-max-steps", type: "number", min: "1", step: "1" });
    this.submit = h("button", { type: "submit", class: "primary" }, "Send");
    this.hint = h("p", { id: "message-hint", class: "hint message-hint" });
    this.goResume = h("button", { type: "button", class: "link", onclick: () => onResume(this.text.value) }, "Go to Resume");
    this.problem = h("p", { class: "error", role: "alert" });
    this.queuedList = h("ol", { class: "queued-messages", "aria-label": "Messages not taken yet" });
    this.options = h("div", { class: "message-options" },
      this.interruptField,
      h("div", { class: "field inline" }, h("label", { for: "message-max-steps" }, "Max steps from now on (optional)"), this.maxSteps));
    this.form = h("form", { class: "message-box", "aria-label": "Send the task a message", onsubmit: (event) => {
      event.preventDefault();
      this.send();
    } },
    h("label", { for: "message-text" }, "Message to the task"),
    h("p", { class: "hint-line" }, this.hint, " ", this.goResume),
    this.text,
    this.options,
    h("div", { class: "actions" }, this.submit,
      h("span", { id: "message-keys", class: "muted keys" }, h("kbd", {}, "Enter"), " sends · ", h("kbd", {}, "Shift+Enter"), " starts a new line")),
    this.problem);
    this.element = h("section", { class: "composer" }, this.queuedList, this.form);
    this.update("pending");
  }

  /** What the box offers for a task in `status`. Typed text is never lost. */
  update(status) {
    this.status = status;
    const closed = !this.canSend ? READ_ONLY : CLOSED[status];
    this.open = !closed;
    this.hint.textContent = closed ?? WHAT_SENDING_DOES[status] ?? WHAT_SENDING_DOES.running;
    this.hint.classList.toggle("closed", Boolean(closed));
    this.goResume.hidden = !(this.canSend && status === "failed");
    this.text.disabled = !this.open;
    this.options.hidden = !this.open; // nothing to choose for a message that cannot be sent
    this.submit.disabled = !this.open || this.busy;
    // Only a model call in flight can be interrupted; an answered task has none.
    this.interruptField.hidden = !["pending", "running", "waiting_quota"].includes(status) || !this.open;
    if (this.interruptField.hidden) this.interrupt.checked = false;
    this.renderQueue();
  }

  /** Its `user_message` event came: message `messageId` is no longer queued. */
  taken(messageId) {
    this.takenIds.add(messageId);
    if (!this.queue.some((m) => m.id === messageId)) return;
    this.queue = this.queue.filter((m) => m.id !== messageId);
    this.saveQueue();
    this.renderQueue();
  }

  focus() {
    this.text.focus();
  }

  onKey(event) {
    // Enter sends, Shift+Enter is a new line; Enter that ends an IME composition is not a send.
    if (event.key !== "Enter" || event.shiftKey || event.altKey || event.isComposing) return;
    event.preventDefault();
    this.form.requestSubmit();
  }

  async send() {
    if (this.busy || !this.open) return;
    const content = this.text.value;
    this.problem.textContent = "";
    if (!content.trim()) {
      this.problem.textContent = "Write a message first: an empty one is not sent.";
      return;
    }
    if (content.length > MESSAGE_CHARS) {
      this.problem.textContent = `A message may have at most ${count(MESSAGE_CHARS)} characters; this one has ${count(content.length)}.`;
      return;
    }
    const body = { content };
    const interrupt = this.interrupt.checked && !this.interruptField.hidden;
    if (interrupt) body.interrupt = true;
    if (this.maxSteps.value) body.max_steps = Number(this.maxSteps.value);
    const signature = JSON.stringify(body);
    if (this.sending?.signature !== signature) this.sending = { signature, key: idempotencyKey() };
    this.busy = true;
    this.submit.disabled = true;
    this.submit.textContent = "Sending…";
    try {
      const accepted = await api(`/tasks/${seg(this.taskId)}/messages`, {
        method: "POST", body, headers: { "Idempotency-Key": this.sending.key },
      });
      this.sending = null;
      this.text.value = "";
      this.maxSteps.value = "";
      this.interrupt.checked = false;
      this.enqueue({ id: accepted.message_id, content, sender: this.sender, interrupt, followUp: accepted.follow_up });
    } catch (error) {
      this.refused(error);
    } finally {
      this.busy = false;
      this.submit.textContent = "Send";
      this.submit.disabled = !this.open;
    }
  }

  /** Say why a message was not sent; the text stays in the box. */
  refused(error) {
    const status = error instanceof ApiError ? error.status : 0;
    if (status === 403) {
      this.canSend = false;
      this.update(this.status);
      this.problem.textContent = `Not sent: ${READ_ONLY}`;
    } else if (status === 409 && error.kind === "task_not_taking_messages") {
      this.problem.textContent = `Not sent: ${error.message}`;
      this.onRefused();
    } else if (status === 422) {
      const field = error.fields?.[0];
      this.problem.textContent = `Not sent: ${field ? `${field.msg} (${(field.loc ?? []).slice(1).join(".") || "message"})` : error.message}`;
    } else {
      this.problem.textContent = `Not sent: ${error.message}. Send it again: it is sent once however often you try.`;
    }
  }

  enqueue(message) {
    // Its event may have come before the API's answer: then it is taken already.
    if (this.takenIds.has(message.id)) return;
    if (this.queue.some((m) => m.id === message.id)) return;
    this.queue = [...this.queue, message].slice(-QUEUE_KEPT);
    this.saveQueue();
    this.renderQueue();
  }

  renderQueue() {
    const key = JSON.stringify([this.status, this.queue.map((m) => m.id)]);
    if (key === this.queueKey) return; // drawn again only when it changes
    this.queueKey = key;
    replace(this.queuedList, this.queue.map((message) => h("li",
      { class: "message queued", dataset: { messageId: message.id } },
      h("p", { class: "event-head" }, h("span", { class: "type" }, "Message"),
        h("span", { class: "sender" }, `from ${message.sender}`),
        h("span", { class: "queued-note" }, queuedNote(message, this.status))),
      h("p", { class: "text" }, message.content))));
  }

  readQueue() {
    try {
      const kept = JSON.parse(sessionStorage.getItem(queueKey(this.taskId)) ?? "[]");
      return Array.isArray(kept) ? kept.filter((m) => typeof m?.id === "string" && typeof m.content === "string") : [];
    } catch {
      return [];
    }
  }

  saveQueue() {
    if (this.queue.length) sessionStorage.setItem(queueKey(this.taskId), JSON.stringify(this.queue));
    else sessionStorage.removeItem(queueKey(this.taskId));
  }
}
