// The chat page (web/app) driven as a user would in headless Chromium: without WebGPU it says
// so; on gemma-3-270m (no chat template) it loads, streams, stops and streams again; with the
// speculative toggle on, a text that repeats itself gets the same reply as with it off, and the
// stats show the drafts the model accepted.

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { REPO, SITE, launchBrowser, openPage, requireFile, secondsSince, startServer } from "./lib.mjs";

const MODEL = "gemma-3-270m";
const SCREENSHOT = join(REPO, "target/web/chat-page.png");
// SwiftShader runs gemma at 0.1-1 token/s on 2 busy cores: the stopped reply may run to 24
// tokens, the one that must finish is kept short.
const MAX_TOKENS = 24;
const SECOND_MAX_TOKENS = 8;
const LOAD_MS = 6 * 60_000;
const GENERATE_MS = 5 * 60_000;
const STOP_MS = 90_000;

// Page-side predicates fail the wait at once when the page shows an error.
const PAGE_HELPERS = `
  window.$id = (id) => document.getElementById(id);
  window.failOnPageError = () => {
    const e = $id("error");
    if (e && !e.hidden) throw new Error("page shows an error: " + e.textContent);
  };`;

test("without WebGPU the page says so and keeps Load disabled", { timeout: 2 * 60_000 }, async (t) => {
  requireFile(join(SITE, "index.html"));
  const server = await startServer();
  t.after(server.close);
  const browser = await launchBrowser({ webgpu: false });
  t.after(() => browser.close());

  const cases = {
    "no adapter (Chromium without --enable-unsafe-webgpu)": null,
    "no navigator.gpu at all": () => delete Navigator.prototype.gpu,
  };
  for (const [name, init] of Object.entries(cases)) {
    await t.test(name, async () => {
      const page = await openPage(browser, "no-webgpu");
      if (init) await page.addInitScript(init);
      await page.goto(`${server.url}/`);
      const status = page.locator("#webgpu-status");
      await status.getByText("WebGPU is not available").waitFor({ state: "visible", timeout: 30_000 });
      await page.fill("#model-url", `${server.url}/models/${MODEL}.gguf`);
      assert.equal(await page.isDisabled("#load"), true, "Load must stay disabled without WebGPU");
      await page.close();
    });
  }
});

