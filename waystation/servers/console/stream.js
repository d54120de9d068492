// Following a task's stream: Server-Sent Events read through fetch(), because EventSource
// cannot send the Authorization header. Every item carries its offset; after any cut (the
// API restarted, the network dropped) the follower asks again with Last-Event-ID (the last
// offset it took), and drops anything older it is sent, so no item is shown twice or
// missed. With `follow` the stream goes on across a conversation's turns: an answer is not
// its end, only a cancellation is (a failure may still be resumed).

import { authHeaders, seg, signalUnauthorized } from "./api.js";

// The statuses a task ends a turn with, named as the events that end it (TERMINAL_STATUSES
// of waystation/vocabulary.py: tests/test_console_api.py checks they are the same).
export const TERMINAL = new Set(["done", "failed", "cancelled"]);
// Nothing comes after these; an answer only ends a stream that does not follow the turns.
const ENDINGS = new Set(["done", "cancelled"]);
const FOLLOWED_ENDINGS = new Set(["cancelled"]);
const FIRST_RETRY_MS = 250;
const LAST_RETRY_MS = 2000;
// A failed task may be resumed (from here, the CLI or another page): the stream is asked
// again this often for what comes after the failure.
const FAILED_RECHECK_MS = 3000;
// A stream that closes cleanly this many times in a row without a single item has nothing
// more to say (a run closed without an ending, e.g. terminated): stop asking.
const EMPTY_CLOSES = 3;

/**
 * Follow task `taskId` from offset `since`. `onItem({offset, type, data})` gets each item
 * once, in order; `onState(state)` hears "connecting", "live", "reconnecting", "failed"
 * (the task failed; still watching for a resume), "ended", "quiet", "gone" or
 * "unauthorized". `isLatest(item)` tells whether a terminal item is the task's last word
 * (a failure followed by a resume is not: the stream goes on past it). With `follow` the
 * stream goes on past each answer (`?follow=true`). Returns {stop(), next} where `next` is
 * the next offset wanted.
 */
export function followStream(taskId, since, { onItem, onState = () => {}, isLatest = () => true, follow = false }) {
  const controller = new AbortController();
  const follower = { next: since, stopped: false };
  follower.stop = () => {
    follower.stopped = true;
    controller.abort();
  };
  let received = 0;
  let failed = false;

  const accept = (item) => {
    if (item.offset < follower.next) return null; // a repeat after a reconnect
    follower.next = item.offset + 1;
    received += 1;
    onItem(item);
    if (!TERMINAL.has(item.type) || !isLatest(item)) return null;
    if ((follow ? FOLLOWED_ENDINGS : ENDINGS).has(item.type)) return "end";
    return item.type === "failed" ? "failed" : null;
  };

  (async () => {
    let delay = FIRST_RETRY_MS;
    let first = true;
    let emptyCloses = 0;
    while (!follower.stopped) {
      if (!failed) onState(first ? "connecting" : "reconnecting");
      first = false;
      try {
        const headers = { Accept: "text/event-stream" };
        // The offset last taken: the stream goes on right after it.
        if (follower.next > 0) headers["Last-Event-ID"] = String(follower.next - 1);
        const query = follow ? "?follow=true" : "";
        const response = await fetch(`/tasks/${seg(taskId)}/events${query}`, {
          headers: authHeaders(headers),
          signal: controller.signal,
          cache: "no-store",
        });
        if (response.status === 401) {
          signalUnauthorized("the stream needs a token");
          onState("unauthorized");
          return;
        }
        if (response.status === 404) {
          onState("gone");
          return;
        }
        if (response.ok) {
          if (!failed) onState("live");
          delay = FIRST_RETRY_MS;
          received = 0;
          const verdict = await readEvents(response.body, accept);
          if (verdict === "end") {
            onState("ended");
            return;
          }
          if (verdict === "failed") {
            failed = true;
            onState("failed");
          } else if (!failed) {
            emptyCloses = received ? 0 : emptyCloses + 1;
            if (emptyCloses >= EMPTY_CLOSES) {
              onState("quiet");
              return;
            }
          }
        }
        // Closed without the task's ending, or refused for now (503): ask again.
      } catch (error) {
        if (follower.stopped) return;
      }
      if (follower.stopped) return;
      if (!failed) onState("reconnecting");
      await pause(failed ? FAILED_RECHECK_MS : delay, controller.signal);
      delay = Math.min(delay * 2, LAST_RETRY_MS);
    }
  })();
  return follower;
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * Parse an SSE body, calling `accept(item)` per event; resolves to the first verdict
 * `accept` gives (non-null), or null when the body closed first.
 */
export async function readEvents(body, accept) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { id: null, type: null, data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return null;
      buffer += value;
      for (;;) {
        const end = buffer.search(/[\r\n]/);
        if (end < 0) break;
        // "\r\n" may be split across chunks: wait for the next one to see the "\n".
        if (buffer[end] === "\r" && end === buffer.length - 1) break;
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
        if (line === "") {
          if (event.data.length && event.id !== null) {
            const verdict = accept({
              offset: Number.parseInt(event.id, 10),
              type: event.type ?? "message",
              data: JSON.parse(event.data.join("\n")),
            });
            if (verdict) return verdict;
          }
          event = { id: null, type: null, data: [] };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? "" : line.slice(colon + 1);
          if (text.startsWith(" ")) text = text.slice(1);
          if (field === "id") event.id = text;
          else if (field === "event") event.type = text;
          else if (field === "data") event.data.push(text);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
