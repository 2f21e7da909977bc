//! The engine in the browser: wasm-bindgen bindings over `flint::Engine`, the same code the
//! native CLI runs. The npm package `flint-llm` (`web/`) wraps this in its OpenAI-shaped API.
//!
//! Weights never pass whole through wasm memory: the model is a JS object
//! `{ size, read(offset, length) → Promise<Uint8Array> }` (a URL fetched in ranges, or a
//! `Blob` sliced), read header first and then tensor by tensor straight into GPU buffers.
//! Requests and results cross the boundary as JSON text; tokens stream through a callback.
//! Errors are JS `Error`s whose `name` the package maps to its error classes.
#![cfg(target_arch = "wasm32")]

mod request;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures::StreamExt;
use js_sys::{Function, Promise, Uint8Array};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

use flint::{Engine, EngineError, Event, GenerateError, LoadOptions, TokenLogprobs, Tokenizer};
use flint_core::chat::{tokenize_rendered, ChatError, ChatTemplate};
use flint_core::gguf::{ByteSource, GgufError};

use request::Request;

#[wasm_bindgen]
extern "C" {
    /// `performance.now()`: a global in windows and workers alike.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

fn unix_seconds() -> Option<u64> {
    Some((js_sys::Date::now() / 1000.0) as u64)
}

/// A JS `Error` with a stable `name` (the package's error class) and a readable message.
fn js_error(name: &str, message: impl std::fmt::Display) -> JsValue {
    let e = js_sys::Error::new(&message.to_string());
    e.set_name(name);
    e.into()
}

/// The error class a failure belongs to, by what went wrong rather than where.
fn engine_error(e: &EngineError, loading: bool) -> JsValue {
    use flint::BackendError;
    let name = match e {
        EngineError::Gpu(flint_gpu_err) => gpu_error_name(&flint_gpu_err.to_string(), loading),
        EngineError::Backend(BackendError::ContextFull { .. })
        | EngineError::Generate(GenerateError::ContextExceeded { .. })
        | EngineError::Generate(GenerateError::Backend(BackendError::ContextFull { .. })) => {
            "ContextWindowExceededError"
        }
        EngineError::Backend(BackendError::Device(m))
        | EngineError::Generate(GenerateError::Backend(BackendError::Device(m))) => gpu_error_name(m, loading),
        EngineError::Generate(
            GenerateError::EmptyPrompt | GenerateError::MaxTokens | GenerateError::EmptyStop | GenerateError::Sampling(_),
        ) => "InvalidRequestError",
        _ if loading => "ModelLoadError",
        _ => "GenerationError",
    };
    js_error(name, e)
}

fn gpu_error_name(message: &str, loading: bool) -> &'static str {
    if message.contains("no GPU adapter") {
        "WebGPUNotAvailableError"
    } else if message.contains("device was lost") {
        "DeviceLostError"
    } else if loading {
        "ModelLoadError"
    } else {
        "GPUError"
    }
}

/// The model bytes behind a JS reader: a ranged `fetch`, a sliced `Blob`, a cached file.
struct JsSource {
    size: u64,
    reader: JsValue,
    read: Function,
}

impl JsSource {
    fn new(reader: JsValue) -> Result<JsSource, JsValue> {
        let field = |k: &str| js_sys::Reflect::get(&reader, &JsValue::from_str(k));
        let size = field("size")?.as_f64().filter(|s| s.is_finite() && *s >= 0.0 && s.fract() == 0.0);
        let read = field("read")?.dyn_into::<Function>().ok();
        match (size, read) {
            (Some(size), Some(read)) => Ok(JsSource { size: size as u64, reader, read }),
            _ => Err(js_error("ModelLoadError", "the model source needs a numeric `size` and a `read(offset, length)` function")),
        }
    }

    async fn read_js(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let promise = self
            .read
            .call2(&self.reader, &JsValue::from_f64(offset as f64), &JsValue::from_f64(buf.len() as f64))
            .map_err(describe)?;
        let value = JsFuture::from(Promise::resolve(&promise)).await.map_err(describe)?;
        let bytes = value.dyn_into::<Uint8Array>().map_err(|_| "read() must resolve to a Uint8Array".to_string())?;
        if bytes.length() as usize != buf.len() {
            return Err(format!("read({offset}, {}) returned {} bytes", buf.len(), bytes.length()));
        }
        bytes.copy_to(buf);
        Ok(())
    }
}

fn describe(v: JsValue) -> String {
    v.dyn_ref::<js_sys::Error>().map_or_else(|| format!("{v:?}"), |e| String::from(e.message()))
}

