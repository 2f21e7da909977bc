//! OpenAI's request shapes for `/v1/chat/completions` and `/v1/completions`, read once for
//! every front end (the server, the wasm bindings behind the npm package, the fuzzer), field by
//! field, so that a bad value is answered as vLLM answers it: status 400 and an OpenAI error
//! body naming the field. The ranges are the engine's (`GenerateParams::validate`) plus
//! OpenAI's limits (n ≤ 128, top_logprobs ≤ 20, at most 4 stop strings). Unknown fields are
//! ignored (and reported in `Parsed::unknown`), as vLLM and llama.cpp do, so that clients
//! written for them work.

use serde_json::{json, Map, Value};

use crate::{BackendError, EngineError, GenerateError, GenerateParams, Input, SamplingError, SamplingParams, MAX_N};

/// HTTP status codes the errors carry (no HTTP crate here: the server maps them).
pub mod status {
    pub const BAD_REQUEST: u16 = 400;
    pub const NOT_FOUND: u16 = 404;
    pub const INTERNAL: u16 = 500;
    pub const UNAVAILABLE: u16 = 503;
}
/// Most alternatives per token in log-probabilities.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most stop strings (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most prompts in one completion request (each runs `n` choices).
pub const MAX_PROMPTS: usize = 16;

/// An error as OpenAI shapes it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status it is answered with.
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after_s: None }
    }

    /// 400 for a bad value of `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::new(status::BAD_REQUEST, "invalid_request_error", message) }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The JSON body (also sent as an SSE event when a stream fails after it started).
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// A request the engine refused, or a step that failed. `prompt_param` names the field
    /// the prompt came from (`messages` or `prompt`).
    pub fn from_engine(e: &EngineError, prompt_param: &str) -> ApiError {
        match e {
            EngineError::Generate(g) => from_generate(g, prompt_param),
            EngineError::Chat(_) | EngineError::NoChatTemplate => ApiError::invalid(prompt_param, e.to_string()),
            EngineError::Tokenizer(_) => ApiError::invalid(prompt_param, e.to_string()),
            EngineError::Backend(BackendError::BadToken { .. }) => ApiError::invalid(prompt_param, e.to_string()),
            EngineError::Closed => ApiError::new(status::UNAVAILABLE, "server_error", "the engine has stopped"),
            EngineError::Constraint { field, .. } => ApiError::invalid(field, e.to_string()),
            // The next request opens a new device and loads the model again.
            _ if matches!(e.backend(), Some(BackendError::DeviceLost { .. })) => {
                ApiError::new(status::UNAVAILABLE, "server_error", e.to_string()).with_code("device_lost")
            }
            _ => ApiError::new(status::INTERNAL, "server_error", e.to_string()),
        }
    }
}

fn from_generate(g: &GenerateError, prompt_param: &str) -> ApiError {
    let param = match g {
        GenerateError::EmptyPrompt => prompt_param,
        GenerateError::ContextExceeded { .. } | GenerateError::ReplyExceedsContext { .. } => {
            return ApiError::invalid(prompt_param, g.to_string()).with_code("context_length_exceeded")
        }
        GenerateError::MaxTokens => "max_tokens",
        GenerateError::EmptyStop => "stop",
        GenerateError::BadN { .. } => "n",
        GenerateError::Sampling(s) => match s {
            SamplingError::Temperature(_) => "temperature",
            SamplingError::TopP(_) => "top_p",
            SamplingError::TopK(_) => "top_k",
            SamplingError::MinP(_) => "min_p",
            SamplingError::RepeatPenalty(_) => "repetition_penalty",
            SamplingError::RepeatLastN(_) => "repeat_last_n",
            SamplingError::PresencePenalty(_) => "presence_penalty",
            SamplingError::FrequencyPenalty(_) => "frequency_penalty",
            SamplingError::NLogprobs(_) => "top_logprobs",
            SamplingError::LogitBias { .. } | SamplingError::OutOfVocab { .. } | SamplingError::MaskLength { .. } => "logit_bias",
        },
        GenerateError::Backend(_) => return ApiError::new(status::INTERNAL, "server_error", g.to_string()),
    };
    ApiError::invalid(param, g.to_string())
}

