// The package's OpenAI shaping (web/src/openai.js) over a scripted core, in node: response
// and chunk shapes, usage, errors, early cancellation and one-at-a-time requests. The real
// engine behind it is tested in Chromium by package.test.mjs.

import { test } from "node:test";
import assert from "node:assert/strict";
import { openaiApi } from "../../web/src/openai.js";
import { InvalidRequestError, ContextWindowExceededError } from "../../web/src/errors.js";

const SUMMARY = { prompt_tokens: 3, cached_prompt_tokens: 1, completion_tokens: 2, ttft_ms: 5, prefill_tok_s: 60, decode_tok_s: 20 };

/** A core that emits `tokens` one per macrotask, records requests and interrupts. */
function scriptedCore(tokens = ["Hel", "lo"], { tail = "", fail = null } = {}) {
  const core = {
    requests: [],
    interrupts: 0,
    running: 0,
    maxRunning: 0,
    aborted: false,
    interrupt() {
      core.interrupts += 1;
      core.aborted = true;
    },
    async generate(request, onToken) {
      core.requests.push(JSON.parse(request));
      core.running += 1;
      core.maxRunning = Math.max(core.maxRunning, core.running);
      core.aborted = false;
      try {
        if (fail) throw Object.assign(new Error(fail.message), { name: fail.name });
        let n = 0;
        for (const [i, t] of tokens.entries()) {
          if (core.aborted) break;
          await new Promise((r) => setTimeout(r, 1));
          onToken(t, 100 + i, null);
          n += 1;
        }
        const finish_reason = core.aborted ? "abort" : "length";
        return JSON.stringify({ ...SUMMARY, completion_tokens: n, finish_reason, text: tail, logprobs: null });
      } finally {
        core.running -= 1;
      }
    },
  };
  return core;
}

test("completions.create returns a text_completion with usage; request fields pass through", async () => {
  const core = scriptedCore(["Hel", "lo"], { tail: "!" });
  const api = openaiApi(core, () => "m");
  const r = await api.completions.create({ prompt: "Say", max_tokens: 2, temperature: 0, stop: "x", top_k: 5, ignored: 1 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, "m");
  assert.equal(r.choices[0].text, "Hello!");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.deepEqual(r.usage, {
    prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, cached_prompt_tokens: 1,
    prompt_tokens_details: { cached_tokens: 1 }, ttft_ms: 5, prefill_tok_s: 60, decode_tok_s: 20,
  });
  assert.deepEqual(core.requests[0], { prompt: "Say", max_tokens: 2, temperature: 0, stop: ["x"], top_k: 5 });
});

test("streamed chat: role first, one chunk per delta, then finish_reason and usage", async () => {
  const core = scriptedCore(["A", "", "B"]);
  const api = openaiApi(core, () => "m");
  const chunks = [];
  for await (const c of await api.chat.completions.create({ messages: [{ role: "user", content: "hi" }], stream: true })) chunks.push(c);
  assert.equal(chunks.length, 3, "the empty delta is not sent");
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0].id));
  assert.deepEqual(chunks[0].choices[0].delta, { role: "assistant", content: "A" });
  assert.deepEqual(chunks[1].choices[0].delta, { content: "B" });
  assert.deepEqual(chunks[2].choices[0].delta, {});
  assert.equal(chunks[2].choices[0].finish_reason, "length");
  assert.equal(chunks[2].usage.completion_tokens, 3);
  assert.equal(chunks[0].usage, undefined);
});

test("bad requests are InvalidRequestErrors; engine errors keep their class", async () => {
  const api = openaiApi(scriptedCore(), () => "m");
  await assert.rejects(api.chat.completions.create({ messages: [] }), InvalidRequestError);
  await assert.rejects(api.completions.create({ prompt: 3 }), InvalidRequestError);
  await assert.rejects(api.completions.create(undefined), InvalidRequestError);
  await assert.rejects(api.completions.create({ prompt: "x", n: 2 }), InvalidRequestError);
  const failing = openaiApi(scriptedCore([], { fail: { name: "ContextWindowExceededError", message: "too long" } }), () => "m");
  await assert.rejects(failing.completions.create({ prompt: "x" }), (e) => e instanceof ContextWindowExceededError && e.code === "context_length_exceeded");
  const stream = await failing.completions.create({ prompt: "x", stream: true });
  await assert.rejects(async () => {
    for await (const _ of stream);
  }, ContextWindowExceededError);
});

test("breaking out of a stream interrupts the generation", async () => {
  const core = scriptedCore(["a", "b", "c", "d", "e", "f"]);
  const api = openaiApi(core, () => "m");
  let seen = 0;
  for await (const _ of await api.completions.create({ prompt: "x", stream: true })) {
    seen += 1;
    if (seen === 2) break;
  }
  assert.equal(core.interrupts, 1);
  // The next request waits for the interrupted one instead of failing as busy.
  const r = await api.completions.create({ prompt: "y" });
  assert.equal(r.choices[0].text, "abcdef");
  assert.equal(core.maxRunning, 1);
});

test("concurrent requests run one at a time, in order", async () => {
  const core = scriptedCore(["x"]);
  const api = openaiApi(core, () => "m");
  const results = await Promise.all([1, 2, 3].map((i) => api.completions.create({ prompt: `p${i}` })));
  assert.equal(core.maxRunning, 1);
  assert.deepEqual(core.requests.map((r) => r.prompt), ["p1", "p2", "p3"]);
  assert.ok(results.every((r) => r.choices[0].text === "x"));
});
