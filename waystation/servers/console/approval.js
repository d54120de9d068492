// One pending approval request as a card: what the tool would do, why it asks, and (for an
// approver) approve, reject with a message, or edit the arguments and approve.

import { ApiError, api, idempotencyKey, seg } from "./api.js";
import { cardHead, taskLines } from "./card.js";
import { h, pretty, replace } from "./dom.js";

const VERBS = { approve: "approved", reject: "rejected", timeout: "timed out" };

/** "approved by you (alice)", "rejected by bob: not there", "timed out". */
export function describeOutcome(outcome, me) {
  const verb = VERBS[outcome.decision] ?? outcome.decision;
  let text = verb;
  if (outcome.decision !== "timeout") {
    const by = outcome.approver ?? "someone (no name: a Temporal signal?)";
    text += ` by ${by === me ? `you (${me})` : by}`;
  }
  if (outcome.message) text += `: ${outcome.message}`;
  return text;
}

/** Arguments on one line, for a compact card: `command="ls -l" timeout_seconds=30`. */
function oneLine(args) {
  return Object.entries(args ?? {}).map(([name, value]) => `${name}=${JSON.stringify(value)}`).join(" ");
}

/** How the request ended, read from the task's state (for requests decided elsewhere). */
export async function lookUpOutcome(taskId, requestId) {
  try {
    const view = await api(`/tasks/${seg(taskId)}`);
    const outcome = view.state.decisions?.[requestId] ?? null;
    const pending = Boolean(view.state.pending_approvals?.[requestId]);
    return { outcome, pending, status: view.state.status };
  } catch (error) {
    return { outcome: null, status: null, error };
  }
}

/**
 * A card for `item` ({task_id, task, request_id, tool, arguments, reason, model_reason,
 * requested_at, step, chain}). `onDecided(item, text, outcome)` is called once it is decided,
 * here or elsewhere. Returns {element, approve(), reject(), edit(), refreshAge(), gone()}.
 */
