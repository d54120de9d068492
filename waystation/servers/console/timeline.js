// The rows of a task's timeline: one per event, each rendered from the event's data as
// text. Long outputs fold; void text (of a retried attempt, or of a model call a message
// interrupted) is shown struck through; a turn's answer is shown in full once, in its own
// row (as data when the task has an output schema), and the thought that gave it refers to
// it. What a person said, the questions the agent asked them and the answers read as a
// chat; the rest is the turn's work (see turns.js).

import { taskHref } from "./chain.js";
import { dataView } from "./data.js";
import { count, duration, h, moment, pretty } from "./dom.js";

const FOLD_AT = 2000; // characters of an output shown before "show all"

const TITLES = {
  task_started: "Task",
  memory_recalled: "Memory loaded",
  thought: "Thought",
  action: "Action",
  observation: "Observation",
  approval_requested: "Approval requested",
  approval_resolved: "Approval resolved",
  agent_started: "Sub-agent started",
  question_asked: "Question",
  question_answered: "Answer to the question",
  output_rejected: "Answer refused",
  repaired: "Repaired",
  error: "Error",
  resumed: "Resumed",
  user_message: "Message",
  interrupted: "Interrupted",
  context_compacted: "Context compacted",
  model_switched: "Model switched",
  waiting_quota: "Waiting for the quota",
  quota_granted: "Quota granted",
  done: "Answer",
  failed: "Failed",
  cancelled: "Cancelled",
};

/** What a model call waits for under a quota, as `ws status` says it: "for its turn under
 * the quota of openai (requests per minute), about 12 s". */
export function quotaWaitText(wait) {
  let text = `for its turn under the quota of ${wait.quota}`;
  if (wait.limit === "paused") text += " (paused by the provider)";
  else if (wait.limit) text += ` (${wait.limit.replaceAll("_", " ")})`;
  if (wait.expected_seconds !== null && wait.expected_seconds !== undefined) {
    text += `, about ${Math.max(1, Math.round(wait.expected_seconds))} s`;
  }
  return text;
}

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

/** A step's tokens, only the counts that are not zero: "1,234 in (1,100 cached) · 56 out ·
 * 20 reasoning", then its cost when its model has a price (as the CLI's live view shows
 * them). */
export function usageText(usage) {
  if (!usage) return "";
  const cached = [
    usage.cache_read_tokens ? `${count(usage.cache_read_tokens)} cached` : null,
    usage.cache_write_tokens ? `${count(usage.cache_write_tokens)} to cache` : null,
  ].filter(Boolean);
  return [
    usage.input_tokens ? `${count(usage.input_tokens)} in${cached.length ? ` (${cached.join(", ")})` : ""}` : null,
    usage.output_tokens ? `${count(usage.output_tokens)} out` : null,
    usage.reasoning_tokens ? `${count(usage.reasoning_tokens)} reasoning` : null,
    usage.cost_usd != null && (usage.input_tokens || usage.output_tokens)
      ? `$${usage.cost_usd.toFixed(4)}` + (usage.unpriced_tokens ? ` + ${count(usage.unpriced_tokens)} unpriced tokens` : "")
      : null,
  ].filter(Boolean).join(" · ");
}

function usageLine(usage) {
  const text = usageText(usage);
  return text ? h("p", { class: "usage muted" }, `tokens ${text}`) : null;
}

// How each kind of event takes part in the conversation: what a person said, an answer, an
// ending; everything else is the work of its turn, which can be folded away.
const ROLES = {
  task_started: "said",
  user_message: "said",
  question_asked: "asks",
  question_answered: "said",
  done: "answer",
  resumed: "ending",
  failed: "ending",
  cancelled: "ending",
};

/**
 * The void text of a step's attempts, struck through: `retracted` is [{attempt, number, text,
 * why}], `why` "retried" (a failed attempt, `number` its place in its call) or "interrupted"
 * (a message cancelled the call).
 */
