// Types of flint-llm's public API (the JS in this folder is the implementation).

export type Role = "system" | "user" | "assistant" | "tool";

export interface ChatMessage {
  role: Role | string;
  content: string | null;
  /** An assistant turn's calls (sent back with the tools' results in `tool` messages). */
  tool_calls?: ToolCall[];
  /** A `tool` message: the call it answers. */
  tool_call_id?: string;
  [extra: string]: unknown;
}

export interface ToolCall {
  id: string;
  type: "function";
  /** `arguments` is JSON text. */
  function: { name: string; arguments: string };
}

/** A streamed piece of a call: the first carries `id`, `type` and the name, the next ones more of `arguments`. */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function: { name?: string; arguments: string };
}

export interface Tool {
  type: "function";
  function: { name: string; description?: string; parameters?: object };
}

/** A reply held to a JSON schema, a grammar, a regex or a choice (see the README). */
export interface StructuredOutput {
  response_format?:
    | { type: "text" | "json_object"; schema?: object | string }
    | { type: "json_schema"; json_schema: { name: string; schema?: object; strict?: boolean } }
    | { type: "grammar"; grammar: string };
  json_schema?: object;
  grammar?: string;
  structured_outputs?: { json?: object | string; regex?: string; choice?: string[]; grammar?: string; json_object?: boolean };
  guided_json?: object | string;
  guided_regex?: string;
  guided_choice?: string[];
  guided_grammar?: string;
}

export interface InitProgressReport {
  stage: "check" | "download" | "cache" | "load" | "compile" | "ready";
  loaded: number;
  total: number;
  /** 0..1 within the stage. */
  progress: number;
  text: string;
  /** Stage "load": the model's tensors read whole so far, of all its tensors. */
  tensors?: { loaded: number; total: number };
}

export interface EngineOptions {
  model: string | URL | Blob | File;
  initProgressCallback?: (report: InitProgressReport) => void;
  /** Where the engine's .wasm is served from (self-hosting); default: next to this module. */
  wasmUrl?: string | URL;
  /** Context size in tokens of one request (default 4096; an integer in 1..=2^24, else the load throws `InvalidRequestError`). */
  nCtx?: number;
  /** Requests (choices) running at once in the same forward steps (default 4; an integer in 1..=64, else `InvalidRequestError`). */
  maxSeqs?: number;
  /** Keep URL models in the browser's cache (default true). */
  useCache?: boolean;
  /**
   * The GPU's memory in MB (WebGPU reports none): a model whose memory plan (`info.memory`)
   * does not fit is refused with `ModelLoadError` saying what it needs, before any weight is read.
   */
  deviceMemoryMB?: number;
  /**
   * How the KV cache stores keys and values (llama.cpp's `-ctk` / `-ctv`; default "f16", or
   * "f32" with `exact`): "f16" takes half of f32's memory, "q8_0" 9/32 of it (keys and values
   * rotated by a Hadamard matrix before rounding, as llama.cpp does). Stored packed, so no
   * `shader-f16` is needed.
   */
  cacheTypeK?: "f32" | "f16" | "q8_0";
  cacheTypeV?: "f32" | "f16" | "q8_0";
  /**
   * The exact mode (default false): every result f32-faithful (NMSE at most 1e-5 against the
   * f32 reference) and batch-invariant (a sequence's logits the same bits whatever runs beside
   * it). It keeps the KV cache in f32; asking for another cache type with it is an error. On
   * GPUs it also keeps steps of more than 16 tokens off the tiled GEMM, whose sums' order
   * differs.
   */
  exact?: boolean;
  /**
   * Overlapped steps (default false in the browser): each decode step is submitted before the
   * previous one is read, its tokens fed on the GPU, so the GPU does not wait for the page
   * between steps. The tokens are the same either way. Off by default: on SwiftShader in
   * headless Chromium it made decode steps about 1.6x slower. Requests with a `prediction`
   * run one step after another either way.
   */
  overlap?: boolean;
  /**
   * Check the GPU at load (default false): a short fixed input through the first layer and the
   * head on the GPU and on the CPU reference, compared tap by tap (NMSE at most 1e-5). A driver
   * that computes wrongly fails the load with a `SelfTestError` naming the adapter and the tap.
   */
  selfTest?: boolean;
  /**
   * A Jinja chat template to use instead of the model's (as `flint run --chat-template-file`).
   * Rendering is bounded (instructions, nesting, string sizes, output); a template past a
   * bound makes the request fail with `ChatTemplateError`.
   */
  chatTemplate?: string;
  /**
   * Speculative decoding (default "none"): with "ngram" each request drafts the continuation
   * of the latest earlier repeat of its last tokens, and the model verifies the draft in one
   * step. The tokens are exactly those without it (greedy or seeded); only the speed changes,
   * and it pays on text that repeats the prompt or itself (code edits, quoting).
   */
  speculative?: "none" | "ngram";
  /** The most tokens drafted per step (default 8). */
  draftMax?: number;
  /**
   * A draft model (as `model`: URL, File or Blob): a smaller model with this model's
   * vocabulary drafts for every request on the same GPU (greedily, stopping where its top
   * probability is below 0.75). The tokens are those without it. A model of another
   * vocabulary fails the load with `ModelLoadError` before any weight is read.
   */
  draftModel?: string | URL | Blob | File;
  /** The draft model stops drafting where its top probability falls below this (default 0.75). */
  draftPMin?: number;
}

