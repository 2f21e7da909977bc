// The npm package as a user gets it: the packed tarball installed into a fresh directory, a
// page importing it from there, models from `flint web`, WebGPU on SwiftShader. Outputs are
// checked against the f32 reference's greedy text (../shared/golden/f32).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FLINT_BIN, REPO, launchPersistent, openPage, requireFile, secondsSince, startServe, startServer } from "./lib.mjs";

const GOLDEN = join(REPO, "../shared/golden");
const golden = (model, n) => JSON.parse(readFileSync(join(GOLDEN, "f32", model, `${n}.json`), "utf8"));
// The tiny random-weight qwen3 of the family oracles (TINY): its model and f32 references.
const TINY_DIR = join(GOLDEN, "families/qwen3");
const tinyGolden = (n) => JSON.parse(readFileSync(join(TINY_DIR, `${n}.json`), "utf8"));
// A non-empty start of the reference's greedy text `want`.
const assertPrefix = (text, want, label) =>
  assert.ok(text.length > 0 && want.startsWith(text), `${label}: ${JSON.stringify(text)} is not a prefix of ${JSON.stringify(want)}`);
const GEMMA = "/models/gemma-3-270m.gguf";
const QWEN = "/models/qwen2.5-coder-0.5b.gguf";
const PKG = "/node_modules/flint-llm/src/index.js";
const WORKER = "/node_modules/flint-llm/src/worker.js";
// The tiny random-weight qwen3 of the family oracles: quick to load and compile.
const TINY = "/qwen3-tiny.gguf";
// Two layers of Qwen2.5-7B's widths in Q4_K_M's formats, and the GPU's greedy continuation:
// written by crates/flint/tests/wide_model.rs (the Rust tests run first).
const WIDE = "/wide-2l.gguf";
const WIDE_DIR = join(REPO, "target/test-models");
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
  copyFileSync(join(TINY_DIR, "model.gguf"), join(app, TINY.slice(1)));
  requireFile(join(WIDE_DIR, "wide-2l.gguf"), "run `cargo test --release -p flint --test wide_model` first");
  copyFileSync(join(WIDE_DIR, "wide-2l.gguf"), join(app, WIDE.slice(1)));
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
// Whole-file downloads (not Range reads).
const fullGets = (path) => server.requests.filter((r) => r.method === "GET" && r.path === path && r.status === 200).length;

test("createEngine: greedy completion of golden prompt 1 on gemma-3-270m equals the f32 reference", { timeout: 15 * MINUTES }, async () => {
  const t0 = performance.now();
  const prompt = readFileSync(join(GOLDEN, "prompts/p1.txt"), "utf8");
  const r = await page.evaluate(
    async ({ PKG, GEMMA, prompt }) => {
      const flint = await import(PKG);
      const stages = new Set();
      const tensors = [];
      const engine = await flint.createEngine({ model: GEMMA, initProgressCallback: (p) => stages.add(p.stage) && p.tensors && tensors.push(p.tensors) });
      const done = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16 });
      // Bad requests fail with the package's named errors, before any GPU work.
      const errorName = (p) => p.then(() => "no error", (e) => `${e.name}${e instanceof flint.FlintError ? "" : " (not a FlintError)"}`);
      const badTemperature = await errorName(engine.completions.create({ prompt, temperature: 3 }));
      const tooLong = await errorName(engine.completions.create({ prompt: "word ".repeat(5000), max_tokens: 1 }));
      const noTemplate = await errorName(engine.chat.completions.create({ messages: [{ role: "user", content: "hi" }] }));
      const cached = await flint.hasModelInCache(GEMMA);
      await engine.unload();
      return { done, stages: [...stages], tensors, badTemperature, tooLong, noTemplate, cached };
    },
    { PKG, GEMMA, prompt },
  );
  console.log(`gemma completion in ${secondsSince(t0)} s: ${JSON.stringify(r.done.usage)}`);
  assert.equal(r.done.object, "text_completion");
  assert.equal(r.done.choices[0].text, golden("gemma", 1).greedy_text_16);
  assert.equal(r.done.choices[0].finish_reason, "length");
  assert.equal(r.done.usage.completion_tokens, 16);
  assert.ok(r.done.usage.ttft_ms > 0 && r.done.usage.decode_tok_s > 0, "the request is timed with the browser's clock");
  assert.equal(r.done.usage.prompt_tokens, golden("gemma", 1).prompt_token_ids.length);
  // The header is read by ranges and checked before the download.
  assert.deepEqual(r.stages, ["check", "download", "load", "compile", "ready"]);
  // The load's progress counts tensors too: gemma-3-270m's 236 (`flint info`), read whole.
  const last = r.tensors.at(-1);
  console.log(`load progress: ${r.tensors.length} reports, the last ${JSON.stringify(last)}`);
  assert.ok(r.tensors.every((t, i) => t.total === 236 && (i === 0 || t.loaded >= r.tensors[i - 1].loaded)), JSON.stringify(r.tensors));
  assert.ok(last.loaded >= 0.9 * last.total, JSON.stringify(last));
  assert.equal(r.badTemperature, "InvalidRequestError");
  assert.equal(r.tooLong, "ContextWindowExceededError");
  assert.equal(r.noTemplate, "ChatTemplateError");
  assert.equal(r.cached, true, "hasModelInCache after loading");
  assert.equal(fullGets(GEMMA), 1, "the model was downloaded once");
  assert.ok(modelGets(GEMMA) > 1 && server.requests.some((q) => q.path === GEMMA && q.status === 206), "after its header was read by ranges");
});

