// A task's sub-agents: each child task its calls started, with the agent, what it was
// asked and how it is doing, each linking to the child's own page. The parent's log says
// when a child started and ended; while a child works, its own state says how (waiting for
// an approval, say), asked every few seconds.

import { api, seg } from "./api.js";
import { taskHref } from "./chain.js";
import { h, replace, statusBadge } from "./dom.js";
import { TERMINAL } from "./stream.js";

const POLL_MS = 2000;

export class SubAgents {
  constructor() {
    this.title = h("h2", {});
    this.list = h("ol", { class: "tree", "aria-label": "Sub-agents of this task" });
    this.element = h("section", { class: "sub-agents", hidden: true }, this.title, this.list);
    this.children = [];
    this.own = new Map(); // child task id -> its status, as its own state says
    this.timer = null;
    this.polling = false;
    this.stopped = false;
    this.shown = null;
  }

  /** The children as the parent's events have them (TaskFold.children), in call order. */
  update(children) {
    this.children = [...children.values()].sort((a, b) => a.step - b.step || a.order - b.order);
    this.render();
    this.schedule(0);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  statusOf(child) {
    if (TERMINAL.has(child.status)) return child.status;
    return this.own.get(child.taskId) ?? child.status;
  }

  render() {
    const rows = this.children.map((child) => [child, this.statusOf(child)]);
    const key = JSON.stringify(rows.map(([child, status]) => [child.taskId, status, child.instruction]));
    if (key === this.shown) return; // drawn again only when it changes (a focused link stays)
    this.shown = key;
    this.element.hidden = rows.length === 0;
    this.title.textContent = `Sub-agents (${rows.length})`;
    replace(this.list, rows.map(([child, status]) => h("li", { class: "child", dataset: { taskId: child.taskId, status } },
      h("span", { class: "agent-name" }, child.agent),
      statusBadge(status),
      h("a", { href: taskHref(child.taskId), class: "child-link" }, child.instruction || child.taskId),
      h("span", { class: "muted child-meta" }, `called at step ${child.step} · `, h("span", { class: "child-id" }, child.taskId)))));
  }

  schedule(delay) {
    if (this.stopped || this.timer || this.polling) return;
    if (!this.children.some((child) => !TERMINAL.has(child.status))) return;
    this.timer = setTimeout(() => this.poll(), delay);
  }

  async poll() {
    this.timer = null;
    this.polling = true;
    const working = this.children.filter((child) => !TERMINAL.has(child.status));
    await Promise.all(working.map(async (child) => {
      try {
        const view = await api(`/tasks/${seg(child.taskId)}`);
        this.own.set(child.taskId, view.state.status);
      } catch {
        // Not readable now (no worker answers?): the parent's view of it stays.
      }
    }));
    this.polling = false;
    if (this.stopped) return;
    this.render();
    this.schedule(POLL_MS);
  }
}
