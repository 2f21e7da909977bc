// flint-llm: LLMs on WebGPU in the browser, with an OpenAI-shaped API.
//
//   const engine = await createEngine({ model: url | File | Blob, initProgressCallback });
//   const reply = await engine.chat.completions.create({ messages, temperature: 0 });

import { Engine } from "./engine.js";
import { LocalCore } from "./local.js";
import { WorkerCore } from "./worker_core.js";
import { fromWire } from "./errors.js";

export * from "./errors.js";
export { hasModelInCache, deleteModelFromCache } from "./cache.js";

/**
 * Loads a model in this thread. Options: `model` (URL, File or Blob), `initProgressCallback`
 * ({stage, loaded, total, progress, text, and in stage "load" tensors: {loaded, total}}), `wasmUrl` (self-hosted engine .wasm), `nCtx`
 * (context tokens, default 4096), `useCache` (default true: URLs are kept in the browser's cache).
 */
export async function createEngine(options) {
  try {
    return new Engine(await LocalCore.load(options));
  } catch (e) {
    throw fromWire(e);
  }
}

/** The same engine running in `worker` (a module Worker on this package's `worker.js`). */
export async function createWebWorkerEngine(worker, options = {}) {
  const { initProgressCallback, ...rest } = options;
  return new Engine(await new WorkerCore(worker).load({ ...rest, initProgressCallback }));
}
