// The chat: a model picker, conversations kept in this browser, answers streamed from
// /v1/chat/completions with their reasoning folded apart, tool calls shown as calls, and per
// answer its tokens, TTFT, tok/s and whether the prompt's prefix was cached.

import { api, apiJson, serverEvents } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import {
  exportFile,
  loadConversations,
  newConversation,
  parseImport,
  saveConversations,
} from "./store.js";

const $ = (id) => document.getElementById(id);
const state = {
  conversations: [],
  currentId: null,
  models: [],
  images: [], // data URLs waiting in the composer
  editFrom: null, // index of the user message being edited
  controller: null, // the answer streaming now (AbortController)
};

export async function startChat() {
  state.conversations = loadConversations();
  if (!state.conversations.length) state.conversations.push(newConversation(""));
  state.currentId = state.conversations[0].id;
  bindComposer();
  bindConversations();
  await refreshModels();
  renderConversations();
  renderMessages();
}

function current() {
  return state.conversations.find((c) => c.id === state.currentId) || state.conversations[0];
}

// --- models ---------------------------------------------------------------------------

export async function refreshModels() {
  try {
    const doc = await apiJson("/v1/models");
    state.models = doc.data || [];
  } catch (error) {
    showError(error.message);
    return;
  }
  const picker = $("model-picker");
  const wanted = current().model || picker.value;
  picker.replaceChildren(...state.models.map(modelOption));
  const known = state.models.some((m) => m.id === wanted);
  if (known) picker.value = wanted;
  showModelFacts();
}

function modelOption(card) {
  const option = document.createElement("option");
  option.value = card.id;
  const loaded = card.status === undefined || card.status === "loaded";
  option.textContent = `${card.id} (${loaded ? "loaded" : card.status || "not loaded"})`;
  return option;
}

function selectedCard() {
  return state.models.find((m) => m.id === $("model-picker").value);
}

function showModelFacts() {
  const card = selectedCard();
  const facts = $("model-facts");
  if (!card) {
    facts.textContent = "";
    return;
  }
  const caps = (card.capabilities || []).join(", ");
  if (card.context_length !== undefined) {
    facts.textContent = `${card.context_length.toLocaleString()} tokens of context · ${caps}`;
  } else {
    const trained = card.meta?.n_ctx_train;
    const context = trained ? ` · trained for ${trained.toLocaleString()} tokens` : "";
    facts.textContent = `not loaded: it loads on its first message${context}${caps ? ` · ${caps}` : ""}`;
  }
  const blind = card.capabilities !== undefined && !card.capabilities.includes("vision");
  $("attach").disabled = blind;
  $("attach-label").classList.toggle("disabled", blind);
  $("attach-label").title = blind ? "This model takes no images." : "Attach images";
}

// --- conversations --------------------------------------------------------------------

function bindConversations() {
  $("new-chat").addEventListener("click", () => {
    const conversation = newConversation($("model-picker").value);
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
    persist();
    renderConversations();
    renderMessages();
    $("prompt").focus();
  });
  $("export-chats").addEventListener("click", exportConversations);
  $("import-chats").addEventListener("change", importConversations);
  $("model-picker").addEventListener("change", () => {
    current().model = $("model-picker").value;
    persist();
    showModelFacts();
  });
}

