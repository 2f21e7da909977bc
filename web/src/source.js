// Model sources for the wasm engine: `{ size, read(offset, length) → Promise<Uint8Array> }`.
// The engine reads the header, then each tensor in chunks of a few MB straight into GPU
// buffers, so no ArrayBuffer ever holds the whole model (a model over 2 GB loads the same way).
// Each source reads into one buffer it reuses (the engine copies a chunk out before it asks
// for the next), so a 5 GB load leaves no gigabytes of dead ArrayBuffers for the GC to find.

import { ModelLoadError } from "./errors.js";

/**
 * Readers and slices with a read pending. Chromium may collect a stream (a Blob's, a fetch
 * body's) whose only references are its own pending read, and that read then never settles:
 * loads stalled for good now and then, and at once with garbage collection forced every
 * 30 ms. Each is held here while it reads.
 */
const reading = new Set();

/** `promise` (a read of `source`), with `source` held until it settles. */
function holding(source, promise) {
  reading.add(source);
  return promise.finally(() => reading.delete(source));
}

/**
 * How long a read may go without a byte before it counts as stalled (the sources and
 * `readInto` take another as their last argument): a read that waits on a browser that never
 * answers is abandoned and made again (a slice or a range reads the same bytes twice), up to
 * `READ_TRIES` times in all, then the load fails saying so.
 */
const STALL_MS = 20_000;
const READ_TRIES = 3;

/** A read that got no byte for its stall time. */
class ReadStalled extends Error {}

/**
 * `promise`, or a `ReadStalled` rejection once `ms` pass first; `onStall` then runs (a cancel
 * that settles `promise` as it goes: the rejection is first, so it wins the race).
 */
function unlessStalled(promise, ms, onStall) {
  let timer;
  const stalled = new Promise((_, reject) => {
    timer = setTimeout(() => {
      reject(new ReadStalled(`no byte for ${ms / 1000} s`));
      onStall?.();
    }, ms);
  });
  return Promise.race([promise, stalled]).finally(() => clearTimeout(timer));
}

/** A reader of `stream`: BYOB where it is a byte stream (no buffer allocated per chunk). */
export function streamReader(stream) {
  try {
    return { reader: stream.getReader({ mode: "byob" }), byob: true, rest: null };
  } catch {
    return { reader: stream.getReader(), byob: false, rest: null };
  }
}

/**
 * Reads up to `length` bytes from `r` (a `streamReader`) into `reuse` (an ArrayBuffer, replaced
 * when too small); resolves to `{ bytes, buffer }`: the bytes read (a view on `buffer`, fewer
 * only at the stream's end) and the buffer to reuse next time. Rejects with `ReadStalled`
 * when the stream gives no byte for `stallMs` (the reader is cancelled; `reuse` may be
 * detached by then).
 */
export async function readInto(r, length, reuse, stallMs = STALL_MS) {
  let buffer = reuse && reuse.byteLength >= length ? reuse : new ArrayBuffer(length);
  let got = 0;
  const read = (view) => unlessStalled(holding(r.reader, view ? r.reader.read(view) : r.reader.read()), stallMs, () => r.reader.cancel().catch(() => {}));
  if (r.byob) {
    while (got < length) {
      const { value, done } = await read(new Uint8Array(buffer, got, length - got));
      if (value) buffer = value.buffer;
      if (done) break;
      got += value.byteLength;
    }
  } else {
    while (got < length) {
      let chunk = r.rest;
      r.rest = null;
      if (!chunk) {
        const { value, done } = await read();
        if (done) break;
        chunk = value;
      }
      const take = Math.min(chunk.byteLength, length - got);
      new Uint8Array(buffer, got, take).set(chunk.subarray(0, take));
      if (take < chunk.byteLength) r.rest = chunk.subarray(take);
      got += take;
    }
  }
  return { bytes: new Uint8Array(buffer, 0, got), buffer };
}

/** `length` bytes of `stream` into `reuse`, as `readInto`; the stream is cancelled after. */
async function readStream(stream, length, reuse, stallMs) {
  const r = streamReader(stream);
  try {
    return await readInto(r, length, reuse, stallMs);
  } finally {
    r.reader.cancel().catch(() => {});
  }
}

/**
 * Reads through one reused buffer; a read started while another is in flight gets its own.
 * A stalled read is made again with a new buffer (the stalled one may hold the old).
 */
function reusing(readAt) {
  let spare = null;
  return async (offset, length) => {
    let mine = spare;
    spare = null;
    for (let tries = 1; ; tries++) {
      try {
        const { bytes, buffer } = await readAt(offset, length, mine);
        spare = buffer;
        return bytes;
      } catch (e) {
        if (!(e instanceof ReadStalled)) throw e;
        if (tries >= READ_TRIES) throw new ModelLoadError(`reading the model stalled: ${length} bytes at ${offset} got ${e.message}, ${tries} times`);
        console.warn(`flint: a read of ${length} bytes at ${offset} stalled (${e.message}); reading it again`);
        mine = null;
      }
    }
  };
}

/** The source of `size` bytes that `read` reads, telling `onRead` of each read's length. */
function counted(size, read, onRead) {
  return {
    size,
    async read(offset, length) {
      const bytes = await read(offset, length);
      onRead?.(length);
      return bytes;
    },
  };
}

/** Reads slices of a Blob or File (a local file, or a model held in the browser's storage). */
export function blobSource(blob, onRead, stallMs = STALL_MS) {
  const read = reusing(async (offset, length, reuse) => {
    const slice = blob.slice(offset, offset + length);
    const whole = () => unlessStalled(holding(slice, slice.arrayBuffer()), stallMs).then((b) => ({ bytes: new Uint8Array(b), buffer: null }));
    const got = typeof slice.stream === "function" ? await readStream(slice.stream(), length, reuse, stallMs) : await whole();
    if (got.bytes.length !== length) throw new ModelLoadError(`reading the model: ${got.bytes.length} of ${length} bytes at ${offset}`);
    return got;
  });
  return counted(blob.size, read, onRead);
}

/** Reads byte ranges of a URL with HTTP Range requests (no caching). */
export async function rangeSource(url, onRead, stallMs = STALL_MS) {
  const head = await fetch(url, { method: "HEAD" });
  if (!head.ok) throw new ModelLoadError(`${url}: HTTP ${head.status}`);
  const size = Number(head.headers.get("content-length"));
  if (!Number.isSafeInteger(size) || size <= 0) throw new ModelLoadError(`${url}: the server gives no Content-Length`);
  const read = reusing(async (offset, length, reuse) => {
    const abort = new AbortController();
    const ranged = fetch(url, { headers: { Range: `bytes=${offset}-${offset + length - 1}` }, signal: abort.signal });
    const res = await unlessStalled(ranged, stallMs, () => abort.abort());
    if (res.status !== 206 || !res.body) throw new ModelLoadError(`${url}: the server ignored a Range request (HTTP ${res.status})`);
    // One byte more than asked for is room to notice a body longer than the range.
    const got = await readStream(res.body, length + 1, reuse, stallMs);
    if (got.bytes.length !== length) throw new ModelLoadError(`${url}: range read returned ${got.bytes.length} of ${length} bytes`);
    return got;
  });
  return counted(size, read, onRead);
}
