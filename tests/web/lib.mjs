// Shared helpers of the browser tests: the `flint web` server with its request log, and headless
// Chromium (system binary, WebGPU on SwiftShader) with page logs forwarded to the test output.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const SITE = process.env.FLINT_WEB_SITE ?? join(REPO, "target/web/site");
export const FLINT_BIN = process.env.FLINT_BIN ?? join(REPO, "target/release/flint");
export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

const SERVER_START_MS = 20_000;
// Without --enable-unsafe-webgpu this Chromium still defines navigator.gpu but grants no adapter
// on a machine without a GPU (checked on Chromium 156): that is the "no WebGPU" browser.
const WEBGPU_FLAG = "--enable-unsafe-webgpu";
const CHROMIUM_ARGS = [
  "--headless", "--no-sandbox", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

/** Fails loudly when the build output a test needs is missing. */
export function requireFile(path, hint = "run `bash scripts/build-web.sh` first") {
  if (!existsSync(path)) throw new Error(`missing ${path}: ${hint}`);
}

/**
 * Starts `flint web --port 0 --log --root <root>` and resolves once it listens. `requests` holds
 * one `{method, path, status, bytes, range}` per logged request.
 */
export async function startServer({ root = SITE } = {}) {
  requireFile(FLINT_BIN, "build it with `cargo build --release -p flint-cli` or set $FLINT_BIN");
  const child = spawn(FLINT_BIN, ["web", "--port", "0", "--log", "--root", root], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const requests = [];
  const stderrTail = [];
  lines(child.stderr, (line) => {
    // `flint web --log`: METHOD PATH STATUS BYTES [range R] MSms, once the response has ended.
    const m = /^(\S+) (\S+) (\d{3}) (\d+)(?: range (\S+))?(?: \d+ms)?$/.exec(line);
    if (m) requests.push({ method: m[1], path: m[2], status: +m[3], bytes: +m[4], range: m[5] ?? null });
    else stderrTail.push(line);
  });
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`flint web did not start in ${SERVER_START_MS} ms`)), SERVER_START_MS);
    lines(child.stdout, (line) => {
      const m = /listening on (http:\/\/\S+)/.exec(line);
      if (m) { clearTimeout(timer); resolveUrl(m[1].replace(/\/$/, "")); }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`flint web exited with ${code}: ${stderrTail.join("\n")}`));
    });
  });
  return {
    url,
    requests,
    /** Requests whose path matches `pattern` (a RegExp or an exact string). */
    count: (pattern) => requests.filter((r) => (typeof pattern === "string" ? r.path === pattern : pattern.test(r.path))).length,
    close: () => new Promise((done) => {
      if (child.exitCode !== null) return done();
      child.once("exit", () => done());
      child.kill();
    }),
  };
}

/**
 * Starts `flint serve <args>` (give `--port 0`) and resolves once it listens and its model is
 * loaded (`/health` 200; 503 while loading): `{url, child}`.
 */
export async function startServe(args) {
  requireFile(FLINT_BIN, "build it with `cargo build --release -p flint-cli` or set $FLINT_BIN");
  const child = spawn(FLINT_BIN, ["serve", ...args], { stdio: ["ignore", "pipe", "inherit"] });
  const url = await new Promise((resolveUrl, reject) => {
    lines(child.stdout, (line) => {
      const m = /listening on (http:\/\/\S+)/.exec(line);
      if (m) resolveUrl(m[1].replace(/\/$/, ""));
    });
    child.on("exit", (code) => reject(new Error(`flint serve exited with ${code}`)));
  });
  for (let t0 = Date.now(); ; ) {
    const r = await fetch(`${url}/health`);
    if (r.status === 200) break;
    if (r.status !== 503) throw new Error(`/health answered ${r.status} while loading, not 503`);
    if (Date.now() - t0 > 120_000) throw new Error("the model never loaded");
    await new Promise((done) => setTimeout(done, 100));
  }
  return { url, child };
}

function lines(stream, onLine) {
  let buf = "";
  stream.setEncoding("utf8");
  stream.on("data", (data) => {
    buf += data;
    const parts = buf.split("\n");
    buf = parts.pop();
    for (const line of parts) onLine(line.replace(/\r$/, ""));
  });
}

function launchOptions(webgpu, extra = []) {
  return { executablePath: CHROMIUM, headless: true, args: [...CHROMIUM_ARGS, ...(webgpu ? [WEBGPU_FLAG] : []), ...extra] };
}

/** A fresh headless Chromium; `webgpu: false` leaves out the flag that grants an adapter. */
export function launchBrowser({ webgpu = true } = {}) {
  return chromium.launch(launchOptions(webgpu));
}

/**
 * A persistent context on a new profile directory, so Cache API / OPFS storage survives a
 * reload or a relaunch on the same `dir`. `close()` also deletes a directory it created.
 */
export async function launchPersistent({ dir, webgpu = true, args = [] } = {}) {
  const profile = dir ?? mkdtempSync(join(tmpdir(), "flint-chromium-"));
  const context = await chromium.launchPersistentContext(profile, launchOptions(webgpu, args));
  const close = context.close.bind(context);
  context.close = async () => {
    await close();
    if (!dir) rmSync(profile, { recursive: true, force: true });
  };
  return { context, dir: profile };
}

/** A new page whose console (its workers' too) and uncaught errors go to the test output. */
export async function openPage(browserOrContext, label = "page") {
  const page = await browserOrContext.newPage();
  const say = (text) => process.stderr.write(`[${label}] ${text}\n`);
  page.on("console", (m) => say(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => say(`pageerror: ${e.stack ?? e}`));
  page.on("worker", (w) => {
    say(`worker started: ${w.url()}`);
    w.on("console", (m) => say(`worker ${m.type()}: ${m.text()}`));
  });
  page.on("crash", () => say("page crashed"));
  return page;
}

/** Seconds since `t0` (a `performance.now()`), one decimal, for timing notes in the output. */
export const secondsSince = (t0) => ((performance.now() - t0) / 1000).toFixed(1);