test("draftModel: a model drafting for itself gives the same greedy text, every draft accepted; a draft of another vocabulary is refused", { timeout: 10 * MINUTES }, async () => {
  const t0 = performance.now();
  const r = await page.evaluate(
    async ({ PKG, TINY, QWEN }) => {
      const flint = await import(PKG);
      const greedy = { prompt: "Once upon a time", max_tokens: 16, temperature: 0 };
      const plain = await flint.createEngine({ model: TINY, useCache: false });
      const want = (await plain.completions.create(greedy)).choices[0].text;
      await plain.unload();
      // Random weights are never confident: no p_min cut, so every step drafts.
      const drafting = await flint.createEngine({ model: TINY, draftModel: TINY, draftPMin: 0, useCache: false });
      const got = await drafting.completions.create(greedy);
      await drafting.unload();
      const refused = await flint.createEngine({ model: TINY, draftModel: QWEN, useCache: false })
        .then(() => "loaded", (e) => `${e.name}: ${e.message}`);
      return { want, got, refused };
    },
    { PKG, TINY, QWEN },
  );
  console.log(`draftModel in ${secondsSince(t0)} s: ${JSON.stringify(r.got.usage.completion_tokens_details)}; ${r.refused}`);
  assert.equal(r.got.choices[0].text, r.want, "drafting changed the greedy text");
  const d = r.got.usage.completion_tokens_details;
  assert.ok(d.accepted_prediction_tokens > 0 && d.rejected_prediction_tokens === 0, JSON.stringify(r.got.usage));
  assert.match(r.refused, /^ModelLoadError: .*vocabulary/);
});

test("a GPUDevice destroyed from the page: the running request fails with DeviceLostError; the next request, and reload(), load the model on a new device", { timeout: 10 * MINUTES }, async () => {
  const t0 = performance.now();
  const r = await page.evaluate(
    async ({ PKG, TINY }) => {
      const flint = await import(PKG);
      // The page keeps every GPUDevice the engine asks for, to destroy it as a driver reset would.
      const devices = [];
      const requestDevice = GPUAdapter.prototype.requestDevice;
      GPUAdapter.prototype.requestDevice = async function (...args) {
        const device = await requestDevice.apply(this, args);
        devices.push(device);
        return device;
      };
      try {
        const engine = await flint.createEngine({ model: TINY, useCache: false });
        const greedy = { prompt: "Once upon a time", max_tokens: 16, temperature: 0 };
        const text = async () => (await engine.completions.create(greedy)).choices[0].text;
        const before = await text();
        let chunks = 0;
        let lostAt = 0;
        let failed = null;
        try {
          const stream = await engine.completions.create({ ...greedy, max_tokens: 300, stream: true });
          for await (const _ of stream) {
            if (++chunks === 1) {
              lostAt = performance.now();
              devices.at(-1).destroy();
            }
          }
        } catch (e) {
          failed = { name: e.name, typed: e instanceof flint.DeviceLostError, message: e.message, ms: performance.now() - lostAt };
        }
        const attempt = async (f) => {
          try {
            return await f();
          } catch (e) {
            return `${e.name}: ${e.message}`;
          }
        };
        const afterLoss = await attempt(text);
        const devicesAfterLoss = devices.length;
        devices.at(-1).destroy();
        const reloaded = await attempt(() => engine.reload());
        const afterReload = await attempt(text);
        await engine.unload();
        return { before, chunks, failed, afterLoss, reloaded, afterReload, devicesAfterLoss, devices: devices.length };
      } finally {
        GPUAdapter.prototype.requestDevice = requestDevice;
      }
    },
    { PKG, TINY },
  );
  console.log(`device loss in the page, ${secondsSince(t0)} s: ${JSON.stringify(r)}`);
  assert.ok(r.failed, "the running stream did not fail");
  assert.equal(r.failed.name, "DeviceLostError", r.failed.message);
  assert.ok(r.failed.typed, "a DeviceLostError instance");
  assert.ok(r.failed.ms < 2000, `the stream failed ${r.failed.ms} ms after the loss`);
  assert.ok(r.chunks < 300, "the stream ran to its end");
  assert.equal(r.devicesAfterLoss, 2, "the next request opened a new device");
  assert.equal(r.afterLoss, r.before, "the text after the reload differs");
  assert.equal(r.reloaded, undefined, "reload() failed");
  assert.equal(r.devices, 3, "reload() opened a new device");
  assert.equal(r.afterReload, r.before);
});

