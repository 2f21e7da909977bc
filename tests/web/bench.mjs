// The browser's side of `flint bench`: a worker engine in headless Chromium (WebGPU on
// SwiftShader) runs `engine.bench()`, the same measurement as `flint bench`, on a model served by
// `flint web` from the site (`bash scripts/build-web.sh` first). Not a test: it prints figures.
//   node tests/web/bench.mjs [model] [prompt tokens] [generated tokens] [reps]
// Compare with native wgpu on the same software device:
//   VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json target/release/flint bench -m MODEL -p P -n N --reps R

import { launchBrowser, openPage, requireFile, SITE, startServer } from "./lib.mjs";
import { join } from "node:path";

const [model = "gemma-3-270m", p = "32", n = "8", reps = "3"] = process.argv.slice(2);
const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

requireFile(join(SITE, "pkg/index.js"));
const server = await startServer();
const browser = await launchBrowser();
try {
  const page = await openPage(browser, "bench");
  await page.goto(`${server.url}/`);
  const r = await page.evaluate(async ({ model, p, n, reps }) => {
    const { createWebWorkerEngine } = await import("/pkg/index.js");
    const worker = new Worker("/pkg/worker.js", { type: "module" });
    const engine = await createWebWorkerEngine(worker, { model: `/models/${model}.gguf`, useCache: false, nCtx: p + n + 1 });
    const run = await engine.bench({ promptTokens: p, genTokens: n, reps });
    return { ...run, adapter: engine.info.adapter };
  }, { model, p: +p, n: +n, reps: +reps });
  const fmt = (v) => `${median(v).toFixed(2)} tok/s (min ${Math.min(...v).toFixed(2)}, max ${Math.max(...v).toFixed(2)})`;
  console.log(`model    ${model} in Chromium (${r.adapter.trim()})`);
  console.log(`prefill  ${fmt(r.prefill_tok_s)} over ${p} tokens`);
  console.log(`decode   ${fmt(r.decode_tok_s)} over ${n} tokens`);
} finally {
  await browser.close();
  await server.close();
}
