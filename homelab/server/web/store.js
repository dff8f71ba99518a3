// Conversations are kept in this browser only (localStorage), exported and imported as JSON.
// An imported file is untrusted: only the known fields of each message are kept, as strings.

const STORE_NAME = "homelab.conversations";
const ROLES = new Set(["system", "user", "assistant"]);

export function loadConversations() {
  try {
    return cleanConversations(JSON.parse(localStorage.getItem(STORE_NAME) || "[]"));
  } catch {
    return [];
  }
}

export function saveConversations(conversations) {
  try {
    localStorage.setItem(STORE_NAME, JSON.stringify(conversations));
    return null;
  } catch (error) {
    return `This browser's storage is full (${error.name}): export and delete some conversations.`;
  }
}

export function newConversation(model) {
  return { id: crypto.randomUUID(), title: "New chat", model, messages: [], updated: Date.now() };
}

export function exportFile(conversations) {
  const text = JSON.stringify({ homelab_conversations: 1, conversations }, null, 2);
  return new Blob([text], { type: "application/json" });
}

// The conversations of an exported file (an Error naming what is wrong with it).
export function parseImport(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new Error("This file is not JSON: choose a file the Export button saved.");
  }
  const list = Array.isArray(doc) ? doc : doc?.conversations;
  if (!Array.isArray(list)) {
    throw new Error("This file has no conversations: choose a file the Export button saved.");
  }
  return cleanConversations(list).map((c) => ({ ...c, id: crypto.randomUUID() }));
}

function cleanConversations(list) {
  return (Array.isArray(list) ? list : []).filter(isObject).map((c) => ({
    id: typeof c.id === "string" ? c.id : crypto.randomUUID(),
    title: text(c.title) || "Imported chat",
    model: text(c.model),
    updated: Number(c.updated) || Date.now(),
    messages: (Array.isArray(c.messages) ? c.messages : []).filter(isMessage).map(cleanMessage),
  }));
}

function isObject(value) {
  return value !== null && typeof value === "object";
}

function isMessage(m) {
  return isObject(m) && ROLES.has(m.role);
}

function cleanMessage(m) {
  const images = Array.isArray(m.images) ? m.images : [];
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
  return {
    role: m.role,
    content: text(m.content),
    reasoning: text(m.reasoning),
    images: images.filter((url) => typeof url === "string" && url.startsWith("data:image/")),
    tool_calls: calls.filter(isObject).map((call) => ({
      name: text(call.name),
      arguments: text(call.arguments),
    })),
    stats: isObject(m.stats) ? cleanStats(m.stats) : null,
    stopped: m.stopped === true,
    model: text(m.model),
  };
}

function cleanStats(s) {
  const number = (v) => (Number.isFinite(v) ? v : null);
  return {
    prompt_tokens: number(s.prompt_tokens),
    completion_tokens: number(s.completion_tokens),
    cached_tokens: number(s.cached_tokens),
    ttft_s: number(s.ttft_s),
    tok_s: number(s.tok_s),
  };
}

function text(value) {
  return typeof value === "string" ? value : "";
}
