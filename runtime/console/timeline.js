// The rows of a task's timeline: one per event, each rendered from the event's data as
// text. Long outputs fold; retried attempts of a step show their void text struck through;
// the answer the Result box shows in full is referred to, not repeated.

import { h, moment, pretty } from "./dom.js";

const FOLD_AT = 2000; // characters of an output shown before "show all"

const TITLES = {
  task_started: "Task started",
  thought: "Thought",
  action: "Action",
  observation: "Observation",
  approval_requested: "Approval requested",
  approval_resolved: "Approval resolved",
  error: "Error",
  resumed: "Resumed",
  user_message: "User message",
  context_compacted: "Context compacted",
  done: "Done",
  failed: "Failed",
  cancelled: "Cancelled",
};

/** A long text, folded after FOLD_AT characters with a button to show the rest. */
function longText(text, className) {
  const block = h("pre", { class: className });
  if (text.length <= FOLD_AT) {
    block.textContent = text;
    return block;
  }
  block.textContent = text.slice(0, FOLD_AT);
  const more = h("button", { type: "button", class: "link", onclick: () => {
    block.textContent = text;
    more.remove();
  } }, `show all ${text.length.toLocaleString()} characters`);
  return h("div", {}, block, more);
}

function usageLine(usage) {
  if (!usage || (!usage.input_tokens && !usage.output_tokens)) return null;
  return h("p", { class: "usage muted" }, `${usage.input_tokens} tokens in · ${usage.output_tokens} out`);
}

/** The void text of attempts that were retried (struck through), then a note per attempt. */
export function retractedBlock(retracted) {
  if (!retracted?.length) return null;
  return h("div", { class: "retracted-attempts" },
    retracted.map(({ attempt, text }) => h("p", { class: "retracted", dataset: { attempt: String(attempt) } },
      h("span", { class: "retry-mark" }, `attempt ${attempt} retried · its text is void: `),
      h("del", {}, text || "(no text)"))));
}

/** Where a row's answer is shown instead of in the row: under Result, or in the thought above. */
function answerReference(event, answer, onShowAnswer) {
  if (answer?.at === "result" && event.type === "thought") {
    return h("p", { class: "answer-ref muted" }, "This is the answer, shown under Result above.");
  }
  if (answer?.at === "result") {
    return h("p", { class: "answer-ref muted" }, "Finished: the answer is shown under Result, above. ",
      h("button", { type: "button", class: "link", onclick: onShowAnswer }, "Go to the result"));
  }
  if (answer?.at === "thought") {
    return h("p", { class: "answer-ref muted" }, `Finished: the answer is the thought just above (#${answer.seq}).`);
  }
  return null;
}

function thoughtBody(event, { streamed, answer, onShowAnswer }) {
  const parts = [];
  if (event.attempt > 1) {
    parts.push(h("p", { class: "retry-mark" }, `attempt ${event.attempt}: ${event.attempt - 1} earlier attempt${event.attempt > 2 ? "s" : ""} failed and ${event.attempt > 2 ? "were" : "was"} retried`));
  }
  parts.push(retractedBlock(streamed?.retracted));
  if (answer) parts.push(answerReference(event, answer, onShowAnswer));
  else if (event.content) parts.push(h("p", { class: "text" }, event.content));
  else if (!event.tool_calls.length) parts.push(h("p", { class: "muted" }, "(no text)"));
  if (streamed?.differs) {
    parts.push(h("p", { class: "muted note" }, "the streamed text differed from the final text"));
  }
  if (event.tool_calls.length) {
    parts.push(h("ul", { class: "calls" }, event.tool_calls.map((call) =>
      h("li", {}, h("span", { class: "tool" }, call.tool), " ", h("code", {}, call.raw_arguments),
        call.problem ? h("span", { class: "error" }, ` — ${call.problem}`) : null))));
  }
  parts.push(usageLine(event.usage));
  return parts;
}

function argumentsBlock(args, raw) {
  return h("pre", { class: "arguments" }, args ? pretty(args) : raw ?? "");
}