function renderConversations() {
  const items = state.conversations.map((c) => {
    const item = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "conversation";
    open.textContent = c.title;
    open.setAttribute("aria-current", c.id === state.currentId ? "true" : "false");
    open.addEventListener("click", () => openConversation(c.id));
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "quiet small";
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Delete ${c.title}`);
    remove.addEventListener("click", () => deleteConversation(c.id));
    item.append(open, remove);
    return item;
  });
  $("conversation-list").replaceChildren(...items);
}

function openConversation(id) {
  state.currentId = id;
  const model = current().model;
  if (model && state.models.some((m) => m.id === model)) $("model-picker").value = model;
  showModelFacts();
  renderConversations();
  renderMessages();
}

function deleteConversation(id) {
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (!state.conversations.length) state.conversations.push(newConversation(""));
  if (!state.conversations.some((c) => c.id === state.currentId)) {
    state.currentId = state.conversations[0].id;
  }
  persist();
  renderConversations();
  renderMessages();
}

function exportConversations() {
  const url = URL.createObjectURL(exportFile(state.conversations));
  const link = document.createElement("a");
  link.href = url;
  link.download = `homelab-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function importConversations(event) {
  const file = event.target.files[0];
  event.target.value = "";
  if (!file) return;
  try {
    const imported = parseImport(await file.text());
    state.conversations.unshift(...imported);
    if (imported.length) state.currentId = imported[0].id;
    persist();
    renderConversations();
    renderMessages();
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

function persist() {
  const problem = saveConversations(state.conversations);
  if (problem) showError(problem);
}

// --- messages -------------------------------------------------------------------------

function renderMessages() {
  const messages = current().messages;
  const items = messages.map((m, index) => messageItem(m, index, index === messages.length - 1));
  $("messages").replaceChildren(...items);
  $("messages").scrollTop = $("messages").scrollHeight;
}

function messageItem(message, index, last) {
  const item = document.createElement("li");
  item.className = `message ${message.role}`;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = message.role === "assistant" ? message.model || "assistant" : message.role;
  item.append(role, ...imagesOf(message));
  if (message.reasoning) item.append(reasoningOf(message));
  const body = document.createElement("div");
  body.className = message.role === "assistant" ? "content markdown" : "content plain";
  if (message.role === "assistant") body.innerHTML = renderMarkdown(message.content);
  else body.textContent = message.content;
  item.append(body, ...message.tool_calls.map(toolCallOf));
  if (message.error) item.append(errorLine(message.error));
  item.append(footerOf(message, index, last));
  return item;
}

function imagesOf(message) {
  return message.images.map((url) => {
    const image = document.createElement("img");
    image.src = url; // a data: URL the user attached
    image.alt = "attached image";
    image.className = "thumb";
    return image;
  });
}

function reasoningOf(message) {
  const details = document.createElement("details");
  details.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const body = document.createElement("div");
  body.className = "markdown";
  body.innerHTML = renderMarkdown(message.reasoning);
  details.append(summary, body);
  return details;
}

function toolCallOf(call) {
  const box = document.createElement("div");
  box.className = "tool-call";
  const label = document.createElement("span");
  label.textContent = "tool call ";
  const code = document.createElement("code");
  code.textContent = `${call.name}(${call.arguments})`;
  box.append(label, code);
  return box;
}

function errorLine(text) {
  const line = document.createElement("p");
  line.className = "error";
  line.textContent = text;
  return line;
}

function footerOf(message, index, last) {
  const footer = document.createElement("div");
  footer.className = "footer";
  const facts = document.createElement("span");
  facts.className = "facts stats";
  facts.textContent = statsText(message);
  footer.append(facts);
  const idle = state.controller === null;
  if (message.role === "user" && idle) footer.append(action("Edit", () => editMessage(index)));
  if (message.role === "assistant" && last && idle) footer.append(action("Regenerate", regenerate));
  return footer;
}

function action(label, handler) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "quiet small";
  button.textContent = label;
  button.addEventListener("click", handler);
  return button;
}

function statsText(message) {
  const s = message.stats;
  const parts = [];
  if (message.stopped) parts.push("stopped");
  if (!s) return parts.join(" · ");
  if (s.prompt_tokens !== null) parts.push(`${s.prompt_tokens} prompt tokens`);
  if (s.cached_tokens) parts.push(`${s.cached_tokens} cached`);
  else if (s.prompt_tokens !== null) parts.push("prefix not cached");
  if (s.completion_tokens !== null) parts.push(`${s.completion_tokens} tokens`);
  if (s.ttft_s !== null) parts.push(`TTFT ${(s.ttft_s * 1000).toFixed(0)} ms`);
  if (s.tok_s !== null) parts.push(`${s.tok_s.toFixed(1)} tok/s`);
  return parts.join(" · ");
}

// --- the composer ---------------------------------------------------------------------

function bindComposer() {
  const prompt = $("prompt");
  prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  $("stop").addEventListener("click", () => state.controller?.abort());
  $("attach").addEventListener("change", (event) => {
    addImages([...event.target.files]);
    event.target.value = "";
  });
  prompt.addEventListener("paste", (event) => addImages(filesOf(event.clipboardData)));
  const main = document.querySelector(".chat-main");
  main.addEventListener("dragover", (event) => event.preventDefault());
  main.addEventListener("drop", (event) => {
    event.preventDefault();
    addImages(filesOf(event.dataTransfer));
  });
}

function filesOf(transfer) {
  return [...(transfer?.files || [])].filter((file) => file.type.startsWith("image/"));
}

async function addImages(files) {
  if ($("attach").disabled) {
    if (files.length) showError("This model takes no images: pick a vision model.");
    return;
  }
  for (const file of files) {
    state.images.push(await dataUrl(file));
  }
  renderAttachments();
}

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function renderAttachments() {
  const chips = state.images.map((url, index) => {
    const chip = document.createElement("span");
    chip.className = "chip";
    const image = document.createElement("img");
    image.src = url;
    image.alt = `attachment ${index + 1}`;
    const remove = action("×", () => {
      state.images.splice(index, 1);
      renderAttachments();
    });
    remove.setAttribute("aria-label", `Remove attachment ${index + 1}`);
    chip.append(image, remove);
    return chip;
  });
  if (state.editFrom !== null) {
    const note = document.createElement("span");
    note.className = "chip editing";
    note.textContent = "Editing an earlier message: sending replaces it and what followed. ";
    note.append(action("Cancel", cancelEdit));
    chips.unshift(note);
  }
  $("attachments").replaceChildren(...chips);
}

function editMessage(index) {
  const message = current().messages[index];
  state.editFrom = index;
  state.images = [...message.images];
  $("prompt").value = message.content;
  renderAttachments();
  $("prompt").focus();
}

function cancelEdit() {
  state.editFrom = null;
  state.images = [];
  $("prompt").value = "";
  renderAttachments();
}

async function submit() {
  const text = $("prompt").value;
  if (state.controller || (!text.trim() && !state.images.length)) return;
  const conversation = current();
  if (state.editFrom !== null) conversation.messages.splice(state.editFrom);
  conversation.messages.push(userMessage(text, state.images));
  if (conversation.title === "New chat") conversation.title = text.trim().slice(0, 40) || "Image";
  state.editFrom = null;
  state.images = [];
  $("prompt").value = "";
  renderAttachments();
  renderConversations();
  await answer(conversation);
}

function userMessage(content, images) {
  return { role: "user", content, images: [...images], tool_calls: [], reasoning: "", stats: null };
}

async function regenerate() {
  const conversation = current();
  if (conversation.messages.at(-1)?.role === "assistant") conversation.messages.pop();
  await answer(conversation);
}

// --- one streamed answer --------------------------------------------------------------

async function answer(conversation) {
  const model = $("model-picker").value;
  conversation.model = model;
  const reply = {
    role: "assistant",
    model,
    content: "",
    reasoning: "",
    images: [],
    tool_calls: [],
    stats: null,
    stopped: false,
  };
  const body = requestBody(conversation.messages, model);
  conversation.messages.push(reply);
  setBusy(new AbortController());
  renderMessages();
  const timing = { started: performance.now(), first: null };
  let usage = null;
  try {
    usage = await stream(body, reply, timing);
  } catch (error) {
    if (error.name === "AbortError") reply.stopped = true;
    else reply.error = error.message;
  }
  reply.stats = statsOf(usage, timing, performance.now());
  conversation.updated = Date.now();
  setBusy(null);
  persist();
  renderMessages();
  refreshModels(); // a model that loaded for this answer now shows its context
}

function requestBody(messages, model) {
  const settings = readSettings();
  return {
    model,
    messages: messages.map(wireMessage),
    stream: true,
    stream_options: { include_usage: true },
    ...settings,
  };
}

function readSettings() {
  const settings = {};
  const maxTokens = Number.parseInt($("max-tokens").value, 10);
  if (Number.isFinite(maxTokens) && maxTokens > 0) settings.max_tokens = maxTokens;
  const temperature = Number.parseFloat($("temperature").value);
  if (Number.isFinite(temperature)) settings.temperature = temperature;
  return settings;
}

function wireMessage(message) {
  if (message.role === "assistant") {
    const wire = { role: "assistant", content: message.content };
    if (message.reasoning) wire.reasoning_content = message.reasoning;
    return wire;
  }
  if (!message.images.length) return { role: message.role, content: message.content };
  const parts = message.images.map((url) => ({ type: "image_url", image_url: { url } }));
  return { role: message.role, content: [{ type: "text", text: message.content }, ...parts] };
}

async function stream(body, reply, timing) {
  const response = await api("/v1/chat/completions", {
    method: "POST",
    body,
    signal: state.controller.signal,
  });
  let usage = null;
  for await (const chunk of serverEvents(response)) {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices?.[0]?.delta;
    if (!delta) continue;
    if (timing.first === null && hasOutput(delta)) timing.first = performance.now();
    applyDelta(reply, delta);
    scheduleRender();
  }
  return usage;
}

function hasOutput(delta) {
  return Boolean(delta.content || delta.reasoning_content || delta.tool_calls?.length);
}

function applyDelta(reply, delta) {
  if (delta.content) reply.content += delta.content;
  if (delta.reasoning_content) reply.reasoning += delta.reasoning_content;
  for (const piece of delta.tool_calls || []) {
    const index = piece.index ?? reply.tool_calls.length;
    reply.tool_calls[index] ??= { name: "", arguments: "" };
    reply.tool_calls[index].name += piece.function?.name || "";
    reply.tool_calls[index].arguments += piece.function?.arguments || "";
  }
}

let renderPending = false;

function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  requestAnimationFrame(() => {
    renderPending = false;
    renderMessages();
  });
}

function statsOf(usage, timing, ended) {
  const completion = usage?.completion_tokens ?? null;
  const generating_s = timing.first === null ? null : (ended - timing.first) / 1000;
  // a short answer can arrive in one read (first token and end at once): then its rate is
  // counted over the whole request, never left out
  const rate_s = generating_s > 0 ? generating_s : (ended - timing.started) / 1000;
  return {
    prompt_tokens: usage?.prompt_tokens ?? null,
    completion_tokens: completion,
    cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
    ttft_s: timing.first === null ? null : (timing.first - timing.started) / 1000,
    tok_s: completion !== null && rate_s > 0 ? completion / rate_s : null,
  };
}

function setBusy(controller) {
  state.controller = controller;
  $("stop").hidden = controller === null;
  $("send").disabled = controller !== null;
}

function showError(text) {
  $("chat-error").textContent = text;
  $("chat-error").hidden = !text;
}
