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

  #streams = new Map();

  #receive({ id, kind, ...rest }) {
    if (kind === "event") {
      const onEvent = this.#streams.get(id);
      if (rest.event.type === "end") this.#streams.delete(id);
      onEvent?.(rest.event);
      return;
    }
    const p = this.#pending.get(id);
    if (!p) return;
    if (kind === "progress") p.onProgress?.(rest.report);
    else {
      this.#pending.delete(id);
      if (kind === "result") p.resolve(rest.value);
      else p.reject(fromWire(rest.error));
    }
  }

  #failAll(err) {
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
    for (const onEvent of this.#streams.values()) {
      onEvent({ type: "error", name: err.name, message: err.message });
      onEvent({ type: "end" });
    }
    this.#streams.clear();
  }

  #call(op, args, handlers = {}, id = this.#next++) {
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ id, op, args });
    });
  }

  async load({ model, initProgressCallback, wasmUrl, nCtx, maxSeqs, selfTest, chatTemplate, speculative, draftMax, draftModel, draftPMin, deviceMemoryMB, cacheTypeK, cacheTypeV, exact, overlap, useCache }) {
    // Blobs and Files cross by structured clone (no copy of the data); URLs are resolved here,
    // where the page's base URL is known.
    const m = typeof model === "string" || model instanceof URL ? new URL(model, location.href).href : model;
    const w = wasmUrl ? new URL(wasmUrl, location.href).href : undefined;
    const d = typeof draftModel === "string" || draftModel instanceof URL ? new URL(draftModel, location.href).href : draftModel;
    this.info = await this.#call("load", { model: m, wasmUrl: w, nCtx, maxSeqs, selfTest, chatTemplate, speculative, draftMax, draftModel: d, draftPMin, deviceMemoryMB, cacheTypeK, cacheTypeV, exact, overlap, useCache }, { onProgress: initProgressCallback });
    return this;
  }
  /** Queues `request` in the worker; `onEvent` gets its events. Resolves to its id. */
  submit(request, onEvent) {
    const id = this.#next++;
    this.#streams.set(id, onEvent);
    return this.#call("submit", { request }, {}, id).catch((e) => {
      this.#streams.delete(id);
      throw e;
    });
  }
  cancel(rid) {
    this.#worker.postMessage({ id: 0, op: "cancel", args: { rid } });
  }
  interrupt() {
    this.#worker.postMessage({ id: 0, op: "interrupt" });
  }
  reset() {
    return this.#call("reset");
  }
  reload() {
    return this.#call("reload");
  }
  bench(nPrompt, nGen, reps) {
    return this.#call("bench", { nPrompt, nGen, reps });
  }
  async unload() {
    await this.#call("unload");
  }
}
