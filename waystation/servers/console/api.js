// Talking to the API: every request carries the bearer token the user gave this tab.
// No cookies: the token lives in sessionStorage and goes out only as a header, so no other
// site can make the browser send it (nothing for CSRF to ride on).

const TOKEN_KEY = "waystation.token";

export const auth = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  set(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
  },
};

/** An API answer that is not a success: its HTTP status, its kind and its sentence. */
export class ApiError extends Error {
  constructor(status, kind, detail, fields = null) {
    super(detail);
    this.status = status;
    this.kind = kind;
    this.fields = fields;
  }
}

export function authHeaders(extra = {}) {
  const headers = { ...extra };
  const token = auth.token;
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** Tell the page the token is missing or refused (it shows the sign-in form). */
export function signalUnauthorized(detail) {
  window.dispatchEvent(new CustomEvent("waystation:unauthorized", { detail }));
}

/** A JSON request to the API; resolves to the answer's JSON, rejects with an ApiError. */
export async function api(path, { method = "GET", body, headers = {}, signal } = {}) {
  const sent = authHeaders({ Accept: "application/json", ...headers });
  if (body !== undefined) sent["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: sent,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "unreachable", "the API does not answer (is `ws api` running?)");
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(
      response.status,
      data?.error ?? `http_${response.status}`,
      data?.detail ?? (text.slice(0, 300) || response.statusText),
      data?.fields ?? null,
    );
    if (response.status === 401) signalUnauthorized(error.message);
    throw error;
  }
  return data;
}

/** A path segment, escaped. */
export function seg(value) {
  return encodeURIComponent(value);
}

/** A fresh Idempotency-Key: a retried POST then finds the first answer. */
export function idempotencyKey() {
  // getRandomValues works on plain http too (randomUUID needs a secure context).
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