test(`chat page on ${MODEL}: load, stream, stop, send again`, { timeout: 15 * 60_000 }, async (t) => {
  requireFile(join(SITE, "pkg/index.js"));
  requireFile(join(SITE, "pkg/worker.js"));
  const server = await startServer();
  t.after(server.close);
  const browser = await launchBrowser();
  t.after(() => browser.close());
  const page = await openPage(browser, "chat");
  try {
    await page.addInitScript(PAGE_HELPERS);
    await page.goto(`${server.url}/`);
    await page.waitForFunction(() => !$id("webgpu-status").textContent.startsWith("Checking"), null, { timeout: 30_000 });
    const status = await page.textContent("#webgpu-status");
    assert.doesNotMatch(status, /not available/, status);
    process.stderr.write(`[chat] ${status}\n`);

    // Pick the catalog entry, as a user would from the drop-down.
    await page.waitForFunction((m) => [...$id("model-select").options].some((o) => o.text.startsWith(m)), MODEL,
      { timeout: 30_000 }).catch(() => assert.fail(`${MODEL} is not in /models/index.json: run \`flint pull ${MODEL}\``));
    const url = await page.$eval("#model-select", (s, m) => [...s.options].find((o) => o.text.startsWith(m)).value, MODEL);
    await page.selectOption("#model-select", url);
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", String(MAX_TOKENS));

    // Record every value the progress bar shows on its way to 100%.
    await page.evaluate(() => {
      const bar = $id("progress");
      window.progressSeen = [];
      new MutationObserver(() => window.progressSeen.push(bar.value / bar.max))
        .observe(bar, { attributes: true, attributeFilter: ["value", "max"] });
    });
    let t0 = performance.now();
    await page.click("#load");
    await page.waitForFunction(() => {
      failOnPageError();
      const bar = $id("progress");
      return bar.value === bar.max && /no chat template/.test($id("mode-note").textContent);
    }, null, { timeout: LOAD_MS, polling: 250 });
    const seen = await page.evaluate(() => window.progressSeen);
    process.stderr.write(`[chat] loaded in ${secondsSince(t0)} s; progress text "${await page.textContent("#progress-text")}"; ` +
      `${seen.length} progress updates; mode note "${await page.textContent("#mode-note")}"\n`);
    assert.ok(seen.some((v) => v > 0 && v < 1), `the progress bar never showed a partial value: ${seen}`);
    assert.equal(await page.isEnabled("#send"), true, "Send is enabled once the model is loaded");

    // Count the observer callbacks that changed a reply: each is a separate visible update.
    await page.evaluate(() => {
      window.replyUpdates = 0;
      new MutationObserver((records) => {
        const inReply = (r) => (r.target.nodeType === 1 ? r.target : r.target.parentElement)?.closest(".assistant");
        if (records.some(inReply)) window.replyUpdates++;
      }).observe($id("messages"), { childList: true, characterData: true, subtree: true });
    });
    const lastReply = () => page.locator("#messages .assistant").last().textContent();

    // First message: stop it after three streamed updates.
    t0 = performance.now();
    await page.fill("#input", "The capital of France is");
    await page.click("#send");
    await page.waitForFunction(() => { failOnPageError(); return window.replyUpdates >= 3; }, null,
      { timeout: GENERATE_MS, polling: 100 });
    assert.equal(await page.isDisabled("#send"), true, "still generating after three updates");
    process.stderr.write(`[chat] 3 updates after ${secondsSince(t0)} s: ${JSON.stringify(await lastReply())}\n`);
    await page.click("#stop");
    const tStop = performance.now();
    await page.waitForFunction(() => !$id("send").disabled, null, { timeout: STOP_MS });
    const stopped = await lastReply();
    const stats = await page.textContent("#stats");
    process.stderr.write(`[chat] stopped ${secondsSince(tStop)} s after Stop: ${JSON.stringify(stopped)}; ${stats}\n`);
    assert.match(stats, /finish: (abort|stopped)/, "the reply ended because of Stop, not by itself");
    const updatesAtStop = await page.evaluate(() => window.replyUpdates);
    await page.waitForTimeout(2_000);
    assert.equal(await page.evaluate(() => window.replyUpdates), updatesAtStop, "no tokens arrive after Stop");
    assert.equal(await lastReply(), stopped);

    // Second message: the engine still works, and streams to completion.
    await page.evaluate(() => { window.replyUpdates = 0; });
    await page.fill("#max-tokens", String(SECOND_MAX_TOKENS));
    t0 = performance.now();
    await page.fill("#input", "Once upon a time");
    await page.click("#send");
    await page.waitForFunction(() => { failOnPageError(); return $id("send").disabled === false; }, null,
      { timeout: GENERATE_MS, polling: 250 });
    const second = await lastReply();
    const secondStats = await page.textContent("#stats");
    const updates = await page.evaluate(() => window.replyUpdates);
    process.stderr.write(`[chat] second reply in ${secondsSince(t0)} s, ${updates} updates: ${JSON.stringify(second)}; ${secondStats}\n`);
    assert.ok(second.trim().length > 0, "the second reply has text");
    assert.ok(updates >= 3, `the second reply arrived in ${updates} updates, expected at least 3`);
    assert.match(secondStats, /TTFT \d+ ms · prefill [\d.]+ tok\/s · decode [\d.]+ tok\/s/);
    assert.equal(await page.locator("#messages .assistant").count(), 2);

    // The speculative toggle: the same greedy reply with n-gram drafts and without.
    const reply = async (speculative) => {
      await page.setChecked("#speculative", speculative);
      await page.fill("#input", "The cat sat on the mat. The cat sat on the mat. The cat");
      await page.click("#send");
      await page.waitForFunction(() => { failOnPageError(); return $id("send").disabled === false; }, null,
        { timeout: GENERATE_MS, polling: 250 });
      return [await lastReply(), await page.textContent("#stats")];
    };
    t0 = performance.now();
    const [drafted, draftedStats] = await reply(true);
    const [plain, plainStats] = await reply(false);
    process.stderr.write(`[chat] speculative and plain replies in ${secondsSince(t0)} s: ${JSON.stringify(drafted)}; ${draftedStats}\n`);
    assert.equal(drafted, plain, "the speculative toggle changed the reply");
    assert.match(draftedStats, /drafts accepted: [1-9]\d* of \d+/, "drafts were accepted");
    assert.doesNotMatch(plainStats, /drafts/, "no drafts with the toggle off");

    mkdirSync(join(REPO, "target/web"), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  } catch (err) {
    mkdirSync(join(REPO, "target/web"), { recursive: true });
    await page.screenshot({ path: join(REPO, "target/web/chat-page-failure.png"), fullPage: true }).catch(() => {});
    throw err;
  }
});
