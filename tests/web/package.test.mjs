// The npm package as a user gets it: the packed tarball installed into a fresh directory, a
// page importing it from there, models from `flint web`, WebGPU on SwiftShader. Outputs are
// checked against the f32 reference's greedy text (../shared/golden/f32).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO, launchPersistent, openPage, requireFile, secondsSince, startServer } from "./lib.mjs";

const GOLDEN = join(REPO, "../shared/golden");
const golden = (model, n) => JSON.parse(readFileSync(join(GOLDEN, "f32", model, `${n}.json`), "utf8"));
const GEMMA = "/models/gemma-3-270m.gguf";
const QWEN = "/models/qwen2.5-coder-0.5b.gguf";
const PKG = "/node_modules/flint-llm/src/index.js";
const WORKER = "/node_modules/flint-llm/src/worker.js";
const MINUTES = 60_000;

let app, server, browser, page;

before(async () => {
  const out = join(REPO, "target/web");
  const tarball = readdirSync(out).find((f) => /^flint-llm-.*\.tgz$/.test(f));
  requireFile(tarball ? join(out, tarball) : join(out, "flint-llm-*.tgz"));
  app = mkdtempSync(join(tmpdir(), "flint-app-"));
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "flint-app", private: true, type: "module" }));
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--offline", join(out, tarball)], { cwd: app, stdio: "inherit" });
  writeFileSync(join(app, "index.html"), '<!doctype html><meta charset="utf-8"><title>flint-llm test</title>');
  server = await startServer({ root: app });
  browser = await launchPersistent();
  page = await openPage(browser.context, "app");
  await page.goto(`${server.url}/index.html`);
});

after(async () => {
  await browser?.context.close();
  await server?.close();
  if (app) rmSync(app, { recursive: true, force: true });
});

const modelGets = (path) => server.requests.filter((r) => r.method === "GET" && r.path === path).length;

test("createEngine: greedy completion of golden prompt 1 on gemma-3-270m equals the f32 reference", { timeout: 15 * MINUTES }, async () => {
  const t0 = performance.now();
  const prompt = readFileSync(join(GOLDEN, "prompts/p1.txt"), "utf8");
  const r = await page.evaluate(
    async ({ PKG, GEMMA, prompt }) => {
      const flint = await import(PKG);
      const stages = new Set();
      const engine = await flint.createEngine({ model: GEMMA, initProgressCallback: (p) => stages.add(p.stage) });
      const done = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16 });
      // Bad requests fail with the package's named errors, before any GPU work.
      const errorName = (p) => p.then(() => "no error", (e) => `${e.name}${e instanceof flint.FlintError ? "" : " (not a FlintError)"}`);
      const badTemperature = await errorName(engine.completions.create({ prompt, temperature: 3 }));
      const tooLong = await errorName(engine.completions.create({ prompt: "word ".repeat(5000), max_tokens: 1 }));
      const noTemplate = await errorName(engine.chat.completions.create({ messages: [{ role: "user", content: "hi" }] }));
      const cached = await flint.hasModelInCache(GEMMA);
      await engine.unload();
      return { done, stages: [...stages], badTemperature, tooLong, noTemplate, cached };
    },
    { PKG, GEMMA, prompt },
  );
  console.log(`gemma completion in ${secondsSince(t0)} s: ${JSON.stringify(r.done.usage)}`);
  assert.equal(r.done.object, "text_completion");
  assert.equal(r.done.choices[0].text, golden("gemma", 1).greedy_text_16);
  assert.equal(r.done.choices[0].finish_reason, "length");
  assert.equal(r.done.usage.completion_tokens, 16);
  assert.equal(r.done.usage.prompt_tokens, golden("gemma", 1).prompt_token_ids.length);
  assert.deepEqual(r.stages, ["download", "load", "ready"]);
  assert.equal(r.badTemperature, "InvalidRequestError");
  assert.equal(r.tooLong, "ContextWindowExceededError");
  assert.equal(r.noTemplate, "ChatTemplateError");
  assert.equal(r.cached, true, "hasModelInCache after loading");
  assert.equal(modelGets(GEMMA), 1, "the model was downloaded once");
});

test("after a reload, the worker engine loads gemma from the browser cache without downloading it", { timeout: 15 * MINUTES }, async () => {
  const t0 = performance.now();
  const before = server.requests.length;
  await page.reload();
  const prompt = readFileSync(join(GOLDEN, "prompts/p1.txt"), "utf8");
  const r = await page.evaluate(
    async ({ PKG, WORKER, GEMMA, prompt }) => {
      const flint = await import(PKG);
      const stages = new Set();
      const worker = new Worker(WORKER, { type: "module" });
      const engine = await flint.createWebWorkerEngine(worker, { model: GEMMA, initProgressCallback: (p) => stages.add(p.stage) });
      const done = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16 });
      await engine.unload();
      worker.terminate();
      return { done, stages: [...stages], info: engine.info };
    },
    { PKG, WORKER, GEMMA, prompt },
  );
  console.log(`gemma from the cache, in a worker, in ${secondsSince(t0)} s: ${JSON.stringify(r.done.usage)}`);
  const modelRequests = server.requests.slice(before).filter((q) => q.path.startsWith("/models/"));
  assert.deepEqual(modelRequests, [], "no request for the model after the reload");
  assert.deepEqual(r.stages, ["cache", "load", "ready"]);
  assert.equal(r.info.has_chat_template, false);
  assert.equal(r.done.choices[0].text, golden("gemma", 1).greedy_text_16);
});

test("worker engine: streamed chat on qwen2.5-coder-0.5b (read by HTTP ranges) equals the f32 reference", { timeout: 25 * MINUTES }, async () => {
  const t0 = performance.now();
  const messages = JSON.parse(readFileSync(join(GOLDEN, "prompts/chat_messages_qwen6.json"), "utf8"));
  const r = await page.evaluate(
    async ({ PKG, WORKER, QWEN, messages }) => {
      const flint = await import(PKG);
      const worker = new Worker(WORKER, { type: "module" });
      const engine = await flint.createWebWorkerEngine(worker, { model: QWEN, useCache: false });
      const chunks = [];
      for await (const c of await engine.chat.completions.create({ messages, stream: true, temperature: 0, max_tokens: 16 })) {
        chunks.push(c);
      }
      await engine.unload();
      worker.terminate();
      return { chunks, info: engine.info, cached: await flint.hasModelInCache(QWEN) };
    },
    { PKG, WORKER, QWEN, messages },
  );
  const last = r.chunks.at(-1);
  console.log(`qwen streamed chat in ${secondsSince(t0)} s, ${r.chunks.length} chunks: ${JSON.stringify(last.usage)}`);
  assert.ok(r.chunks.length >= 3, "the reply arrives in several chunks");
  assert.ok(r.chunks.every((c) => c.object === "chat.completion.chunk"));
  assert.equal(r.chunks[0].choices[0].delta.role, "assistant");
  const text = r.chunks.map((c) => c.choices[0].delta.content ?? "").join("");
  assert.equal(text, golden("qwen", 6).greedy_text_16);
  assert.equal(last.choices[0].finish_reason, "length");
  assert.equal(last.usage.prompt_tokens, golden("qwen", 6).prompt_token_ids.length);
  assert.equal(r.info.has_chat_template, true);
  assert.equal(r.cached, false, "useCache: false keeps the model out of the cache");
  assert.ok(server.requests.some((q) => q.path === QWEN && q.status === 206), "read by Range requests");
  assert.equal(modelGets(QWEN), server.requests.filter((q) => q.path === QWEN && q.method === "GET" && q.status === 206).length);
});