const BODIES = {
  task_started: (e) => [
    h("p", { class: "text" }, e.task.task),
    h("p", { class: "muted" }, `model ${e.task.model.name} · max ${e.task.max_steps} steps` +
      (e.task.token_budget ? ` · budget ${e.task.token_budget} tokens` : "") +
      (e.task.tools ? ` · tools ${e.task.tools.join(", ")}` : "")),
  ],
  thought: thoughtBody,
  action: (e) => [
    h("p", {}, h("span", { class: "tool" }, e.tool), e.needs_approval ? h("span", { class: "badge" }, "needs approval") : null),
    argumentsBlock(e.arguments, e.raw_arguments),
  ],
  observation: (e) => [
    h("p", {}, h("span", { class: "tool" }, e.tool), e.is_error ? h("span", { class: "badge status-failed" }, "error") : null),
    longText(e.output, "code output"),
  ],
  approval_requested: (e) => [
    h("p", {}, h("span", { class: "tool" }, e.tool), h("span", { class: "muted" }, ` request ${e.request_id}`)),
    e.reason ? h("p", {}, h("strong", {}, "Policy: "), e.reason) : null,
    e.model_reason ? h("p", {}, h("strong", {}, "Model: "), e.model_reason) : null,
    argumentsBlock(e.arguments),
  ],
  approval_resolved: (e) => [
    h("p", {}, h("span", { class: `badge decision-${e.decision}` }, e.decision),
      ` ${e.decision === "timeout" ? "nobody decided in time" : `by ${e.approver ?? "someone"}`} · via ${e.via} · request ${e.request_id}`),
    e.message ? h("p", { class: "text" }, h("strong", {}, "Message: "), e.message) : null,
    e.arguments ? h("div", {}, h("p", { class: "muted" }, "edited arguments:"), argumentsBlock(e.arguments)) : null,
  ],
  error: (e) => [h("p", { class: "text" }, h("strong", {}, `${e.kind}: `), e.message)],
  resumed: (e) => [
    h("p", {}, `after: ${e.failure ?? "a failure"}${e.failure_kind ? ` (${e.failure_kind})` : ""}`),
    e.max_steps || e.token_budget
      ? h("p", { class: "muted" }, [e.max_steps ? `max steps now ${e.max_steps}` : null, e.token_budget ? `token budget now ${e.token_budget}` : null].filter(Boolean).join(" · "))
      : null,
  ],
  user_message: (e) => [h("p", { class: "text" }, e.content)],
  context_compacted: (e) => [
    h("p", { class: "muted" }, `messages ${e.start}–${e.end - 1} replaced by a summary`),
    longText(e.summary, "code output"),
  ],
  done: (e, { answer, onShowAnswer }) => [
    answerReference(e, answer, onShowAnswer) ?? h("p", { class: "text" }, e.result),
  ],
  failed: (e) => [h("p", { class: "text" }, h("strong", {}, `${e.kind}: `), e.reason)],
  cancelled: (e) => [h("p", { class: "text" }, e.reason)],
};

/**
 * One timeline row for `event`. `streamed`: what a thought's step streamed; `answer`: where
 * its answer is shown instead ({at: "result"} or {at: "thought", seq}), null to show it here;
 * `onShowAnswer()` brings the Result box into view; `onFork(event, slot)` opens the fork form.
 */
export function eventRow(event, { streamed, answer, onShowAnswer, onFork }) {
  const slot = h("div", { class: "fork-slot" });
  const render = BODIES[event.type] ?? ((e) => [h("pre", { class: "code" }, pretty(e))]);
  const body = render(event, { streamed, answer, onShowAnswer });
  const row = h(
    "li",
    {
      class: `event type-${event.type}`,
      dataset: { seq: String(event.seq), type: event.type, step: String(event.step) },
    },
    h("div", { class: "event-head" },
      h("span", { class: "seq" }, `#${event.seq}`),
      h("span", { class: "type" }, TITLES[event.type] ?? event.type),
      h("span", { class: "muted" }, `step ${event.step}`),
      moment(event.at),
      onFork ? h("button", { type: "button", class: "link fork", "aria-label": `Fork from event ${event.seq}`,
        onclick: () => onFork(event, slot) }, "Fork from here") : null),
    h("div", { class: "event-body" }, body),
    slot,
  );
  if (event.type === "thought") {
    // Whether the final attempt's streamed text was exactly the thought's (tests read it).
    row.dataset.streamed = !streamed?.final ? "none" : streamed.differs ? "differs" : "match";
    if (event.attempt > 1) row.dataset.attempt = String(event.attempt);
  }
  return row;
}