test("hostile chat templates (chatTemplate) fail with ChatTemplateError within 1 s each, and the engine keeps serving", { timeout: 10 * MINUTES }, async () => {
  // One template whose branch the message picks: endless loops, a string doubled in a
  // namespace loop and by an explicit chain of concatenations, recursion, and a plain render.
  const chain = "{% set a = 'xxxxxxxx' %}" + "{% set a = a ~ a %}".repeat(40) + "{{ a }}";
  const template = [
    "{% set m = messages[0]['content'] %}",
    "{% if m == 'loops' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% elif m == 'namespace' %}{% set ns = namespace(a='x') %}{% for i in range(64) %}{% set ns.a = ns.a ~ ns.a %}{% endfor %}{{ ns.a }}",
    `{% elif m == 'chain' %}${chain}`,
    "{% elif m == 'recursion' %}{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% else %}{{ m }}{% endif %}",
  ].join("");
  const r = await page.evaluate(
    async ({ PKG, TINY, template }) => {
      const flint = await import(PKG);
      const engine = await flint.createEngine({ model: TINY, useCache: false, chatTemplate: template });
      const out = {};
      for (const content of ["loops", "namespace", "chain", "recursion"]) {
        const t0 = performance.now();
        try {
          await engine.chat.completions.create({ messages: [{ role: "user", content }], max_tokens: 1 });
          out[content] = { name: "no error" };
        } catch (e) {
          out[content] = { name: e.name, typed: e instanceof flint.ChatTemplateError, message: e.message, ms: performance.now() - t0 };
        }
      }
      const fine = await engine.chat.completions.create({ messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 2, temperature: 0 });
      await engine.unload();
      return { out, finished: fine.choices[0].finish_reason };
    },
    { PKG, TINY, template },
  );
  console.log(`hostile templates in the browser: ${JSON.stringify(r)}`);
  for (const [which, e] of Object.entries(r.out)) {
    assert.equal(e.name, "ChatTemplateError", `${which}: ${e.message}`);
    assert.ok(e.typed, which);
    assert.match(e.message, /chat template stopped/, which);
    assert.ok(e.ms < 1000, `${which}: ${e.ms} ms`);
  }
  assert.equal(r.finished, "length", "the engine serves after the refusals");
});

