// The task list (status filter, search by task text, pages) and the start-task form.

import { ApiError, api, idempotencyKey } from "./api.js";
import { ago, count, h, moment, refreshAges, replace, statusBadge } from "./dom.js";

const PAGE_SIZE = 25;
const REFRESH_MS = 3000;

/** The task list; returns its unmount function. */
export function mountTaskList(main, { session }) {
  const params = new URLSearchParams(sessionStorage.getItem("waystation.list") ?? "");
  const status = h("select", { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any status"),
    session.statuses.map((s) => h("option", { value: s }, s.replace("_", " "))));
  status.value = params.get("status") ?? "";
  const search = h("input", { id: "filter-text", name: "q", type: "search", autocomplete: "off", placeholder: "words in the task" });
  search.value = params.get("q") ?? "";
  const rows = h("tbody");
  const note = h("p", { class: "muted", role: "status", "aria-live": "polite" });
  const trouble = h("p", { class: "error", role: "alert" });
  const newer = h("button", { type: "button", onclick: () => turn(-1) }, "← Newer");
  const older = h("button", { type: "button", onclick: () => turn(1) }, "Older →");
  let tokens = [null]; // page tokens of the pages seen, tokens[i] opens page i
  let page = 0;
  let nextToken = null;
  let shown = "";
  let timer = null;
  let typingTimer = null;
  let generation = 0;

  const filters = h(
    "form",
    { class: "filters", role: "search", onsubmit: (event) => { event.preventDefault(); restart(); } },
    h("label", { for: "filter-status" }, "Status"), status,
    h("label", { for: "filter-text" }, "Search task text"), search,
    h("button", { type: "submit" }, "Search"),
  );
  status.addEventListener("change", restart);
  search.addEventListener("input", () => {
    clearTimeout(typingTimer);
    typingTimer = setTimeout(restart, 300);
  });

  replace(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Tasks"), h("a", { class: "button primary", href: "#/new" }, "New task")),
    filters,
    trouble,
    h("table", { class: "tasks" },
      h("thead", {}, h("tr", {}, ["Task", "Status", "Step", "Started", "Finished"].map((t) => h("th", { scope: "col" }, t)))),
      rows),
    h("div", { class: "pager" }, newer, older, note),
  );

  function restart() {
    sessionStorage.setItem("waystation.list", new URLSearchParams({ status: status.value, q: search.value }).toString());
    tokens = [null];
    page = 0;
    load();
  }

  function turn(step) {
    if (step > 0 && !nextToken) return;
    if (step > 0) tokens[page + 1] = nextToken;
    page = Math.max(0, page + step);
    load();
  }

  async function load(quiet = false) {
    clearTimeout(timer);
    const mine = ++generation;
    const query = new URLSearchParams({ page_size: String(PAGE_SIZE) });
    if (status.value) query.set("status", status.value);
    if (search.value.trim()) query.set("q", search.value.trim());
    if (tokens[page]) query.set("page_token", tokens[page]);
    try {
      const result = await api(`/console/api/tasks?${query}`);
      if (mine !== generation) return;
      trouble.textContent = "";
      nextToken = result.next_page_token;
      const fingerprint = JSON.stringify(result.tasks);
      if (!quiet || fingerprint !== shown) show(result);
      else refreshAges(rows);
      shown = fingerprint;
    } catch (error) {
      if (mine !== generation) return;
      trouble.textContent = `The list could not be read: ${error.message}`;
    }
    newer.disabled = page === 0;
    older.disabled = !nextToken;
    // The first page follows new tasks and status changes; later pages stay as they are.
    if (page === 0) timer = setTimeout(() => load(true), REFRESH_MS);
  }

  // On a phone the table is a list of cards: each cell says what it is (data-label), and the
  // Finished column is left out (the latest activity says when a task last did something).
  function show(result) {
    replace(rows, result.tasks.map((task) =>
      h("tr", { dataset: { taskId: task.id } },
        h("td", { class: "task-cell" },
          h("a", { class: "task-text", href: `#/tasks/${encodeURIComponent(task.id)}` }, task.task || task.id),
          activity(task),
          h("div", { class: "muted id" }, task.id)),
        h("td", { class: "status-cell", dataset: { label: "Status" } }, statusBadge(task.status)),
        h("td", { class: "number", dataset: { label: "Step" } }, task.step ?? "—"),
        h("td", { class: "started", dataset: { label: "Started" } }, moment(task.started_at)),
        h("td", { class: "finished", dataset: { label: "Finished" } }, moment(task.closed_at)))));
    if (!result.tasks.length) rows.append(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No task here.")));
    const searching = search.value.trim() ? ` (searched ${result.scanned} tasks)` : "";
    note.textContent = `Page ${page + 1}: ${result.tasks.length} tasks${searching}.`;
  }

  document.title = "Tasks · waystation";
  load();
  return () => {
    generation++;
    clearTimeout(timer);
    clearTimeout(typingTimer);
  };
}

/** "2 turns · 3 min ago · 1,234 tokens · cache hit 80%": a conversation's turns, when it last
 * did something, and its tokens. */
function activity(task) {
  const parts = [];
  if (task.turns) parts.push(h("span", { class: "turns" }, `${task.turns} turn${task.turns === 1 ? "" : "s"}`));
  if (task.last_activity_at) parts.push(ago(task.last_activity_at, "latest"));
  const usage = task.usage;
  if (usage && (usage.input_tokens || usage.output_tokens)) {
    // The cache-hit ratio only where the endpoint reported caching (no cache is no 0% hit).
    const cached = usage.cache_read_tokens || usage.cache_write_tokens;
    // The cost only where a priced model was called (an unpriced one is no $0).
    const cost = usage.cost_usd != null
      ? ` · $${usage.cost_usd.toFixed(4)}` + (usage.unpriced_tokens ? ` + ${count(usage.unpriced_tokens)} unpriced tokens` : "")
      : "";
    parts.push(h("span", { class: "row-usage" }, `${count(usage.input_tokens + usage.output_tokens)} tokens` + cost +
      (cached ? ` · cache hit ${Math.round((usage.cache_hit_ratio ?? 0) * 100)}%` : "")));
  }
  if (!parts.length) return null;
  return h("div", { class: "task-activity muted" }, parts.flatMap((part, i) => (i ? [" · ", part] : [part])));
}

const RULES = ["always", "never", "outside_scratch"];
// Looser to stricter: only an approver may choose a rule looser than a tool's default (the
// API refuses it from a reader; the form does not offer it).
const STRICTNESS = { never: 0, outside_scratch: 1, always: 2 };

function field(id, label, control, hint) {
  return h("div", { class: "field" },
    h("label", { for: id }, label),
    control,
    hint ? h("p", { class: "hint muted", id: `${id}-hint` }, hint) : null);
}

function numberInput(id, value, min) {
  return h("input", { id, name: id, type: "number", min: String(min), step: "1", inputmode: "numeric", value: value ?? "" });
}

/** The start-task form; returns its unmount function. */
export function mountNewTask(main, { session }) {
  const key = idempotencyKey(); // one per form: a double submit starts one task
  const task = h("textarea", { id: "new-task", name: "task", rows: "5", required: true, "aria-describedby": "new-task-hint" });
  const model = h("input", { id: "new-model", name: "model", type: "text", autocomplete: "off", value: session.default_model, required: true });
  const maxSteps = numberInput("new-max-steps", "20", 1);
  maxSteps.max = String(session.max_steps_cap);
  const mayLoosen = session.role === "approver";
  const budget = numberInput("new-token-budget", "", 1);
  const timeout = numberInput("new-approval-timeout", "", 1);
  const onTimeout = h("select", { id: "new-on-timeout", name: "on_timeout" },
    h("option", { value: "reject" }, "reject the call"), h("option", { value: "fail" }, "fail the task"));
  const rules = session.tools.map((tool) => {
    const id = `new-rule-${tool.name}`;
    const select = h("select", { id, name: id, dataset: { tool: tool.name } },
      h("option", { value: "" }, `default (${tool.approval.replace("_", " ")})`),
      RULES.filter((rule) => mayLoosen || STRICTNESS[rule] >= STRICTNESS[tool.approval])
        .map((rule) => h("option", { value: rule }, rule.replace("_", " "))));
    return field(id, tool.name, select);
  });
  const problem = h("div", { class: "error", role: "alert" });
  const submit = h("button", { type: "submit", class: "primary" }, "Start task");

  const form = h(
    "form",
    { class: "new-task", onsubmit: (event) => { event.preventDefault(); start(); } },
    h("h1", {}, "New task"),
    field("new-task", "Task", task, "What the agent should do."),
    field("new-model", "Model", model, "A model name at the configured endpoint, or \"offline\"."),
    h("fieldset", {}, h("legend", {}, "Limits"),
      field("new-max-steps", "Max steps", maxSteps, `At most ${session.max_steps_cap}.`),
      field("new-token-budget", "Token budget", budget, "Tokens in and out over all steps; empty: no budget.")),
    h("fieldset", {}, h("legend", {}, "Approval policy"),
      h("div", { class: "rules" }, rules),
      h("div", { class: "rules" },
        field("new-approval-timeout", "Approval timeout (seconds)", timeout, "Empty: 7 days."),
        field("new-on-timeout", "When nobody decides in time", onTimeout))),
    problem,
    submit,
  );
  replace(main, form);
  document.title = "New task · waystation";
  task.focus();

  async function start() {
    const body = { task: task.value, model: { name: model.value.trim() } };
    if (maxSteps.value) body.max_steps = Number(maxSteps.value);
    if (budget.value) body.token_budget = Number(budget.value);
    const policy = {};
    for (const select of form.querySelectorAll("select[data-tool]")) {
      if (select.value) policy[select.dataset.tool] = select.value;
    }
    body.approval = { policy, on_timeout: onTimeout.value };
    if (timeout.value) body.approval.timeout_seconds = Number(timeout.value);
    submit.disabled = true;
    replace(problem);
    try {
      const created = await api("/tasks", { method: "POST", body, headers: { "Idempotency-Key": key } });
      location.hash = `#/tasks/${encodeURIComponent(created.id)}`;
    } catch (error) {
      submit.disabled = false;
      replace(problem, `Not started: ${error.message}`);
      if (error instanceof ApiError && error.fields) {
        problem.append(h("ul", {}, error.fields.map((f) => h("li", {}, `${f.loc.slice(1).join(".") || "body"}: ${f.msg}`))));
      }
    }
  }
  return () => {};
}
