// The browser's copy of downloaded models, in the origin-private file system (OPFS): one file
// per model, named by a hash of its absolute URL, and beside it a small record of the URL and
// size written only once every byte has arrived, so a partial download is never taken for a
// model. The body is read into one reused buffer and written straight to the file, so the
// page's JS heap stays small whatever the model's size. Where the browser has no writable OPFS
// the model is read by HTTP ranges instead, and the load's progress says why.

import { ModelLoadError } from "./errors.js";
import { readInto, streamReader } from "./source.js";

const DIR = "flint-llm-models";
/** The Cache Storage name earlier versions kept models under: emptied when a model is deleted. */
const LEGACY_CACHE = "flint-llm-models";
const CHUNK = 4 << 20;

function key(url) {
  return new URL(url, globalThis.location?.href).href;
}

async function names(url) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key(url)));
  const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return { data: `${hex}.gguf`, record: `${hex}.json` };
}

/** The models' directory, or null where the browser has no OPFS (or no writable files in it). */
async function directory() {
  try {
    if (typeof navigator === "undefined" || !navigator.storage?.getDirectory) return null;
    if (typeof FileSystemFileHandle === "undefined" || !("createWritable" in FileSystemFileHandle.prototype)) return null;
    return await (await navigator.storage.getDirectory()).getDirectoryHandle(DIR, { create: true });
  } catch {
    return null;
  }
}

async function readRecord(dir, name) {
  try {
    return JSON.parse(await (await (await dir.getFileHandle(name)).getFile()).text());
  } catch {
    return null;
  }
}

/** The stored model for `url` as a File (disk-backed), or null. */
export async function cachedModel(url) {
  const dir = await directory();
  if (!dir) return null;
  const { data, record } = await names(url);
  const rec = await readRecord(dir, record);
  if (!rec || rec.url !== key(url)) return null;
  try {
    const file = await (await dir.getFileHandle(data)).getFile();
    if (Number.isSafeInteger(rec.size) && file.size === rec.size) return file;
  } catch {
    // The data file is gone: drop the record below.
  }
  await deleteModelFromCache(url);
  return null;
}

export async function hasModelInCache(url) {
  return (await cachedModel(url)) !== null;
}

export async function deleteModelFromCache(url) {
  let deleted = false;
  const dir = await directory();
  if (dir) {
    const { data, record } = await names(url);
    for (const name of [record, data]) {
      deleted = (await dir.removeEntry(name).then(() => true, () => false)) || deleted;
    }
  }
  if (typeof caches !== "undefined" && (await caches.has(LEGACY_CACHE).catch(() => false))) {
    deleted = (await (await caches.open(LEGACY_CACHE)).delete(key(url))) || deleted;
  }
  return deleted;
}

/**
 * Downloads `url` into the browser's storage, reporting (loaded, total) as bytes arrive, and
 * returns the stored File. It returns null, and the caller reads the model by HTTP ranges
 * instead, where the browser has no writable OPFS, where the model is larger than the storage
 * the browser has left for this origin (`navigator.storage.estimate()`), or where writing it
 * fails (a quota error); `onSkip(reason)` says why. A download cut short throws.
 */
export async function downloadToCache(url, onProgress, onSkip = () => {}) {
  const dir = await directory();
  if (!dir) {
    onSkip("the page has no origin-private file system to keep it in (it needs a secure context)");
    return null;
  }
  const res = await fetch(url);
  if (!res.ok || !res.body) throw new ModelLoadError(`${url}: HTTP ${res.status}`);
  const total = Number(res.headers.get("content-length")) || 0;
  const room = await storageLeft();
  if (total && room != null && total > room) {
    await res.body.cancel();
    onSkip(`the model (${mb(total)} MB) is larger than the browser's storage left for this site (${mb(room)} MB)`);
    return null;
  }
  // The storage refused the model: the caller reads it by ranges instead.
  const refused = (e) => {
    onSkip(`storing it in the browser's storage failed (${e?.message ?? e})`);
    return null;
  };
  const { data, record } = await names(url);
  await dir.removeEntry(record).catch(() => {});
  let writable;
  try {
    writable = await (await dir.getFileHandle(data, { create: true })).createWritable();
  } catch (e) {
    await res.body.cancel();
    return refused(e);
  }
  // A download that does not finish leaves no file behind.
  const discard = async () => {
    await writable.abort().catch(() => {});
    await dir.removeEntry(data).catch(() => {});
  };
  const body = streamReader(res.body);
  let loaded = 0;
  let buffer = null;
  try {
    for (;;) {
      const got = await readInto(body, CHUNK, buffer);
      buffer = got.buffer;
      if (got.bytes.length === 0) break;
      try {
        await writable.write(got.bytes);
      } catch (e) {
        await body.reader.cancel().catch(() => {});
        await discard();
        return refused(e);
      }
      loaded += got.bytes.length;
      onProgress(loaded, total);
      if (got.bytes.length < CHUNK) break;
    }
  } catch (e) {
    await discard();
    throw new ModelLoadError(`${url}: the download failed at ${loaded} bytes (${e?.message ?? e})`);
  }
  if (total && loaded !== total) {
    await discard();
    throw new ModelLoadError(`${url}: download ended at ${loaded} of ${total} bytes`);
  }
  try {
    await writable.close();
    const rec = await (await dir.getFileHandle(record, { create: true })).createWritable();
    await rec.write(JSON.stringify({ url: key(url), size: loaded }));
    await rec.close();
  } catch (e) {
    await deleteModelFromCache(url);
    return refused(e);
  }
  const file = await cachedModel(url);
  if (!file) throw new ModelLoadError(`${url}: the stored copy is incomplete`);
  return file;
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
