// A typed answer (a task with an output schema) shown as data: a flat object as a table of
// its fields, anything else as indented JSON. Keys and values are text nodes.

import { h, pretty } from "./dom.js";

const isScalar = (value) => value === null || ["string", "number", "boolean"].includes(typeof value);

/** An object whose every value is a string, number, boolean or null (and that has one). */
export function isFlat(value) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const values = Object.values(value);
  return values.length > 0 && values.every(isScalar);
}

/** A value as its cell shows it: a string as written, anything else as JSON. */
function cell(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** The answer's data: a table for a flat object, indented JSON otherwise. */
export function dataView(value) {
  if (!isFlat(value)) return h("pre", { class: "code answer-json", "aria-label": "the answer as JSON" }, pretty(value));
  return h("table", { class: "answer-table", "aria-label": "the answer's fields" },
    h("tbody", {}, Object.entries(value).map(([name, field]) =>
      h("tr", { dataset: { field: name } },
        h("th", { scope: "row" }, name),
        h("td", { class: `text value-${field === null ? "null" : typeof field}` }, cell(field))))));
}

/** JSON with its object keys in order, so two values compare by their text. */
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** Whether `text` (a thought's) is the JSON of `output`, or of the `{"value": ...}` that
 * wraps a schema that is not an object: then it is the answer, shown as data below it. */
export function textIsData(text, output) {
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    return false;
  }
  const seen = canonical(parsed);
  return seen === canonical(output) || seen === canonical({ value: output });
}