export function retractedBlock(retracted) {
  if (!retracted?.length) return null;
  return h("div", { class: "retracted-attempts" },
    retracted.map(({ attempt, number, text, why }) => h("p", { class: "retracted", dataset: { attempt: String(attempt), why } },
      h("span", { class: "retry-mark" }, why === "interrupted"
        ? "interrupted by a message · its text is void: "
        : `attempt ${number ?? attempt} retried · its text is void: `),
      h("del", {}, text || "(no text)"))));
}

/** How a thought's step got to its final attempt: messages that interrupted its model call
 * (`cuts`: the last attempt of each call they cancelled), then retries of the last call. */
function attemptNote(event, cuts = []) {
  const notes = [];
  if (cuts.length) {
    notes.push(cuts.length === 1
      ? "a message interrupted the model call; the step started again with it"
      : `messages interrupted the model call ${cuts.length} times; the step started again with them`);
  }
  const retries = event.attempt - 1 - (cuts.at(-1) ?? 0);
  if (retries > 0) {
    notes.push(`attempt ${retries + 1}: ${retries} earlier attempt${retries > 1 ? "s" : ""} failed and ${retries > 1 ? "were" : "was"} retried`);
  }
  return notes.map((note) => h("p", { class: "retry-mark" }, note));
}

function thoughtBody(event, { streamed, answerBelow }) {
  const parts = [attemptNote(event, streamed?.cuts)];
  parts.push(retractedBlock(streamed?.retracted));
  if (answerBelow) parts.push(h("p", { class: "answer-ref muted" }, "This is the answer, shown in full below."));
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
    h("p", {}, h("span", { class: "tool" }, e.tool), e.is_error ? h("span", { class: "badge status-failed" }, "error") : null,
      e.agent_status ? h("span", { class: `badge status-${e.agent_status}` }, `sub-agent ${e.agent_status}`) : null),
    longText(e.output, "code output"),
  ],
  agent_started: (e) => [
    h("p", {}, "The sub-agent ", h("span", { class: "agent-name" }, e.agent), " works on its own task: ",
      h("a", { href: taskHref(e.child_id), class: "child-link" }, e.child_id)),
  ],
  question_asked: (e) => [
    h("p", { class: "question-text text" }, e.question),
    e.details ? h("p", { class: "details text muted" }, e.details) : null,
    e.choices?.length
      ? h("ul", { class: "choices-list", "aria-label": "Choices" }, e.choices.map((choice) => h("li", { class: "text" }, choice)))
      : null,
    h("div", { class: "question-slot" }), // the answer box while it waits (task.js places it)
  ],
  question_answered: (e, { questionTimeout }) => e.timed_out
    ? [h("p", { class: "text" }, `Nobody answered${questionTimeout ? ` within ${duration(questionTimeout)}` : " in time"}: the model decides without the answer.`)]
    : [h("p", { class: "answer-given text" }, e.answer ?? ""),
       h("p", { class: "muted" }, `to question ${e.request_id} · via ${e.via}`)],
  output_rejected: (e) => [
    h("p", { class: "text" }, h("strong", {}, "It did not fit the output schema: "), e.problem),
    h("p", { class: "muted" }, "The model was told why and asked again."),
  ],
  repaired: (e) => [
    h("p", { class: "text" }, `${e.problem} · reset to history event ${e.reset_to_event} by ${e.by}`),
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
  user_message: (e) => {
    const notes = messageNotes(e);
    return [h("p", { class: "text" }, e.content), notes ? h("p", { class: "muted" }, notes) : null];
  },
  interrupted: (e) => [
    h("p", {}, `A message cancelled the model call of step ${e.interrupted_step}: the text it had streamed is void, and the step starts again with the message.`),
  ],
  context_compacted: (e) => [
    h("p", { class: "muted" }, `messages ${e.start}–${e.end - 1} replaced by a summary`),
    longText(e.summary, "code output"),
  ],
  done: (e) => [e.output !== null && e.output !== undefined
    ? h("div", { class: "answer-data" }, dataView(e.output))
    : h("div", { class: "answer-text text" }, e.result)],
  waiting_worker: (e) => [
    h("p", { class: "text" }, h("strong", {}, "Waiting for a worker that offers: "), e.missing.join(", ")),
    h("p", { class: "muted" }, e.message),
  ],
  model_switched: (e) => [
    h("p", { class: "text" }, "Model ", h("code", {}, e.from_model), ` failed (${e.reason}): going on with `, h("code", {}, e.to_model), "."),
    e.reasoning_dropped
      ? h("p", { class: "muted reasoning-dropped" }, `${e.reasoning_dropped} reasoning item${e.reasoning_dropped > 1 ? "s" : ""} could not carry over.`)
      : null,
  ],
  waiting_quota: (e) => [
    h("p", { class: "text" }, `The model call (attempt ${e.attempt}) waits ${quotaWaitText(e)}.`),
  ],
  quota_granted: (e) => [
    h("p", { class: "muted" }, `The call has its turn under ${e.quota} after ${e.waited_seconds.toFixed(1)} s.`),
  ],
  memory_recalled: (e) => e.problem
    ? [h("p", { class: "text" }, `Memory ${e.namespace} was not loaded: ${e.problem}`)]
    : [
      h("p", { class: "muted" }, `From ${e.namespace}, for “${e.query}”: ${e.items.length ? "" : "nothing matched."}`),
      ...e.items.map((item) => h("p", { class: "text" }, h("strong", {}, `${item.key}: `), item.value)),
    ],
  worker_found: (e) => [h("p", { class: "muted" }, e.worker ? `taken up by ${e.worker}` : "a worker that offers it took the call")],
  failed: (e) => [h("p", { class: "text" }, h("strong", {}, `${e.kind}: `), e.reason)],
  cancelled: (e) => [h("p", { class: "text" }, e.reason)],
};

