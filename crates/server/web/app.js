// The chat page's logic. It speaks only the server's public API: `GET /v1/models` for the
// models and their context, `POST /v1/chat/completions` streamed for answers. Conversations are
// trees of messages kept in localStorage: editing a user message or regenerating an answer adds
// a sibling, and the arrows beside a message move between siblings, so no branch is lost.
"use strict";

const STORAGE = { conversations: "spindle.conversations", settings: "spindle.settings", key: "spindle.apiKey" };
const SETTING_FIELDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "thinking", "thinking_budget", "tools"];
const $ = (id) => document.getElementById(id);

const page = {
  conversations: readStored(STORAGE.conversations, []),
  currentId: null,
  settings: readStored(STORAGE.settings, {}),
  models: [],
  // The answer being streamed: { controller, conversation, node }.
  streaming: null,
  // The message whose text is being edited in place.
  editing: null,
  // The conversation being renamed in the list.
  renaming: null,
};

function readStored(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text ? JSON.parse(text) : fallback;
  } catch {
    return fallback;
  }
}

function saveConversations() {
  try {
    localStorage.setItem(STORAGE.conversations, JSON.stringify(page.conversations));
  } catch (error) {
    toast(`Could not save the conversations: ${error.message}`);
  }
}

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function toast(text) {
  const box = $("toast");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 4000);
}

// ---- Conversations as trees -------------------------------------------------------------

function current() {
  return page.conversations.find((c) => c.id === page.currentId) || null;
}

function createConversation() {
  const conversation = { id: newId(), title: "New chat", created: Date.now(), updated: Date.now(), nodes: {}, leaf: null };
  page.conversations.unshift(conversation);
  page.currentId = conversation.id;
  return conversation;
}

function addNode(conversation, fields) {
  const node = { id: newId(), time: Date.now(), content: "", ...fields };
  conversation.nodes[node.id] = node;
  conversation.leaf = node.id;
  conversation.updated = Date.now();
  return node;
}

// The messages from the first to the conversation's chosen leaf.
function branch(conversation) {
  const path = [];
  for (let id = conversation.leaf; id; id = conversation.nodes[id]?.parent) path.unshift(conversation.nodes[id]);
  return path.filter(Boolean);
}

function children(conversation, parentId) {
  return Object.values(conversation.nodes)
    .filter((n) => (n.parent || null) === (parentId || null))
    .sort((a, b) => a.time - b.time);
}

// Follows the newest child down from `node`: the end of the branch the user last grew there.
function deepestLeaf(conversation, node) {
  let leaf = node;
  for (let next = children(conversation, leaf.id); next.length; next = children(conversation, leaf.id)) {
    leaf = next[next.length - 1];
  }
  return leaf;
}

function showSibling(conversation, node, step) {
  const siblings = children(conversation, node.parent);
  const index = siblings.findIndex((s) => s.id === node.id) + step;
  if (index < 0 || index >= siblings.length) return;
  conversation.leaf = deepestLeaf(conversation, siblings[index]).id;
  saveConversations();
  render();
}

function titleFrom(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 48 ? `${line.slice(0, 47)}…` : line || "New chat";
}

// ---- Settings -----------------------------------------------------------------------------

function readSettingsForm() {
  for (const field of SETTING_FIELDS) page.settings[field] = $(`set-${field}`).value;
  localStorage.setItem(STORAGE.settings, JSON.stringify(page.settings));
}

function fillSettingsForm() {
  for (const field of SETTING_FIELDS) $(`set-${field}`).value = page.settings[field] ?? "";
}

// The request's sampling and thinking fields; empty settings are left to the server.
function requestOptions() {
  const s = page.settings;
  const options = {};
  const number = (name, parse) => {
    if (s[name] === undefined || String(s[name]).trim() === "") return;
    const value = parse(s[name]);
    if (!Number.isFinite(value)) throw new Error(`the setting ${name} is not a number: ${s[name]}`);
    options[name] = value;
  };
  number("temperature", Number);
  number("top_p", Number);
  number("top_k", (v) => Number.parseInt(v, 10));
  number("min_p", Number);
  number("max_tokens", (v) => Number.parseInt(v, 10));
  number("seed", (v) => Number.parseInt(v, 10));
  number("thinking_budget", (v) => Number.parseInt(v, 10));
  if (s.thinking === "on" || s.thinking === "off") {
    options.chat_template_kwargs = { enable_thinking: s.thinking === "on" };
  }
  if (s.tools && s.tools.trim()) {
    let tools;
    try {
      tools = JSON.parse(s.tools);
    } catch (error) {
      throw new Error(`the Tools setting is not JSON: ${error.message}`);
    }
    if (!Array.isArray(tools)) throw new Error("the Tools setting must be a JSON array of tools");
    options.tools = tools;
  }
  return options;
}

