// What every inbox card shows alike, an approval or a question: what waits and how long,
// the task it belongs to, and the chain of a sub-agent's request.

import { seg } from "./api.js";
import { chainLine, chainOfItem } from "./chain.js";
import { h, moment, since } from "./dom.js";

/** The card's header: `title` (nodes), the request id, how long it has waited. Returns
 * {header, refreshAge()}. */
export function cardHead(title, item) {
  const age = h("span", { class: "age" }, since(item.requested_at));
  const header = h("header", {},
    h("h3", {}, title, h("span", { class: "muted request-id" }, item.request_id)),
    h("p", { class: "waiting" }, "waiting ", age,
      h("span", { class: "waiting-detail" }, " · since ", moment(item.requested_at), ` · step ${item.step}`)));
  return { header, refreshAge() { age.textContent = since(item.requested_at); } };
}

/** "Task <link>", and under it the chain when a sub-agent asks. */
export function taskLines(item) {
  return [
    h("p", { class: "task-line" }, "Task ",
      h("a", { href: `#/tasks/${seg(item.task_id)}`, class: "task-link" }, item.task || item.task_id)),
    chainLine(chainOfItem(item.chain)),
  ];
}
