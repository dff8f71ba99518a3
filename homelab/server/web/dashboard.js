// The dashboard: /admin/dashboard polled once a second while it is shown (the facts of
// `homelab ps`, /admin/prompt-cache and /metrics), drawn as bars, tables and a tok/s line.

import { api, apiJson } from "./api.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const HISTORY_POINTS = 120; // two minutes of the tok/s line
const history = [];
let timer = null;

export function showDashboard(visible) {
  clearInterval(timer);
  timer = null;
  if (!visible) return;
  poll();
  timer = setInterval(poll, POLL_MS);
}

async function poll() {
  let doc;
  try {
    doc = await apiJson("/admin/dashboard");
  } catch (error) {
    const admin = error.status === 403 ? " Sign in with an admin key to see it." : "";
    showError(`The dashboard is unavailable: ${error.message}${admin}`);
    return;
  }
  showError("");
  const tokS = doc.models.reduce((sum, m) => sum + (m.decode_tok_s || 0), 0);
  history.push(tokS);
  if (history.length > HISTORY_POINTS) history.shift();
  renderHardware(doc.hardware);
  drawLine($("toks-chart"), history);
  $("toks-now").textContent = `${tokS.toFixed(1)} tok/s now (all models)`;
  renderModels(doc.models);
  renderTenants(doc.tenants, doc.prompt_cache);
  renderRequests(doc.recent_requests);
}

function showError(text) {
  $("dashboard-error").textContent = text;
  $("dashboard-error").hidden = !text;
}

// --- drawing --------------------------------------------------------------------------

