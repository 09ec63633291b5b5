// The chat page's state and what it keeps in the browser: conversations as trees of messages
// (editing a user message or regenerating an answer adds a sibling, so no branch is lost), the
// settings, and export / import as JSON. The page's scripts share one global scope, loaded in
// the order store.js, stream.js, app.js.
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
