// The OpenAI-shaped API (`chat.completions.create`, `completions.create`) over a core that
// runs one request at a time: `core.generate(request, onToken) → Promise<summary>`. The
// in-page engine and the Web Worker proxy are both such cores, so this shaping is written once.

import { fromWire, InvalidRequestError } from "./errors.js";

const REQUEST_FIELDS = [
  "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
  "frequency_penalty", "repetition_penalty", "repeat_last_n", "logit_bias", "logprobs", "top_logprobs",
];

/** The engine's request: the sampling fields OpenAI's API names, and the prompt or messages. */
function engineRequest(params, input) {
  const req = { ...input };
  for (const k of REQUEST_FIELDS) if (params[k] != null) req[k] = params[k];
  if (typeof req.stop === "string") req.stop = [req.stop];
  if (params.max_completion_tokens != null && req.max_tokens == null) req.max_tokens = params.max_completion_tokens;
  if (params.n != null && params.n !== 1) throw new InvalidRequestError("only n = 1 is supported");
  return JSON.stringify(req);
}

function usage(summary) {
  return {
    prompt_tokens: summary.prompt_tokens,
    completion_tokens: summary.completion_tokens,
    total_tokens: summary.prompt_tokens + summary.completion_tokens,
    cached_prompt_tokens: summary.cached_prompt_tokens,
    prompt_tokens_details: { cached_tokens: summary.cached_prompt_tokens },
    ttft_ms: summary.ttft_ms,
    prefill_tok_s: summary.prefill_tok_s,
    decode_tok_s: summary.decode_tok_s,
  };
}

let counter = 0;
function newId(prefix) {
  counter += 1;
  return `${prefix}-${Date.now().toString(36)}${counter.toString(36)}`;
}

/** Pushes values from callbacks and hands them out as an async iterable. */
class Channel {
  #items = [];
  #waiting = null;
  #done = false;
  #error = null;
  #onCancel;
  constructor(onCancel) {
    this.#onCancel = onCancel;
  }
  push(v) {
    this.#items.push(v);
    this.#wake();
  }
  close(error = null) {
    this.#done = true;
    this.#error = error;
    this.#wake();
  }
  #wake() {
    const w = this.#waiting;
    this.#waiting = null;
    w?.();
  }
  async *[Symbol.asyncIterator]() {
    try {
      for (;;) {
        if (this.#items.length) yield this.#items.shift();
        else if (this.#done) {
          if (this.#error) throw this.#error;
          return;
        } else await new Promise((r) => (this.#waiting = r));
      }
    } finally {
      if (!this.#done) this.#onCancel?.();
    }
  }
}

/** Requests on one engine run one after another, in the order they were made. */
function serialize(core) {
  let tail = Promise.resolve();
  return (request, onDelta) => {
    const result = tail.then(() => run(core, request, onDelta));
    tail = result.catch(() => {});
    return result;
  };
}

/** One request's run: streams deltas (text, logprobs) and returns the final summary. */
async function run(core, request, onDelta) {
  try {
    const summary = JSON.parse(await core.generate(request, (text, _id, logprobs) => onDelta(text, logprobs)));
    if (summary.text) onDelta(summary.text, null);
    return summary;
  } catch (e) {
    throw fromWire(e);
  }
}

function parseLogprobs(lp) {
  return lp == null ? null : typeof lp === "string" ? JSON.parse(lp) : lp;
}

/** `create` for one endpoint; `shape` builds the non-streamed object and the chunks. */
function endpoint(core, queue, model, toInput, shape) {
  return {
    async create(params) {
      if (params == null || typeof params !== "object") throw new InvalidRequestError("the request must be an object");
      const request = engineRequest(params, toInput(params));
      const id = newId(shape.prefix);
      const created = Math.floor(Date.now() / 1000);
      const head = { id, created, model: model() };
      if (!params.stream) {
        let text = "";
        const content = [];
        const summary = await queue(request, (t, lp) => {
          text += t;
          if ((lp = parseLogprobs(lp))) content.push(lp);
        });
        const logprobs = params.logprobs ? { content } : null;
        return { ...head, object: shape.object, choices: [shape.choice(text, summary.finish_reason, logprobs)], usage: usage(summary) };
      }
      // A consumer that stops iterating early ends the generation too.
      const channel = new Channel(() => core.interrupt());
      let first = true;
      queue(request, (t, lp) => {
        lp = parseLogprobs(lp);
        if (!t && !lp) return;
        channel.push({ ...head, object: shape.chunkObject, choices: [shape.delta(t, first, lp ? { content: [lp] } : null)] });
        first = false;
      }).then(
        (summary) => {
          channel.push({ ...head, object: shape.chunkObject, choices: [shape.last(summary.finish_reason)], usage: usage(summary) });
          channel.close();
        },
        (e) => channel.close(e),
      );
      return channel;
    },
  };
}

/** `chat.completions` and `completions` over `core`; `model()` names the loaded model. */
export function openaiApi(core, model) {
  const queue = serialize(core);
  const chat = {
    completions: endpoint(
      core,
      queue,
      model,
      (p) => {
        if (!Array.isArray(p.messages) || !p.messages.length) throw new InvalidRequestError("messages must be a non-empty array");
        return { messages: p.messages };
      },
      {
        prefix: "chatcmpl",
        object: "chat.completion",
        chunkObject: "chat.completion.chunk",
        choice: (text, finish_reason, logprobs) => ({ index: 0, message: { role: "assistant", content: text }, finish_reason, logprobs }),
        delta: (text, first, logprobs) => ({
          index: 0,
          delta: first ? { role: "assistant", content: text } : { content: text },
          finish_reason: null,
          logprobs,
        }),
        last: (finish_reason) => ({ index: 0, delta: {}, finish_reason, logprobs: null }),
      },
    ),
  };
  const completions = endpoint(
    core,
    queue,
    model,
    (p) => {
      if (typeof p.prompt !== "string") throw new InvalidRequestError("prompt must be a string");
      return { prompt: p.prompt };
    },
    {
      prefix: "cmpl",
      object: "text_completion",
      chunkObject: "text_completion",
      choice: (text, finish_reason, logprobs) => ({ index: 0, text, finish_reason, logprobs }),
      delta: (text, _first, logprobs) => ({ index: 0, text, finish_reason: null, logprobs }),
      last: (finish_reason) => ({ index: 0, text: "", finish_reason, logprobs: null }),
    },
  );
  return { chat, completions };
}
