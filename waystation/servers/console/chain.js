// Where a sub-agent sits in its tree, as one line of links: the root task, the agents from
// the root down, the one that called this one linking to its task. Ids and texts are data:
// text nodes only, and every link is built from an encoded id.

import { seg } from "./api.js";
import { h } from "./dom.js";

/** The chain an inbox item names ({root_id, root_task, parent_id, parent_task, path}). */
export function chainOfItem(chain) {
  if (!chain) return null;
  return {
    rootId: chain.root_id, rootText: chain.root_task,
    parentId: chain.parent_id, parentText: chain.parent_task,
    path: chain.path ?? [],
  };
}

/** The chain a sub-agent's task names in its `task_started` event (`task.parent`). */
export function chainOfTask(task) {
  const parent = task?.parent;
  if (!parent) return null;
  return { rootId: parent.root_id, rootText: "", parentId: parent.task_id, parentText: "", path: parent.path ?? [] };
}

export function taskHref(taskId) {
  return `#/tasks/${seg(taskId)}`;
}

/**
 * "Sub-agent of <root task> → planner → shell": the root task links to its page, the agent
 * that called this one to its parent's page, this one is the last name. A direct child of
 * the root names only itself after the root (its parent is the root).
 */
export function chainLine(chain) {
  if (!chain) return null;
  const { path } = chain;
  const steps = path.map((agent, i) => {
    const name = h("span", { class: "agent-name" }, agent);
    if (i === path.length - 1) return h("strong", { class: "chain-self" }, name);
    if (i === path.length - 2) {
      return h("a", { href: taskHref(chain.parentId), class: "chain-parent", title: chain.parentText || chain.parentId }, name);
    }
    return name;
  });
  return h("p", { class: "chain", dataset: { rootId: chain.rootId, parentId: chain.parentId } },
    h("span", { class: "chain-label" }, "Sub-agent of "),
    h("a", { href: taskHref(chain.rootId), class: "chain-root", title: chain.rootId }, chain.rootText || chain.rootId),
    steps.map((step) => [h("span", { class: "chain-arrow" }, " → "), step]));
}