export interface SamplingOptions {
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  seed?: number;
  stop?: string | string[];
  presence_penalty?: number;
  frequency_penalty?: number;
  repetition_penalty?: number;
  repeat_last_n?: number;
  logit_bias?: Record<string, number>;
  logprobs?: boolean;
  top_logprobs?: number;
  /** Choices from the same prompt (1..128); choice i draws from the random stream (seed, i). */
  n?: number;
  /** false: no speculative drafts for this request, whatever the engine's `speculative`. */
  speculative?: boolean;
  /**
   * OpenAI's predicted output: text the reply is expected to repeat largely (a file being
   * edited). Drafts come from it; the reply is the same, only faster where it matches.
   */
  prediction?: string | { type: "content"; content: string };
}

export type FinishReason = "stop" | "length" | "abort" | "tool_calls";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  cached_prompt_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
  /** Drafted tokens (a prediction's or n-gram lookup's) the model accepted and rejected. */
  completion_tokens_details: { accepted_prediction_tokens: number; rejected_prediction_tokens: number };
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tok_s: number;
}

export interface TokenLogprob {
  token: string;
  logprob: number;
  top_logprobs: { token: string; logprob: number }[];
}
export interface Logprobs {
  content: TokenLogprob[];
}

export interface ChatCompletion {
  id: string;
  object: "chat.completion";
  created: number;
  model: string;
  choices: { index: number; message: { role: "assistant"; content: string | null; tool_calls?: ToolCall[]; reasoning_content?: string }; finish_reason: FinishReason; logprobs: Logprobs | null }[];
  usage: Usage;
}

export interface ChatCompletionChunk {
  id: string;
  object: "chat.completion.chunk";
  created: number;
  model: string;
  choices: {
    index: number;
    delta: { role?: "assistant"; content?: string; tool_calls?: ToolCallDelta[]; reasoning_content?: string };
    finish_reason: FinishReason | null;
    logprobs: Logprobs | null;
  }[];
  /** On the last chunk only. */
  usage?: Usage;
}

export interface Completion {
  id: string;
  object: "text_completion";
  created: number;
  model: string;
  choices: { index: number; text: string; finish_reason: FinishReason | null; logprobs: Logprobs | null }[];
  usage?: Usage;
}

export interface ChatCompletionRequest extends SamplingOptions, StructuredOutput {
  messages: ChatMessage[];
  stream?: boolean;
  tools?: Tool[];
  tool_choice?: "none" | "auto" | "required" | { type: "function"; function: { name: string } };
  parallel_tool_calls?: boolean;
  /** More variables for the chat template, e.g. `{ enable_thinking: false }` for Qwen3. */
  chat_template_kwargs?: Record<string, unknown>;
}
export interface CompletionRequest extends SamplingOptions, StructuredOutput {
  prompt: string;
  stream?: boolean;
}

export interface EngineInfo {
  architecture: string | null;
  name: string | null;
  n_ctx: number;
  n_vocab: number;
  n_layer: number;
  /** Requests (choices) that run at once. */
  max_seqs: number;
  adapter: string;
  backend: string;
  has_chat_template: boolean;
  /** What the model allocates on the GPU, in bytes (the KV cache for `nCtx` and `maxSeqs`). */
  memory: {
    weights: number;
    kv_cache: number;
    kv_positions: number;
    cache_type_k: "f32" | "f16" | "q8_0";
    cache_type_v: "f32" | "f16" | "q8_0";
    activations: number;
    logits: number;
    total: number;
  };
  /** The load-time self-test's result when `selfTest` asked for it, else null. */
  self_test: { adapter: string; taps: { name: string; nmse: number }[]; gpu_ms: number; cpu_ms: number } | null;
  file: string;
  size: number;
}

export interface Engine {
  readonly info: EngineInfo;
  chat: {
    completions: {
      create(req: ChatCompletionRequest & { stream: true }): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(req: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  completions: {
    create(req: CompletionRequest & { stream: true }): Promise<AsyncIterable<Completion>>;
    create(req: CompletionRequest & { stream?: false }): Promise<Completion>;
  };
  /** Ends every running request after its current token (finish_reason "abort"). */
  interruptGenerate(): void;
  /** Forgets cached prompts that no running request holds. */
  resetChat(): Promise<void>;
  /** Prefill and decode speed in this browser, as `flint bench` measures natively, once
   * running requests are done. */
  bench(opts?: { promptTokens?: number; genTokens?: number; reps?: number }): Promise<{ prefill_tok_s: number[]; decode_tok_s: number[] }>;
  /** Once running requests are done, a new GPU device with the model loaded again; after a
   * lost device (`DeviceLostError`) the next request does this by itself. */
  reload(): Promise<void>;
  /** Frees the model's GPU memory. */
  unload(): Promise<void>;
}

export function createEngine(options: EngineOptions): Promise<Engine>;
export function createWebWorkerEngine(worker: Worker, options: EngineOptions): Promise<Engine>;
export function hasModelInCache(url: string | URL): Promise<boolean>;
export function deleteModelFromCache(url: string | URL): Promise<boolean>;

export class FlintError extends Error {
  code: string;
  /** The request field at fault, when a request was refused (as OpenAI's error `param`). */
  param?: string;
}
export class WebGPUNotAvailableError extends FlintError {}
export class ModelLoadError extends FlintError {}
export class ContextWindowExceededError extends FlintError {}
export class DeviceLostError extends FlintError {}
export class InvalidRequestError extends FlintError {}
export class ChatTemplateError extends FlintError {}
export class EngineBusyError extends FlintError {}
export class GPUError extends FlintError {}
export class GenerationError extends FlintError {}
export class EngineUnloadedError extends FlintError {}
export class SelfTestError extends FlintError {}
