// The engine in this thread: loads the wasm module, opens the model (cache, download or
// local file) and runs requests. `createEngine` wraps it; the worker script runs it too.

import init, { checkModel, loadEngine } from "./wasm/flint_wasm.js";
import { fromWire, ModelLoadError, WebGPUNotAvailableError, EngineUnloadedError } from "./errors.js";
import { blobSource, rangeSource } from "./source.js";
import { cachedModel, downloadToCache } from "./cache.js";

let wasmReady = null;

function initWasm(wasmUrl) {
  wasmReady ??= init(wasmUrl ? { module_or_path: wasmUrl } : undefined).catch((e) => {
    wasmReady = null;
    throw new ModelLoadError(`cannot load the engine's wasm module: ${e?.message ?? e}`);
  });
  return wasmReady;
}

/** Reports progress: each stage's start and end, and steps of at least 0.5% between. */
function reporter(cb) {
  let last = { stage: null, progress: -1 };
  const report = (stage, loaded, total, text, tensors) => {
    report.seen = { stage, text, at: performance.now() };
    const progress = total > 0 ? Math.min(1, loaded / total) : stage === "ready" ? 1 : 0;
    // Stages without a total (kernel compiles: a count) report every step.
    if (stage === last.stage && total > 0 && progress < 1 && progress - last.progress < 0.005) return;
    last = { stage, progress };
    cb?.({ stage, loaded, total, progress, text, ...(tensors && { tensors: { ...tensors } }) });
  };
  // The last report, throttled or not (see `watchQuiet`).
  report.seen = { stage: null, text: "", at: performance.now() };
  return report;
}

/** How long a load may go without any progress before it says so on the console. */
const QUIET_MS = 60_000;

/**
 * While `work` runs, says on the console once a minute that it has reported no progress
 * for a minute, naming its last report: a load waiting on the browser (a device that never
 * comes, a promise the GPU never settles) shows where it stopped instead of hanging silently.
 */
async function watchQuiet(report, work) {
  const timer = setInterval(() => {
    const { stage, text, at } = report.seen;
    const quiet = performance.now() - at;
    if (quiet >= QUIET_MS) console.warn(`flint: createEngine has reported no progress for ${Math.round(quiet / 1000)} s; the last report: ${stage ?? "none"} (${text})`);
  }, QUIET_MS);
  try {
    return await work();
  } finally {
    clearInterval(timer);
  }
}

const MB = (n) => (n / 1e6).toFixed(1);

/**
 * Where the model's bytes come from, downloading into the browser's cache first if needed;
 * `check(url)` runs before a download (on the header, read by HTTP ranges) and throws to
 * refuse the model before any of its weights are fetched.
 */
async function openModel(model, report, useCache, check) {
  if (typeof Blob !== "undefined" && model instanceof Blob) return { source: model, name: model.name ?? "model.gguf" };
  if (typeof model !== "string" && !(model instanceof URL)) throw new ModelLoadError("model must be a URL, a File or a Blob");
  const url = String(model);
  const name = decodeURIComponent(url.split("/").pop().split("?")[0]) || url;
  if (useCache) {
    const cached = await cachedModel(url);
    if (cached) {
      report("cache", 0, cached.size, `found ${name} in the browser's storage (${MB(cached.size)} MB)`);
      return { source: cached, name };
    }
    report("check", 0, 0, `checking ${name}: reading its header`);
    await check(url);
    const blob = await downloadToCache(
      url,
      (loaded, total) => report("download", loaded, total, `downloading ${name}: ${MB(loaded)} of ${MB(total)} MB`),
      (why) => report("cache", 0, 0, `not caching ${name}: ${why}; reading it by HTTP ranges instead`),
    );
    if (blob) return { source: blob, name };
  }
  return { source: url, name };
}

export class LocalCore {
  #engine;
  info;

