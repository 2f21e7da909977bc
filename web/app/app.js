// The chat page: WebGPU capability check, model picker, worker engine (or the model of the
// `flint serve` that serves the page), streamed replies.

import { createServerEngine, serverModels } from "./server.js";

const MB = 1024 * 1024;
const SOFTWARE_ADAPTER = /swiftshader|llvmpipe|lavapipe|softpipe|warp|basic render/i;
const SHOWN_LIMITS = [
  "maxStorageBufferBindingSize",
  "maxBufferSize",
  "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupStorageSize",
  "maxStorageBuffersPerShaderStage",
];

const $ = (id) => document.getElementById(id);
const el = {
  status: $("webgpu-status"), gpuInfo: $("gpu-info"),
  select: $("model-select"), apiKey: $("api-key"), url: $("model-url"), file: $("model-file"), drop: $("drop-zone"),
  load: $("load"), progress: $("progress"), progressText: $("progress-text"),
  system: $("system"), temperature: $("temperature"), topP: $("top-p"), topK: $("top-k"),
  maxTokens: $("max-tokens"), seed: $("seed"), speculative: $("speculative"),
  modeNote: $("mode-note"), error: $("error"), messages: $("messages"), form: $("composer"),
  input: $("input"), send: $("send"), stop: $("stop"), newChat: $("new-chat"), stats: $("stats"),
};

const SERVER = "server:";
const state = {
  gpuOk: false, engine: null, worker: null, chatMode: true, history: [], localFile: null, busy: false, serverModels: [],
};

function showError(err) {
  el.error.hidden = !err;
  el.error.textContent = err ? `${err.name ?? "Error"}: ${err.message ?? err}` : "";
  if (err) console.error(err);
}

// Probes WebGPU before anything else, so a browser without it gets a message, not a silent failure.
async function checkWebGPU() {
  const adapter = navigator.gpu ? await navigator.gpu.requestAdapter().catch(() => null) : null;
  if (!adapter) {
    const why = navigator.gpu ? "no GPU adapter was granted" : "navigator.gpu is missing";
    el.status.textContent = `WebGPU is not available (${why}). Use a recent Chrome or Edge, ` +
      "or enable WebGPU in your browser's settings.";
    el.status.className = "bad";
    return false;
  }
  const info = adapter.info ?? {};
  const name = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ");
  const software = adapter.isFallbackAdapter || info.isFallbackAdapter || SOFTWARE_ADAPTER.test(name);
  el.status.textContent = `WebGPU adapter: ${name || "unnamed"}` +
    (software ? ". Warning: this is a software adapter; expect a few tokens per second." : "");
  el.status.className = software ? "warn" : "ok";
  const rows = SHOWN_LIMITS.map((k) => [k, adapter.limits[k]]);
  rows.push(["shader-f16", adapter.features.has("shader-f16") ? "yes" : "no"]);
  el.gpuInfo.textContent = rows
    .map(([k, v]) => `${k} ${typeof v === "number" && v >= MB ? `${v / MB} MiB` : v}`)
    .join(" · ");
  el.gpuInfo.hidden = false;
  return true;
}

// The catalog models served beside the page; a missing index just means no catalog.
async function loadCatalog() {
  try {
    const res = await fetch("models/index.json");
    if (!res.ok) return;
    for (const m of await res.json()) {
      el.select.add(new Option(`${m.name} (${(m.size / MB).toFixed(0)} MB)`, m.url));
    }
  } catch { /* no catalog */ }
}

// The server's own model, when the page is served by `flint serve`: it needs no WebGPU.
async function loadServerModels() {
  state.serverModels = await serverModels();
  if (!state.serverModels.length) return;
  const group = Object.assign(document.createElement("optgroup"), { label: "On this server" });
  for (const m of state.serverModels) group.append(new Option(`${m.id} (server)`, SERVER + m.id));
  el.select.append(group);
  el.apiKey.closest("label").hidden = false;
  if (!state.gpuOk) {
    el.status.textContent += " You can still chat with this server's model.";
    el.select.value = SERVER + state.serverModels[0].id;
  }
}

function chosenModel() {
  return state.localFile ?? (el.url.value.trim() || el.select.value || null);
}

const isServerModel = (model) => typeof model === "string" && model.startsWith(SERVER);

function refreshLoadButton() {
  const model = chosenModel();
  el.load.disabled = state.busy || !model || (!state.gpuOk && !isServerModel(model));
}

function onProgress(p) {
  el.progress.value = p.stage === "ready" ? el.progress.max : p.progress;
  const bytes = p.total ? ` ${(p.loaded / MB).toFixed(1)} / ${(p.total / MB).toFixed(1)} MB` : "";
  el.progressText.textContent = `${p.stage}:${bytes}${p.text ? ` (${p.text})` : ""}`;
}

