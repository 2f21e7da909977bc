// `flint serve` spoken to by the official OpenAI JavaScript client (npm `openai`), as a user
// points an existing app at it: qwen on the GPU (lavapipe), on a free loopback port, with an
// API key. Greedy chat reproduces the f32 reference for qwen's golden chat prompt; streaming
// with usage, plain completions, the model list, n, seeds, stop strings, logprobs, and the
// typed errors the client raises for a bad value, an unknown model and a wrong key. And the
// chat page served by the same server, in a Chromium without WebGPU, chatting with the
// server's model.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import Ajv from "ajv";
import { REPO, SITE, launchBrowser, openPage, requireFile, startServe } from "./lib.mjs";

const SHARED = join(REPO, "../shared");
const MODEL = "qwen2.5-coder-0.5b";
const KEY = "sk-flint-test";
const MODELS = process.env.FLINT_HOME ?? join(homedir(), ".cache/flint/models");
const golden = (rel) => JSON.parse(readFileSync(join(SHARED, "golden", rel), "utf8"));

let server;
let client;

async function startQwen() {
  const model = join(MODELS, `${MODEL}.gguf`);
  requireFile(model, `run \`flint pull ${MODEL}\``);
  requireFile(join(SITE, "index.html"));
  return startServe(["-m", model, "--port", "0", "--api-key", KEY, "-c", "1024", "--parallel", "4", "--static", SITE]);
}

before(async () => {
  server = await startQwen();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 300_000 });
});

after(() => server?.child.kill("SIGTERM"));

test("the model list names the served model", async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [MODEL]);
});

test("greedy chat, streamed with usage, reproduces the f32 reference for the golden chat prompt", async () => {
  const messages = golden("prompts/chat_messages_qwen6.json");
  const want = golden("f32/qwen/6.json");
  const stream = await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  assert.equal(chunks[0].choices[0].delta.role, "assistant");
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one id for every chunk");
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
  assert.equal(text, want.greedy_text_16);
  assert.equal(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].finish_reason).join(), "length");
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.prompt_tokens, want.prompt_token_ids.length);
  assert.equal(usage.usage.completion_tokens, 16);
  assert.equal(usage.usage.total_tokens, want.prompt_token_ids.length + 16);
});

test("a predicted output (prediction) drafts: the same reply, with the accepted and rejected tokens in usage", async () => {
  const messages = golden("prompts/chat_messages_qwen6.json");
  const want = golden("f32/qwen/6.json").greedy_text_16;
  const ask = (content) => client.chat.completions.create({
    model: MODEL, messages, max_tokens: 16, temperature: 0, prediction: { type: "content", content },
  });
  const [right, wrong] = await Promise.all([ask(want), ask(want.replace("Python", "Rust"))]);
  for (const r of [right, wrong]) assert.equal(r.choices[0].message.content, want);
  const details = (r) => r.usage.completion_tokens_details;
  assert.ok(details(right).accepted_prediction_tokens >= 8, JSON.stringify(right.usage));
  assert.ok(details(wrong).rejected_prediction_tokens > 0, JSON.stringify(wrong.usage));
});

test("json_schema replies for four schemas of the golden file (at once): every one that ends with stop validates, at least half stop", { timeout: 5 * 60_000 }, async () => {
  const IDS = ["Glaiveai2K---calculate_shipping_cost_4b09e153", "Glaiveai2K---search_jobs_6f74b972", "Glaiveai2K---create_invoice_637dbd76", "Glaiveai2K---calculate_area_011c2f1f"];
  const cases = readFileSync(join(SHARED, "golden/json-schema/cases.jsonl"), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const schemas = IDS.map((id) => cases.find((c) => c.id === id).schema);
  const ajv = new Ajv({ strict: false, validateFormats: false });
  const replies = await Promise.all(
    schemas.map((schema, i) =>
      client.chat.completions.create({
        model: MODEL, max_tokens: 160, temperature: 0,
        messages: [{ role: "user", content: `Reply with a JSON object for this schema, with realistic values:\n${JSON.stringify(schema)}` }],
        response_format: { type: "json_schema", json_schema: { name: IDS[i].split("---")[1], schema, strict: true } },
      }),
    ),
  );
  let stopped = 0;
  for (const [i, r] of replies.entries()) {
    const { content } = r.choices[0].message;
    if (r.choices[0].finish_reason !== "stop") continue;
    stopped += 1;
    const validate = ajv.compile(schemas[i]);
    assert.ok(validate(JSON.parse(content)), `${IDS[i]}: ${content}: ${JSON.stringify(validate.errors)}`);
  }
  assert.ok(stopped * 2 >= replies.length, `${stopped} of ${replies.length} replies ended with stop`);
});

test("tool calls: 8 BFCL items with tool_choice required (at once), every call a listed function with valid arguments; a streamed call, its arguments in pieces, equals the unstreamed one", { timeout: 6 * 60_000 }, async () => {
  const IDS = ["simple_python_0", "simple_python_1", "multiple_3", "multiple_5", "parallel_9", "parallel_19", "irrelevance_0", "irrelevance_2"];
  const items = readFileSync(join(SHARED, "golden/tools/bfcl.jsonl"), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)).filter((i) => IDS.includes(i.id));
  assert.equal(items.length, IDS.length);
  const ajv = new Ajv({ strict: false, validateFormats: false });
  const ask = (item, extra = {}) =>
    client.chat.completions.create({ model: MODEL, messages: item.messages, tools: item.tools, tool_choice: "required", temperature: 0, seed: 1, max_tokens: 256, ...extra });
  const replies = await Promise.all(items.map((item) => ask(item)));
  for (const [k, r] of replies.entries()) {
    const { message, finish_reason } = r.choices[0];
    const label = `${items[k].id}: ${JSON.stringify(message)}`;
    if (finish_reason === "length") continue;
    assert.equal(finish_reason, "tool_calls", label);
    assert.ok(message.tool_calls.length >= 1, label);
    for (const call of message.tool_calls) {
      const tool = items[k].tools.find((t) => t.function.name === call.function.name);
      assert.ok(tool, `${label}: ${call.function.name} is not listed`);
      assert.equal(call.type, "function");
      const validate = ajv.compile(tool.function.parameters ?? { type: "object" });
      assert.ok(validate(JSON.parse(call.function.arguments)), `${label}: ${JSON.stringify(validate.errors)}`);
    }
    assert.equal(new Set(message.tool_calls.map((c) => c.id)).size, message.tool_calls.length, `${label}: ids repeat`);
  }
  assert.ok(replies.filter((r) => r.choices[0].finish_reason === "tool_calls").length >= 6, "most replies end with their calls");
  // Streamed: the deltas, put together as the client does, give the same calls and ids.
  const stream = await ask(items[4], { stream: true });
  const calls = [];
  let finish = null;
  let pieces = 0;
  for await (const chunk of stream) {
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      pieces += 1;
      const c = (calls[d.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      c.id += d.id ?? "";
      c.function.name += d.function?.name ?? "";
      c.function.arguments += d.function?.arguments ?? "";
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, replies[4].choices[0].finish_reason);
  assert.deepEqual(calls, replies[4].choices[0].message.tool_calls);
  // The arguments came as they were written, in more pieces than calls.
  assert.ok(pieces > 2 * calls.length, `${pieces} deltas for ${calls.length} calls`);
});

test("a plain completion of a golden raw prompt is the f32 reference's greedy text", async () => {
  const prompt = readFileSync(join(SHARED, "golden/prompts/p1.txt"), "utf8");
  const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0].text, golden("f32/qwen/1.json").greedy_text_16);
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 16);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, "number");
});

