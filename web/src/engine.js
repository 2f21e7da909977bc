// The public engine object: the OpenAI-shaped API plus control methods, over a core that
// runs in this thread (LocalCore) or in a Web Worker (WorkerCore).

import { openaiApi } from "./openai.js";
import { fromWire } from "./errors.js";

export class Engine {
  #core;
  constructor(core) {
    this.#core = core;
    const api = openaiApi(core, () => core.info?.name ?? core.info?.file ?? "flint");
    this.chat = api.chat;
    this.completions = api.completions;
  }
  /** architecture, name, n_ctx, n_vocab, n_layer, adapter, backend, has_chat_template, file, size */
  get info() {
    return this.#core.info;
  }
  /** Ends every running request of this engine after its current token: finish_reason "abort". */
  interruptGenerate() {
    this.#core.interrupt();
  }
  /** Forgets the conversation: drops the cached prompts no running request holds. */
  async resetChat() {
    try {
      await this.#core.reset();
    } catch (e) {
      throw fromWire(e);
    }
  }
  /** `flint bench`'s measurement in this browser once running requests are done:
   * {prefill_tok_s: [...], decode_tok_s: [...]}. */
  async bench({ promptTokens = 128, genTokens = 32, reps = 3 } = {}) {
    try {
      return await this.#core.bench(promptTokens, genTokens, reps);
    } catch (e) {
      throw fromWire(e);
    }
  }
  /**
   * Once running requests are done, opens a new GPU device and loads the model onto it again:
   * after the device was lost (a `DeviceLostError`), the next request does this by itself.
   */
  async reload() {
    try {
      await this.#core.reload();
    } catch (e) {
      throw fromWire(e);
    }
  }
  /** Frees the model's GPU memory; the engine cannot be used afterwards. */
  async unload() {
    await this.#core.unload();
  }
}
