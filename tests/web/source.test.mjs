// The package's model readers (web/src/source.js) under Node, where their stall handling can be
// driven exactly: a read that gets no byte for its stall time is abandoned and made again, up
// to three times, then the load fails with ModelLoadError instead of waiting forever
// (Chromium's Blob streams now and then leave a read pending under load: a File, or a model in
// the browser's storage, stalled `createEngine` for good). Blobs whose slices stall on a BYOB
// byte stream, on a default stream and without a stream; a slow source that keeps sending is
// not a stall; HTTP range reads from a real server on loopback that stalls before its headers
// and inside a body.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { blobSource, rangeSource } from "../../web/src/source.js";
import { ModelLoadError } from "../../web/src/errors.js";

const STALL = 150;
const bytes = Uint8Array.from({ length: 5000 }, (_, i) => (i * 7 + 3) & 255);

/** A stream that never gives a byte (a byte stream, so BYOB readers attach, unless `plain`). */
function silent(plain = false) {
  return new ReadableStream({ ...(plain ? {} : { type: "bytes" }), pull: () => new Promise(() => {}) });
}

/** A stream of `data` a byte every `ms`. */
function trickle(data, ms) {
  let i = 0;
  return new ReadableStream({
    async pull(c) {
      await new Promise((r) => setTimeout(r, ms));
      if (i < data.length) c.enqueue(data.slice(i, ++i));
      else c.close();
    },
  });
}

/**
 * `bytes` as a Blob whose first `stalls` slices stall: `kind` "byob" and "plain" give a
 * stream that never sends, "whole" a slice with no stream whose arrayBuffer() never settles.
 */
function stallingBlob(stalls, kind) {
  let left = stalls;
  class Stalling extends Blob {
    slice(start, end) {
      const real = super.slice(start, end);
      if (left-- <= 0) return kind === "whole" ? { arrayBuffer: () => real.arrayBuffer() } : real;
      if (kind === "whole") return { arrayBuffer: () => new Promise(() => {}) };
      return { stream: () => silent(kind === "plain") };
    }
  }
  return new Stalling([bytes]);
}

/** Runs `work` with console.warn captured; resolves to [its result, the warnings]. */
async function warnings(work) {
  const said = [];
  const warn = console.warn;
  console.warn = (...a) => said.push(a.join(" "));
  try {
    return [await work(), said];
  } finally {
    console.warn = warn;
  }
}

for (const kind of ["byob", "plain", "whole"]) {
  test(`a Blob slice that stalls (${kind}) is read again, and one that always stalls fails with ModelLoadError`, async () => {
    const [got, said] = await warnings(() => blobSource(stallingBlob(2, kind), null, STALL).read(1000, 3000));
    assert.deepEqual(got, bytes.slice(1000, 4000));
    assert.equal(said.length, 2, said.join("\n"));
    assert.match(said[0], /a read of 3000 bytes at 1000 stalled/);
    const t0 = performance.now();
    const [err] = await warnings(() => blobSource(stallingBlob(Infinity, kind), null, STALL).read(0, 100).then(() => null, (e) => e));
    assert.ok(err instanceof ModelLoadError, String(err));
    assert.match(err.message, /reading the model stalled: 100 bytes at 0 .* 3 times/);
    assert.ok(performance.now() - t0 >= 3 * STALL * 0.9, "it gave up before three stalls");
  });
}

test("a source that keeps sending, however slowly, is not stalled", async () => {
  const data = bytes.slice(0, 12);
  class Slow extends Blob {
    slice() {
      return { stream: () => trickle(data, STALL / 3) };
    }
  }
  const [got, said] = await warnings(() => blobSource(new Slow([data]), null, STALL).read(0, 12));
  assert.deepEqual(got, data);
  assert.deepEqual(said, []);
});

test("HTTP range reads that stall before their headers or inside their body are made again", async () => {
  // Request k of a range: 0 answers nothing, 1 sends half the body and stops, then whole.
  const seen = new Map();
  const server = createServer((req, res) => {
    if (req.method === "HEAD") {
      res.writeHead(200, { "content-length": bytes.length });
      return res.end();
    }
    const [, a, b] = /bytes=(\d+)-(\d+)/.exec(req.headers.range);
    const body = bytes.slice(Number(a), Number(b) + 1);
    const k = seen.get(req.headers.range) ?? 0;
    seen.set(req.headers.range, k + 1);
    if (k === 0) return;
    res.writeHead(206, { "content-length": body.length });
    if (k === 1) return res.write(body.slice(0, body.length >> 1));
    res.end(body);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const url = `http://127.0.0.1:${server.address().port}/model.gguf`;
    const source = await rangeSource(url, null, STALL);
    assert.equal(source.size, bytes.length);
    const [got, said] = await warnings(() => source.read(100, 2000));
    assert.deepEqual(got, bytes.slice(100, 2100));
    assert.equal(seen.get("bytes=100-2099"), 3);
    assert.equal(said.length, 2, said.join("\n"));
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
