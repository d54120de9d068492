// The Memory page: the namespaces the signed-in token reaches, a namespace's items (or the
// best matches of a search), and, for an approver, a form that writes an item and buttons
// that delete one. Every read and write goes through the API's /memory routes, which hold
// the token to its tenant and its role.

import { ApiError, api } from "./api.js";
import { h, replace } from "./dom.js";

/** The Memory page, on `namespace` when the address names one; returns its unmount. */
export function mountMemory(main, { session }, namespace = null) {
  const list = h("ul", { class: "namespaces" });
  const items = h("div", { class: "memory-items" });
  const trouble = h("p", { class: "error", role: "alert" });
  const query = h("input", { id: "memory-q", name: "q", type: "search", autocomplete: "off", placeholder: "words to look for" });
  const search = h("form", { class: "filters", role: "search", onsubmit: (e) => { e.preventDefault(); showItems(); } },
    h("label", { for: "memory-q" }, "Search"), query, h("button", { type: "submit" }, "Search"));
  const writer = session.role === "approver" ? writeForm() : null;
  replace(
    main,
    h("h1", {}, "Memory"),
    h("p", { class: "muted" }, "What tasks remember across tasks, by namespace (TENANT:AGENT)."),
    trouble,
    h("div", { class: "memory" },
      h("nav", { "aria-label": "Namespaces" }, h("h2", {}, "Namespaces"), list),
      h("section", { "aria-label": "Items" }, namespace ? h("h2", {}, namespace) : null, namespace ? search : null, items, writer)),
  );
  loadNamespaces();
  if (namespace) showItems();
  else replace(items, h("p", { class: "muted" }, "Choose a namespace."));

  async function loadNamespaces() {
    try {
      const { namespaces } = await api("/memory");
      replace(list, namespaces.length
        ? namespaces.map((n) => h("li", {},
          h("a", { href: `#/memory/${encodeURIComponent(n.namespace)}`, "aria-current": n.namespace === namespace ? "page" : null }, n.namespace),
          h("span", { class: "count" }, String(n.items))))
        : h("li", { class: "muted" }, "No memory yet."));
    } catch (error) {
      trouble.textContent = error.message;
    }
  }

  async function showItems() {
    const ns = encodeURIComponent(namespace);
    const q = query.value.trim();
    try {
      const page = await api(q ? `/memory/${ns}?${new URLSearchParams({ q })}` : `/memory/${ns}`);
      trouble.textContent = "";
      replace(items, page.items.length ? table(page.items) : h("p", { class: "muted" }, q ? "Nothing matches." : "No items."));
    } catch (error) {
      if (error instanceof ApiError && error.kind === "unknown_namespace") replace(items, h("p", { class: "muted" }, error.message));
      else trouble.textContent = error.message;
    }
  }

  function table(rows) {
    return h("table", { class: "memory-table" },
      h("thead", {}, h("tr", {}, ["Key", "Value", "Updated", "Expires", ""].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((item) => h("tr", { dataset: { key: item.key } },
        h("td", {}, h("code", {}, item.key)),
        h("td", { class: "text" }, item.value),
        h("td", {}, when(item.updated_at)),
        h("td", {}, item.expires_at ? when(item.expires_at) : "never"),
        h("td", {}, session.role === "approver"
          ? h("button", { type: "button", class: "link danger", onclick: () => remove(item.key) }, "Delete")
          : null)))));
  }

  async function remove(key) {
    try {
      await api(`/memory/${encodeURIComponent(namespace)}/${encodeURIComponent(key)}`, { method: "DELETE" });
      await Promise.all([showItems(), loadNamespaces()]);
    } catch (error) {
      trouble.textContent = error.message;
    }
  }

  function writeForm() {
    const ns = h("input", { id: "memory-ns", name: "namespace", required: true, value: namespace ?? "", placeholder: "TENANT:AGENT" });
    const key = h("input", { id: "memory-key", name: "key", required: true });
    const value = h("textarea", { id: "memory-value", name: "value", required: true, rows: 3 });
    const said = h("p", { class: "muted", role: "status" });
    return h("form", { class: "memory-write", onsubmit: async (event) => {
      event.preventDefault();
      try {
        const path = `/memory/${encodeURIComponent(ns.value.trim())}/${encodeURIComponent(key.value.trim())}`;
        const item = await api(path, { method: "PUT", body: { value: value.value } });
        said.textContent = `Saved ${item.key} (revision ${item.revision}).`;
        trouble.textContent = "";
        if (item.namespace === namespace) await showItems();
        await loadNamespaces();
      } catch (error) {
        trouble.textContent = error.message;
      }
    } },
    h("h2", {}, "Remember"),
    h("label", { for: "memory-ns" }, "Namespace"), ns,
    h("label", { for: "memory-key" }, "Key"), key,
    h("label", { for: "memory-value" }, "Value"), value,
    h("button", { type: "submit", class: "primary" }, "Save"), said);
  }
}

function when(seconds) {
  return new Date(seconds * 1000).toLocaleString();
}
