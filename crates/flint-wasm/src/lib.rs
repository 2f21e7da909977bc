//! The engine in the browser: wasm-bindgen bindings over `flint::Engine`, the same code the
//! native CLI runs. The npm package `flint-llm` (`web/`) wraps this in its OpenAI-shaped API.
//!
//! Weights never pass whole through wasm memory: the model is a JS object
//! `{ size, read(offset, length) → Promise<Uint8Array> }` (a URL fetched in ranges, or a
//! `Blob` sliced), read header first and then tensor by tensor straight into GPU buffers.
//! The engine's run loop runs on the browser's event loop; requests submitted while others
//! run join the same forward steps. Requests and results cross the boundary as JSON text;
//! each request's events stream through its callback. Errors are JS `Error`s whose `name`
//! the package maps to its error classes, chosen from the error's variant.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::StreamExt;
use js_sys::{Function, Promise, Uint8Array};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, spawn_local, JsFuture};

use flint::{BackendError, Canceller, ChatError, Engine, EngineError, Event, GenerateError, KvError, LoadOptions, SchedError, TokenLogprobs, Tokenizer};
use flint_core::gguf::{ByteSource, GgufError};

use flint::openai::{self, ApiError, Endpoint};

#[wasm_bindgen]
extern "C" {
    /// `performance.now()`: a global in windows and workers alike.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

/// A panic (a bug, or a WebGPU error wgpu reports by panicking) aborts the instance with only
/// "unreachable"; this prints its message and place to the console first.
fn log_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::panic::set_hook(Box::new(|info| console_error(&format!("flint-wasm panicked: {info}")))));
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

/// The package's error class for a backend error, by its variant.
fn backend_error_name(e: &BackendError, loading: bool) -> &'static str {
    match e.root() {
        BackendError::DeviceLost { .. } => "DeviceLostError",
        BackendError::OutOfMemory { .. } | BackendError::Validation { .. } | BackendError::Device { .. } if !loading => "GPUError",
        BackendError::BadToken { .. } | BackendError::Sampling(_) if !loading => "InvalidRequestError",
        _ if loading => "ModelLoadError",
        _ => "GenerationError",
    }
}

/// The error class a failure belongs to, by what went wrong rather than where.
fn error_name(e: &EngineError, loading: bool) -> &'static str {
    use flint::GpuError;
    match e {
        EngineError::Gpu(GpuError::NoAdapter { .. } | GpuError::RequestDevice { .. }) => "WebGPUNotAvailableError",
        EngineError::Gpu(GpuError::DeviceLost { .. }) => "DeviceLostError",
        EngineError::Gpu(_) if loading => "ModelLoadError",
        EngineError::Gpu(_) => "GPUError",
        EngineError::Generate(GenerateError::ContextExceeded { .. } | GenerateError::ReplyExceedsContext { .. })
        | EngineError::Sched(SchedError::ContextExceeded { .. }) => "ContextWindowExceededError",
        EngineError::Generate(GenerateError::Backend(b)) | EngineError::Backend(b) => backend_error_name(b, loading),
        EngineError::Step(b) => backend_error_name(b, false),
        EngineError::Generate(_) | EngineError::Sched(_) => "InvalidRequestError",
        EngineError::Chat(ChatError::Raised(_)) => "InvalidRequestError",
        // A schema or grammar that does not compile; one that cannot go on mid-reply is a
        // GenerationError.
        EngineError::Constraint { source: flint::ConstraintError::Invalid { .. } | flint::ConstraintError::Vocabulary { .. }, .. } => "InvalidRequestError",
        EngineError::Chat(_) | EngineError::NoChatTemplate if !loading => "ChatTemplateError",
        EngineError::Closed => "EngineUnloadedError",
        EngineError::SelfTest { .. } => "SelfTestError",
        _ if loading => "ModelLoadError",
        _ => "GenerationError",
    }
}

fn engine_error(e: &EngineError, loading: bool) -> JsValue {
    let message = match e {
        EngineError::Chat(ChatError::Raised(m)) => format!("the chat template refused the messages: {m}"),
        EngineError::Backend(BackendError::Kv(k @ KvError::ContextTooLarge { .. })) => k.to_string(),
        e => e.to_string(),
    };
    js_error(error_name(e, loading), message)
}

