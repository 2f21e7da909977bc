// The browser check at full size (a bench, not a test: it takes minutes and gigabytes): a model
// of Qwen2.5-7B's shapes in Q4_K_M (`bench/synth_gguf.py fill`, 4.9 GB) through the packed npm
// package in headless Chromium (WebGPU on SwiftShader) with the default options: from a URL
// (downloaded into the browser's cache), from a File, and from the cache after a page reload.
// Each load's greedy continuation of an 8-token prompt (4 tokens, top-20 logprobs) is compared
// with native `flint serve` on lavapipe in the same run: ids equal, top-20 logprobs within
// NMSE 1e-4. Prints load times, the page's peak JS heap and wasm memory, and the renderer
// process's peak resident memory (all of the page, Chromium's own included).
//   node tests/web/big.mjs MODEL.gguf
// (`bash scripts/build-web.sh` first.)

import { execFileSync } from "node:child_process";
import { linkSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { REPO, launchPersistent, openPage, requireFile, startServe, startServer } from "./lib.mjs";

const model = process.argv[2];
requireFile(model ?? "MODEL.gguf", "give the model's path");
const PROMPT = "The capital of France is the city of";
const PKG = "/node_modules/flint-llm/src/index.js";
// The package's wasm-bindgen module: its init() returns the instance's exports, memory included.
const WASM = "/node_modules/flint-llm/src/wasm/flint_wasm.js";
const URL_PATH = `/${basename(model)}`;
const t = () => performance.now();
const secs = (t0) => ((performance.now() - t0) / 1000).toFixed(1);

// Native: flint serve on lavapipe, the same request.
let t0 = t();
const serve = await startServe(["-m", model, "--port", "0", "-c", "256", "--parallel", "1", "--no-warmup"]);
let native;
try {
  const res = await fetch(`${serve.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: PROMPT, max_tokens: 4, temperature: 0, logprobs: 20 }),
  });
  native = await res.json();
  if (!native.choices) throw new Error(`flint serve: ${JSON.stringify(native)}`);
} finally {
  serve.child.kill();
}
console.log(`native (lavapipe): ${secs(t0)} s, ${JSON.stringify(native.usage)}`);

// The package as a user gets it, the model hard-linked beside the page.
const out = join(REPO, "target/web");
const tarball = readdirSync(out).find((f) => /^flint-llm-.*\.tgz$/.test(f));
const app = mkdtempSync(join(tmpdir(), "flint-big-"));
writeFileSync(join(app, "package.json"), JSON.stringify({ name: "flint-big", private: true, type: "module" }));
execFileSync("npm", ["install", "--no-audit", "--no-fund", "--offline", join(out, tarball)], { cwd: app, stdio: "inherit" });
writeFileSync(join(app, "index.html"), '<!doctype html><meta charset="utf-8"><title>flint-llm big</title>');
linkSync(model, join(app, URL_PATH.slice(1)));
const server = await startServer({ root: app });
// Precise memory info: performance.memory otherwise gives bucketed values refreshed rarely.
const browser = await launchPersistent({ args: ["--enable-precise-memory-info"] });

// Peak resident memory of Chromium's renderer processes, sampled every 200 ms.
let peakRss = 0;
const sampler = setInterval(() => {
  try {
    const ps = execFileSync("ps", ["-C", "chromium,chrome", "-o", "rss=,args="], { encoding: "utf8" });
    for (const line of ps.split("\n")) {
      if (line.includes("--type=renderer")) peakRss = Math.max(peakRss, Number(line.trim().split(/\s+/)[0]) * 1024);
    }
  } catch {}
}, 200);

const run = (page, from) =>
  page.evaluate(
    async ({ PKG, WASM, URL_PATH, from, prompt }) => {
      const flint = await import(PKG);
      // The page's own peaks: the JS heap (sampled) and the engine's wasm memory (which never
      // shrinks, so its size after the run is its peak).
      let heap = 0;
      const sample = () => (heap = Math.max(heap, performance.memory?.usedJSHeapSize ?? 0));
      const timer = setInterval(sample, 100);
      if (from === "url") await flint.deleteModelFromCache(URL_PATH);
      const model = from === "file" ? new File([await (await fetch(URL_PATH)).blob()], "model.gguf") : URL_PATH;
      const stages = [];
      const t0 = performance.now();
      const engine = await flint.createEngine({ model, initProgressCallback: (p) => stages.includes(p.stage) || stages.push(p.stage) });
      const loadS = (performance.now() - t0) / 1000;
      const r = await engine.completions.create({ prompt, max_tokens: 4, temperature: 0, logprobs: 20 });
      sample();
      clearInterval(timer);
      const wasm = await (await import(WASM)).default();
      const wasmBytes = wasm.memory.buffer.byteLength;
      await engine.unload();
      return { stages, loadS, r, heap, wasmBytes };
    },
    { PKG, WASM, URL_PATH, from, prompt: PROMPT },
  );

const nmse = (a, b) => {
  const mean = b.reduce((x, y) => x + y, 0) / b.length;
  return a.reduce((acc, x, k) => acc + (x - b[k]) ** 2, 0) / b.reduce((acc, y) => acc + (y - mean) ** 2, 0);
};
const want = native.choices[0].logprobs;
let ok = true;
const compare = (label, got) => {
  const content = got.r.choices[0].logprobs.content;
  const steps = content.map((c, i) => {
    // The server's completions logprobs: `tokens`, and `top_logprobs` as {token: logprob}.
    const entries = Object.entries(want.top_logprobs[i]);
    const a = entries.map(([tok]) => c.top_logprobs.find((x) => x.token === tok)?.logprob ?? NaN);
    const b = entries.map(([, lp]) => lp);
    return { same: c.token === want.tokens[i], n: entries.length, nmse: nmse(a, b) };
  });
  const pass = steps.every((s) => s.same && s.nmse <= 1e-4);
  ok &&= pass;
  console.log(
    `${label}: ${pass ? "agrees" : "DIFFERS"}; stages ${got.stages}; load ${got.loadS.toFixed(1)} s; ` +
      `text ${JSON.stringify(got.r.choices[0].text)}; per step (same id, NMSE) ${JSON.stringify(steps)}; peak JS heap ${(got.heap / 2 ** 20).toFixed(0)} MiB, wasm memory ${(got.wasmBytes / 2 ** 20).toFixed(0)} MiB; ` +
      `usage ${JSON.stringify(got.r.usage)}`,
  );
};

try {
  let page = await openPage(browser.context, "big");
  await page.goto(`${server.url}/index.html`);
  t0 = t();
  compare("from a URL (cached)", await run(page, "url"));
  compare("from a File", await run(page, "file"));
  await page.reload();
  compare("from the cache after a reload", await run(page, "cache"));
  console.log(`browser: ${secs(t0)} s in all; renderer peak RSS ${(peakRss / 2 ** 20).toFixed(0)} MiB`);
} finally {
  clearInterval(sampler);
  await browser.context.close();
  await server.close();
  rmSync(app, { recursive: true, force: true });
}
console.log(`native text ${JSON.stringify(native.choices[0].text)}`);
process.exit(ok ? 0 : 1);