test("n: 2 returns two choices; a seed reproduces its request; a stop string ends early", async () => {
  const messages = [{ role: "user", content: "Name a color." }];
  const seeded = { model: MODEL, messages, max_tokens: 6, temperature: 1, seed: 1234 };
  const [a, b, two] = await Promise.all([
    client.chat.completions.create(seeded),
    client.chat.completions.create(seeded),
    client.chat.completions.create({ ...seeded, n: 2 }),
  ]);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content, "the same seed, the same text");
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.ok(two.choices.every((c) => c.message.role === "assistant" && typeof c.message.content === "string"));
  // Both choices' tokens (each at most 6; one may end early on end-of-generation).
  assert.ok(two.usage.completion_tokens >= 2 && two.usage.completion_tokens <= 12, JSON.stringify(two.usage));

  const stopped = await client.chat.completions.create({
    model: MODEL, messages: golden("prompts/chat_messages_qwen6.json"), max_tokens: 16, temperature: 0, stop: ["Python"],
  });
  assert.equal(stopped.choices[0].message.content, "Here's a ");
  assert.equal(stopped.choices[0].finish_reason, "stop");
});

test("logprobs: the chosen token and its alternatives", async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: golden("prompts/chat_messages_qwen6.json"), max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 4);
  assert.equal(content.map((t) => t.token).join(""), r.choices[0].message.content);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 2);
    assert.ok(t.logprob <= 0);
    // Greedy: the chosen token is the most likely one.
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.ok(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
  }
});

test("the client raises typed errors: a bad value, an unknown model, a wrong key", async () => {
  const messages = [{ role: "user", content: "hi" }];
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages, temperature: 5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, "temperature");
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: "gpt-4o", messages }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.code, "model_not_found");
    return true;
  });
  const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
  await assert.rejects(wrong.chat.completions.create({ model: MODEL, messages }), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
    assert.equal(e.status, 401);
    return true;
  });
});

test("the chat page served by flint serve chats with the server's model, without WebGPU", { timeout: 5 * 60_000 }, async (t) => {
  const browser = await launchBrowser({ webgpu: false });
  t.after(() => browser.close());
  const page = await openPage(browser, "server-chat");
  await page.goto(`${server.url}/`);
  await page.locator("#webgpu-status").getByText("You can still chat with this server's model").waitFor({ timeout: 30_000 });
  assert.equal(await page.inputValue("#model-select"), `server:${MODEL}`, "the server's model is chosen");
  assert.equal(await page.isEnabled("#load"), true, "Load works without WebGPU for the server's model");

  // The golden chat prompt, greedy, as a user types it: the f32 reference's text.
  const [system, user] = golden("prompts/chat_messages_qwen6.json");
  await page.fill("#api-key", KEY);
  await page.click("#load");
  await page.locator("#mode-note").getByText("chat mode").waitFor({ timeout: 30_000 });
  await page.fill("#system", system.content);
  await page.fill("#temperature", "0");
  await page.fill("#max-tokens", "16");
  await page.fill("#input", user.content);
  await page.click("#send");
  await page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout: 4 * 60_000, polling: 100 });
  assert.equal(await page.isHidden("#error"), true, await page.textContent("#error"));
  const reply = await page.locator("#messages .assistant").last().textContent();
  assert.equal(reply, golden("f32/qwen/6.json").greedy_text_16);
  assert.match(await page.textContent("#stats"), /TTFT \d+ ms · .* 16 generated tokens.*finish: length/);

  // A wrong key is shown as the server's error, not a silent empty reply.
  await page.fill("#api-key", "sk-wrong");
  await page.click("#load");
  await page.locator("#mode-note").getByText("chat mode").waitFor({ timeout: 30_000 });
  await page.fill("#input", "hi");
  await page.click("#send");
  await page.locator("#error").getByText("invalid or missing API key").waitFor({ timeout: 30_000 });
});
