// Error classes with stable names. The wasm engine throws plain Errors whose `name` is one
// of these; `fromWire` turns them (or a worker's serialized copy) back into the class.

export class FlintError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "FlintError";
    this.code = "flint_error";
  }
}

function define(name, code) {
  const cls = class extends FlintError {
    constructor(message, options) {
      super(message, options);
      this.name = name;
      this.code = code;
    }
  };
  Object.defineProperty(cls, "name", { value: name });
  return cls;
}

export const WebGPUNotAvailableError = define("WebGPUNotAvailableError", "webgpu_not_available");
export const ModelLoadError = define("ModelLoadError", "model_load_failed");
export const ContextWindowExceededError = define("ContextWindowExceededError", "context_length_exceeded");
export const DeviceLostError = define("DeviceLostError", "device_lost");
export const InvalidRequestError = define("InvalidRequestError", "invalid_request");
export const ChatTemplateError = define("ChatTemplateError", "chat_template");
export const EngineBusyError = define("EngineBusyError", "engine_busy");
export const GPUError = define("GPUError", "gpu_error");
export const GenerationError = define("GenerationError", "generation_failed");
export const EngineUnloadedError = define("EngineUnloadedError", "engine_unloaded");
export const SelfTestError = define("SelfTestError", "self_test_failed");

const CLASSES = {
  WebGPUNotAvailableError,
  ModelLoadError,
  ContextWindowExceededError,
  DeviceLostError,
  InvalidRequestError,
  ChatTemplateError,
  EngineBusyError,
  GPUError,
  GenerationError,
  EngineUnloadedError,
  SelfTestError,
};

/**
 * The package's error for `err` ({name, message, param?} from wasm or a worker); others pass
 * through. `param` names the request field at fault, as OpenAI's error body does.
 */
export function fromWire(err) {
  if (err instanceof FlintError) return err;
  const cls = err && CLASSES[err.name];
  if (!cls) return err instanceof Error ? err : new FlintError(String(err?.message ?? err));
  const e = new cls(err.message);
  if (err.param != null) e.param = err.param;
  return e;
}

/** A structured-clone-safe copy of an error, for postMessage. */
export function toWire(err) {
  const w = { name: err?.name ?? "Error", message: String(err?.message ?? err) };
  if (err?.param != null) w.param = err.param;
  return w;
}