export function formatBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit && value < 10 ? 1 : 0)} ${units[unit]}`;
}

function bar(fraction, label) {
  const outer = document.createElement("div");
  outer.className = "bar";
  outer.setAttribute("role", "meter");
  outer.setAttribute("aria-valuemin", "0");
  outer.setAttribute("aria-valuemax", "100");
  const percent = Math.max(0, Math.min(1, fraction || 0)) * 100;
  outer.setAttribute("aria-valuenow", percent.toFixed(0));
  outer.setAttribute("aria-label", label);
  const inner = document.createElement("div");
  inner.className = "fill";
  inner.style.width = `${percent}%`; // CSSOM, not an inline style attribute: CSP allows it
  const text = document.createElement("span");
  text.textContent = label;
  outer.append(inner, text);
  return outer;
}

function drawLine(canvas, points) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const context = canvas.getContext("2d");
  context.scale(ratio, ratio);
  context.clearRect(0, 0, width, height);
  const styles = getComputedStyle(document.body);
  context.strokeStyle = styles.getPropertyValue("--accent").trim() || "#3b82f6";
  context.lineWidth = 2;
  const top = Math.max(1, ...points);
  const step = width / (HISTORY_POINTS - 1);
  const offset = HISTORY_POINTS - points.length;
  context.beginPath();
  points.forEach((value, i) => {
    const x = (offset + i) * step;
    const y = height - 4 - (value / top) * (height - 8);
    if (i === 0) context.moveTo(x, y);
    else context.lineTo(x, y);
  });
  context.stroke();
  context.fillStyle = styles.getPropertyValue("--muted").trim() || "#888";
  context.fillText(`${top.toFixed(0)} tok/s`, 4, 12);
}

function table(element, headers, rows) {
  const head = document.createElement("tr");
  for (const title of headers) {
    const cell = document.createElement("th");
    cell.scope = "col";
    cell.textContent = title;
    head.append(cell);
  }
  const body = rows.map((cells) => {
    const row = document.createElement("tr");
    for (const value of cells) {
      const cell = document.createElement("td");
      if (value instanceof Node) cell.append(value);
      else cell.textContent = value ?? "–";
      row.append(cell);
    }
    return row;
  });
  const thead = document.createElement("thead");
  thead.append(head);
  const tbody = document.createElement("tbody");
  tbody.append(...body);
  element.replaceChildren(thead, tbody);
}

// --- sections -------------------------------------------------------------------------

function renderHardware(hardware) {
  const rows = hardware.gpus.map((gpu) => {
    const used = gpu.memory_used_bytes / gpu.memory_total_bytes;
    const label = `${gpu.label}: ${formatBytes(gpu.memory_free_bytes)} free of ${formatBytes(gpu.memory_total_bytes)}`;
    return bar(used, label);
  });
  if (!hardware.gpus.length) {
    const note = document.createElement("p");
    note.className = "facts";
    note.textContent = "No NVIDIA GPU: the models run on the CPU.";
    rows.push(note);
  }
  const ramUsed = 1 - hardware.ram_available_bytes / hardware.ram_total_bytes;
  const ram = `RAM: ${formatBytes(hardware.ram_available_bytes)} available of ${formatBytes(hardware.ram_total_bytes)}`;
  rows.push(bar(ramUsed, ram));
  $("hardware").replaceChildren(...rows);
}

function renderModels(models) {
  const headers = ["Model", "Status", "Memory (allocated of planned)", "K/V", "Context", "Slots busy", "tok/s", ""];
  table($("models-table"), headers, models.map(modelRow));
}

function modelRow(m) {
  const loaded = m.status === "loaded";
  const planned = m.planned_bytes || m.actual_bytes || 0;
  const memory = loaded
    ? bar(planned ? m.actual_bytes / planned : 0, `${formatBytes(m.actual_bytes)} of ${formatBytes(m.planned_bytes ?? null)}`)
    : "–";
  const kv = m.type_k ? `${m.type_k}/${m.type_v}` : "–";
  const context = m.n_ctx_per_slot ? `${m.n_ctx_per_slot.toLocaleString()} × ${m.n_parallel ?? m.slots_total}` : "–";
  const slots = loaded ? `${m.slots_busy}/${m.slots_total}` : "–";
  const tokS = loaded ? (m.decode_tok_s ?? 0).toFixed(1) : "–";
  const button = m.path === undefined ? "" : residencyButton(m);
  return [m.model, m.status, memory, kv, context, slots, tokS, button];
}

function residencyButton(m) {
  const loaded = m.status === "loaded";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "small";
  button.textContent = loaded ? "Unload" : "Load";
  button.disabled = m.status === "loading";
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await api(`/admin/models/${loaded ? "unload" : "load"}`, { method: "POST", body: { model: m.model } });
    } catch (error) {
      showError(error.message);
    }
    poll();
  });
  return button;
}

function renderTenants(tenants, cache) {
  $("cache-summary").textContent = cache.enabled
    ? `Saved prompt states: ${formatBytes(cache.ram_bytes)} in RAM (of ${formatBytes(cache.ram_budget_bytes)}), ${formatBytes(cache.disk_bytes)} on disk; ${cache.hits} restored, ${cache.misses} missed.`
    : "The prompt cache that outlives a slot is off; cached prefixes are the slots' own.";
  const headers = ["Tenant", "Requests", "Prompt tokens", "Cached tokens", "Cached prefixes", "Saved states", "Saved"];
  const rows = tenants.map((t) => [
    t.tenant,
    String(t.requests),
    String(t.prompt_tokens),
    String(t.cached_tokens),
    String(t.cache_hits),
    String(t.saved_states),
    formatBytes(t.saved_bytes),
  ]);
  table($("tenants-table"), headers, rows);
}

function renderRequests(requests) {
  const headers = ["Time", "Tenant", "Route", "Status", "Prompt", "Cached", "Tokens", "TTFT", "tok/s"];
  const rows = requests.map((r) => [
    new Date(r.at * 1000).toLocaleTimeString(),
    r.tenant,
    r.route,
    String(r.status),
    String(r.prompt_tokens),
    String(r.cached_tokens),
    String(r.completion_tokens),
    r.ttft_s === null ? "–" : `${(r.ttft_s * 1000).toFixed(0)} ms`,
    r.completion_tok_s.toFixed(1),
  ]);
  table($("requests-table"), headers, rows);
}
