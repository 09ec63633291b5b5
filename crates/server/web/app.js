// The chat page's actions, rendering and keyboard: the conversation list, the shown branch of
// the conversation with its answers as Markdown, the context gauge, and the wiring of buttons
// and keys (Enter sends, Shift+Enter adds a line, Escape stops).
"use strict";

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