test("info.memory gives the memory plan; deviceMemoryMB below it refuses the load with ModelLoadError saying what it needs; cacheTypeK/V store the KV cache smaller (f16 by default, f32 with exact: true); with the cache, a model that does not fit is refused from its header before the download", { timeout: 10 * MINUTES }, async () => {
  const r = await page.evaluate(
    async ({ PKG, TINY }) => {
      const flint = await import(PKG);
      // The exact mode's f32 cache, the figures the smaller types are compared with.
      const engine = await flint.createEngine({ model: TINY, useCache: false, nCtx: 1024, maxSeqs: 2, exact: true });
      const memory = engine.info.memory;
      await engine.unload();
      const mb = Math.floor(memory.total / 2 ** 20);
      let refused = null;
      try {
        await (await flint.createEngine({ model: TINY, useCache: false, nCtx: 1024, maxSeqs: 2, exact: true, deviceMemoryMB: Math.max(1, mb - 2) })).unload();
      } catch (e) {
        refused = { name: e.name, typed: e instanceof flint.ModelLoadError, message: e.message };
      }
      const fits = await flint.createEngine({ model: TINY, useCache: false, nCtx: 1024, maxSeqs: 2, exact: true, deviceMemoryMB: mb + 2 });
      const greedy = { prompt: "Once upon a time", max_tokens: 4, temperature: 0 };
      const f32Text = (await fits.completions.create(greedy)).choices[0].text;
      await fits.unload();
      // Smaller KV caches: q8_0 keys (rotated, packed bytes), f16 values (pack2x16float).
      const small = await flint.createEngine({ model: TINY, useCache: false, nCtx: 1024, maxSeqs: 2, cacheTypeK: "q8_0", cacheTypeV: "f16" });
      const smallMemory = small.info.memory;
      const smallText = (await small.completions.create(greedy)).choices[0].text;
      await small.unload();
      let badType = null;
      try {
        await (await flint.createEngine({ model: TINY, useCache: false, cacheTypeK: "q4_0" })).unload();
      } catch (e) {
        badType = { name: e.name, message: e.message };
      }
      let badExact = null;
      try {
        await (await flint.createEngine({ model: TINY, useCache: false, exact: true, cacheTypeV: "f16" })).unload();
      } catch (e) {
        badExact = { name: e.name, message: e.message };
      }
      // Counts out of range are refused, not dropped for the defaults.
      const badCounts = [];
      for (const bad of [{ maxSeqs: 100 }, { nCtx: 0 }, { nCtx: 1.5 }, { selfTest: "yes" }]) {
        try {
          await (await flint.createEngine({ model: TINY, useCache: false, ...bad })).unload();
          badCounts.push({ bad, loaded: true });
        } catch (e) {
          badCounts.push({ bad, name: e.name, message: e.message });
        }
      }
      // With the cache (the default): a model that does not fit is refused from its header,
      // read by ranges, before the download; one that fits is checked, then downloaded.
      await flint.deleteModelFromCache(TINY);
      const stages = [];
      let early = null;
      try {
        await flint.createEngine({ model: TINY, nCtx: 1024, maxSeqs: 2, exact: true, deviceMemoryMB: Math.max(1, mb - 2), initProgressCallback: (p) => stages.push(p.stage) });
      } catch (e) {
        early = { name: e.name, message: e.message };
      }
      const cachedAfterRefusal = await flint.hasModelInCache(TINY);
      const okStages = [];
      const byDefault = await flint.createEngine({ model: TINY, nCtx: 1024, maxSeqs: 2, initProgressCallback: (p) => okStages.push(p.stage) });
      const defaultMemory = byDefault.info.memory;
      await byDefault.unload();
      return { memory, refused, f32Text, smallMemory, smallText, badType, badExact, badCounts, defaultMemory, early, stages, cachedAfterRefusal, okStages, cachedAfterLoad: await flint.hasModelInCache(TINY) };
    },
    { PKG, TINY },
  );
  console.log(`memory plan in the browser: ${JSON.stringify(r)}`);
  const m = r.memory;
  assert.ok(m.weights > 0 && m.kv_cache > 0 && m.activations > 0 && m.logits > 0, JSON.stringify(m));
  assert.equal(m.total, m.weights + m.kv_cache + m.activations + m.logits);
  assert.ok(m.kv_positions >= 1024, JSON.stringify(m));
  assert.ok(r.refused?.typed, JSON.stringify(r.refused));
  assert.match(r.refused.message, /needs about .* MiB/);
  const s = r.smallMemory;
  assert.equal(s.cache_type_k, "q8_0");
  assert.equal(s.cache_type_v, "f16");
  assert.equal(m.cache_type_k, "f32");
  assert.equal(r.defaultMemory.cache_type_k, "f16", "the default KV cache is f16, as llama.cpp's");
  assert.equal(r.defaultMemory.cache_type_v, "f16");
  assert.equal(r.defaultMemory.kv_cache * 2, m.kv_cache, "f16 takes half of f32's KV bytes");
  assert.equal(r.badExact?.name, "InvalidRequestError", JSON.stringify(r.badExact));
  assert.match(r.badExact.message, /exact: true keeps the KV cache in f32/);
  // Per position: K at 9/32 of f32's bytes, V at half: (9/32 + 1/2) / 2 of f32's when K and V rows are as wide.
  assert.ok(s.kv_cache < m.kv_cache * 0.8 && s.kv_cache > m.kv_cache * 0.2, JSON.stringify({ s, m }));
  assert.equal(r.smallText, r.f32Text, "4 greedy tokens with q8_0 keys and f16 values equal f32's");
  assert.equal(r.badType?.name, "InvalidRequestError", JSON.stringify(r.badType));
  const said = r.badCounts.map((b) => [b.name, b.message?.match(/^(\w+) must/)?.[1]]);
  assert.deepEqual(said, [["InvalidRequestError", "maxSeqs"], ["InvalidRequestError", "nCtx"], ["InvalidRequestError", "nCtx"], ["InvalidRequestError", "selfTest"]], JSON.stringify(r.badCounts));
  assert.match(r.badType.message, /cacheTypeK: unknown KV cache type "q4_0"/);
  assert.equal(r.early?.name, "ModelLoadError", JSON.stringify(r.early));
  assert.match(r.early.message, /needs about .* MiB/);
  assert.ok(r.stages.includes("check") && !r.stages.includes("download") && !r.stages.includes("load"), JSON.stringify(r.stages));
  assert.equal(r.cachedAfterRefusal, false, "nothing was downloaded into the cache");
  assert.ok(r.okStages.indexOf("check") >= 0 && r.okStages.indexOf("check") < r.okStages.indexOf("download"), JSON.stringify(r.okStages));
  assert.equal(r.cachedAfterLoad, true);
});