/// A JS error carrying OpenAI's `param` (the field at fault), as the server's body does.
fn with_param(err: JsValue, param: Option<&str>) -> JsValue {
    if let Some(p) = param {
        let _ = js_sys::Reflect::set(&err, &JsValue::from_str("param"), &JsValue::from_str(p));
    }
    err
}

/// A request the reader refused: `InvalidRequestError` (or `ContextWindowExceededError`) with
/// the field at fault, as `flint serve` answers 400.
fn api_error(e: &ApiError) -> JsValue {
    let name = match e.code {
        Some("context_length_exceeded") => "ContextWindowExceededError",
        _ if e.status == openai::status::BAD_REQUEST => "InvalidRequestError",
        _ => "GenerationError",
    };
    with_param(js_error(name, &e.message), e.param.as_deref())
}

/// The model bytes behind a JS reader: a ranged `fetch`, a sliced `Blob`, a cached file.
struct JsSource {
    size: u64,
    reader: JsValue,
    read: Function,
    /// Tensors read to their last byte, for the load's progress (set once the header is read).
    tensors: Rc<RefCell<TensorCount>>,
}

/// Counts a model's tensors read whole, in whatever order the loader reads them, and tells
/// `on_tensor(done, total)` of each one finished.
#[derive(Default)]
struct TensorCount {
    /// Each tensor's bytes in the file, `[start, end)`, by start (GGUF's data never overlaps),
    /// and how many of them have been read.
    ranges: Vec<(u64, u64, u64)>,
    done: usize,
    on_tensor: Option<Function>,
}

impl TensorCount {
    fn start(&mut self, file: &flint::GgufFile, on_tensor: Option<Function>) {
        self.ranges = file.tensors.iter().map(|t| (file.data_offset + t.offset, file.data_offset + t.offset + t.n_bytes, 0)).collect();
        self.ranges.sort_unstable();
        self.done = self.ranges.iter().filter(|r| r.0 == r.1).count();
        self.on_tensor = on_tensor;
    }

    fn read(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let first = self.ranges.partition_point(|r| r.1 <= offset);
        let mut finished = 0;
        for r in self.ranges[first..].iter_mut().take_while(|r| r.0 < end) {
            let size = r.1 - r.0;
            let before = r.2;
            r.2 = (r.2 + end.min(r.1) - offset.max(r.0)).min(size);
            finished += usize::from(before < size && r.2 == size);
        }
        if finished > 0 {
            self.done += finished;
            if let Some(f) = &self.on_tensor {
                let _ = f.call2(&JsValue::NULL, &JsValue::from(self.done as u32), &JsValue::from(self.ranges.len() as u32));
            }
        }
    }
}

impl JsSource {
    fn new(reader: JsValue) -> Result<JsSource, JsValue> {
        let field = |k: &str| js_sys::Reflect::get(&reader, &JsValue::from_str(k));
        let size = field("size")?.as_f64().filter(|s| s.is_finite() && *s >= 0.0 && s.fract() == 0.0);
        let read = field("read")?.dyn_into::<Function>().ok();
        match (size, read) {
            (Some(size), Some(read)) => Ok(JsSource { size: size as u64, reader, read, tensors: Rc::default() }),
            _ => Err(js_error("ModelLoadError", "the model source needs a numeric `size` and a `read(offset, length)` function")),
        }
    }

