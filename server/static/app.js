// pn serve chat page: talks only to POST /v1/chat/completions (SSE, include_usage).
// Conversations live in localStorage under "pn.conversations"; settings under "pn.settings".
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = "pn.conversations", CURRENT = "pn.current", SETTINGS = "pn.settings";
const SETTING_FIELDS = { temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens", system: "system-prompt", api_key: "api-key" };

let conversations = load(STORE, []);   // [{id, title, messages: [{role, content, reasoning?, stats?, error?}]}]
let currentId = localStorage.getItem(CURRENT);
let running = null;                    // {controller, conv, msg, el} while a request streams

function load(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
function save() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  if (currentId) localStorage.setItem(CURRENT, currentId);
}
function current() {
  return conversations.find((c) => c.id === currentId);
}
function newConversation() {
  const c = { id: (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random()), title: "New chat", messages: [] };
  conversations.unshift(c);
  currentId = c.id;
  save();
  return c;
}

// ---- settings ----
function readSettings() {
  const s = {};
  for (const [k, id] of Object.entries(SETTING_FIELDS)) s[k] = $(id).value;
  return s;
}
function initSettings() {
  const s = load(SETTINGS, {});
  for (const [k, id] of Object.entries(SETTING_FIELDS)) {
    if (s[k] !== undefined) $(id).value = s[k];
    $(id).addEventListener("change", () => localStorage.setItem(SETTINGS, JSON.stringify(readSettings())));
  }
}

// ---- rendering ----
// Text with ``` fenced blocks as <pre><code> and `inline` as <code>; never innerHTML.
function renderText(el, text) {
  el.replaceChildren();
  const parts = text.split("```");
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const pre = document.createElement("pre"), code = document.createElement("code");
      code.textContent = part.replace(/^[\w+-]*\n/, "");   // drop the language tag line
      pre.appendChild(code);
      el.appendChild(pre);
    } else {
      part.split(/(`[^`\n]+`)/).forEach((seg) => {
        if (seg.length > 2 && seg.startsWith("`") && seg.endsWith("`")) {
          const code = document.createElement("code");
          code.textContent = seg.slice(1, -1);
          el.appendChild(code);
        } else if (seg) {
          el.appendChild(document.createTextNode(seg));
        }
      });
    }
  });
}
function statsLine(s) {
  if (!s) return "";
  const f = (x, d) => (x === undefined || x === null || !isFinite(x) ? "–" : x.toFixed(d));
  let line = `${s.tokens ?? "–"} tokens · ${f(s.tps, 1)} tokens/s · TTFT ${f(s.ttft_ms, 0)} ms · cached prompt tokens ${s.cached ?? "–"}`;
  if (s.stopped) line += " · stopped";
  else if (s.finish) line += ` · ${s.finish}`;
  return line;
}
function messageElement(m) {
  const el = document.createElement("div");
  el.className = "msg " + m.role + (m.error ? " error" : "");
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role;
  const thinking = document.createElement("div");
  thinking.className = "thinking";
  const body = document.createElement("div");
  body.className = "body";
  const stats = document.createElement("div");
  stats.className = "stats";
  el.append(role, thinking, body, stats);
  updateMessage(el, m);
  return el;
}
function updateMessage(el, m) {
  el.classList.toggle("error", !!m.error);
  el.querySelector(".thinking").textContent = m.reasoning || "";
  renderText(el.querySelector(".body"), m.error ? m.error : m.content);
  el.querySelector(".stats").textContent = m.role === "assistant" ? statsLine(m.stats) : "";
}
function renderConversation() {
  const c = current();
  const box = $("messages");
  box.replaceChildren(...(c ? c.messages.map(messageElement) : []));
  box.scrollTop = box.scrollHeight;
  renderList();
}
function renderList() {
  const ul = $("conversations");
  ul.replaceChildren(...conversations.map((c) => {
    const li = document.createElement("li");
    li.textContent = c.title;
    li.title = c.title;
    li.dataset.id = c.id;
    if (c.id === currentId) li.className = "current";
    li.addEventListener("click", () => {
      if (running) return;
      currentId = c.id;
      save();
      renderConversation();
    });
    return li;
  }));
}
function setRunning(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// ---- the request ----
function requestBody(c, s) {
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of c.messages) {
    if (m.error || (m.role === "assistant" && m.pending)) continue;
    messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  const num = (v) => (v === "" ? undefined : Number(v));
  if (num(s.temperature) !== undefined) body.temperature = num(s.temperature);
  if (num(s.top_p) !== undefined) body.top_p = num(s.top_p);
  if (num(s.max_tokens) !== undefined) body.max_tokens = num(s.max_tokens);
  return body;
}

// Reads an SSE body; calls onData(payload) for each `data:` line.
async function readSse(response, onData) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) onData(line.slice(5).trimStart());
      }
    }
  }
}

async function send(text) {
  if (running || !text.trim()) return;
  const c = current() || newConversation();
  if (c.messages.length === 0) c.title = text.trim().slice(0, 60);
  c.messages.push({ role: "user", content: text });
  const body = requestBody(c, readSettings());
  const msg = { role: "assistant", content: "", reasoning: "", pending: true, stats: null };
  c.messages.push(msg);
  save();
  renderConversation();
  const el = $("messages").lastElementChild;
  const controller = new AbortController();
  running = { controller, conv: c, msg, el };
  setRunning(true);
  $("status").textContent = "waiting for the first token…";
  const headers = { "Content-Type": "application/json", "x-session-id": c.id };
  const key = $("api-key").value.trim();
  if (key) headers["Authorization"] = "Bearer " + key;
  const t0 = performance.now();
  let tFirst = null, tLast = null, usage = null, finish = null, deltas = 0;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body), signal: controller.signal });
    if (!r.ok) {
      let m = `HTTP ${r.status}`;
      try { m += ": " + (await r.json()).error.message; } catch { /* not JSON */ }
      if (r.status === 401) m += " (set the API key in Settings)";
      throw new Error(m);
    }
    await readSse(r, (data) => {
      if (data === "[DONE]") return;
      const v = JSON.parse(data);
      if (v.error) throw new Error(v.error.message);
      if (v.usage) usage = v.usage;
      for (const ch of v.choices || []) {
        const d = ch.delta || {};
        if (d.content || d.reasoning_content) {
          tFirst ??= performance.now();
          tLast = performance.now();
          deltas++;
          msg.content += d.content || "";
          msg.reasoning += d.reasoning_content || "";
          updateMessage(el, msg);
          $("messages").scrollTop = $("messages").scrollHeight;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    });
  } catch (e) {
    if (e.name !== "AbortError") msg.error = String(e.message || e);
  }
  const stopped = controller.signal.aborted;
  const tokens = usage ? usage.completion_tokens : deltas;
  const genSecs = tFirst !== null && tLast > tFirst ? (tLast - tFirst) / 1000 : null;
  msg.stats = {
    tokens,
    tps: genSecs ? (tokens - 1) / genSecs : null,
    ttft_ms: tFirst !== null ? tFirst - t0 : null,
    cached: usage?.prompt_tokens_details?.cached_tokens ?? null,
    finish,
    stopped,
  };
  delete msg.pending;
  save();
  updateMessage(el, msg);
  running = null;
  setRunning(false);
  $("status").textContent = "";
}

// ---- wiring ----
initSettings();
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.controller.abort());
$("new-chat").addEventListener("click", () => {
  if (running) return;
  newConversation();
  renderConversation();
  $("prompt").focus();
});
// An answer cut off by a reload stays as far as it got.
for (const c of conversations) for (const m of c.messages) if (m.pending) { delete m.pending; m.stats = { stopped: true }; }
if (!current()) currentId = conversations[0]?.id ?? null;
renderConversation();
$("model-line").textContent = "pn serve · " + location.host;
$("prompt").focus();
