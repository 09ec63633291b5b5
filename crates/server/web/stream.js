// The chat page's side of the API: the model list and its contexts, the API key (asked for
// once, kept in the browser), and an answer streamed from `POST /v1/chat/completions` into a
// message, with its usage and the speeds this page measures.
"use strict";

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
