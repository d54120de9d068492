// Building the page: elements and text nodes only. Data never becomes markup: strings are
// text nodes or textContent, so a `<script>` or `onerror=` in model output stays text.

const PROPERTIES = new Set([
  "value", "checked", "disabled", "hidden", "selected", "readOnly", "required", "open",
  "tabIndex", "defaultValue",
]);

/** An element with attributes, properties, listeners (`onclick`, ...) and children. */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(props ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      element.addEventListener(key.slice(2), value);
    } else if (PROPERTIES.has(key)) element[key] = value;
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

/** Append children: nodes as they are, strings and numbers as text, arrays flattened. */
export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Replace every child of `parent`. */
export function replace(parent, ...children) {
  parent.replaceChildren();
  return append(parent, children);
}

/** JSON for people: indented, keys in their order. */
export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

// Short enough for one line in a table cell, with the zone it is in; the year only when it
// is not this one.
const COMPACT = {
  month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  timeZoneName: "short",
};
const clockThisYear = new Intl.DateTimeFormat(undefined, COMPACT);
const clockOtherYear = new Intl.DateTimeFormat(undefined, { ...COMPACT, year: "numeric" });
const clockInFull = new Intl.DateTimeFormat(undefined, { dateStyle: "full", timeStyle: "long" });

/** A <time> element showing a moment compactly, with its zone; in full in its title. */
export function moment(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const date = new Date(iso);
  const clock = date.getFullYear() === new Date().getFullYear() ? clockThisYear : clockOtherYear;
  return h("time", {
    datetime: date.toISOString(),
    title: `${clockInFull.format(date)} (${date.toISOString()})`,
  }, clock.format(date));
}

/** A <time> saying how long ago `iso` was ("3 min ago"), the moment in full in its title;
 * `refreshAges` keeps its words in step with the clock. */
export function ago(iso, className = "ago") {
  const date = new Date(iso);
  return h("time", {
    class: className,
    datetime: date.toISOString(),
    title: `${clockInFull.format(date)} (${date.toISOString()})`,
  }, `${since(iso)} ago`);
}

/** Rewrite the words of every `ago` time under `root` for the clock as it is now. */
export function refreshAges(root, now = Date.now()) {
  for (const time of root.querySelectorAll("time[datetime]")) {
    if (time.textContent.endsWith(" ago")) time.textContent = `${since(time.dateTime, now)} ago`;
  }
}

/** "4 s", "3 min", "2 h 5 min", "3 d 4 h": how long ago `iso` was. */
export function since(iso, now = Date.now()) {
  return duration((now - new Date(iso).getTime()) / 1000);
}

/** "4 s", "3 min", "2 h 5 min", "3 d 4 h": a span of `seconds`. */
export function duration(seconds) {
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${minutes % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

const numbers = new Intl.NumberFormat();

/** 12,345 */
export function count(n) {
  return numbers.format(n ?? 0);
}

/** A status badge: the class carries the colour, the text says it. */
export function statusBadge(status) {
  return h("span", { class: `badge status-${status}`, dataset: { status } }, status.replace("_", " "));
}

/** Is keyboard input going to a field (so single-key shortcuts must stay quiet)? */
export function typing(event) {
  const target = event.target;
  return (
    target instanceof HTMLElement &&
    (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName))
  );
}
