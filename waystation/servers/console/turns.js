// A task's conversation, turn by turn: each turn opens with what a person said (the task's
// own text for the first, then a follow-up) and ends with its answer; its work in between
// (thoughts, actions, observations, approvals) is grouped under it and can be folded away.
// An answered turn folds once a later one begins, unless the person chose otherwise. Rows
// come from timeline.js; this module only places them.

import { count, h } from "./dom.js";

export class Conversation {
  constructor() {
    this.element = h("ol", { class: "conversation", "aria-label": "Conversation" });
    this.turns = new Map(); // turn -> {element, list, toggle, work, answered, folded}
    this.chosen = new Map(); // turn -> folded, as the person chose with its button
  }

  /** Place `row`, an event of `turn`, after the rows shown. */
  append(row, turn) {
    const section = this.section(turn, false);
    section.list.append(row);
    this.counted(section, row);
  }

  /** Place rows of earlier events before those shown; `placed` is [row, turn] in seq order. */
  prepend(placed) {
    for (const [row, turn] of [...placed].reverse()) {
      const section = this.section(turn, true);
      section.list.prepend(row);
      this.counted(section, row);
    }
  }

  /** The row of event `seq`, when it is shown. */
  row(seq) {
    return this.element.querySelector(`li.event[data-seq="${seq}"]`);
  }

  section(turn, atStart) {
    let section = this.turns.get(turn);
    if (section) return section;
    const name = turn === 0 ? "The task" : `Follow-up ${turn}`;
    const toggle = h("button", { type: "button", class: "link turn-toggle", onclick: () => this.choose(turn) });
    const list = h("ol", { class: "timeline", "aria-label": `Events of ${name.toLowerCase()}` });
    const element = h("li", { class: "turn", dataset: { turn: String(turn) } },
      h("div", { class: "turn-head" }, h("h3", {}, name), toggle), list);
    section = { element, list, toggle, work: 0, answered: false, folded: false };
    this.turns.set(turn, section);
    // Turns come in order: forwards while appending, backwards while prepending.
    if (atStart) this.element.prepend(element);
    else this.element.append(element);
    this.settle();
    return section;
  }

  counted(section, row) {
    if (row.classList.contains("work")) section.work += 1;
    if (row.classList.contains("answer") && !section.answered) {
      section.answered = true;
      this.settle();
    }
    this.label(section);
  }

  choose(turn) {
    this.chosen.set(turn, !this.turns.get(turn).folded);
    this.settle();
  }

  /** Fold each answered turn but the latest, unless the person chose otherwise. */
  settle() {
    const latest = Math.max(...this.turns.keys());
    for (const [turn, section] of this.turns) {
      const folded = this.chosen.get(turn) ?? (turn < latest && section.answered);
      if (folded === section.folded) continue;
      section.folded = folded;
      section.element.classList.toggle("folded", folded);
      this.label(section);
    }
  }

  label(section) {
    const { toggle, work, folded } = section;
    toggle.hidden = work === 0;
    toggle.setAttribute("aria-expanded", String(!folded));
    const events = `${count(work)} event${work === 1 ? "" : "s"}`;
    toggle.textContent = folded ? `Show its work (${events})` : `Hide its work (${events})`;
  }
}
