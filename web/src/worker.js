// The engine inside a Web Worker: the page talks to it through createWebWorkerEngine, so
// loading and generating never block the page. Messages: {id, op, args} in; {id, kind, ...}
// out, with kind "progress" | "event" | "result" | "error"; a submitted request's events carry
// the id of the call that submitted it, until its "end" event.

import { LocalCore } from "./local.js";
import { toWire } from "./errors.js";

let core = null;

const ops = {
  async load(id, args) {
    core?.unload();
    core = null;
    core = await LocalCore.load({ ...args, initProgressCallback: (report) => postMessage({ id, kind: "progress", report }) });
    return core.info;
  },
  submit(id, { request }) {
    return need().submit(request, (event) => postMessage({ id, kind: "event", event }));
  },
  cancel(_id, { rid }) {
    core?.cancel(rid);
  },
  interrupt() {
    core?.interrupt();
  },
  reset() {
    need().reset();
  },
  reload() {
    return need().reload();
  },
  bench(_id, { nPrompt, nGen, reps }) {
    return need().bench(nPrompt, nGen, reps);
  },
  unload() {
    core?.unload();
    core = null;
  },
};

function need() {
  if (!core) throw Object.assign(new Error("no model is loaded in the worker"), { name: "EngineUnloadedError" });
  return core;
}

self.onmessage = async ({ data: { id, op, args } }) => {
  try {
    const fn = ops[op];
    if (!fn) throw new Error(`unknown operation ${op}`);
    postMessage({ id, kind: "result", value: await fn(id, args ?? {}) });
  } catch (e) {
    postMessage({ id, kind: "error", error: toWire(e) });
  }
};