const VIA = { fork: "added by the fork", resume: "added by the resume" };

/** What else a message says: how it came, what it did to the turn. */
function messageNotes(e) {
  return [
    VIA[e.via],
    e.interrupted ? "it interrupted the model call in flight" : null,
    e.max_steps ? `max steps from now on: ${e.max_steps}` : null,
  ].filter(Boolean).join(" · ");
}

/** Who said it: the sender of a message (a Python or Temporal client may name nobody), or
 * the person who answered a question. */
function speaker(event) {
  if (event.type === "question_answered") {
    if (event.timed_out) return null;
    return event.answerer ? h("span", { class: "sender" }, `from ${event.answerer}`) : h("span", { class: "sender muted" }, "no answerer named");
  }
  if (event.type !== "user_message") return null;
  if (event.sender) return h("span", { class: "sender" }, `from ${event.sender}`);
  return VIA[event.via] ? null : h("span", { class: "sender muted" }, "no sender named");
}

/**
 * One timeline row for `event`. `streamed`: what a thought's step streamed ({retracted,
 * final, differs, cuts}); `answerBelow`: the thought's text is its turn's answer, shown in
 * full in the next row; `questionTimeout`: how long a question waits (seconds), for a
 * timeout's row; `onFork(event, slot)` opens the fork form.
 */
export function eventRow(event, { streamed, answerBelow, questionTimeout, onFork }) {
  const slot = h("div", { class: "fork-slot" });
  const render = BODIES[event.type] ?? ((e) => [h("pre", { class: "code" }, pretty(e))]);
  const body = render(event, { streamed, answerBelow, questionTimeout });
  const role = ROLES[event.type] ?? "work";
  const row = h(
    "li",
    {
      class: `event type-${event.type} ${role}`,
      // An answer can be brought into view and focus ("Go to the answer").
      tabindex: role === "answer" ? "-1" : undefined,
      dataset: { seq: String(event.seq), type: event.type, step: String(event.step) },
    },
    h("div", { class: "event-head" },
      h("span", { class: "seq" }, `#${event.seq}`),
      h("span", { class: "type" }, TITLES[event.type] ?? event.type),
      speaker(event),
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