test("a two-layer model of 7B widths loads with the default options from a URL (cached), from a File, and from the cache after a page reload; each gives native's greedy tokens and top-20 logprobs", { timeout: 20 * MINUTES }, async () => {
  const oracle = JSON.parse(readFileSync(join(WIDE_DIR, "wide-2l.json"), "utf8"));
  const run = (from) =>
    page.evaluate(
      async ({ PKG, WIDE, from, prompt }) => {
        const flint = await import(PKG);
        if (from === "url") await flint.deleteModelFromCache(WIDE);
        const model = from === "file" ? new File([await (await fetch(WIDE)).blob()], "wide-2l.gguf") : WIDE;
        const stages = [];
        const t0 = performance.now();
        const engine = await flint.createEngine({ model, initProgressCallback: (p) => stages.includes(p.stage) || stages.push(p.stage) });
        const loadMs = performance.now() - t0;
        const r = await engine.completions.create({ prompt, max_tokens: 4, temperature: 0, logprobs: 20 });
        await engine.unload();
        const heap = performance.memory?.usedJSHeapSize ?? null;
        return { stages, loadMs, r, heap, cached: await flint.hasModelInCache(WIDE) };
      },
      { PKG, WIDE, from, prompt: oracle.prompt },
    );
  const check = (label, got) => {
    console.log(`wide-2l from ${label}: stages ${got.stages}, load ${(got.loadMs / 1000).toFixed(1)} s, JS heap ${(got.heap / 2 ** 20).toFixed(0)} MiB, usage ${JSON.stringify(got.r.usage)}`);
    assert.equal(got.r.usage.prompt_tokens, oracle.prompt_token_ids.length);
    const content = got.r.choices[0].logprobs?.content;
    assert.equal(content?.length, 4, JSON.stringify(got.r.choices[0]));
    for (let i = 0; i < 4; i++) {
      const want = oracle.top_logprobs[i];
      const top = content[i].top_logprobs;
      assert.equal(top.length, 20);
      assert.equal(content[i].token, want[0].token, `${label}: token ${i}`);
      const a = top.map((t) => t.logprob);
      const b = want.map((t) => t.logprob);
      const mean = b.reduce((x, y) => x + y, 0) / b.length;
      const nmse = a.reduce((acc, x, k) => acc + (x - b[k]) ** 2, 0) / b.reduce((acc, y) => acc + (y - mean) ** 2, 0);
      assert.ok(nmse <= 1e-4, `${label}: token ${i}: top-20 logprobs NMSE ${nmse}`);
    }
  };
  const fromUrl = await run("url");
  check("a URL", fromUrl);
  assert.deepEqual(fromUrl.stages.slice(0, 3), ["check", "download", "load"]);
  assert.equal(fromUrl.cached, true);
  check("a File", await run("file"));
  await page.reload();
  const fromCache = await run("cache");
  check("the cache after a reload", fromCache);
  assert.equal(fromCache.stages[0], "cache");
  assert.ok(!fromCache.stages.includes("download"));
});

test("loads survive garbage collection: with gc() every 30 ms, wide-2l downloads into storage, then loads from storage and from a File", { timeout: 10 * MINUTES }, async () => {
  // Chromium may collect a stream whose only reference is its own pending read, which then
  // never settles: loads stalled for good now and then, and at once under this GC. The
  // package holds each reader while it reads (web/src/source.js).
  const gcBrowser = await launchPersistent({ args: ["--js-flags=--expose-gc"] });
  try {
    const gcPage = await openPage(gcBrowser.context, "gc");
    await gcPage.goto(`${server.url}/index.html`);
    for (const from of ["url", "cache", "file"]) {
      const t0 = performance.now();
      const load = gcPage.evaluate(
        async ({ PKG, WIDE, from }) => {
          globalThis.gcTimer ??= setInterval(() => globalThis.gc(), 30);
          const flint = await import(PKG);
          const model = from === "file" ? new File([await (await fetch(WIDE)).blob()], "wide-2l.gguf") : WIDE;
          const stages = [];
          const engine = await flint.createEngine({ model, initProgressCallback: (p) => stages.includes(p.stage) || stages.push(p.stage) });
          const n = engine.info.n_layer;
          await engine.unload();
          return { stages, n };
        },
        { PKG, WIDE, from },
      );
      // A load takes seconds; one that stalls is reported, not waited for until the timeout.
      let timer;
      const stalled = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`the load from ${from} stalled under garbage collection`)), 3 * MINUTES);
      });
      const got = await Promise.race([load, stalled]).finally(() => clearTimeout(timer));
      console.log(`wide-2l from ${from} under gc(): stages ${got.stages}, ${secondsSince(t0)} s`);
      assert.equal(got.n, 2);
      assert.equal(got.stages[0], { url: "check", cache: "cache", file: "load" }[from]);
    }
  } finally {
    await gcBrowser.context.close();
  }
});

