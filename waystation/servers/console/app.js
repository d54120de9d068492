// The console's shell: who is signed in, the sections, and which view the address shows.

import { ApiError, api, auth } from "./api.js";
import { h, replace } from "./dom.js";
import { InboxFeed, mountInbox, waitingCount } from "./inbox.js";
import { mountNewTask, mountTaskList } from "./tasks.js";
import { mountTask } from "./task.js";
import { mountMemory } from "./memory.js";
import { mountSchedules } from "./schedules.js";

const ROUTES = [
  [/^#\/inbox$/, (main, ctx) => mountInbox(main, ctx)],
  [/^#\/tasks$/, (main, ctx) => mountTaskList(main, ctx)],
  [/^#\/new$/, (main, ctx) => mountNewTask(main, ctx)],
  [/^#\/memory$/, (main, ctx) => mountMemory(main, ctx)],
  [/^#\/memory\/(.+)$/, (main, ctx, ns) => mountMemory(main, ctx, decodeURIComponent(ns))],
  [/^#\/schedules$/, (main, ctx) => mountSchedules(main, ctx)],
  // A sub-agent's id holds slashes: its address takes them encoded (as the console's links
  // write them) or as they are (typed, or from another tool).
  [/^#\/tasks\/(.+)$/, (main, ctx, id) => mountTask(main, ctx, decodeURIComponent(id))],
];

// Without WAYSTATION_API_TOKENS nobody signs in: the API listens on localhost only and lets
// every local caller approve (the header says so; "tokens" alone read like an LLM's).
const OPEN_ACCESS =
  "The API runs without API tokens (WAYSTATION_API_TOKENS is not set): it listens on localhost " +
  "only, and everyone on this machine may start tasks and decide approvals.";

const main = document.getElementById("main");
const who = document.getElementById("who");
const inboxCount = document.getElementById("inbox-count");
let session = null;
let feed = null;
let unmount = null;

async function start() {
  try {
    session = await api("/console/api/session");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) showSignIn(error.message);
    else showProblem(error);
    return;
  }
  document.body.dataset.role = session.role;
  replace(
    who,
    h("span", { class: "who-name", title: `role: ${session.role}` }, session.name),
    h("span", { class: `badge role-${session.role}` }, session.role),
    session.tokens_required
      ? h("button", { type: "button", class: "link", onclick: signOut }, "Sign out")
      : h("span", { class: "muted open-access", title: OPEN_ACCESS }, "no sign-in · localhost only"),
  );
  feed?.stop();
  feed = new InboxFeed();
  feed.subscribe((inbox) => {
    const n = waitingCount(inbox);
    inboxCount.textContent = n ? String(n) : "";
  });
  feed.start();
  route();
}

function route() {
  if (!session) return;
  if (!location.hash || location.hash === "#" || location.hash === "#/") {
    location.replace("#/inbox");
    return;
  }
  unmount?.();
  unmount = null;
  for (const link of document.querySelectorAll("header nav a")) {
    const here = location.hash === link.getAttribute("href");
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const context = { session, feed };
  for (const [pattern, mount] of ROUTES) {
    const match = location.hash.match(pattern);
    if (match) {
      unmount = mount(main, context, ...match.slice(1)) ?? null;
      return;
    }
  }
  replace(main, h("h1", {}, "Not found"), h("p", {}, "This address shows nothing. ", h("a", { href: "#/inbox" }, "Go to the inbox")));
}

function showSignIn(detail) {
  session = null;
  feed?.stop();
  unmount?.();
  unmount = null;
  replace(who);
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    spellcheck: "false",
  });
  const form = h(
    "form",
    { class: "signin", onsubmit: (event) => {
      event.preventDefault();
      auth.set(input.value.trim());
      start();
    } },
    h("h1", {}, "Sign in"),
    h("p", {}, "Paste an API token (from WAYSTATION_API_TOKENS). It is kept in this tab only and sent as a header with every request."),
    auth.token ? h("p", { class: "error", role: "alert" }, detail || "The token was refused.") : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  replace(main, form);
  input.focus();
}

function signOut() {
  auth.clear();
  showSignIn("");
}

function showProblem(error) {
  replace(
    main,
    h("h1", {}, "The API does not answer"),
    h("p", { class: "error", role: "alert" }, error.message),
    h("button", { type: "button", onclick: start }, "Try again"),
  );
}

window.addEventListener("hashchange", route);
window.addEventListener("waystation:unauthorized", (event) => {
  if (session) showSignIn(event.detail);
});
start();