export function approvalCard(item, { me, canDecide, showTask = true, onDecided = () => {} }) {
  const outcomeLine = h("p", { class: "outcome", role: "status" });
  const formSlot = h("div", { class: "form-slot" });
  const head = cardHead(h("span", { class: "tool" }, item.tool), item);
  let decided = false;
  let busy = false;

  const buttons = canDecide
    ? h(
        "div",
        { class: "actions" },
        h("button", { type: "button", class: "approve primary", onclick: () => approve() },
          "Approve", h("kbd", {}, "a")),
        h("button", { type: "button", class: "reject", onclick: () => reject() },
          "Reject…", h("kbd", {}, "r")),
        h("button", { type: "button", class: "edit", onclick: () => edit() },
          "Edit & approve…", h("kbd", {}, "e")),
      )
    : h("p", { class: "muted read-only" }, "Read-only: deciding needs an approver token.");

  const element = h(
    "article",
    {
      class: "card approval",
      tabindex: "-1",
      dataset: { taskId: item.task_id, requestId: item.request_id },
      "aria-label": `${item.tool} on task ${item.task || item.task_id}`,
    },
    head.header,
    showTask ? taskLines(item) : null,
    item.reason ? h("p", { class: "reason" }, h("strong", {}, "Policy: "), item.reason) : null,
    item.model_reason ? h("blockquote", { class: "model-reason" }, h("strong", {}, "Model: "), item.model_reason) : null,
    h("pre", { class: "arguments", "aria-label": "arguments" }, pretty(item.arguments)),
    h("p", { class: "arguments-line" }, oneLine(item.arguments)), // what a compact card shows
    buttons,
    formSlot,
    outcomeLine,
  );

  function settle(text, outcome) {
    if (decided) return;
    decided = true;
    element.classList.add("decided");
    element.dataset.outcome = outcome?.decision ?? "gone";
    buttons.remove();
    replace(formSlot);
    outcomeLine.textContent = text;
    onDecided(item, text, outcome);
  }

  async function send(kind, body) {
    if (decided || busy) return;
    busy = true;
    element.classList.add("busy");
    outcomeLine.textContent = kind === "approve" ? "approving…" : "rejecting…";
    try {
      const outcome = await api(`/tasks/${seg(item.task_id)}/${kind}`, {
        method: "POST",
        // The inbox's item names the call it shows: the API refuses the decision for any other.
        body: { request_id: item.request_id, ...(item.digest ? { shown: item.digest } : {}), ...body },
        headers: { "Idempotency-Key": idempotencyKey() },
      });
      const mine = outcome.approver === me && outcome.decision === kind;
      settle(mine ? describeOutcome(outcome, me) : `Already ${describeOutcome(outcome, me)}`, outcome);
    } catch (error) {
      if (error instanceof ApiError && [404, 409].includes(error.status)) await settleFromState();
      if (!decided) {
        outcomeLine.textContent = error instanceof ApiError && error.status === 403
          ? `Refused: ${error.message}`
          : `Not decided: ${error.message}`;
        outcomeLine.classList.add("error");
      }
    } finally {
      busy = false;
      element.classList.remove("busy");
    }
  }

  /** The request left the pending list: say how it ended and who decided. Not while our
   * own decision is in flight: a poll can see the request leave before the answer comes,
   * and the answer says whose decision won. */
  let looking = null;
  function gone() {
    return busy ? Promise.resolve() : settleFromState();
  }

  function settleFromState() {
    looking ??= lookUp().finally(() => { looking = null; });
    return looking;
  }

  async function lookUp() {
    if (decided) return;
    const found = await lookUpOutcome(item.task_id, item.request_id);
    if (found.pending || found.error) return false; // still waiting, or unknown for now
    if (found.outcome) settle(`Already ${describeOutcome(found.outcome, me)}`, found.outcome);
    else if (found.status) settle(`No longer pending: the task is ${found.status.replace("_", " ")}`, null);
    else settle("No longer pending", null);
  }

  function approve() {
    return send("approve", {});
  }

  function openForm(form, focus) {
    if (decided || !canDecide) return;
    replace(formSlot, form);
    focus.focus();
    focus.select?.();
  }

  function closeForm() {
    replace(formSlot);
    element.focus();
  }

  function reject() {
    const id = `reject-${item.task_id}-${item.request_id}`;
    const message = h("input", { id, type: "text", autocomplete: "off", placeholder: "why, and what to do instead" });
    const form = h(
      "form",
      { class: "inline-form", onsubmit: (event) => {
        event.preventDefault();
        send("reject", { message: message.value.trim() || null });
      }, onkeydown: (event) => {
        if (event.key === "Escape") { event.preventDefault(); closeForm(); }
      } },
      h("label", { for: id }, "Message to the model"),
      message,
      h("div", { class: "actions" },
        h("button", { type: "submit", class: "reject primary" }, "Reject", h("kbd", {}, "Enter")),
        h("button", { type: "button", onclick: closeForm }, "Cancel", h("kbd", {}, "Esc"))),
    );
    openForm(form, message);
  }

  function edit() {
    const id = `edit-${item.task_id}-${item.request_id}`;
    const text = h("textarea", { id, rows: "6", spellcheck: "false", class: "code" });
    text.value = pretty(item.arguments);
    const problem = h("p", { class: "error", role: "alert" });
    const submit = () => {
      let edited;
      try {
        edited = JSON.parse(text.value);
      } catch (error) {
        problem.textContent = `Not JSON: ${error.message}`;
        return;
      }
      if (edited === null || typeof edited !== "object" || Array.isArray(edited)) {
        problem.textContent = "The arguments are a JSON object: {\"name\": value, ...}";
        return;
      }
      send("approve", { arguments: edited });
    };
    const form = h(
      "form",
      { class: "inline-form", onsubmit: (event) => { event.preventDefault(); submit(); },
        onkeydown: (event) => {
          if (event.key === "Escape") { event.preventDefault(); closeForm(); }
          if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); submit(); }
        } },
      h("label", { for: id }, "Arguments (JSON)"),
      text,
      problem,
      h("div", { class: "actions" },
        h("button", { type: "submit", class: "approve primary" }, "Approve with these arguments", h("kbd", {}, "Ctrl+Enter")),
        h("button", { type: "button", onclick: closeForm }, "Cancel", h("kbd", {}, "Esc"))),
    );
    openForm(form, text);
  }

  return {
    element,
    item,
    approve,
    reject,
    edit,
    gone,
    get decided() { return decided; },
    kind: "approval",
    refreshAge: head.refreshAge,
  };
}