test("a model the browser's storage cannot hold (over the quota, or a write refused) is read by HTTP ranges instead, saying so", { timeout: 10 * MINUTES }, async () => {
  const r = await page.evaluate(
    async ({ PKG, TINY }) => {
      const flint = await import(PKG);
      const greedy = { prompt: "Once upon a time", max_tokens: 4, temperature: 0 };
      const run = async (opts) => {
        const texts = [];
        const engine = await flint.createEngine({ model: TINY, initProgressCallback: (p) => texts.push(p.text), ...opts });
        const out = (await engine.completions.create(greedy)).choices[0].text;
        await engine.unload();
        return { out, texts, cached: await flint.hasModelInCache(TINY) };
      };
      const ranges = await run({ useCache: false });
      await flint.deleteModelFromCache(TINY);
      // Storage left below the model's size: not downloaded into the cache at all.
      const estimate = navigator.storage.estimate;
      navigator.storage.estimate = async () => ({ quota: 1000, usage: 0 });
      const quota = await run({}).finally(() => (navigator.storage.estimate = estimate));
      // The storage refusing a write (the quota reached while downloading).
      const write = FileSystemWritableFileStream.prototype.write;
      FileSystemWritableFileStream.prototype.write = () => Promise.reject(new DOMException("the quota has been exceeded", "QuotaExceededError"));
      const refused = await run({}).finally(() => (FileSystemWritableFileStream.prototype.write = write));
      return { ranges, quota, refused };
    },
    { PKG, TINY },
  );
  console.log(`cache fallbacks: ${JSON.stringify({ quota: r.quota.texts.filter((t) => /not caching/.test(t)), refused: r.refused.texts.filter((t) => /not caching/.test(t)) })}`);
  for (const [which, got] of [["quota", r.quota], ["refused", r.refused]]) {
    assert.equal(got.out, r.ranges.out, which);
    assert.equal(got.cached, false, which);
  }
  assert.ok(r.quota.texts.some((t) => /not caching .* larger than the browser's storage left .* reading it by HTTP ranges/.test(t)), JSON.stringify(r.quota.texts));
  assert.ok(r.refused.texts.some((t) => /not caching .* storing it in the browser's storage failed .*quota.* HTTP ranges/.test(t)), JSON.stringify(r.refused.texts));
});

test("the request-case table (tests/requests/cases.json): the same answers as flint serve, as error names and params", { timeout: 10 * MINUTES }, async () => {
  const table = JSON.parse(readFileSync(join(REPO, "tests/requests/cases.json"), "utf8"));
  const template = readFileSync(join(REPO, "tests/requests/template.jinja"), "utf8");
  const got = await page.evaluate(
    async ({ PKG, TINY, template, cases }) => {
      const flint = await import(PKG);
      const engine = await flint.createEngine({ model: TINY, useCache: false, chatTemplate: template, nCtx: 1024 });
      const out = [];
      for (const c of cases) {
        const api = c.endpoint === "chat" ? engine.chat.completions : engine.completions;
        try {
          let r = await api.create(c.body);
          // A streamed request's refusal arrives as the stream is read.
          if (r && r[Symbol.asyncIterator]) for await (const _ of r);
          out.push({ name: c.name, ok: true, choices: r.choices?.length ?? null });
        } catch (e) {
          out.push({ name: c.name, ok: false, error: e.name, param: e.param ?? null, typed: e instanceof flint.FlintError, message: e.message });
        }
      }
      await engine.unload();
      return out;
    },
    { PKG, TINY, template, cases: table.cases },
  );
  assert.equal(got.length, table.cases.length);
  for (const [i, c] of table.cases.entries()) {
    const g = got[i];
    if (c.status === 200) {
      assert.ok(g.ok, `${c.name}: ${g.error}: ${g.message}`);
      assert.equal(g.choices, c.body.n ?? 1, c.name);
    } else {
      assert.ok(!g.ok, `${c.name}: no error`);
      assert.deepEqual([g.error, g.param, g.typed], [c.error, c.param, true], `${c.name}: ${g.message}`);
    }
  }
});

test("structured output: json_schema, GBNF and regex replies in the browser equal native `flint run`'s, each valid; a bad schema is an InvalidRequestError", { timeout: 10 * MINUTES }, async () => {
  const schema = {
    type: "object",
    properties: { ok: { type: "boolean" }, n: { type: "integer", minimum: 0, maximum: 99 }, color: { enum: ["red", "green", "blue"] } },
    required: ["ok", "n", "color"],
    additionalProperties: false,
  };
  const gbnf = 'root ::= ("yes" | "no") ", " [0-9]{1,2}';
  const regex = "[a-c]{3}-[0-9]{2}";
  requireFile(FLINT_BIN, "run `cargo build --release -p flint-cli` first");
  const tiny = join(TINY_DIR, "model.gguf");
  const native = (flag, value) =>
    execFileSync(FLINT_BIN, ["run", "-m", tiny, "--raw", "--temp", "0", "-n", "200", flag, value, "Answer:"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).replace(/\n$/, "");
  const want = [native("-j", JSON.stringify(schema)), native("--grammar", gbnf), native("--grammar", `start: /${regex}/`)];
  const got = await page.evaluate(
    async ({ PKG, TINY, schema, gbnf, regex }) => {
      const flint = await import(PKG);
      const engine = await flint.createEngine({ model: TINY, useCache: false, nCtx: 512 });
      const ask = async (extra) => (await engine.completions.create({ prompt: "Answer:", max_tokens: 200, temperature: 0, ...extra })).choices[0];
      const out = [
        await ask({ response_format: { type: "json_schema", json_schema: { name: "answer", schema, strict: true } } }),
        await ask({ grammar: gbnf }),
        await ask({ guided_regex: regex }),
      ];
      let refused = null;
      try {
        await ask({ response_format: { type: "json_schema", json_schema: { name: "bad", schema: { type: "array", uniqueItems: true } } } });
      } catch (e) {
        refused = { name: e.name, param: e.param, message: e.message };
      }
      await engine.unload();
      return { out: out.map((c) => ({ text: c.text, finish: c.finish_reason })), refused };
    },
    { PKG, TINY, schema, gbnf, regex },
  );
  for (const [i, c] of got.out.entries()) {
    assert.equal(c.finish, "stop", `reply ${i}: ${c.text}`);
    assert.equal(c.text, want[i], `reply ${i}: browser and native differ`);
  }
  const v = JSON.parse(got.out[0].text);
  assert.ok(typeof v.ok === "boolean" && Number.isInteger(v.n) && ["red", "green", "blue"].includes(v.color), got.out[0].text);
  assert.match(got.out[1].text, /^(yes|no), [0-9]{1,2}$/);
  assert.match(got.out[2].text, new RegExp(`^${regex}$`));
  assert.deepEqual([got.refused?.name, got.refused?.param], ["InvalidRequestError", "response_format"], got.refused?.message);
});

test("tool calls: a required call and a named one in the browser equal native `flint serve`'s (tiny qwen3, Qwen3's template), ids included; a thought as reasoning_content", { timeout: 10 * MINUTES }, async () => {
  const template = readFileSync(join(GOLDEN, "chat-templates/Qwen-Qwen3-0.6B.jinja"), "utf8");
  const tools = [
    { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { enum: ["Paris", "Oslo"] } }, required: ["city"], additionalProperties: false } } },
    { type: "function", function: { name: "add", parameters: { type: "object", properties: { a: { type: "integer", minimum: 0, maximum: 9 }, b: { type: "integer", minimum: 0, maximum: 9 } }, required: ["a", "b"], additionalProperties: false } } },
  ];
  const bodies = [
    { tool_choice: "required", parallel_tool_calls: false },
    { tool_choice: { type: "function", function: { name: "add" } }, parallel_tool_calls: false },
  ].map((b) => ({
    messages: [{ role: "user", content: "Weather in Oslo, and 2 + 3?" }],
    tools,
    temperature: 0,
    seed: 3,
    max_tokens: 300,
    // Qwen3's template thinks first; random weights would think to max_tokens.
    chat_template_kwargs: { enable_thinking: false },
    ...b,
  }));
  // Thinking on: the grammar opens the thought, all of this short reply, as reasoning_content.
  bodies.push({ ...bodies[0], chat_template_kwargs: {}, max_tokens: 24 });
  // Native: the same model and template behind flint serve.
  const file = join(app, "qwen3.jinja");
  writeFileSync(file, template);
  const { url, child } = await startServe(["-m", join(TINY_DIR, "model.gguf"), "--port", "0", "-c", "1024", "--chat-template-file", file, "--no-warmup"]);
  try {
    const native = [];
    for (const b of bodies) {
      const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(b) });
      native.push((await r.json()).choices[0]);
    }
    const browser = await page.evaluate(
      async ({ PKG, TINY, template, bodies }) => {
        const flint = await import(PKG);
        const engine = await flint.createEngine({ model: TINY, useCache: false, nCtx: 1024, chatTemplate: template });
        const out = [];
        for (const b of bodies) out.push((await engine.chat.completions.create(b)).choices[0]);
        await engine.unload();
        return out;
      },
      { PKG, TINY, template, bodies },
    );
    const thought = native.pop();
    assert.equal(thought.finish_reason, "length", JSON.stringify(thought));
    assert.ok(thought.message.reasoning_content.length > 0, JSON.stringify(thought));
    assert.deepEqual(browser.pop().message, thought.message);
    for (const [i, n] of native.entries()) {
      assert.equal(n.finish_reason, "tool_calls", JSON.stringify(n));
      assert.deepEqual(browser[i].message.tool_calls, n.message.tool_calls, `request ${i}`);
      assert.equal(browser[i].finish_reason, "tool_calls");
    }
    assert.equal(native[1].message.tool_calls[0].function.name, "add");
  } finally {
    child.kill("SIGTERM");
  }
});

