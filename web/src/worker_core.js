// The page's side of a worker engine: the same core interface as LocalCore, carried over
// postMessage to worker.js.

import { fromWire } from "./errors.js";

export class WorkerCore {
  #worker;
  #next = 1;
  #pending = new Map();
  info;

  constructor(worker) {
    this.#worker = worker;
    worker.addEventListener("message", ({ data }) => this.#receive(data));
    worker.addEventListener("error", (e) => this.#failAll(new Error(`the engine worker failed: ${e.message ?? "error"}`)));
  }

  #receive({ id, kind, ...rest }) {
    const p = this.#pending.get(id);
    if (!p) return;
    if (kind === "progress") p.onProgress?.(rest.report);
    else if (kind === "token") p.onToken?.(rest.text, rest.tokenId, rest.logprobs);
    else {
      this.#pending.delete(id);
      if (kind === "result") p.resolve(rest.value);
      else p.reject(fromWire(rest.error));
    }
  }

  #failAll(err) {
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
  }

  #call(op, args, handlers = {}) {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ id, op, args });
    });
  }

  async load({ model, initProgressCallback, wasmUrl, nCtx, useCache }) {
    // Blobs and Files cross by structured clone (no copy of the data); URLs are resolved here,
    // where the page's base URL is known.
    const m = typeof model === "string" || model instanceof URL ? new URL(model, location.href).href : model;
    const w = wasmUrl ? new URL(wasmUrl, location.href).href : undefined;
    this.info = await this.#call("load", { model: m, wasmUrl: w, nCtx, useCache }, { onProgress: initProgressCallback });
    return this;
  }
  generate(request, onToken) {
    return this.#call("generate", { request }, { onToken });
  }
  interrupt() {
    this.#worker.postMessage({ id: 0, op: "interrupt" });
  }
  reset() {
    return this.#call("reset");
  }
  bench(nPrompt, nGen, reps) {
    return this.#call("bench", { nPrompt, nGen, reps });
  }
  async unload() {
    await this.#call("unload");
  }
}
