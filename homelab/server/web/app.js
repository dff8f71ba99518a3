// The page's entry point: asks for a key when the server wants one, then shows the chat or
// the dashboard. The key stays in this browser (localStorage when remembered, else
// sessionStorage) and travels in the Authorization header only.

import { ApiError, api, forgetKey, saveKey, savedKey } from "./api.js";
import { refreshModels, startChat } from "./chat.js";
import { showDashboard } from "./dashboard.js";

const $ = (id) => document.getElementById(id);
let chatStarted = false;

async function boot() {
  bindTabs();
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => {
    forgetKey();
    location.reload();
  });
  try {
    await api("/v1/models");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      showSignIn("");
      return;
    }
    throw error;
  }
  await enter();
}

function showSignIn(message) {
  $("sign-in").hidden = false;
  $("chat-view").hidden = true;
  $("dashboard-view").hidden = true;
  $("sign-in-error").textContent = message;
  $("sign-in-error").hidden = !message;
  $("key-input").focus();
}

async function signIn(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  try {
    await api("/v1/models", { key });
  } catch (error) {
    const refused = error instanceof ApiError && error.status === 401;
    showSignIn(refused ? `The server refused this key: ${error.message}` : error.message);
    return;
  }
  saveKey(key, $("key-remember").checked);
  $("key-input").value = "";
  $("sign-out").hidden = false;
  await enter();
}

async function enter() {
  $("sign-in").hidden = true;
  $("sign-out").hidden = !savedKey();
  if (!chatStarted) {
    chatStarted = true;
    await startChat();
  }
  show(location.hash === "#dashboard" ? "dashboard" : "chat");
}

function bindTabs() {
  $("tab-chat").addEventListener("click", () => show("chat"));
  $("tab-dashboard").addEventListener("click", () => show("dashboard"));
}

function show(view) {
  if (!$("sign-in").hidden) return;
  const dashboard = view === "dashboard";
  $("chat-view").hidden = dashboard;
  $("dashboard-view").hidden = !dashboard;
  $("tab-chat").setAttribute("aria-pressed", String(!dashboard));
  $("tab-dashboard").setAttribute("aria-pressed", String(dashboard));
  history.replaceState(null, "", dashboard ? "#dashboard" : "#");
  showDashboard(dashboard);
  if (!dashboard) refreshModels();
}

boot().catch((error) => {
  document.body.dataset.failed = "true";
  const line = document.createElement("p");
  line.className = "error";
  line.textContent = `The page could not start: ${error.message}`;
  document.querySelector("main").prepend(line);
});