// ---- The API ------------------------------------------------------------------------------

function headers() {
  const result = { "content-type": "application/json" };
  const key = localStorage.getItem(STORAGE.key);
  if (key) result.authorization = `Bearer ${key}`;
  return result;
}

// Asks for the API key once; resolves true when one was saved.
function askForKey() {
  const dialog = $("key-dialog");
  if (dialog.open) return askForKey.pending;
  $("key-input").value = "";
  dialog.showModal();
  askForKey.pending = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      const key = $("key-input").value.trim();
      if (dialog.returnValue === "save" && key) {
        localStorage.setItem(STORAGE.key, key);
        resolve(true);
      } else {
        resolve(false);
      }
    }, { once: true });
  });
  return askForKey.pending;
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    return body.error?.message || body.message || text;
  } catch {
    return text || response.statusText;
  }
}

async function loadModels() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: headers() });
  } catch (error) {
    toast(`The server does not answer: ${error.message}`);
    return;
  }
  if (response.status === 401 && await askForKey()) return loadModels();
  if (!response.ok) {
    toast(`Could not list the models (${response.status}): ${await errorText(response)}`);
    return;
  }
  page.models = (await response.json()).data || [];
  const select = $("model");
  select.replaceChildren(...page.models.map((m) => new Option(m.id, m.id)));
  if (page.models.some((m) => m.id === page.settings.model)) select.value = page.settings.model;
  page.settings.model = select.value;
  select.disabled = page.models.length < 2;
  renderGauge();
}

function contextOf(modelId) {
  return page.models.find((m) => m.id === modelId)?.max_model_len || null;
}

// The conversation up to `parent`, as the API wants it.
function apiMessages(conversation, parent) {
  const messages = [];
  const system = page.settings.system?.trim();
  if (system) messages.push({ role: "system", content: system });
  const chain = [];
  for (let id = parent.id; id; id = conversation.nodes[id].parent) chain.unshift(conversation.nodes[id]);
  for (const node of chain) {
    if (node.role === "user") {
      messages.push({ role: "user", content: node.content });
    } else if (node.content || node.toolCalls?.length) {
      const message = { role: "assistant", content: node.content };
      if (node.toolCalls?.length) {
        message.tool_calls = node.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
      }
      messages.push(message);
    }
  }
  return messages;
}

// Streams an answer to `parent` (a user message) into a new assistant message.
async function generate(conversation, parent) {
  if (page.streaming) return;
  const model = $("model").value || undefined;
  const node = addNode(conversation, { role: "assistant", parent: parent.id, status: "waiting", reasoning: "", toolCalls: [], deltas: 0, model });
  const controller = new AbortController();
  page.streaming = { controller, conversation, node };
  render();
  const started = performance.now();
  try {
    const body = { model, messages: apiMessages(conversation, parent), stream: true, stream_options: { include_usage: true }, return_progress: true, ...requestOptions() };
    const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal });
    if (response.status === 401) {
      delete conversation.nodes[node.id];
      conversation.leaf = parent.id;
      page.streaming = null;
      if (await askForKey()) return generate(conversation, parent);
      throw Object.assign(new Error("the server needs an API key"), { shown: true });
    }
    if (!response.ok) {
      node.status = "error";
      node.error = `The server answered ${response.status}: ${await errorText(response)}`;
      return;
    }
    node.status = "streaming";
    await readStream(response, node, started);
  } catch (error) {
    if (error.shown) {
      toast(error.message);
    } else if (error.name === "AbortError") {
      node.status = "stopped";
    } else if (node.status === "streaming") {
      node.status = "dropped";
      node.error = `The connection was lost (${error.message}); what had arrived is kept.`;
    } else {
      node.status = "error";
      node.error = node.deltas ? `${error.message}` : `No answer: ${error.message}`;
    }
  } finally {
    if (page.streaming?.node === node) page.streaming = null;
    node.time = node.time || Date.now();
    saveConversations();
    render();
  }
}