  static async load(options) {
    const report = reporter(options.initProgressCallback);
    return watchQuiet(report, () => LocalCore.#load(options, report));
  }

  static async #load({ model, wasmUrl, nCtx, maxSeqs, selfTest, chatTemplate, speculative, draftMax, draftModel, draftPMin, deviceMemoryMB, cacheTypeK, cacheTypeV, exact, overlap, useCache = true }, report) {
    if (typeof navigator === "undefined" || !navigator.gpu) {
      throw new WebGPUNotAvailableError("WebGPU is not available in this browser (navigator.gpu is missing)");
    }
    await initWasm(wasmUrl);
    const opts = {};
    // Passed as given (undefined and null: the default), so that a bad value is refused, not dropped.
    if (nCtx != null) opts.n_ctx = nCtx;
    if (maxSeqs != null) opts.max_seqs = maxSeqs;
    if (selfTest != null) opts.self_test = selfTest;
    if (typeof chatTemplate === "string") opts.chat_template = chatTemplate;
    if (speculative != null) opts.spec_type = speculative;
    if (draftMax != null) opts.draft_max = draftMax;
    if (draftPMin != null) opts.draft_p_min = draftPMin;
    if (deviceMemoryMB != null) opts.device_mem_mb = deviceMemoryMB;
    if (cacheTypeK != null) opts.cache_type_k = cacheTypeK;
    if (cacheTypeV != null) opts.cache_type_v = cacheTypeV;
    if (exact != null) opts.exact = exact;
    if (overlap != null) opts.overlap = overlap;
    // Before a download: the header alone, by ranges, checked as the load checks it.
    const check = async (url) => {
      try {
        await checkModel(await rangeSource(url), JSON.stringify(opts));
      } catch (e) {
        throw fromWire(e);
      }
    };
    const { source, name } = await openModel(model, report, useCache, check);
    let loaded = 0;
    const tensors = { loaded: 0, total: 0 };
    const onRead = (n) => {
      loaded += n;
      const count = tensors.total ? `, ${tensors.loaded} of ${tensors.total} tensors` : "";
      report("load", loaded, total, `loading ${name} onto the GPU: ${MB(loaded)} of ${MB(total)} MB${count}`, tensors.total ? tensors : undefined);
    };
    const onTensor = (done, all) => Object.assign(tensors, { loaded: done, total: all });
    const reader = typeof source === "string" ? await rangeSource(source, onRead) : blobSource(source, onRead);
    // A draft model is opened the same way; its bytes count in the load's progress too.
    let draftReader = null;
    if (draftModel != null) {
      const draft = await openModel(draftModel, report, useCache, async () => {});
      draftReader = typeof draft.source === "string" ? await rangeSource(draft.source, onRead) : blobSource(draft.source, onRead);
    }
    const total = reader.size + (draftReader?.size ?? 0);
    const core = new LocalCore();
    try {
      const onCompile = (n) => report("compile", n, 0, `compiling GPU kernels: ${n}`);
      core.#engine = await loadEngine(reader, JSON.stringify(opts), onCompile, draftReader, onTensor);
    } catch (e) {
      throw fromWire(e);
    }
    core.info = { ...JSON.parse(core.#engine.info()), file: name, size: total };
    report("ready", total, total, `${name} is ready`);
    return core;
  }

  #live() {
    if (!this.#engine) throw new EngineUnloadedError("the engine was unloaded");
    return this.#engine;
  }

  /** Queues `request`; `onEvent` gets each event object. Resolves to the request's id. */
  async submit(request, onEvent) {
    try {
      return this.#live().submit(request, (json) => onEvent(JSON.parse(json)));
    } catch (e) {
      throw fromWire(e);
    }
  }
  cancel(id) {
    this.#engine?.cancel(id);
  }
  interrupt() {
    this.#engine?.interruptAll();
  }
  reset() {
    this.#live().reset();
  }
  reload() {
    return this.#live().reload();
  }
  bench(nPrompt, nGen, reps) {
    return this.#live().bench(nPrompt, nGen, reps).then(JSON.parse);
  }
  unload() {
    this.#engine?.free();
    this.#engine = null;
  }
}
