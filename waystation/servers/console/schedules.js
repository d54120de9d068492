// The Schedules page: each schedule, when it fires, its next and last runs, links to their
// tasks; a trigger for anyone who may start tasks, pause and resume for an approver.

import { api } from "./api.js";
import { h, moment, replace } from "./dom.js";

const REFRESH_MS = 5000;
const RUNS_SHOWN = 3;

/** An interval in its largest whole unit: "1 d", "90 min", "45 s". */
function interval(seconds) {
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
    if (seconds >= size && seconds % size === 0) return `${seconds / size} ${unit}`;
  }
  return `${seconds} s`;
}

/** When a schedule fires, in a few words: "cron 0 9 * * 1-5 (Europe/Paris)", "every 1 h". */
function timing(schedule) {
  const parts = [
    ...schedule.cron.map((c) => `cron ${c}`),
    ...schedule.every_seconds.map((s) => `every ${interval(s)}`),
  ];
  return parts.join(", ") + (schedule.timezone ? ` (${schedule.timezone})` : "");
}

function taskLink(taskId) {
  return h("a", { class: "id", href: `#/tasks/${encodeURIComponent(taskId)}` }, taskId);
}

/** The schedule list; returns its unmount function. */
export function mountSchedules(main, { session }) {
  const rows = h("tbody");
  const trouble = h("p", { class: "error", role: "alert" });
  const note = h("p", { class: "muted", role: "status", "aria-live": "polite" });
  let timer = null;
  let stopped = false;

  replace(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Schedules")),
    h("p", { class: "muted" }, "Tasks that start on a cron expression or an interval (",
      h("code", {}, "ws schedule create"), ", ", h("code", {}, "POST /schedules"),
      "). Each firing is a task; the Temporal UI shows the same schedules."),
    trouble,
    h("table", { class: "tasks schedules" },
      h("thead", {}, h("tr", {}, ["Schedule", "When", "Next run", "Last runs", ""].map((t) => h("th", { scope: "col" }, t)))),
      rows),
    note,
  );

  async function act(name, verb) {
    try {
      await api(`/schedules/${encodeURIComponent(name)}/${verb}`, { method: "POST" });
      trouble.textContent = "";
      note.textContent = `Schedule ${name}: ${verb === "trigger" ? "fired now" : `${verb}d`}.`;
    } catch (error) {
      trouble.textContent = `Schedule ${name} could not be ${verb === "trigger" ? "triggered" : `${verb}d`}: ${error.message}`;
    }
    load();
  }

  function buttons(schedule) {
    const list = [h("button", { type: "button", onclick: () => act(schedule.name, "trigger") }, "Run now")];
    if (session.role === "approver") {
      const verb = schedule.paused ? "resume" : "pause";
      list.push(h("button", { type: "button", onclick: () => act(schedule.name, verb) }, schedule.paused ? "Resume" : "Pause"));
    }
    return list;
  }

  function runs(schedule) {
    if (schedule.conversation && schedule.task_id) {
      return h("div", {}, "every firing continues ", taskLink(schedule.task_id));
    }
    if (!schedule.recent_runs.length) return h("span", { class: "muted" }, "none yet");
    return h("ul", { class: "runs" }, schedule.recent_runs.slice(0, RUNS_SHOWN).map((run) =>
      h("li", {}, taskLink(run.task_id), " ", moment(run.scheduled_at))));
  }

  function show(schedules) {
    replace(rows, schedules.map((schedule) =>
      h("tr", { dataset: { schedule: schedule.name } },
        h("td", { class: "task-cell" },
          h("strong", {}, schedule.name), " ",
          schedule.paused ? h("span", { class: "badge status-cancelled", title: schedule.note ?? "" }, "paused") : null,
          h("div", { class: "task-text" }, schedule.text),
          schedule.tenant ? h("div", { class: "muted" }, `tenant ${schedule.tenant}`) : null),
        h("td", { dataset: { label: "When" } }, timing(schedule),
          h("div", { class: "muted" }, `fired ${schedule.fired}, skipped ${schedule.skipped}`)),
        h("td", { class: "next", dataset: { label: "Next run" } },
          schedule.paused || !schedule.next_runs.length ? h("span", { class: "muted" }, "—") : moment(schedule.next_runs[0])),
        h("td", { class: "last", dataset: { label: "Last runs" } }, runs(schedule)),
        h("td", { class: "actions" }, buttons(schedule)))));
    if (!schedules.length) rows.append(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No schedule yet.")));
  }

  async function load() {
    clearTimeout(timer);
    try {
      const result = await api("/schedules");
      if (stopped) return;
      trouble.textContent = "";
      show(result.schedules);
    } catch (error) {
      if (stopped) return;
      trouble.textContent = `The schedules could not be read: ${error.message}`;
    }
    timer = setTimeout(load, REFRESH_MS);
  }

  document.title = "Schedules · waystation";
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