async function readStream(response, node, started) {
  const reader = response.body.getReader();
  let finished = false;
  const stats = { started };
  node.stats = stats;
  try {
    await readEvents(reader, node, stats, () => { finished = true; });
  } finally {
    // Also for a stopped or dropped answer: its time to first token is known.
    finishStats(node, stats);
  }
  if (node.status === "error") return;
  if (finished) {
    node.status = "done";
  } else {
    node.status = "dropped";
    node.error = "The connection closed before the answer ended; what had arrived is kept.";
  }
}

async function readEvents(reader, node, stats, onDone) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") {
        onDone();
        continue;
      }
      applyChunk(node, JSON.parse(data), stats);
    }
  }
}

function applyChunk(node, chunk, stats) {
  if (chunk.error) {
    node.status = "error";
    node.error = `The server stopped the answer: ${chunk.error.message || JSON.stringify(chunk.error)}`;
    return scheduleRender();
  }
  if (chunk.prompt_progress) {
    node.progress = chunk.prompt_progress;
    return scheduleRender();
  }
  if (chunk.usage) stats.usage = chunk.usage;
  const choice = chunk.choices?.[0];
  if (!choice) return;
  const delta = choice.delta || {};
  const now = performance.now();
  let grew = false;
  if (delta.reasoning_content) {
    node.reasoning += delta.reasoning_content;
    grew = true;
  }
  if (delta.content) {
    node.content += delta.content;
    grew = true;
  }
  for (const call of delta.tool_calls || []) {
    const index = call.index ?? node.toolCalls.length;
    const entry = node.toolCalls[index] || (node.toolCalls[index] = { id: "", name: "", arguments: "" });
    if (call.id) entry.id = call.id;
    if (call.function?.name) entry.name += call.function.name;
    if (call.function?.arguments) entry.arguments += call.function.arguments;
    grew = true;
  }
  if (grew) {
    node.deltas += 1;
    stats.first ??= now;
    stats.last = now;
    // Saved now and then, so a reload in the middle of a long answer keeps most of it.
    if (node.deltas % 32 === 0) saveConversations();
  }
  if (choice.finish_reason) stats.finish = choice.finish_reason;
  scheduleRender();
}

function finishStats(node, stats) {
  const usage = stats.usage;
  const result = { finish: stats.finish || null };
  if (stats.first !== undefined) {
    result.ttftMs = Math.round(stats.first - stats.started);
    const decodeSeconds = (stats.last - stats.first) / 1000;
    if (usage && decodeSeconds > 0 && usage.completion_tokens > 1) {
      result.decodeRate = (usage.completion_tokens - 1) / decodeSeconds;
    }
    const read = usage ? usage.prompt_tokens - (usage.prompt_tokens_details?.cached_tokens || 0) : 0;
    if (read > 0 && result.ttftMs > 0) result.prefillRate = read / (result.ttftMs / 1000);
  }
  if (usage) {
    result.prompt = usage.prompt_tokens;
    result.cached = usage.prompt_tokens_details?.cached_tokens || 0;
    result.generated = usage.completion_tokens;
    result.reasoningTokens = usage.completion_tokens_details?.reasoning_tokens || 0;
  }
  node.stats = result;
}

function stop() {
  page.streaming?.controller.abort();
}

// ---- Actions ------------------------------------------------------------------------------

function send() {
  const input = $("input");
  const text = input.value;
  if (!text.trim() || page.streaming) return;
  const conversation = current() || createConversation();
  if (!Object.keys(conversation.nodes).length) conversation.title = titleFrom(text);
  const user = addNode(conversation, { role: "user", parent: conversation.leaf, content: text });
  input.value = "";
  autosize();
  generate(conversation, user);
}

function regenerate(node) {
  const conversation = current();
  if (page.streaming || !conversation) return;
  generate(conversation, conversation.nodes[node.parent]);
}

function resend(node, text) {
  const conversation = current();
  if (page.streaming || !conversation || !text.trim()) return;
  page.editing = null;
  const user = addNode(conversation, { role: "user", parent: node.parent || null, content: text });
  generate(conversation, user);
}