async function loadModel() {
  const model = chosenModel();
  showError(null);
  setBusy(true);
  try {
    await unloadModel();
    if (isServerModel(model)) {
      const served = state.serverModels.find((m) => SERVER + m.id === model);
      state.engine = createServerEngine(served, { apiKey: el.apiKey.value.trim() });
      onProgress({ stage: "ready", progress: 1, text: "on the server" });
    } else {
      const { createWebWorkerEngine } = await import("./pkg/index.js");
      state.worker = new Worker(new URL("./pkg/worker.js", import.meta.url), { type: "module" });
      // N-gram drafting is on in the engine; each request says whether it uses it (the toggle).
      state.engine = await createWebWorkerEngine(state.worker, { model, initProgressCallback: onProgress, speculative: "ngram" });
    }
    const info = state.engine.info;
    state.chatMode = info.has_chat_template;
    const where = isServerModel(model) ? " On the server." : "";
    el.modeNote.textContent = state.chatMode
      ? `${info.name}: chat mode (the model's chat template), context ${info.n_ctx} tokens.${where}`
      : `${info.name}: this model has no chat template: plain text completion. Your message is continued as text.`;
    el.system.disabled = !state.chatMode;
    clearChat();
  } catch (err) {
    showError(err);
    await unloadModel();
  } finally {
    setBusy(false);
  }
}

async function unloadModel() {
  const { engine, worker } = state;
  state.engine = state.worker = null;
  if (engine) await engine.unload().catch(() => {});
  worker?.terminate();
}

function setBusy(busy) {
  state.busy = busy;
  el.send.disabled = busy || !state.engine;
  el.stop.disabled = !busy || !state.engine;
  el.newChat.disabled = busy || !state.engine;
  refreshLoadButton();
}

function clearChat() {
  state.history = [];
  el.messages.replaceChildren();
  el.stats.textContent = "";
}

function addMessage(role, text) {
  const div = Object.assign(document.createElement("div"), { className: role, textContent: text });
  el.messages.append(div);
  return div;
}

function samplingSettings() {
  const num = (input) => (input.value === "" ? undefined : Number(input.value));
  return {
    temperature: num(el.temperature), top_p: num(el.topP), top_k: num(el.topK),
    max_tokens: num(el.maxTokens), seed: num(el.seed), speculative: el.speculative.checked,
  };
}

function formatStats(u, finish) {
  const parts = [
    `TTFT ${Math.round(u.ttft_ms)} ms`,
    `prefill ${u.prefill_tok_s.toFixed(1)} tok/s`,
    `decode ${u.decode_tok_s.toFixed(1)} tok/s`,
    `${u.prompt_tokens} prompt + ${u.completion_tokens} generated tokens`,
  ];
  if (u.cached_prompt_tokens) parts.push(`cached prompt tokens: ${u.cached_prompt_tokens}`);
  const d = u.completion_tokens_details;
  const drafted = d ? d.accepted_prediction_tokens + d.rejected_prediction_tokens : 0;
  if (drafted) parts.push(`drafts accepted: ${d.accepted_prediction_tokens} of ${drafted} (${Math.round((100 * d.accepted_prediction_tokens) / drafted)}%)`);
  if (finish) parts.push(`finish: ${finish}`);
  return parts.join(" · ");
}

async function send() {
  const text = el.input.value;
  if (!state.engine || state.busy || !text.trim()) return;
  el.input.value = "";
  showError(null);
  setBusy(true);
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  let usage = null, finish = null;
  try {
    const request = { ...samplingSettings(), stream: true };
    let chunks;
    if (state.chatMode) {
      const system = el.system.value.trim();
      state.history.push({ role: "user", content: text });
      const messages = system ? [{ role: "system", content: system }, ...state.history] : state.history;
      chunks = await state.engine.chat.completions.create({ ...request, messages });
    } else {
      chunks = await state.engine.completions.create({ ...request, prompt: text });
    }
    for await (const chunk of chunks) {
      const choice = chunk.choices[0];
      const delta = (state.chatMode ? choice?.delta?.content : choice?.text) ?? "";
      if (delta) reply.append(delta);
      finish = choice?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
  } catch (err) {
    if (err.name === "AbortError") finish = "stopped";
    else showError(err);
  }
  // A turn that produced nothing is dropped from the history the next request sends.
  if (state.chatMode && reply.textContent) state.history.push({ role: "assistant", content: reply.textContent });
  else if (state.chatMode) state.history.pop();
  const stats = usage ? formatStats(usage, finish) : finish ?? "";
  el.stats.textContent = stats;
  reply.after(Object.assign(document.createElement("div"), { className: "reply-stats", textContent: stats }));
  setBusy(false);
}

// A dropped or chosen file wins over the URL and the catalog; picking either of those clears it.
function useLocalFile(file) {
  state.localFile = file ?? null;
  if (file) { el.select.value = ""; el.url.value = ""; }
  refreshLoadButton();
}

el.select.addEventListener("change", () => { el.url.value = ""; el.file.value = ""; useLocalFile(null); });
el.url.addEventListener("input", () => { el.select.value = ""; el.file.value = ""; state.localFile = null; refreshLoadButton(); });
el.file.addEventListener("change", () => useLocalFile(el.file.files[0]));
document.addEventListener("dragover", (e) => { e.preventDefault(); el.drop.classList.add("over"); });
document.addEventListener("dragleave", () => el.drop.classList.remove("over"));
document.addEventListener("drop", (e) => {
  e.preventDefault();
  el.drop.classList.remove("over");
  const file = [...e.dataTransfer.files].find((f) => f.name.endsWith(".gguf"));
  if (file) { el.file.value = ""; useLocalFile(file); el.progressText.textContent = `local file: ${file.name}`; }
});
el.load.addEventListener("click", loadModel);
el.form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
el.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
});
el.stop.addEventListener("click", () => state.engine?.interruptGenerate());
el.newChat.addEventListener("click", async () => {
  await state.engine?.resetChat();
  clearChat();
});

state.gpuOk = await checkWebGPU();
await loadCatalog();
await loadServerModels();
refreshLoadButton();
