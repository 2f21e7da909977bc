// The browser's copy of downloaded models: Cache API entries keyed by the model's absolute
// URL, with its size recorded and checked. A download is stored only once every byte has
// arrived (Cache.put resolves after the whole body), so a partial file is never cached.

import { ModelLoadError } from "./errors.js";

const CACHE_NAME = "flint-llm-models";
const SIZE_HEADER = "x-flint-size";

function key(url) {
  return new URL(url, globalThis.location?.href).href;
}

function cacheAvailable() {
  return typeof caches !== "undefined";
}

/** The cached model for `url` as a Blob (disk-backed in the browser), or null. */
export async function cachedModel(url) {
  if (!cacheAvailable()) return null;
  const cache = await caches.open(CACHE_NAME);
  const res = await cache.match(key(url));
  if (!res) return null;
  const size = Number(res.headers.get(SIZE_HEADER));
  const blob = await res.blob();
  if (!Number.isSafeInteger(size) || blob.size !== size) {
    await cache.delete(key(url));
    return null;
  }
  return blob;
}

export async function hasModelInCache(url) {
  if (!cacheAvailable()) return false;
  const cache = await caches.open(CACHE_NAME);
  const res = await cache.match(key(url));
  return Boolean(res && Number(res.headers.get(SIZE_HEADER)) > 0);
}

export async function deleteModelFromCache(url) {
  if (!cacheAvailable()) return false;
  const cache = await caches.open(CACHE_NAME);
  return cache.delete(key(url));
}

/**
 * Downloads `url` into the cache, reporting (loaded, total) as bytes arrive, and returns the
 * cached Blob. It returns null, and the caller reads the model by HTTP ranges instead, where
 * there is no Cache API, where the model is larger than the storage the browser has left for
 * this origin (`navigator.storage.estimate()`), or where storing it fails (Chromium refuses
 * bodies past its limits with a "network error"); `onSkip(reason)` says why.
 */
export async function downloadToCache(url, onProgress, onSkip = () => {}) {
  if (!cacheAvailable()) return null;
  const res = await fetch(url);
  if (!res.ok || !res.body) throw new ModelLoadError(`${url}: HTTP ${res.status}`);
  const total = Number(res.headers.get("content-length")) || 0;
  const room = await storageLeft();
  if (total && room != null && total > room) {
    await res.body.cancel();
    onSkip(`the model (${mb(total)} MB) is larger than the browser's storage left for this site (${mb(room)} MB)`);
    return null;
  }
  let loaded = 0;
  let cut = null;
  const counted = res.body.pipeThrough(
    new TransformStream({
      transform(chunk, ctl) {
        loaded += chunk.byteLength;
        onProgress(loaded, total);
        ctl.enqueue(chunk);
      },
      flush() {
        if (total && loaded !== total) {
          cut = new ModelLoadError(`${url}: download ended at ${loaded} of ${total} bytes`);
          throw cut;
        }
      },
    }),
  );
  const cache = await caches.open(CACHE_NAME);
  const stored = new Response(counted, { headers: { "content-type": "application/octet-stream", [SIZE_HEADER]: String(total) } });
  try {
    await cache.put(key(url), stored);
  } catch (e) {
    if (cut) throw cut;
    await cache.delete(key(url)).catch(() => {});
    onSkip(`storing it in the browser cache failed (${e?.message ?? e})`);
    return null;
  }
  if (!total) {
    // Without a Content-Length the size is known only now: record it.
    const blob = await (await cache.match(key(url))).blob();
    await cache.put(key(url), new Response(blob, { headers: { [SIZE_HEADER]: String(blob.size) } }));
  }
  const blob = await cachedModel(url);
  if (!blob) throw new ModelLoadError(`${url}: the cached copy is incomplete`);
  return blob;
}

/** Bytes of storage this origin may still use, when the browser says. */
async function storageLeft() {
  try {
    const { quota, usage } = (await navigator.storage?.estimate?.()) ?? {};
    return Number.isFinite(quota) && Number.isFinite(usage) ? Math.max(0, quota - usage) : null;
  } catch {
    return null;
  }
}

function mb(bytes) {
  return (bytes / 1e6).toFixed(0);
}