test("after a reload, the worker engine loads gemma from the browser cache without downloading it, self-tested", { timeout: 15 * MINUTES }, async () => {
  const t0 = performance.now();
  const before = server.requests.length;
  await page.reload();
  const prompt = readFileSync(join(GOLDEN, "prompts/p1.txt"), "utf8");
  const r = await page.evaluate(
    async ({ PKG, WORKER, GEMMA, prompt }) => {
      const flint = await import(PKG);
      const stages = new Set();
      const worker = new Worker(WORKER, { type: "module" });
      const engine = await flint.createWebWorkerEngine(worker, { model: GEMMA, selfTest: true, initProgressCallback: (p) => stages.add(p.stage) });
      // Four tokens: the first test checks sixteen on the same kernels, and SwiftShader decodes
      // gemma at about 1.4 s a token.
      const done = await engine.completions.create({ prompt, temperature: 0, max_tokens: 4 });
      await engine.unload();
      worker.terminate();
      return { done, stages: [...stages], info: engine.info };
    },
    { PKG, WORKER, GEMMA, prompt },
  );
  console.log(`gemma from the cache, in a worker, in ${secondsSince(t0)} s: ${JSON.stringify(r.done.usage)}`);
  const modelRequests = server.requests.slice(before).filter((q) => q.path.startsWith("/models/"));
  assert.deepEqual(modelRequests, [], "no request for the model after the reload");
  assert.deepEqual(r.stages, ["cache", "load", "compile", "ready"]);
  assert.equal(r.info.has_chat_template, false);
  assertPrefix(r.done.choices[0].text, golden("gemma", 1).greedy_text_16, "gemma prompt 1");
  assert.equal(r.done.usage.completion_tokens, 4);
  // selfTest: the load compared layer 0 and the head with the CPU reference, in the worker.
  const st = r.info.self_test;
  console.log(`self-test on ${st?.adapter}: ${JSON.stringify(st?.taps)} GPU ${st?.gpu_ms} ms, CPU ${st?.cpu_ms} ms`);
  assert.equal(st.adapter, r.info.adapter);
  assert.equal(st.taps.length, 6);
  assert.ok(st.taps.every((t) => t.nmse <= 1e-5), JSON.stringify(st.taps));
  assert.equal(st.taps[5].name, "decode step: logits");
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

// On the tiny qwen3: the scheduling is the point here, and gemma-3-270m on SwiftShader took 2
// minutes for these 30 tokens (its real-model runs are the tests above). The exact mode's f32
// cache keeps the reference's greedy text.
test("one engine, concurrent requests: two streams progress together, breaking one leaves the other, n: 2", { timeout: 20 * MINUTES }, async () => {
  const t0 = performance.now();
  const prompts = [1, 2, 3, 4].map((n) => readFileSync(join(GOLDEN, `prompts/p${n}.txt`), "utf8"));
  const r = await page.evaluate(
    async ({ PKG, TINY, prompts }) => {
      const flint = await import(PKG);
      const engine = await flint.createEngine({ model: TINY, useCache: false, exact: true });
      const events = [];
      // Reads a stream, logging (name, finished?) per chunk; stops after `stopAfter` chunks.
      const consume = async (name, stream, stopAfter = Infinity) => {
        let text = "", n = 0, finish = null;
        for await (const c of stream) {
          const ch = c.choices[0];
          text += ch.text ?? "";
          finish = ch.finish_reason ?? finish;
          events.push({ name, done: ch.finish_reason != null });
          if (++n >= stopAfter) break;
        }
        return { text, finish };
      };
      const req = (prompt, max_tokens) => engine.completions.create({ prompt, temperature: 0, max_tokens, stream: true });
      // Each phase says when it ends, so that a stall names its phase.
      console.log("concurrent: loaded");
      const [a, b] = await Promise.all([consume("a", await req(prompts[0], 5)), consume("b", await req(prompts[1], 5))]);
      const together = events.splice(0);
      console.log("concurrent: a and b done");
      // Breaking out of c cancels c only; d runs to its end.
      const [c, d] = await Promise.all([consume("c", await req(prompts[2], 12), 2), consume("d", await req(prompts[3], 5))]);
      console.log("concurrent: c broken off, d done");
      const two = await engine.completions.create({ prompt: prompts[0], temperature: 0, max_tokens: 3, n: 2 });
      console.log("concurrent: n: 2 done");
      await engine.unload();
      return { a, b, c, d, together, two };
    },
    { PKG, TINY, prompts },
  );
  console.log(`concurrent requests in ${secondsSince(t0)} s: ${JSON.stringify(r.together)}`);
  const prefix = (n, text) => assertPrefix(text, tinyGolden(n).greedy_text_16, `prompt ${n}`);
  prefix(1, r.a.text);
  prefix(2, r.b.text);
  assert.equal(r.a.finish, "length");
  assert.equal(r.b.finish, "length");
  // Both streams had chunks before either finished.
  const firstOf = (name) => r.together.findIndex((e) => e.name === name);
  const doneOf = (name) => r.together.findIndex((e) => e.name === name && e.done);
  assert.ok(firstOf("a") < doneOf("b") && firstOf("b") < doneOf("a"), "the two streams did not overlap");
  prefix(4, r.d.text);
  assert.equal(r.d.finish, "length", "the other request finished on its own");
  assert.ok(r.c.text.length > 0 && r.c.finish === null, "the broken stream stopped early");
  assert.equal(r.two.choices.length, 2);
  assert.deepEqual(r.two.choices.map((c) => c.index), [0, 1]);
  for (const c of r.two.choices) prefix(1, c.text);
  assert.equal(r.two.choices[0].text, r.two.choices[1].text, "greedy choices agree");
  assert.equal(r.two.usage.completion_tokens, 6);
});