impl ByteSource for JsSource {
    fn len(&self) -> u64 {
        self.size
    }

    fn read_at<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> LocalBoxFuture<'a, Result<(), GgufError>> {
        Box::pin(async move {
            if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
                return Err(GgufError::Truncated { what: "read", offset });
            }
            self.read_js(offset, buf).await.map_err(GgufError::Io)
        })
    }
}

struct Inner {
    engine: Engine,
    template: Option<ChatTemplate>,
}

/// A loaded model. Methods that run on the GPU return promises; one request runs at a time.
#[wasm_bindgen]
pub struct WasmEngine {
    inner: Rc<RefCell<Inner>>,
    abort: Arc<AtomicBool>,
    info: String,
}

/// Loads a model from `source` (see the module docs) with options JSON `{"n_ctx": N}`;
/// resolves to a `WasmEngine`.
#[wasm_bindgen(js_name = loadEngine)]
pub fn load_engine(source: JsValue, options: String) -> Promise {
    future_to_promise(async move {
        let source = JsSource::new(source)?;
        let opts: serde_json::Value =
            serde_json::from_str(&options).map_err(|e| js_error("InvalidRequestError", format!("options: {e}")))?;
        let mut load = LoadOptions::default();
        if let Some(n) = opts.get("n_ctx").and_then(|v| v.as_u64()) {
            load.n_ctx = n as usize;
        }
        let file = flint::GgufFile::from_source(Box::new(source))
            .await
            .map_err(|e| js_error("ModelLoadError", format!("malformed model file: {e}")))?;
        let mut engine = Engine::load(file, &load).await.map_err(|e| engine_error(&e, true))?;
        engine.set_clock(performance_now);
        let template = ChatTemplate::from_metadata(&engine.file().metadata, engine.tokenizer())
            .map_err(|e| js_error("ModelLoadError", e))?
            .map(|t| t.with_clock(unix_seconds));
        let cfg = engine.config();
        let info = json!({
            "architecture": engine.file().metadata.opt_str("general.architecture").ok().flatten(),
            "name": engine.file().metadata.opt_str("general.name").ok().flatten(),
            "n_ctx": engine.n_ctx(),
            "n_vocab": cfg.n_vocab,
            "n_layer": cfg.n_layer,
            "adapter": engine.adapter_name(),
            "backend": engine.backend_name(),
            "has_chat_template": template.is_some(),
        })
        .to_string();
        let inner = Rc::new(RefCell::new(Inner { engine, template }));
        Ok(WasmEngine { inner, abort: Arc::new(AtomicBool::new(false)), info }.into())
    })
}

#[wasm_bindgen]
impl WasmEngine {
    /// JSON: architecture, name, n_ctx, n_vocab, n_layer, adapter, backend, has_chat_template.
    pub fn info(&self) -> String {
        self.info.clone()
    }

    /// Runs one request (JSON, see `request.rs`). `on_token(text, id, logprobs_json | null)` is
    /// called for every generated token (`text` may be empty while a character or a possible
    /// stop string is incomplete). Resolves to the summary JSON, whose `text` holds any text
    /// still buffered at the end.
    pub fn generate(&self, request: String, on_token: Function) -> Promise {
        let inner = self.inner.clone();
        let abort = self.abort.clone();
        future_to_promise(async move {
            let req: Request =
                serde_json::from_str(&request).map_err(|e| js_error("InvalidRequestError", format!("request: {e}")))?;
            let mut guard = inner
                .try_borrow_mut()
                .map_err(|_| js_error("EngineBusyError", "a request is already running on this engine"))?;
            let Inner { engine, template } = &mut *guard;
            let prompt = prompt_tokens(engine, template.as_ref(), &req)?;
            let params = req.params().map_err(|e| js_error("InvalidRequestError", e))?;
            abort.store(false, Ordering::SeqCst);
            let want_logprobs = params.sampling.n_logprobs > 0;
            let tokenizer = engine.shared_tokenizer();
            let mut stream = engine.generate(prompt, params, abort).map_err(|e| engine_error(&e, false))?;
            let mut content = Vec::new();
            while let Some(event) = stream.next().await {
                match event.map_err(|e| engine_error(&EngineError::Generate(e), false))? {
                    Event::Token { id, text, logprobs } => {
                        let lp = match logprobs {
                            Some(lp) if want_logprobs => {
                                let entry = token_logprobs(&tokenizer, id, &lp);
                                let s = JsValue::from_str(&entry.to_string());
                                content.push(entry);
                                s
                            }
                            _ => JsValue::NULL,
                        };
                        on_token.call3(&JsValue::NULL, &JsValue::from_str(&text), &JsValue::from(id), &lp)?;
                    }
                    Event::Done { summary, text } => {
                        let logprobs = want_logprobs.then(|| json!({ "content": content }));
                        return Ok(JsValue::from_str(
                            &json!({
                                "finish_reason": summary.finish_reason.as_str(),
                                "prompt_tokens": summary.prompt_tokens,
                                "cached_prompt_tokens": summary.cached_prompt_tokens,
                                "completion_tokens": summary.completion_tokens,
                                "ttft_ms": summary.ttft_ms,
                                "prefill_tok_s": summary.prefill_tok_s,
                                "decode_tok_s": summary.decode_tok_s,
                                "text": text,
                                "logprobs": logprobs,
                            })
                            .to_string(),
                        ));
                    }
                }
            }
            Err(js_error("GenerationError", "the generation ended without a summary"))
        })
    }

