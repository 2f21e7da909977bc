// The OpenAI-shaped API (`chat.completions.create`, `completions.create`) over a core that
// runs requests concurrently: `core.submit(request, onEvent) → Promise<id>` with events
// `{type: "token" | "done" | "error" | "end", ...}` and `core.cancel(id)`. The in-page engine
// and the Web Worker proxy are both such cores, so this shaping is written once.

import { fromWire, InvalidRequestError } from "./errors.js";

/**
 * The engine's request: the endpoint and the body as OpenAI's API takes it. The engine reads
 * and validates it with the same reader as `flint serve`, so both answer a request alike.
 */
function engineRequest(endpoint, params) {
  return JSON.stringify({ endpoint, body: params });
}

/** Usage of a request from its choices' summaries: the prompt once, every choice's tokens. */
function usage(summaries) {
  const first = summaries[0];
  const sum = (k) => summaries.reduce((n, s) => n + (s?.[k] ?? 0), 0);
  const completion = sum("completion_tokens");
  const accepted = sum("accepted_draft_tokens");
  return {
    prompt_tokens: first.prompt_tokens,
    completion_tokens: completion,
    total_tokens: first.prompt_tokens + completion,
    cached_prompt_tokens: first.cached_prompt_tokens,
    prompt_tokens_details: { cached_tokens: first.cached_prompt_tokens },
    completion_tokens_details: { accepted_prediction_tokens: accepted, rejected_prediction_tokens: sum("draft_tokens") - accepted },
    ttft_ms: first.ttft_ms,
    prefill_tok_s: first.prefill_tok_s,
    decode_tok_s: first.decode_tok_s,
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

/**
 * Runs one request on `core`: `onDelta(choice, text, logprobs)` as tokens arrive,
 * `onCalls(choice, pieces)` as tool calls stream (a call's first piece has its `id` and name,
 * the next ones more of its `arguments`), `onReasoning(choice, text)` as a thinking model's
 * thought streams, `onDone(choice, summary)` as each choice
 * ends; resolves to the summaries by choice.
 * `ref.cancel()` cancels it (before or after the core has given it an id).
 */
function run(core, request, { onDelta, onCalls, onReasoning, onDone }, ref) {
  return new Promise((resolve, reject) => {
    const summaries = [];
    let failed = null;
    const onEvent = (ev) => {
      if (ev.reasoning) onReasoning?.(ev.choice, ev.reasoning);
      if (ev.type === "token") {
        if (ev.text || ev.logprobs) onDelta(ev.choice, ev.text, ev.logprobs ?? null);
        if (ev.calls?.length) onCalls?.(ev.choice, ev.calls);
      } else if (ev.type === "done") {
        if (ev.text) onDelta(ev.choice, ev.text, null);
        if (ev.calls?.length) onCalls?.(ev.choice, ev.calls);
        summaries[ev.choice] = ev.summary;
        onDone?.(ev.choice, ev.summary);
      } else if (ev.type === "error") {
        failed = fromWire(ev);
      } else if (ev.type === "end") {
        if (failed) reject(failed);
        else resolve(summaries);
      }
    };
    ref.cancel = () => {
      ref.cancelled = true;
      if (ref.id != null) core.cancel(ref.id);
    };
    core.submit(request, onEvent).then(
      (id) => {
        ref.id = id;
        if (ref.cancelled) core.cancel(id);
      },
      (e) => reject(fromWire(e)),
    );
  });
}

function parseLogprobs(lp) {
  return lp == null ? null : typeof lp === "string" ? JSON.parse(lp) : lp;
}

/** `create` for one endpoint; `shape` builds the non-streamed object and the chunks. */
function endpoint(core, model, name, shape) {
  return {
    async create(params) {
      if (params == null || typeof params !== "object") throw new InvalidRequestError("the request must be an object");
      const request = engineRequest(name, params);
      const id = newId(shape.prefix);
      const created = Math.floor(Date.now() / 1000);
      const head = { id, created, model: model() };
      const ref = {};
      if (!params.stream) {
        const texts = [];
        const contents = [];
        const calls = [];
        const onDelta = (i, t, lp) => {
          texts[i] = (texts[i] ?? "") + t;
          if ((lp = parseLogprobs(lp))) (contents[i] ??= []).push(lp);
        };
        // Pieces joined by `index` into whole calls.
        const onCalls = (i, pieces) => {
          const list = (calls[i] ??= []);
          for (const { index, ...p } of pieces) {
            if (list[index]) list[index].function.arguments += p.function.arguments;
            else list[index] = { ...p, function: { ...p.function } };
          }
        };
        const thoughts = [];
        const onReasoning = (i, t) => (thoughts[i] = (thoughts[i] ?? "") + t);
        const summaries = await run(core, request, { onDelta, onCalls, onReasoning }, ref);
        const choices = summaries.map((s, i) =>
          shape.choice(i, texts[i] ?? "", s.finish_reason, params.logprobs ? { content: contents[i] ?? [] } : null, calls[i] ?? [], thoughts[i]),
        );
        return { ...head, object: shape.object, choices, usage: usage(summaries) };
      }
      // A consumer that stops iterating early cancels this request (and only this one).
      const channel = new Channel(() => ref.cancel?.());
      const started = new Set();
      // Each choice's finish chunk; the request's last one also carries its usage.
      let finish = null;
      const onDelta = (i, t, lp) => {
        lp = parseLogprobs(lp);
        if (!t && !lp) return;
        channel.push({ ...head, object: shape.chunkObject, choices: [shape.delta(i, t, !started.has(i), lp ? { content: [lp] } : null)] });
        started.add(i);
      };
      // Each piece of a call in a delta as it comes, with the call's `index` in the choice.
      const onCalls = (i, pieces) => {
        for (const piece of pieces) {
          channel.push({ ...head, object: shape.chunkObject, choices: [shape.calls(i, [piece], !started.has(i))] });
          started.add(i);
        }
      };
      const onReasoning = (i, t) => {
        channel.push({ ...head, object: shape.chunkObject, choices: [shape.reasoning(i, t, !started.has(i))] });
        started.add(i);
      };
      const onDone = (i, summary) => {
        if (finish) channel.push(finish);
        finish = { ...head, object: shape.chunkObject, choices: [shape.last(i, summary.finish_reason)] };
      };
      run(core, request, { onDelta, onCalls, onReasoning, onDone }, ref).then(
        (summaries) => {
          if (finish) channel.push({ ...finish, usage: usage(summaries) });
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
  const chat = {
    completions: endpoint(
      core,
      model,
      "chat",
      {
        prefix: "chatcmpl",
        object: "chat.completion",
        chunkObject: "chat.completion.chunk",
        choice: (index, text, finish_reason, logprobs, calls, reasoning) => {
          const message = calls.length
            ? { role: "assistant", content: text.trim() ? text : null, tool_calls: calls }
            : { role: "assistant", content: text };
          if (reasoning) message.reasoning_content = reasoning;
          return { index, message, finish_reason, logprobs };
        },
        delta: (index, text, first, logprobs) => ({
          index,
          delta: first ? { role: "assistant", content: text } : { content: text },
          finish_reason: null,
          logprobs,
        }),
        last: (index, finish_reason) => ({ index, delta: {}, finish_reason, logprobs: null }),
        calls: (index, tool_calls, first) => ({ index, delta: first ? { role: "assistant", tool_calls } : { tool_calls }, finish_reason: null, logprobs: null }),
        reasoning: (index, reasoning_content, first) => ({
          index,
          delta: first ? { role: "assistant", reasoning_content } : { reasoning_content },
          finish_reason: null,
          logprobs: null,
        }),
      },
    ),
  };
  const completions = endpoint(
    core,
    model,
    "completions",
    {
      prefix: "cmpl",
      object: "text_completion",
      chunkObject: "text_completion",
      choice: (index, text, finish_reason, logprobs) => ({ index, text, finish_reason, logprobs }),
      delta: (index, text, _first, logprobs) => ({ index, text, finish_reason: null, logprobs }),
      last: (index, finish_reason) => ({ index, text: "", finish_reason, logprobs: null }),
    },
  );
  return { chat, completions };
}
