// The package's OpenAI shaping (web/src/openai.js) over a scripted core, in node: response
// and chunk shapes, usage, errors, n choices, concurrent requests, and cancellation of one
// request only. The real engine behind it is tested in Chromium by package.test.mjs.

import { test } from "node:test";
import assert from "node:assert/strict";
import { openaiApi } from "../../web/src/openai.js";
import { InvalidRequestError, ContextWindowExceededError } from "../../web/src/errors.js";

const SUMMARY = {
  prompt_tokens: 3, cached_prompt_tokens: 1, completion_tokens: 2, ttft_ms: 5, prefill_tok_s: 60, decode_tok_s: 20,
  draft_tokens: 4, accepted_draft_tokens: 1,
};
const tick = () => new Promise((r) => setTimeout(r, 1));

/** A core that runs requests concurrently, emitting `tokens` (per choice) one per macrotask. */
function scriptedCore(tokens = ["Hel", "lo"], { tail = "", fail = null, submitError = null } = {}) {
  let next = 1;
  const core = {
    requests: [],
    cancelled: [],
    running: 0,
    maxRunning: 0,
    async submit(request, onEvent) {
      if (submitError) throw Object.assign(new Error(submitError.message), submitError);
      const req = JSON.parse(request);
      core.requests.push(req);
      const id = next++;
      const n = req.body.n ?? 1;
      core.running += 1;
      core.maxRunning = Math.max(core.maxRunning, core.running);
      (async () => {
        await tick();
        if (fail) {
          onEvent({ type: "error", name: fail.name, message: fail.message });
        } else {
          const emitted = new Array(n).fill(0);
          for (const [i, t] of tokens.entries()) {
            if (core.cancelled.includes(id)) break;
            await tick();
            for (let c = 0; c < n; c++) {
              onEvent({ type: "token", choice: c, id: 100 + i, text: n > 1 ? `${t}${c}` : t, logprobs: null });
              emitted[c] += 1;
            }
          }
          const reason = core.cancelled.includes(id) ? "abort" : "length";
          for (let c = 0; c < n; c++) {
            onEvent({ type: "done", choice: c, text: tail, summary: { ...SUMMARY, completion_tokens: emitted[c], finish_reason: reason } });
          }
        }
        core.running -= 1;
        onEvent({ type: "end" });
      })();
      return id;
    },
    cancel(id) {
      core.cancelled.push(id);
    },
  };
  return core;
}

test("completions.create returns a text_completion with usage; the body passes through whole", async () => {
  const core = scriptedCore(["Hel", "lo"], { tail: "!" });
  const api = openaiApi(core, () => "m");
  const prediction = { type: "content", content: "Hello" };
  const r = await api.completions.create({ prompt: "Say", max_tokens: 2, temperature: 0, stop: "x", top_k: 5, ignored: 1, speculative: false, prediction });
  assert.equal(r.object, "text_completion");
  assert.equal(r.model, "m");
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].text, "Hello!");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.deepEqual(r.usage, {
    prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, cached_prompt_tokens: 1,
    prompt_tokens_details: { cached_tokens: 1 }, ttft_ms: 5, prefill_tok_s: 60, decode_tok_s: 20,
    completion_tokens_details: { accepted_prediction_tokens: 1, rejected_prediction_tokens: 3 },
  });
  const body = { prompt: "Say", max_tokens: 2, temperature: 0, stop: "x", top_k: 5, ignored: 1, speculative: false, prediction };
  assert.deepEqual(core.requests[0], { endpoint: "completions", body });
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

test("n: 2 returns two choices, streamed and not; usage counts both", async () => {
  const api = openaiApi(scriptedCore(["a", "b"]), () => "m");
  const r = await api.chat.completions.create({ messages: [{ role: "user", content: "hi" }], n: 2 });
  assert.deepEqual(r.choices.map((c) => [c.index, c.message.content]), [[0, "a0b0"], [1, "a1b1"]]);
  assert.equal(r.usage.completion_tokens, 4);
  const chunks = [];
  for await (const c of await api.completions.create({ prompt: "x", n: 2, stream: true })) chunks.push(c);
  const text = (i) => chunks.filter((c) => c.choices[0].index === i).map((c) => c.choices[0].text).join("");
  assert.equal(text(0), "a0b0");
  assert.equal(text(1), "a1b1");
  assert.deepEqual(chunks.filter((c) => c.choices[0].finish_reason).map((c) => c.choices[0].index).sort(), [0, 1]);
  assert.equal(chunks.at(-1).usage.completion_tokens, 4, "the last chunk carries the request's usage");
});

// Each field's values are checked by the engine's reader (shared with `flint serve`), which
// the request-case table tests through the real engine in Chromium (package.test.mjs).
test("bad requests are InvalidRequestErrors with their param; engine errors keep their class", async () => {
  const api = openaiApi(scriptedCore(), () => "m");
  await assert.rejects(api.completions.create(undefined), InvalidRequestError);
  const bad = openaiApi(scriptedCore([], { submitError: { name: "InvalidRequestError", message: "n out of range", param: "n" } }), () => "m");
  await assert.rejects(bad.completions.create({ prompt: "x", n: 0 }), (e) => e instanceof InvalidRequestError && e.code === "invalid_request" && e.param === "n");
  const refused = openaiApi(scriptedCore([], { submitError: { name: "ContextWindowExceededError", message: "too long" } }), () => "m");
  await assert.rejects(refused.completions.create({ prompt: "x" }), (e) => e instanceof ContextWindowExceededError && e.code === "context_length_exceeded");
  const failing = openaiApi(scriptedCore([], { fail: { name: "ContextWindowExceededError", message: "too long" } }), () => "m");
  const stream = await failing.completions.create({ prompt: "x", stream: true });
  await assert.rejects(async () => {
    for await (const _ of stream);
  }, ContextWindowExceededError);
});

test("concurrent requests run at once; breaking out of one stream cancels only that one", async () => {
  const core = scriptedCore(["a", "b", "c", "d", "e", "f"]);
  const api = openaiApi(core, () => "m");
  const other = api.completions.create({ prompt: "y" });
  let seen = 0;
  for await (const _ of await api.completions.create({ prompt: "x", stream: true })) {
    seen += 1;
    if (seen === 2) break;
  }
  assert.equal(core.cancelled.length, 1, "exactly one request was cancelled");
  const r = await other;
  assert.equal(r.choices[0].text, "abcdef", "the other request finished untouched");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(core.maxRunning, 2, "both requests ran at the same time");
  const many = await Promise.all([1, 2, 3].map((i) => api.completions.create({ prompt: `p${i}` })));
  assert.ok(many.every((m) => m.choices[0].text === "abcdef"));
  assert.equal(core.maxRunning, 3);
});