    async fn read_js(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let promise = self.read.call2(&self.reader, &JsValue::from_f64(offset as f64), &JsValue::from_f64(buf.len() as f64)).map_err(describe)?;
        let value = JsFuture::from(Promise::resolve(&promise)).await.map_err(describe)?;
        let bytes = value.dyn_into::<Uint8Array>().map_err(|_| "read() must resolve to a Uint8Array".to_string())?;
        if bytes.length() as usize != buf.len() {
            return Err(format!("read({offset}, {}) returned {} bytes", buf.len(), bytes.length()));
        }
        bytes.copy_to(buf);
        self.tensors.borrow_mut().read(offset, buf.len() as u64);
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

/// A loaded model. Requests run concurrently: each `submit` joins the running ones in the
/// same forward steps.
#[wasm_bindgen]
pub struct WasmEngine {
    engine: Rc<Engine>,
    /// Requests in flight by the id `submit` returned.
    running: Rc<RefCell<HashMap<u32, Canceller>>>,
    next_id: RefCell<u32>,
    info: String,
}

thread_local! {
    /// `loadEngine`'s `on_compile`: the engine's thread is the page's (or worker's) only one.
    static ON_COMPILE: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// Calls `on_compile(n, label)` after each GPU kernel compile (n: compiled so far).
fn compile_progress() -> flint::CompileProgress {
    flint::CompileProgress(std::sync::Arc::new(|e: &flint::CompileEvent| {
        if let flint::CompileEvent::Done { label, compiled } = e {
            ON_COMPILE.with(|cb| {
                if let Some(f) = cb.borrow().as_ref() {
                    let _ = f.call2(&JsValue::NULL, &JsValue::from(*compiled as u32), &JsValue::from_str(label));
                }
            });
        }
    }))
}

/// The bool option `key` of `opts`, `default` when absent; anything but a bool is an
/// `InvalidRequestError` naming the option as the package does (`name`).
fn bool_option(opts: &serde_json::Value, key: &str, name: &str, default: bool) -> Result<bool, JsValue> {
    match opts.get(key) {
        Some(v) => v.as_bool().ok_or_else(|| js_error("InvalidRequestError", format!("{name} must be true or false, got {v}"))),
        None => Ok(default),
    }
}

/// The load options of `loadEngine`'s options JSON (see there).
fn load_options(options: &str) -> Result<LoadOptions, JsValue> {
    let opts: serde_json::Value = serde_json::from_str(options).map_err(|e| js_error("InvalidRequestError", format!("options: {e}")))?;
    let mut load =
        LoadOptions { template_clock: Some(unix_seconds), clock: Some(performance_now), compile_observer: Some(compile_progress()), ..LoadOptions::default() };
    // Counts out of range are refused, not dropped for the default: the largest context a
    // model's header may declare (2^24 positions), at most 64 sequences.
    if let Some(v) = opts.get("n_ctx") {
        let n = v.as_u64().filter(|&n| (1..=1 << 24).contains(&n));
        load.n_ctx = n.ok_or_else(|| js_error("InvalidRequestError", format!("nCtx must be an integer in 1..=16777216, got {v}")))? as usize;
    }
    if let Some(v) = opts.get("max_seqs") {
        let n = v.as_u64().filter(|&n| (1..=64).contains(&n));
        load.max_seqs = n.ok_or_else(|| js_error("InvalidRequestError", format!("maxSeqs must be an integer in 1..=64, got {v}")))? as usize;
    }
    load.self_test = bool_option(&opts, "self_test", "selfTest", false)?;
    // Requests may bring predictions; n-gram drafts when asked for (`speculative: "ngram"`).
    load.spec.predictions = true;
    if let Some(kind) = opts.get("spec_type") {
        let kind = kind
            .as_str()
            .and_then(|k| k.parse::<flint::SpecKind>().ok())
            .ok_or_else(|| js_error("InvalidRequestError", format!("speculative must be \"none\" or \"ngram\", got {kind}")))?;
        load.spec.kind = kind;
    }
    if let Some(p) = opts.get("draft_p_min") {
        let p = p
            .as_f64()
            .filter(|p| (0.0..=1.0).contains(p))
            .ok_or_else(|| js_error("InvalidRequestError", format!("draftPMin must be a number in [0, 1], got {p}")))?;
        load.draft_p_min = p as f32;
    }
    if let Some(n) = opts.get("draft_max") {
        let n = n
            .as_u64()
            .filter(|&n| (1..=64).contains(&n))
            .ok_or_else(|| js_error("InvalidRequestError", format!("draftMax must be an integer in 1..=64, got {n}")))?;
        load.spec.draft_max = n as usize;
    }
    if let Some(mb) = opts.get("device_mem_mb") {
        let mb =
            mb.as_u64().filter(|&mb| mb > 0).ok_or_else(|| js_error("InvalidRequestError", format!("deviceMemoryMB must be a positive integer, got {mb}")))?;
        load.split.device_mem_mb = Some(vec![mb]);
    }
    load.exact = bool_option(&opts, "exact", "exact", false)?;
    // Overlapped steps (submit a step before the previous one is read) are off in the
    // browser unless asked for: in headless Chromium on SwiftShader a two-sequence gemma
    // decode step took 2.9-3.0 s overlapped against 1.8 s one after another (natively on
    // lavapipe they cost nothing, and on GPUs they hide the host's time).
    load.overlap = bool_option(&opts, "overlap", "overlap", false)?;
    if load.exact {
        (load.cache_k, load.cache_v) = (flint::KvType::F32, flint::KvType::F32);
    }
    for (key, name, slot) in [("cache_type_k", "cacheTypeK", &mut load.cache_k), ("cache_type_v", "cacheTypeV", &mut load.cache_v)] {
        if let Some(t) = opts.get(key) {
            *slot = t
                .as_str()
                .ok_or_else(|| format!("{t} is not a string"))
                .and_then(|t| t.parse::<flint::KvType>())
                .map_err(|e| js_error("InvalidRequestError", format!("{name}: {e}")))?;
        }
    }
    if load.exact_with_rounded_kv() {
        return Err(js_error("InvalidRequestError", "exact: true keeps the KV cache in f32: drop exact or cacheTypeK/cacheTypeV"));
    }
    load.chat_template = opts.get("chat_template").and_then(|v| v.as_str()).map(str::to_string);
    Ok(load)
}

/// Checks a load of `source` (read by ranges: the header alone) with the options of
/// `loadEngine`, as the load checks it before any weight is read (the model, tokenizer and
/// template parse; the memory plan fits `device_mem_mb` and the KV cache the adapter's
/// buffers); resolves to the memory plan's JSON, rejects as `loadEngine` would. The package
/// runs it before downloading a model into the browser's cache.
#[wasm_bindgen(js_name = checkModel)]
pub fn check_model(source: JsValue, options: String) -> Promise {
    log_panics();
    future_to_promise(async move {
        let source = JsSource::new(source)?;
        let load = load_options(&options)?;
        let file = flint::GgufFile::from_source(Box::new(source)).await.map_err(|e| js_error("ModelLoadError", format!("malformed model file: {e}")))?;
        let plan = Engine::check(file, &load).await.map_err(|e| engine_error(&e, true))?;
        Ok(JsValue::from_str(&plan.json().to_string()))
    })
}

/// Loads a model from `source` (see the module docs) with options JSON
/// `{"n_ctx": N, "max_seqs": N, "self_test": bool, "chat_template": "...", "spec_type":
/// "none" | "ngram", "draft_max": N, "draft_p_min": P, "device_mem_mb": MB, "cache_type_k":
/// "f32" | "f16" | "q8_0", "cache_type_v": ..., "exact": bool, "overlap": bool}`; resolves to a `WasmEngine`
/// whose run loop is started.
/// `on_compile(n, label)`, when a function, is called after each GPU kernel compile of the
/// load. `draft_source`, unless null or undefined, is a draft model's reader (as `source`):
/// its vocabulary must be the model's, else the load fails before any weight is read.
/// `on_tensor(done, total)`, when a function, is called as each of the model's tensors has
/// been read whole.
#[wasm_bindgen(js_name = loadEngine)]
pub fn load_engine(source: JsValue, options: String, on_compile: JsValue, draft_source: JsValue, on_tensor: JsValue) -> Promise {
    log_panics();
    ON_COMPILE.with(|cb| *cb.borrow_mut() = on_compile.dyn_into::<Function>().ok());
    future_to_promise(async move {
        let source = JsSource::new(source)?;
        let tensors = source.tensors.clone();
        let load = load_options(&options)?;
        let file = flint::GgufFile::from_source(Box::new(source)).await.map_err(|e| js_error("ModelLoadError", format!("malformed model file: {e}")))?;
        tensors.borrow_mut().start(&file, on_tensor.dyn_into::<Function>().ok());
        let loaded = if draft_source.is_null() || draft_source.is_undefined() {
            Engine::load_local(file, &load).await
        } else {
            let draft = flint::GgufFile::from_source(Box::new(JsSource::new(draft_source)?))
                .await
                .map_err(|e| js_error("ModelLoadError", format!("malformed draft model file: {e}")))?;
            Engine::load_local_with_draft(file, draft, &load).await
        };
        // Compiles after the load (a step's first use of a kernel) are not the load's progress.
        ON_COMPILE.with(|cb| *cb.borrow_mut() = None);
        let (engine, run) = loaded.map_err(|e| engine_error(&e, true))?;
        spawn_local(run);
        let i = engine.info();
        let cfg = engine.config();
        let info = json!({
            "architecture": i.architecture,
            "name": i.name,
            "n_ctx": engine.n_ctx(),
            "n_vocab": cfg.n_vocab,
            "n_layer": cfg.n_layer,
            "max_seqs": i.max_seqs,
            "adapter": engine.adapter_name(),
            "backend": engine.backend_name(),
            "has_chat_template": engine.has_chat_template(),
            "memory": i.memory.json(),
            "self_test": i.self_test.as_ref().map(|r| json!({
                "adapter": r.adapter,
                "taps": r.taps.iter().map(|t| json!({"name": t.name, "nmse": t.nmse})).collect::<Vec<_>>(),
                "gpu_ms": r.gpu_ms,
                "cpu_ms": r.cpu_ms,
            })),
        })
        .to_string();
        Ok(WasmEngine { engine: Rc::new(engine), running: Rc::default(), next_id: RefCell::new(1), info }.into())
    })
}

/// Pieces of tool calls in the shape of OpenAI's stream deltas: `index`, and `id`, `type` and
/// the name only in a call's first piece.
fn calls_json(calls: &[flint::ToolCall]) -> serde_json::Value {
    calls
        .iter()
        .map(|c| match c.id.is_empty() {
            true => json!({"index": c.index, "function": {"arguments": c.arguments}}),
            false => json!({"index": c.index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
        })
        .collect()
}

/// One event as the package reads it.
fn event_json(tok: &Tokenizer, ev: &Event, logprobs: bool) -> serde_json::Value {
    match ev {
        Event::Token { choice, id, text, logprobs: lp, calls, reasoning, .. } => json!({
            "type": "token",
            "choice": choice,
            "id": id,
            "text": text,
            "logprobs": lp.as_ref().filter(|_| logprobs).map(|lp| token_logprobs(tok, *id, lp)),
            "calls": calls_json(calls),
            "reasoning": reasoning,
        }),
        Event::Done { choice, summary, text, calls, reasoning } => json!({
            "type": "done",
            "choice": choice,
            "text": text,
            "calls": calls_json(calls),
            "reasoning": reasoning,
            "summary": {
                "finish_reason": summary.finish_reason.as_str(),
                "prompt_tokens": summary.prompt_tokens,
                "cached_prompt_tokens": summary.cached_prompt_tokens,
                "completion_tokens": summary.completion_tokens,
                "ttft_ms": summary.ttft_ms,
                "prefill_tok_s": summary.prefill_tok_s,
                "decode_tok_s": summary.decode_tok_s,
                "draft_tokens": summary.draft_tokens,
                "accepted_draft_tokens": summary.accepted_draft_tokens,
            },
        }),
    }
}

#[wasm_bindgen]
impl WasmEngine {
    /// JSON: architecture, name, n_ctx, n_vocab, n_layer, max_seqs, adapter, backend,
    /// has_chat_template, self_test (null unless asked: adapter, taps [{name, nmse}], gpu_ms,
    /// cpu_ms).
    pub fn info(&self) -> String {
        self.info.clone()
    }

    /// Submits one request and returns its id. `request` is JSON `{"endpoint": "chat" |
    /// "completions", "body": {...}}`, the body as OpenAI's API (and `flint serve`) takes it,
    /// read by the same reader (`flint::openai`). `on_event(json)` is
    /// called for each of its events: `{"type": "token", choice, id, text, logprobs}` (`text`
    /// may be empty while a character or a possible stop string is incomplete), one
    /// `{"type": "done", choice, text, summary}` per choice, or `{"type": "error", name,
    /// message}`, then `{"type": "end"}`. An invalid request throws at once, with `param`
    /// naming the field at fault.
    pub fn submit(&self, request: String, on_event: Function) -> Result<u32, JsValue> {
        let bad = |m: String| js_error("InvalidRequestError", m);
        let mut wire: serde_json::Value = serde_json::from_str(&request).map_err(|e| bad(format!("request: {e}")))?;
        let endpoint = match wire.get("endpoint").and_then(|e| e.as_str()) {
            Some("chat") => Endpoint::Chat,
            Some("completions") => Endpoint::Completions,
            _ => return Err(bad("request: `endpoint` must be \"chat\" or \"completions\"".into())),
        };
        let body = wire.get_mut("body").map(serde_json::Value::take).unwrap_or_default();
        let parsed = openai::parse_value(body, endpoint, &openai::Defaults::default()).map_err(|e| api_error(&e))?;
        if parsed.inputs.len() != 1 {
            return Err(api_error(&ApiError::invalid("prompt", "the browser engine takes one prompt per request")));
        }
        let want_logprobs = parsed.top_logprobs.is_some();
        let param = endpoint.prompt_param();
        let mut handles = parsed.submit(&self.engine).map_err(|e| with_param(engine_error(&e, false), ApiError::from_engine(&e, param).param.as_deref()))?;
        let mut handle = handles.pop().ok_or_else(|| bad("nothing to run".into()))?;
        let id = {
            let mut next = self.next_id.borrow_mut();
            let id = *next;
            *next = next.wrapping_add(1).max(1);
            id
        };
        self.running.borrow_mut().insert(id, handle.canceller());
        let running = self.running.clone();
        let tok = self.engine.shared_tokenizer();
        spawn_local(async move {
            while let Some(ev) = handle.next().await {
                let payload = match &ev {
                    Ok(ev) => event_json(&tok, ev, want_logprobs),
                    Err(e) => json!({"type": "error", "name": error_name(e, false), "message": e.to_string()}),
                };
                if on_event.call1(&JsValue::NULL, &JsValue::from_str(&payload.to_string())).is_err() {
                    // The callback threw: nobody can take the rest.
                    handle.cancel();
                }
            }
            running.borrow_mut().remove(&id);
            let _ = on_event.call1(&JsValue::NULL, &JsValue::from_str(r#"{"type":"end"}"#));
        });
        Ok(id)
    }

    /// Cancels request `id`: its choices end with `finish_reason: "abort"`, the others run on.
    pub fn cancel(&self, id: u32) {
        if let Some(c) = self.running.borrow().get(&id) {
            c.cancel();
        }
    }

    /// Ends every running request with `finish_reason: "abort"`.
    #[wasm_bindgen(js_name = interruptAll)]
    pub fn interrupt_all(&self) {
        self.engine.cancel_all();
    }

    /// Renders chat messages (JSON array) with the model's template, as the engine would.
    #[wasm_bindgen(js_name = applyChatTemplate)]
    pub fn apply_chat_template(&self, messages: String, add_generation_prompt: bool) -> Result<String, JsValue> {
        let messages: Vec<serde_json::Value> = serde_json::from_str(&messages).map_err(|e| js_error("InvalidRequestError", format!("messages: {e}")))?;
        self.engine.apply_chat_template(&messages, add_generation_prompt).map_err(|e| engine_error(&e, false))
    }

    /// Drops the cached prefixes no running request holds: the next request starts a new
    /// conversation.
    pub fn reset(&self) {
        self.engine.clear_cache();
    }

    /// Once running requests are done: a new device and the weights loaded again (after
    /// `GPUDevice.destroy()` or a lost device; the next request also does it by itself).
    pub fn reload(&self) -> Promise {
        let engine = self.engine.clone();
        future_to_promise(async move {
            engine.reload().await.map_err(|e| engine_error(&e, false))?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// `flint bench`'s measurement once running requests are done: resolves to JSON with the
    /// prefill and decode tok/s of each repetition over a fixed `n_prompt`-token prompt and
    /// `n_gen` greedy tokens.
    pub fn bench(&self, n_prompt: usize, n_gen: usize, reps: usize) -> Promise {
        let engine = self.engine.clone();
        future_to_promise(async move {
            engine.when_idle().await.map_err(|e| engine_error(&e, false))?;
            let prompt = engine.bench_prompt(n_prompt, 0).map_err(|e| engine_error(&e, false))?;
            let (mut prefill, mut decode) = (Vec::new(), Vec::new());
            for _ in 0..reps.max(1) {
                let r = engine.bench_once(&prompt, n_gen).await.map_err(|e| engine_error(&e, false))?;
                prefill.push(r.prefill_tok_s);
                decode.push(r.decode_tok_s);
            }
            engine.clear_cache();
            Ok(JsValue::from_str(&json!({ "prefill_tok_s": prefill, "decode_tok_s": decode }).to_string()))
        })
    }
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