function exportConversations() {
  const blob = new Blob([JSON.stringify({ spindle: 1, conversations: page.conversations }, null, 2)], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `spindle-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  link.click();
  URL.revokeObjectURL(link.href);
}

async function importConversations(file) {
  try {
    const body = JSON.parse(await file.text());
    const list = Array.isArray(body) ? body : body.conversations;
    if (!Array.isArray(list)) throw new Error("expected {\"conversations\": [...]} as the page exports");
    const valid = list.filter((c) => c && typeof c.id === "string" && c.nodes && typeof c.nodes === "object");
    if (valid.length !== list.length) throw new Error(`${list.length - valid.length} entries are not conversations`);
    for (const conversation of valid) {
      page.conversations = page.conversations.filter((c) => c.id !== conversation.id);
      page.conversations.push(conversation);
    }
    page.conversations.sort((a, b) => (b.updated || 0) - (a.updated || 0));
    saveConversations();
    render();
    toast(`Imported ${valid.length} conversation${valid.length === 1 ? "" : "s"}`);
  } catch (error) {
    toast(`Could not import ${file.name}: ${error.message}`);
  }
}

// ---- Rendering ----------------------------------------------------------------------------

function element(tag, attributes = {}, ...content) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...content.filter((c) => c !== null && c !== undefined));
  return node;
}

function renderList() {
  const query = $("search").value.trim().toLowerCase();
  const matches = (c) => !query || c.title.toLowerCase().includes(query) ||
    Object.values(c.nodes).some((n) => n.content?.toLowerCase().includes(query));
  const items = page.conversations.filter(matches).map((c) => {
    if (page.renaming === c.id) {
      const input = element("input", { value: c.title, "aria-label": "New name" });
      const done = (keep) => {
        if (keep && input.value.trim()) c.title = input.value.trim();
        page.renaming = null;
        saveConversations();
        renderList();
      };
      input.addEventListener("keydown", (e) => {
        if (e.key === "Enter") done(true);
        if (e.key === "Escape") { e.stopPropagation(); done(false); }
      });
      input.addEventListener("blur", () => done(true));
      queueMicrotask(() => { input.focus(); input.select(); });
      return element("li", { class: "current" }, input);
    }
    return element("li", { class: c.id === page.currentId ? "current" : null, "data-id": c.id, onclick: () => openConversation(c.id) },
      element("span", { class: "title", title: c.title }, c.title),
      element("span", { class: "actions" },
        element("button", { type: "button", class: "link", title: "Rename", "aria-label": "Rename", onclick: (e) => { e.stopPropagation(); page.renaming = c.id; renderList(); } }, "✎"),
        element("button", { type: "button", class: "link", title: "Delete", "aria-label": "Delete", onclick: (e) => { e.stopPropagation(); remove(c.id); } }, "×")));
  });
  if (!items.length) items.push(element("li", { class: "empty" }, query ? "No conversation matches." : "No conversations yet."));
  $("conversations").replaceChildren(...items);
}

function openConversation(id) {
  if (page.streaming) stop();
  page.currentId = id;
  page.editing = null;
  $("sidebar").classList.remove("open");
  render();
}

function remove(id) {
  if (page.streaming?.conversation.id === id) stop();
  page.conversations = page.conversations.filter((c) => c.id !== id);
  if (page.currentId === id) page.currentId = null;
  saveConversations();
  render();
}

function formatRate(value) {
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

// What is known of an answer: a stopped one has no usage, only its time to first token.
function statsLine(stats) {
  if (!stats) return null;
  const parts = stats.prompt === undefined ? [] : [`${stats.prompt} prompt`, `${stats.cached} cached`, `${stats.generated} generated`];
  if (stats.prefillRate) parts.push(`prefill ${formatRate(stats.prefillRate)} tok/s`);
  if (stats.decodeRate) parts.push(`decode ${formatRate(stats.decodeRate)} tok/s`);
  if (stats.ttftMs !== undefined) parts.push(`TTFT ${stats.ttftMs} ms`);
  if (!parts.length) return null;
  return element("span", { class: "stats", title: "Tokens of the prompt (cached among them) and of the answer; speeds measured by this page" }, parts.join(" · "));
}

function branchControls(conversation, node) {
  const siblings = children(conversation, node.parent);
  if (siblings.length < 2) return null;
  const index = siblings.findIndex((s) => s.id === node.id);
  return element("span", { class: "branch" },
    element("button", { type: "button", class: "link", "aria-label": "Previous version", disabled: index === 0 || !!page.streaming, onclick: () => showSibling(conversation, node, -1) }, "‹"),
    element("span", { class: "branch-position" }, `${index + 1}/${siblings.length}`),
    element("button", { type: "button", class: "link", "aria-label": "Next version", disabled: index === siblings.length - 1 || !!page.streaming, onclick: () => showSibling(conversation, node, 1) }, "›"));
}

function renderUser(conversation, node) {
  if (page.editing === node.id) {
    const area = element("textarea", { "aria-label": "Edit the message" });
    area.value = node.content;
    area.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); resend(node, area.value); }
      if (e.key === "Escape") { e.stopPropagation(); page.editing = null; render(); }
    });
    queueMicrotask(() => area.focus());
    return element("div", { class: "message user edit", "data-id": node.id },
      area,
      element("div", { class: "row" },
        element("button", { type: "button", onclick: () => { page.editing = null; render(); } }, "Cancel"),
        element("button", { type: "button", class: "primary save-edit", onclick: () => resend(node, area.value) }, "Send")));
  }
  return element("div", { class: "message user", "data-id": node.id },
    element("div", { class: "bubble" }, node.content),
    element("div", { class: "meta" },
      branchControls(conversation, node),
      element("button", { type: "button", class: "link edit-message", disabled: !!page.streaming, onclick: () => { page.editing = node.id; render(); } }, "Edit")));
}

function renderAssistant(conversation, node) {
  const bubble = element("div", { class: "bubble" });
  if (node.reasoning) {
    const streamingReasoning = node.status === "streaming" && !node.content && !node.toolCalls.length;
    // Open while it streams, closed once the answer starts, unless the user chose otherwise.
    const open = node.reasoningOpen === undefined ? streamingReasoning : node.reasoningOpen;
    const summary = element("summary", {}, streamingReasoning ? "Thinking…" : "Reasoning");
    // Only the user's clicks are remembered; the page's own opening and closing are not.
    summary.addEventListener("click", () => { node.reasoningOpen = !details.open; });
    const details = element("details", { class: "reasoning", open }, summary,
      element("div", { class: "reasoning-text" }, node.reasoning));
    bubble.append(details);
  }
  if (node.content) {
    const body = element("div", { class: "content" });
    body.innerHTML = Markdown.render(node.content);
    bubble.append(body);
  }
  for (const call of node.toolCalls || []) {
    let args = call.arguments;
    try { args = JSON.stringify(JSON.parse(call.arguments), null, 2); } catch { /* still streaming or not JSON: shown as sent */ }
    bubble.append(element("div", { class: "tool-call" },
      element("div", { class: "tool-name" }, `Tool call: ${call.name || "…"}`),
      element("pre", {}, args)));
  }
  if (node.status === "waiting" || (node.status === "streaming" && !node.deltas)) {
    const progress = node.progress;
    const text = progress && progress.total ? `Reading the prompt… ${Math.round((100 * progress.processed) / progress.total)}%` : "Waiting for the model…";
    bubble.append(element("div", { class: "waiting" }, text));
  }
  if (node.status === "stopped") bubble.append(element("div", { class: "notice soft" }, "Stopped."));
  if (node.error) bubble.append(element("div", { class: "notice", role: "alert" }, node.error));
  const actions = element("div", { class: "meta" },
    branchControls(conversation, node),
    node.model && page.models.length > 1 ? element("span", {}, node.model) : null,
    statsLine(node.stats),
    node.stats?.finish === "length" ? element("span", {}, "cut at max tokens") : null,
    node.status === "streaming" || node.status === "waiting" ? null :
      element("button", { type: "button", class: "link regenerate", disabled: !!page.streaming, onclick: () => regenerate(node) }, "Regenerate"),
    node.content ? element("button", { type: "button", class: "link", "data-copy": "message", onclick: () => copy(node.content) }, "Copy") : null);
  return element("div", { class: `message assistant ${node.status}`, "data-id": node.id, "data-status": node.status, "data-deltas": node.deltas || 0 }, bubble, actions);
}

function renderMessages() {
  const conversation = current();
  const box = $("messages");
  const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  if (!conversation || !conversation.leaf) {
    box.replaceChildren(element("div", { class: "welcome" },
      element("h1", {}, "Spindle"),
      element("p", {}, "Ask anything. Enter sends, Shift+Enter adds a line, Escape stops the answer."),
      element("p", {}, "Conversations stay in this browser; ⚙ holds the system prompt and the sampling settings.")));
    return;
  }
  box.replaceChildren(...branch(conversation).map((node) => node.role === "user" ? renderUser(conversation, node) : renderAssistant(conversation, node)));
  if (nearBottom || page.streaming) box.scrollTop = box.scrollHeight;
}

// Context used: the last answer's prompt and generated tokens on the shown branch.
function renderGauge() {
  const conversation = current();
  const context = contextOf($("model").value);
  const last = conversation ? branch(conversation).reverse().find((n) => n.stats?.prompt !== undefined) : null;
  const used = last ? last.stats.prompt + last.stats.generated : 0;
  const gauge = $("gauge");
  $("gauge-text").textContent = context ? `${used.toLocaleString()} / ${context.toLocaleString()} tokens` : `${used.toLocaleString()} tokens`;
  $("gauge-bar").style.width = context ? `${Math.min(100, (100 * used) / context)}%` : "0";
  gauge.classList.toggle("full", !!context && used / context > 0.85);
}

function render() {
  renderList();
  renderMessages();
  renderGauge();
  const busy = !!page.streaming;
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// Streamed deltas come faster than frames; one render per frame is enough.
function scheduleRender() {
  if (scheduleRender.pending) return;
  scheduleRender.pending = true;
  requestAnimationFrame(() => {
    scheduleRender.pending = false;
    render();
  });
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // Pages served over plain HTTP to another machine get no clipboard API.
    const area = element("textarea", { style: "position:fixed;opacity:0" });
    area.value = text;
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  toast("Copied");
}

function autosize() {
  const input = $("input");
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight + 2}px`;
}

// ---- Wiring -------------------------------------------------------------------------------

function wire() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("input").addEventListener("input", autosize);
  $("stop").addEventListener("click", stop);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && page.streaming) stop(); });
  $("new-chat").addEventListener("click", () => {
    page.currentId = null;
    $("sidebar").classList.remove("open");
    render();
    $("input").focus();
  });
  $("search").addEventListener("input", renderList);
  $("export").addEventListener("click", exportConversations);
  $("import").addEventListener("change", (e) => {
    const file = e.target.files[0];
    if (file) importConversations(file);
    e.target.value = "";
  });
  $("open-sidebar").addEventListener("click", () => $("sidebar").classList.add("open"));
  $("close-sidebar").addEventListener("click", () => $("sidebar").classList.remove("open"));
  $("open-settings").addEventListener("click", () => { $("settings").hidden = !$("settings").hidden; });
  $("close-settings").addEventListener("click", () => { $("settings").hidden = true; });
  $("settings").addEventListener("input", readSettingsForm);
  $("reset-settings").addEventListener("click", () => {
    page.settings = { model: page.settings.model };
    fillSettingsForm();
    readSettingsForm();
  });
  // Enter in the key's field submits the form as Save: Cancel is no submit button.
  $("key-cancel").addEventListener("click", () => $("key-dialog").close("cancel"));
  $("forget-key").addEventListener("click", () => {
    localStorage.removeItem(STORAGE.key);
    toast("The API key is forgotten");
  });
  $("model").addEventListener("change", () => {
    page.settings.model = $("model").value;
    localStorage.setItem(STORAGE.settings, JSON.stringify(page.settings));
    renderGauge();
  });
  $("messages").addEventListener("click", (e) => {
    const button = e.target.closest("button[data-copy='code']");
    if (button) copy(button.closest(".code").querySelector("pre").textContent);
  });
}

// An answer still streaming when the page went away stopped there.
for (const conversation of page.conversations) {
  for (const node of Object.values(conversation.nodes)) {
    if (node.status === "streaming" || node.status === "waiting") {
      node.status = "dropped";
      node.error = "The page was closed while this answer streamed; what had arrived is kept.";
    }
  }
}
page.currentId = page.conversations[0]?.id || null;
fillSettingsForm();
wire();
render();
loadModels();
