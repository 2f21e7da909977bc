// Model sources for the wasm engine: `{ size, read(offset, length) → Promise<Uint8Array> }`.
// The engine reads the header, then each tensor in chunks of a few MB straight into GPU
// buffers, so no ArrayBuffer ever holds the whole model (a model over 2 GB loads the same way).

import { ModelLoadError } from "./errors.js";

/** Reads slices of a Blob or File (a local file, or a model held by the browser's cache). */
export function blobSource(blob, onRead) {
  return {
    size: blob.size,
    async read(offset, length) {
      const buf = await blob.slice(offset, offset + length).arrayBuffer();
      onRead?.(length);
      return new Uint8Array(buf);
    },
  };
}

/** Reads byte ranges of a URL with HTTP Range requests (no caching). */
export async function rangeSource(url, onRead) {
  const head = await fetch(url, { method: "HEAD" });
  if (!head.ok) throw new ModelLoadError(`${url}: HTTP ${head.status}`);
  const size = Number(head.headers.get("content-length"));
  if (!Number.isSafeInteger(size) || size <= 0) throw new ModelLoadError(`${url}: the server gives no Content-Length`);
  return {
    size,
    async read(offset, length) {
      const res = await fetch(url, { headers: { Range: `bytes=${offset}-${offset + length - 1}` } });
      if (res.status !== 206) throw new ModelLoadError(`${url}: the server ignored a Range request (HTTP ${res.status})`);
      const buf = new Uint8Array(await res.arrayBuffer());
      if (buf.length !== length) throw new ModelLoadError(`${url}: range read returned ${buf.length} of ${length} bytes`);
      onRead?.(length);
      return buf;
    },
  };
}