/// The server's sampling defaults: `flint run`'s flags where given, else OpenAI's.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
}

impl Default for Defaults {
    fn default() -> Self {
        // OpenAI's defaults where they differ from llama.cpp's (no top-k, top-p or min-p).
        let sampling = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() };
        Defaults { sampling, max_tokens: None, stop: Vec::new() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// The field the prompt comes from.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// A parsed request: the engine requests to submit (one per prompt) and how to answer.
pub struct Parsed {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub inputs: Vec<Input>,
    pub params: GenerateParams,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token to report, when log-probabilities are asked for.
    pub top_logprobs: Option<usize>,
    pub echo: bool,
    /// `prediction`: a predicted output, drafted from (OpenAI's `{"type": "content",
    /// "content": ...}`, or the text alone).
    pub prediction: Option<String>,
    /// Chat: end the rendered prompt with the assistant's turn opening (vLLM's field; default
    /// true).
    pub add_generation_prompt: bool,
    /// The grammar the replies are held to (`response_format`, `json_schema`, `grammar`,
    /// `structured_outputs`, `guided_*`).
    pub constraint: Option<crate::Constrained>,
    /// Chat: `tools`, `tool_choice` and `parallel_tool_calls`.
    pub tools: Option<flint_core::tools::Tools>,
    /// Chat: `chat_template_kwargs`, more variables for the template (vLLM's and llama.cpp's
    /// field: Qwen3's `enable_thinking`, ...).
    pub template_kwargs: Map<String, Value>,
    /// Top-level fields this reader does not know, in the body's order: ignored.
    pub unknown: Vec<String>,
}

impl Parsed {
    /// The engine's requests, one per prompt, each with `n` choices.
    pub fn requests(&self) -> Vec<crate::Request> {
        self.inputs
            .iter()
            .map(|input| {
                let mut req = crate::Request::new(input.clone(), self.params.clone());
                req.n = self.n;
                req.prediction = self.prediction.clone();
                req.add_generation_prompt = self.add_generation_prompt;
                req.fit_max_tokens = true;
                req.constraint = self.constraint.clone();
                req.tools = self.tools.clone();
                req.template_kwargs = self.template_kwargs.clone();
                // A thinking model's thought goes to `reasoning_content`, as llama.cpp's and
                // vLLM's servers give it.
                req.split_thoughts = true;
                req
            })
            .collect()
    }
}

impl Parsed {
    /// Submits every request to `engine`; fails before anything runs when the engine refuses
    /// one (a bad value, a prompt too long for the context, or one whose `max_tokens` would
    /// not fit after it, as OpenAI answers). The error is the engine's, so that each front end
    /// names it by its variant ([`ApiError::from_engine`] for HTTP).
    pub fn submit(&self, engine: &crate::Engine) -> Result<Vec<crate::RequestHandle>, EngineError> {
        self.requests().into_iter().map(|req| engine.submit(req)).collect()
    }
}

/// Fields both endpoints read (OpenAI's, plus vLLM's and llama.cpp's sampling extensions and
/// Flint's `speculative`).
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "repeat_last_n",
    "logit_bias",
    "logprobs",
    "stream",
    "stream_options",
    "user",
    "ignore_eos",
    "prediction",
    "speculative",
];
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "top_logprobs",
    "add_generation_prompt",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "functions",
    "function_call",
    "audio",
    "modalities",
];
const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// The top-level fields of `obj` that `endpoint` does not read.
fn unknown_fields(obj: &Map<String, Value>, endpoint: Endpoint) -> Vec<String> {
    let own = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completions => COMPLETION_FIELDS,
    };
    let known = |k: &str| COMMON_FIELDS.contains(&k) || own.contains(&k) || crate::structured::FIELDS.contains(&k);
    obj.keys().filter(|k| !known(k)).cloned().collect()
}

