// The model of the server that serves this page (`flint serve`), behind the same interface the
// page uses for an in-browser engine: `chat.completions.create` / `completions.create` with
// `stream: true` yield OpenAI chunks, streamed from the server's /v1 endpoints over SSE. So a
// browser without WebGPU can still chat.

/** The models of this page's server (`GET v1/models`); none when the page is a static site. */
export async function serverModels() {
  try {
    const res = await fetch("v1/models");
    if (!res.ok || !(res.headers.get("content-type") ?? "").startsWith("application/json")) return [];
    const list = await res.json();
    return Array.isArray(list?.data) ? list.data.filter((m) => typeof m?.id === "string") : [];
  } catch {
    return [];
  }
}

/**
 * Stream readers with a read pending: Chromium may collect a stream (a fetch body's) whose only
 * reference is its own pending read, which then never settles. Each is held here while it reads.
 */
const reading = new Set();

function holding(reader, promise) {
  reading.add(reader);
  return promise.finally(() => reading.delete(reader));
}

/** An error the server sent: its OpenAI error body, or the bare status. */
class ServerError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `the server answered ${status}`);
    this.name = "ServerError";
    this.status = status;
    this.code = body?.error?.code ?? null;
  }
}

/** An engine for the server's model `model` (an entry of `serverModels()`). */
export function createServerEngine(model, { apiKey = "" } = {}) {
  let running = null;
  const meta = model.meta ?? {};

  async function* stream(path, request) {
    const controller = new AbortController();
    running = controller;
    const headers = { "content-type": "application/json" };
    if (apiKey) headers.authorization = `Bearer ${apiKey}`;
    const t0 = performance.now();
    let tFirst = null;
    try {
      const res = await fetch(path, {
        method: "POST", headers, signal: controller.signal,
        body: JSON.stringify({ ...request, model: model.id, stream: true, stream_options: { include_usage: true } }),
      });
      if (!res.ok) throw new ServerError(res.status, await res.json().catch(() => null));
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await holding(reader, reader.read());
        if (done) return;
        buf += value;
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
          if (!data) continue;
          if (data === "[DONE]") return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new ServerError(200, chunk);
          tFirst ??= chunk.choices?.length ? performance.now() : null;
          if (chunk.usage) chunk.usage = withTimings(chunk.usage, t0, tFirst);
          yield chunk;
        }
      }
    } finally {
      if (running === controller) running = null;
      controller.abort();
    }
  }

  return {
    info: { name: model.id, has_chat_template: meta.has_chat_template !== false, n_ctx: meta.n_ctx },
    chat: { completions: { create: async (request) => stream("v1/chat/completions", request) } },
    completions: { create: async (request) => stream("v1/completions", request) },
    // Aborting the fetch closes the stream; the server cancels the request at its next step.
    interruptGenerate: () => running?.abort(),
    resetChat: async () => {},
    unload: async () => running?.abort(),
  };
}

/** The page's stats fields, measured here: the server's usage has only token counts. */
function withTimings(usage, t0, tFirst) {
  const now = performance.now();
  const first = tFirst ?? now;
  const decodeS = (now - first) / 1000;
  return {
    ...usage,
    ttft_ms: first - t0,
    prefill_tok_s: usage.prompt_tokens / Math.max((first - t0) / 1000, 1e-3),
    decode_tok_s: decodeS > 0 ? Math.max(usage.completion_tokens - 1, 0) / decodeS : 0,
    cached_prompt_tokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
  };
}