    /// Renders chat messages (JSON array) with the model's template, as the engine would.
    #[wasm_bindgen(js_name = applyChatTemplate)]
    pub fn apply_chat_template(&self, messages: String, add_generation_prompt: bool) -> Result<String, JsValue> {
        let inner = self.inner.try_borrow().map_err(|_| js_error("EngineBusyError", "a request is running"))?;
        let messages: Vec<serde_json::Value> =
            serde_json::from_str(&messages).map_err(|e| js_error("InvalidRequestError", format!("messages: {e}")))?;
        render(inner.template.as_ref(), &messages, add_generation_prompt)
    }

    /// Ends the running request after its current token (finish_reason `abort`).
    pub fn interrupt(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }

    /// Drops every cached position: the next request starts a new conversation.
    pub fn reset(&self) -> Result<(), JsValue> {
        let mut inner = self.inner.try_borrow_mut().map_err(|_| js_error("EngineBusyError", "a request is running"))?;
        inner.engine.reset();
        Ok(())
    }

    /// `flint bench`'s measurement: resolves to JSON with the prefill and decode tok/s of
    /// each repetition over a fixed `n_prompt`-token prompt and `n_gen` greedy tokens.
    pub fn bench(&self, n_prompt: usize, n_gen: usize, reps: usize) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let mut guard = inner.try_borrow_mut().map_err(|_| js_error("EngineBusyError", "a request is running"))?;
            let engine = &mut guard.engine;
            let prompt = engine.bench_prompt(n_prompt).map_err(|e| engine_error(&e, false))?;
            let (mut prefill, mut decode) = (Vec::new(), Vec::new());
            for _ in 0..reps.max(1) {
                let r = engine.bench_once(&prompt, n_gen).await.map_err(|e| engine_error(&e, false))?;
                prefill.push(r.prefill_tok_s);
                decode.push(r.decode_tok_s);
            }
            engine.reset();
            Ok(JsValue::from_str(&json!({ "prefill_tok_s": prefill, "decode_tok_s": decode }).to_string()))
        })
    }
}

fn render(template: Option<&ChatTemplate>, messages: &[serde_json::Value], add_generation_prompt: bool) -> Result<String, JsValue> {
    let template = template.ok_or_else(|| {
        js_error(
            "ChatTemplateError",
            "this model has no chat template (a base model): use completions.create with a prompt instead",
        )
    })?;
    template.render_json(messages, None, add_generation_prompt).map_err(|e| match e {
        ChatError::Raised(m) => js_error("InvalidRequestError", format!("the chat template refused the messages: {m}")),
        e => js_error("ChatTemplateError", e),
    })
}

fn prompt_tokens(engine: &Engine, template: Option<&ChatTemplate>, req: &Request) -> Result<Vec<u32>, JsValue> {
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => engine.tokenize_raw(p).map_err(|e| js_error("InvalidRequestError", e))?,
        (None, Some(m)) => {
            let text = render(template, m, req.add_generation_prompt.unwrap_or(true))?;
            tokenize_rendered(engine.tokenizer(), &text).map_err(|e| js_error("InvalidRequestError", e))?
        }
        _ => return Err(js_error("InvalidRequestError", "give exactly one of `prompt` and `messages`")),
    };
    Ok(tokens)
}

/// One entry of OpenAI's `logprobs.content`: the token's text, log p and the alternatives.
fn token_logprobs(tok: &Tokenizer, id: u32, lp: &TokenLogprobs) -> serde_json::Value {
    let text = |id: u32| String::from_utf8_lossy(&tok.token_bytes(id)).into_owned();
    json!({
        "token": text(id),
        "logprob": lp.logprob,
        "top_logprobs": lp.top.iter().map(|&(t, l)| json!({"token": text(t), "logprob": l})).collect::<Vec<_>>(),
    })
}