/// Logs each unknown field name once per process (a client sends the same ones every time).
pub fn log_unknown(fields: &[String]) {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    let seen = seen.get_or_insert_with(HashSet::new);
    for f in fields {
        // Bounded: a client cannot grow the set without limit.
        if seen.len() < 256 && seen.insert(f.clone()) {
            tracing::warn!("ignoring the unknown request field `{f}` (logged once)");
        }
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls` (chat).
fn tools(obj: &Map<String, Value>) -> Result<Option<flint_core::tools::Tools>, ApiError> {
    use flint_core::tools::{ToolError, Tools};
    let parallel = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(ApiError::invalid("parallel_tool_calls", "`parallel_tool_calls` must be a boolean")),
    };
    Tools::from_openai(obj.get("tools"), obj.get("tool_choice"), parallel).map_err(|e| {
        let param = match e {
            ToolError::BadTool { .. } => "tools",
            ToolError::UnknownChoice { .. } | ToolError::NoTools { .. } | ToolError::BadChoice => "tool_choice",
        };
        ApiError::invalid(param, e.to_string())
    })
}

/// OpenAI's predicted outputs: `{"type": "content", "content": string or text parts}`, or the
/// text alone (as the npm package took it).
fn prediction(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let bad = || ApiError::invalid("prediction", "`prediction` must be a string or {\"type\": \"content\", \"content\": a string or an array of text parts}");
    let p = match obj.get("prediction") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(bad()),
    };
    if p.get("type").and_then(Value::as_str) != Some("content") {
        return Err(bad());
    }
    match p.get("content") {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => text_parts(parts).map(Some).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Fields OpenAI defines that this server does not implement: a 400 naming them, never a
/// silent answer without them. (`value` → whether it asks for the feature.)
fn unsupported(obj: &Map<String, Value>, endpoint: Endpoint) -> Result<(), ApiError> {
    let asks = |name: &str, v: &Value| -> bool {
        match name {
            "functions" => v.as_array().is_some_and(|a| !a.is_empty()),
            "function_call" => v.as_str() != Some("none"),
            "modalities" => v.as_array().is_some_and(|a| a.iter().any(|m| m.as_str() != Some("text"))),
            "best_of" => v.as_u64().is_some_and(|b| b > 1),
            "suffix" => v.as_str().is_some_and(|s| !s.is_empty()),
            _ => true,
        }
    };
    let names: &[&str] = match endpoint {
        Endpoint::Chat => &["functions", "function_call", "audio", "modalities"],
        Endpoint::Completions => &["suffix", "best_of"],
    };
    for &name in names {
        if let Some(v) = obj.get(name).filter(|v| !v.is_null()) {
            if asks(name, v) {
                return Err(ApiError::invalid(name, format!("`{name}` is not supported by this server yet")));
            }
        }
    }
    Ok(())
}

fn number(obj: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::invalid(name, format!("`{name}` must be a number"))),
    }
}

fn integer(obj: &Map<String, Value>, name: &str) -> Result<Option<i64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => Ok(Some(i)),
            None => Err(ApiError::invalid(name, format!("`{name}` must be an integer"))),
        },
        Some(_) => Err(ApiError::invalid(name, format!("`{name}` must be an integer"))),
    }
}

fn boolean(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(name, format!("`{name}` must be true or false"))),
    }
}

/// An integer in `lo..=hi`.
fn ranged(obj: &Map<String, Value>, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match integer(obj, name)? {
        Some(v) if v < lo || v > hi => Err(ApiError::invalid(name, format!("`{name}` must be in [{lo}, {hi}], got {v}"))),
        v => Ok(v),
    }
}

fn stops(obj: &Map<String, Value>) -> Result<Option<Vec<String>>, ApiError> {
    let bad = || ApiError::invalid("stop", format!("`stop` must be a string or an array of at most {MAX_STOP} non-empty strings"));
    let list = match obj.get("stop") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= MAX_STOP => a.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(bad)).collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if list.iter().any(String::is_empty) {
        return Err(bad());
    }
    Ok(Some(list))
}

fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match obj.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ApiError::invalid("logit_bias", "`logit_bias` must map token ids to numbers")),
    };
    map.iter()
        .map(|(k, v)| {
            let id = k.parse::<u32>().map_err(|_| ApiError::invalid("logit_bias", format!("logit_bias key {k:?} is not a token id")))?;
            let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b));
            let b = b.ok_or_else(|| ApiError::invalid("logit_bias", format!("logit_bias for {k} must be a number in [-100, 100]")))?;
            Ok((id, b as f32))
        })
        .collect()
}

/// Chat messages as the template takes them: content given as an array of text parts is
/// joined (as vLLM does); other parts (images, audio) are refused.
fn messages(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |m: String| ApiError::invalid("messages", m);
    let list = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("`messages` may not be empty".into())),
        None | Some(Value::Null) => return Err(bad("`messages` is required".into())),
        Some(_) => return Err(bad("`messages` must be an array of messages".into())),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let mut m = m.as_object().cloned().ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
            if !m.get("role").is_some_and(Value::is_string) {
                return Err(bad(format!("messages[{i}] needs a string `role`")));
            }
            if let Some(Value::Array(parts)) = m.get("content") {
                let text = text_parts(parts).ok_or_else(|| bad(format!("messages[{i}]: only text content parts are supported")))?;
                m.insert("content".into(), Value::String(text));
            }
            Ok(Value::Object(m))
        })
        .collect()
}

/// Content parts (`[{"type": "text", "text"}, ...]`) joined into one text; None when a part is
/// not text.
fn text_parts(parts: &[Value]) -> Option<String> {
    parts
        .iter()
        .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => Some(t),
            _ => None,
        })
        .collect()
}

/// `prompt`: a string, an array of strings, an array of token ids, or an array of those.
fn prompts(obj: &Map<String, Value>) -> Result<Vec<Input>, ApiError> {
    let bad = || ApiError::invalid("prompt", "`prompt` must be a string, an array of strings, or token ids");
    let ids = |a: &[Value]| -> Option<Vec<u32>> { a.iter().map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok())).collect() };
    let inputs = match obj.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(bad()),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Input::Tokens(ids(a).ok_or_else(bad)?)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(t) => Ok(Input::Tokens(ids(t).ok_or_else(bad)?)),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if inputs.len() > MAX_PROMPTS {
        return Err(ApiError::invalid("prompt", format!("at most {MAX_PROMPTS} prompts per request")));
    }
    Ok(inputs)
}

/// Reads a request body of `endpoint`.
pub fn parse(body: &[u8], endpoint: Endpoint, defaults: &Defaults) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::new(status::BAD_REQUEST, "invalid_request_error", format!("malformed JSON: {e}")))?;
    parse_value(value, endpoint, defaults)
}

/// [`parse`] for a body already read as JSON.
pub fn parse_value(value: Value, endpoint: Endpoint, defaults: &Defaults) -> Result<Parsed, ApiError> {
    let Value::Object(obj) = value else {
        return Err(ApiError::new(status::BAD_REQUEST, "invalid_request_error", "the body must be a JSON object"));
    };
    unsupported(&obj, endpoint)?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let inputs = match endpoint {
        Endpoint::Chat => vec![Input::Chat(messages(&obj)?)],
        Endpoint::Completions => prompts(&obj)?,
    };
    let max_tokens = match ranged(&obj, "max_completion_tokens", 1, i64::MAX)? {
        Some(n) => Some(n),
        None => ranged(&obj, "max_tokens", 1, i64::MAX)?,
    };
    let max_tokens = max_tokens.map(|n| n as usize).or(defaults.max_tokens);
    let n = ranged(&obj, "n", 1, MAX_N as i64)?.unwrap_or(1) as usize;
    let top_logprobs = match endpoint {
        Endpoint::Chat => {
            let top = ranged(&obj, "top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            match (boolean(&obj, "logprobs")?, top) {
                (Some(true), top) => Some(top.unwrap_or(0) as usize),
                (_, Some(t)) if t > 0 => return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
                _ => None,
            }
        }
        Endpoint::Completions => ranged(&obj, "logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|k| k as usize),
    };
    let echo = endpoint == Endpoint::Completions && boolean(&obj, "echo")?.unwrap_or(false);
    if echo && top_logprobs.is_some() {
        return Err(ApiError::invalid("echo", "`echo` with `logprobs` (prompt log-probabilities) is not supported yet"));
    }
    let stream = boolean(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            boolean(o, "include_usage").map_err(|_| ApiError::invalid("stream_options", "`include_usage` must be true or false"))?.unwrap_or(false)
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "`stream_options` must be an object")),
    };
    if obj.get("user").is_some_and(|u| !u.is_string() && !u.is_null()) {
        return Err(ApiError::invalid("user", "`user` must be a string"));
    }
    let d = &defaults.sampling;
    let f = |name: &str, default: f32| -> Result<f32, ApiError> { Ok(number(&obj, name)?.map_or(default, |v| v as f32)) };
    let top_k = match integer(&obj, "top_k")? {
        Some(k) => i32::try_from(k).map_err(|_| ApiError::invalid("top_k", "`top_k` is out of range"))?,
        None => d.top_k,
    };
    let sampling = SamplingParams {
        temperature: f("temperature", d.temperature)?,
        top_k,
        top_p: f("top_p", d.top_p)?,
        min_p: f("min_p", d.min_p)?,
        seed: integer(&obj, "seed")?.map(|s| s as u64).or(d.seed),
        repeat_penalty: f("repetition_penalty", d.repeat_penalty)?,
        repeat_last_n: match integer(&obj, "repeat_last_n")? {
            Some(n) => i32::try_from(n).map_err(|_| ApiError::invalid("repeat_last_n", "`repeat_last_n` is out of range"))?,
            None => d.repeat_last_n,
        },
        presence_penalty: f("presence_penalty", d.presence_penalty)?,
        frequency_penalty: f("frequency_penalty", d.frequency_penalty)?,
        logit_bias: logit_bias(&obj)?,
        // The engine reports at least one alternative when asked for any.
        n_logprobs: top_logprobs.map_or(0, |k| k.max(1)),
    };
    let params = GenerateParams {
        max_tokens,
        sampling,
        stop: stops(&obj)?.unwrap_or_else(|| defaults.stop.clone()),
        ignore_eos: boolean(&obj, "ignore_eos")?.unwrap_or(false),
        speculative: boolean(&obj, "speculative")?,
        // Control tokens stay out of `content`, as OpenAI's and llama.cpp's servers keep them.
        special: false,
    };
    params.validate().map_err(|e| from_generate(&e, endpoint.prompt_param()))?;
    let prediction = prediction(&obj)?;
    let add_generation_prompt = match endpoint {
        Endpoint::Chat => boolean(&obj, "add_generation_prompt")?.unwrap_or(true),
        Endpoint::Completions => true,
    };
    let constraint = crate::structured::constraint(&obj)?;
    let tools = match endpoint {
        Endpoint::Chat => tools(&obj)?,
        Endpoint::Completions => None,
    };
    if let (Some(_), Some(t)) = (&constraint, &tools) {
        if t.choice != flint_core::tools::ToolChoice::None {
            return Err(ApiError::invalid("tools", "`tools` and a response format both constrain the reply: give one (or `tool_choice: \"none\"`)"));
        }
    }
    let template_kwargs = match (endpoint, obj.get("chat_template_kwargs")) {
        (_, None | Some(Value::Null)) | (Endpoint::Completions, _) => Map::new(),
        (Endpoint::Chat, Some(Value::Object(o))) => o.clone(),
        (Endpoint::Chat, Some(_)) => return Err(ApiError::invalid("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    };
    let unknown = unknown_fields(&obj, endpoint);
    Ok(Parsed {
        endpoint,
        model,
        inputs,
        params,
        n,
        stream,
        include_usage,
        top_logprobs,
        echo,
        prediction,
        add_generation_prompt,
        constraint,
        tools,
        template_kwargs,
        unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Parsed, ApiError> {
        parse(body.to_string().as_bytes(), Endpoint::Chat, &Defaults::default())
    }

    fn param_of(r: Result<Parsed, ApiError>) -> (u16, Option<String>) {
        let e = r.err().expect("an error");
        (e.status, e.param)
    }

    #[test]
    fn openai_defaults_and_fields() {
        let msgs = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]);
        let p = chat(json!({"model": "m", "messages": msgs, "max_completion_tokens": 5, "n": 2, "stop": "x", "seed": 3, "logprobs": true, "top_logprobs": 2}))
            .unwrap();
        assert_eq!((p.params.sampling.temperature, p.params.sampling.top_p, p.params.sampling.top_k), (1.0, 1.0, 0));
        assert_eq!((p.params.max_tokens, p.n, p.top_logprobs, p.params.sampling.seed), (Some(5), 2, Some(2), Some(3)));
        assert_eq!(p.params.stop, vec!["x".to_string()]);
        assert_eq!(p.prediction, None);
        let parts = json!({"type": "content", "content": [{"type": "text", "text": "fn a"}, {"type": "text", "text": "() {}"}]});
        assert_eq!(chat(json!({"messages": msgs, "prediction": parts})).unwrap().prediction.as_deref(), Some("fn a() {}"));
        let text = json!({"type": "content", "content": "x = 1"});
        assert_eq!(chat(json!({"messages": msgs, "prediction": text})).unwrap().prediction.as_deref(), Some("x = 1"));
        let Input::Chat(m) = &p.inputs[0] else { panic!("chat input") };
        assert_eq!(m[0]["content"], "ab");
    }

    #[test]
    fn bad_values_name_their_field() {
        let m = json!([{"role": "user", "content": "hi"}]);
        for (field, v) in [
            ("temperature", json!(2.5)),
            ("top_p", json!(0)),
            ("min_p", json!(1.5)),
            ("top_k", json!(-2)),
            ("presence_penalty", json!(3)),
            ("frequency_penalty", json!(-2.5)),
            ("repetition_penalty", json!(0)),
            ("n", json!(129)),
            ("n", json!(0)),
            ("repeat_last_n", json!(-2)),
            ("speculative", json!("yes")),
            ("add_generation_prompt", json!(1)),
            ("max_tokens", json!(0)),
            ("top_logprobs", json!(21)),
            ("stop", json!(["a", "b", "c", "d", "e"])),
            ("logit_bias", json!({"x": 1})),
            ("tools", json!([{"type": "function"}])),
            ("response_format", json!({"type": "yaml"})),
            ("prediction", json!({"type": "text", "content": "x"})),
            ("prediction", json!({"type": "content", "content": [{"type": "image_url"}]})),
            ("temperature", json!("hot")),
        ] {
            let mut body = json!({"messages": m});
            body[field] = v;
            if field == "top_logprobs" {
                body["logprobs"] = json!(true);
            }
            assert_eq!(param_of(chat(body)), (400, Some(field.to_string())), "{field}");
        }
        assert_eq!(param_of(chat(json!({"messages": []}))), (400, Some("messages".into())));
        let e = parse(b"{not json", Endpoint::Chat, &Defaults::default()).err().unwrap();
        assert_eq!((e.status, e.param), (400, None));
        // Unknown fields are ignored, as vLLM does; tools: [] asks for nothing.
        let p = chat(json!({"messages": m, "foo": 1, "tools": [], "response_format": {"type": "text"}, "store": false})).unwrap();
        assert_eq!(p.unknown, vec!["foo".to_string(), "store".to_string()]);
        // OpenAI's limit on choices; a prediction may be the text alone.
        let p = chat(json!({"messages": m, "n": 128, "prediction": "x = 1", "add_generation_prompt": false, "speculative": false})).unwrap();
        assert_eq!((p.n, p.prediction.as_deref(), p.add_generation_prompt, p.params.speculative), (128, Some("x = 1"), false, Some(false)));
        assert_eq!(p.requests()[0].n, 128);
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| parse(json!({"prompt": v}).to_string().as_bytes(), Endpoint::Completions, &Defaults::default());
        assert_eq!(p(json!("a")).unwrap().inputs, vec![Input::Text("a".into())]);
        assert_eq!(p(json!(["a", "b"])).unwrap().inputs.len(), 2);
        assert_eq!(p(json!([1, 2, 3])).unwrap().inputs, vec![Input::Tokens(vec![1, 2, 3])]);
        assert_eq!(p(json!([[1], [2, 3]])).unwrap().inputs.len(), 2);
        assert_eq!(param_of(p(json!([]))), (400, Some("prompt".into())));
        assert_eq!(param_of(p(json!([-1]))), (400, Some("prompt".into())));
        assert_eq!(param_of(p(json!(vec!["a"; MAX_PROMPTS + 1]))), (400, Some("prompt".into())));
    }
}
