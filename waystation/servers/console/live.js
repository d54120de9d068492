// The live view of a task's model calls: tokens as they stream, per step and attempt. The
// text of an attempt becomes void when the attempt is retried (`llm_retry`) or when a
// message interrupts the call (`interrupted`: every attempt up to its `attempt`); void text
// is shown struck through, never as what the model said. A step's `thought` is the final
// word: its stream ends, and what its attempts streamed is kept for the thought's row.

import { h } from "./dom.js";
import { retractedBlock } from "./timeline.js";

export class LiveSteps {
  /** `onLateText(seq)`: void text came for a step whose thought (event `seq`) is shown. */
  constructor({ onLateText }) {
    this.element = h("div", { class: "live", "aria-live": "off" });
    this.onLateText = onLateText;
    this.streams = new Map(); // step -> {attempts: Map(attempt -> {text, node}), top, block}
    this.finished = new Map(); // step -> {void: Map(attempt -> text), final, differs}
    this.thoughts = new Map(); // step -> its thought event
    this.cuts = new Map(); // step -> the last attempt of each call a message cut, ascending
  }

  token({ step, attempt, text }) {
    const thought = this.thoughts.get(step);
    if (thought) {
      // Its thought is in and is the final word; text of an attempt before it was void.
      if (attempt < thought.attempt) this.lateVoidText(thought, attempt, text);
      return;
    }
    const stream = this.stream(step);
    const entry = this.attempt(stream, attempt);
    entry.text += text;
    if (attempt > stream.top) {
      stream.top = attempt;
      this.render(step);
    } else if (entry.node) {
      entry.node.append(text);
    } else {
      this.render(step);
    }
  }

  /** A new attempt of `step` began: what earlier ones streamed is void. */
  retry({ step, attempt }) {
    if (this.thoughts.has(step)) return;
    const stream = this.stream(step);
    stream.top = Math.max(stream.top, attempt);
    this.attempt(stream, attempt);
    this.render(step);
  }

  /** An `interrupted` event: a message cancelled the model call of its step. */
  interrupted({ interrupted_step: step, attempt }) {
    const cuts = this.cuts.get(step) ?? [];
    if (!cuts.includes(attempt)) cuts.push(attempt);
    cuts.sort((a, b) => a - b);
    this.cuts.set(step, cuts);
    if (this.streams.has(step) && !this.thoughts.has(step)) this.render(step);
  }

  /** A step's thought arrived: its stream is history, kept to show what was void. */
  closed(thought) {
    this.thoughts.set(thought.step, thought);
    const stream = this.streams.get(thought.step);
    if (!stream) return;
    const spoilt = new Map();
    for (const [attempt, { text }] of stream.attempts) {
      if (attempt < thought.attempt) spoilt.set(attempt, text);
    }
    const streamedText = stream.attempts.get(thought.attempt)?.text ?? "";
    this.finished.set(thought.step, {
      void: spoilt,
      final: streamedText !== "",
      differs: streamedText !== "" && streamedText !== thought.content,
    });
    stream.block?.remove();
    this.streams.delete(thought.step);
  }

  /** What the row of `step`'s thought shows of its stream: {retracted, final, differs, cuts}. */
  streamed(step) {
    const done = this.finished.get(step);
    const cuts = this.cuts.get(step) ?? [];
    if (!done) return { retracted: [], final: false, differs: false, cuts };
    return { retracted: this.retracted(step, [...done.void]), final: done.final, differs: done.differs, cuts };
  }

  stream(step) {
    let stream = this.streams.get(step);
    if (!stream) {
      stream = { attempts: new Map(), top: 0, block: null };
      this.streams.set(step, stream);
    }
    return stream;
  }

  attempt(stream, number) {
    let attempt = stream.attempts.get(number);
    if (!attempt) {
      attempt = { text: "", node: null };
      stream.attempts.set(number, attempt);
    }
    return attempt;
  }

  /** The attempt of `step` that may still be the final word: the latest one past every cut. */
  current(step, stream) {
    return Math.max(stream.top, (this.cuts.get(step)?.at(-1) ?? 0) + 1);
  }

  /**
   * `entries` ([attempt, text]) with why each is void: the latest attempt a cut call had
   * streamed was interrupted, the others of that call were retried. `number` counts the
   * attempts of each call from 1 (a call after a cut is numbered past the cut).
   */
  retracted(step, entries) {
    const cuts = this.cuts.get(step) ?? [];
    const callOf = (attempt) => cuts.findIndex((cut) => attempt <= cut);
    const latestOfCall = new Map();
    for (const [attempt] of entries) {
      const call = callOf(attempt);
      if (call >= 0) latestOfCall.set(call, Math.max(latestOfCall.get(call) ?? 0, attempt));
    }
    return entries.sort(([a], [b]) => a - b).map(([attempt, text]) => {
      const call = callOf(attempt);
      const base = call === 0 ? 0 : call > 0 ? cuts[call - 1] : (cuts.at(-1) ?? 0);
      const why = call >= 0 && latestOfCall.get(call) === attempt ? "interrupted" : "retried";
      return { attempt, number: attempt - base, text, why };
    });
  }

  /** Text of a void attempt that arrives after its step's thought (a page opened late). */
  lateVoidText(thought, attempt, text) {
    const done = this.finished.get(thought.step) ?? { void: new Map(), final: false, differs: false };
    done.void.set(attempt, (done.void.get(attempt) ?? "") + text);
    this.finished.set(thought.step, done);
    this.onLateText(thought.seq);
  }

  /** The streaming block of `step`: void attempts struck through, the current one growing. */
  render(step) {
    const stream = this.streams.get(step);
    if (!stream) return;
    const current = this.current(step, stream);
    const spoilt = [...stream.attempts].filter(([n]) => n < current).map(([n, { text }]) => [n, text]);
    for (const [n, entry] of stream.attempts) if (n !== current) entry.node = null;
    const entry = this.attempt(stream, current);
    entry.node = h("p", { class: "text live-text", dataset: { attempt: String(current) } }, entry.text);
    const cut = this.cuts.get(step)?.at(-1) ?? 0;
    const marks = [
      cut ? "restarted after a message interrupted it" : null,
      current - cut > 1 ? `attempt ${current - cut}` : null,
    ].filter(Boolean);
    const block = h("div", { class: "live-step", dataset: { step: String(step) } },
      h("p", { class: "event-head" }, h("span", { class: "type" }, "Streaming"), h("span", { class: "muted" }, `step ${step}`),
        marks.length ? h("span", { class: "retry-mark" }, ` ${marks.join(" · ")}`) : null),
      retractedBlock(this.retracted(step, spoilt)),
      entry.node);
    if (stream.block) stream.block.replaceWith(block);
    else this.element.append(block);
    stream.block = block;
  }
}
