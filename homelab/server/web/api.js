// The server's API as the page uses it: the key in a header (never in a URL), errors as
// ApiError with the server's own message, and a chat stream read as server-sent events.

const KEY_NAME = "homelab.apiKey";

export function savedKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

export function saveKey(key, remember) {
  forgetKey();
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(path, { method = "GET", body, signal, key = savedKey() } = {}) {
  const headers = {};
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function apiJson(path, options) {
  return (await api(path, options)).json();
}

async function errorOf(response) {
  let message = `The server answered ${response.status} ${response.statusText}.`;
  try {
    const doc = await response.json();
    message = doc?.error?.message || message;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message);
}

// Yields each event's JSON payload until `data: [DONE]`; an error event is thrown.
export async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const payload = JSON.parse(data);
      if (payload.error) throw new ApiError(500, payload.error.message || "The stream failed.");
      yield payload;
    }
  }
}
