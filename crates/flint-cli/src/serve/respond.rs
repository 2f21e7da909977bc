//! Running a parsed request on the engine and answering it as OpenAI does: one JSON body, or
//! server-sent events (`data: {chunk}` lines, one id for every chunk, `data: [DONE]` last).
//! Every choice's handle lives in the response: a client that goes away drops the body, the
//! handles with it, and the engine cancels those sequences within one step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, SelectAll, StreamExt};
use serde_json::{json, Value};

use flint::openai::{ApiError, Endpoint, Parsed};
use flint::{Engine, EngineError, Event, EventResult, FinishReason, Input, RequestHandle, TokenLogprobs, Tokenizer, ToolCall};

use super::metrics::Metrics;
use super::HttpError;

/// Counts requests admitted but not yet producing tokens; held until a request's first event.
pub struct QueueSlot(Arc<AtomicUsize>);

impl QueueSlot {
    /// A slot, unless `max` requests already wait (then 429 with `Retry-After`).
    pub fn take(count: &Arc<AtomicUsize>, max: usize) -> Result<QueueSlot, ApiError> {
        let prev = count.fetch_add(1, Ordering::Relaxed);
        if prev >= max {
            count.fetch_sub(1, Ordering::Relaxed);
            let mut e = ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS.as_u16(),
                "rate_limit_error",
                format!("{prev} requests are waiting already (--max-queue {max})"),
            );
            e.retry_after_s = Some(1);
            return Err(e);
        }
        Ok(QueueSlot(count.clone()))
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every chunk and body of one response shares.
struct Meta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    n: usize,
    include_usage: bool,
    top_logprobs: Option<usize>,
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    arrived: Instant,
}

/// One choice as it grows.
#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<(u32, TokenLogprobs, usize)>,
    /// Characters of token pieces so far (completions' `text_offset`).
    offset: usize,
    finish: Option<FinishReason>,
    last_token: Option<Instant>,
    /// Tokens generated.
    count: usize,
    /// Drafted tokens (a prediction's or n-gram lookup's) and those the model accepted.
    drafted: usize,
    accepted: usize,
    /// Tool calls made so far.
    calls: Vec<ToolCall>,
    /// A thinking model's thought.
    reasoning: String,
}

impl Choice {
    /// Joins streamed call pieces to the choice's calls; gives them back for the stream.
    fn add_calls(&mut self, pieces: Vec<ToolCall>) -> Vec<ToolCall> {
        for p in &pieces {
            ToolCall::join(&mut self.calls, p.clone());
        }
        pieces
    }
}

/// A choice's whole reply: its text, and its tool calls (content null when only calls).
fn chat_message(c: &Choice) -> Value {
    let mut m = if c.calls.is_empty() {
        json!({"role": "assistant", "content": c.text})
    } else {
        let content = if c.text.trim().is_empty() { Value::Null } else { json!(c.text) };
        json!({"role": "assistant", "content": content, "tool_calls": c.calls.iter().map(|call| call_json(call, false)).collect::<Vec<_>>()})
    };
    if !c.reasoning.is_empty() {
        m["reasoning_content"] = json!(c.reasoning);
    }
    m
}

/// A call in OpenAI's shape; in a stream (`delta`), a piece with its `index`, and `id`, `type`
/// and name only in a call's first piece.
fn call_json(call: &ToolCall, delta: bool) -> Value {
    if delta && call.id.is_empty() {
        return json!({"index": call.index, "function": {"arguments": call.arguments}});
    }
    let mut v = json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}});
    if delta {
        v["index"] = json!(call.index);
    }
    v
}

type Events = SelectAll<stream::Map<RequestHandle, Box<dyn FnMut(EventResult) -> (usize, EventResult) + Send>>>;

/// A request on the engine: its prompts' handles merged into one stream of events.
pub struct Running {
    meta: Meta,
    events: Events,
    prompt_tokens: Vec<usize>,
    cached_tokens: Vec<Option<usize>>,
    echo: Vec<Option<String>>,
    choices: Vec<Choice>,
    slot: Option<QueueSlot>,
    first_token: bool,
    /// A step failed: its choices are counted as errors already.
    failed: bool,
}

impl Drop for Running {
    /// A response dropped before its end (the client went away): the handles cancel their
    /// sequences; the choices count as aborted.
    fn drop(&mut self) {
        if !self.failed {
            for _ in self.choices.iter().filter(|c| c.finish.is_none()) {
                self.meta.metrics.finished(Some(FinishReason::Abort));
            }
        }
    }
}

/// Submits every prompt of `p` (each with `n` choices). Fails before anything runs when the
/// engine refuses one (bad value, prompt too long for the context).
pub fn start(engine: &Engine, model: &str, p: Parsed, metrics: Arc<Metrics>, slot: QueueSlot, arrived: Instant) -> Result<Running, ApiError> {
    let param = p.endpoint.prompt_param();
    let tokenizer = engine.shared_tokenizer();
    let mut echo = Vec::new();
    for input in &p.inputs {
        echo.push(match (input, p.echo) {
            (Input::Text(t), true) => Some(t.clone()),
            (Input::Tokens(ids), true) => Some(tokenizer.decode(ids, false).map_err(|e| ApiError::invalid(param, e.to_string()))?),
            _ => None,
        });
    }
    let handles = p.submit(engine).map_err(|e| ApiError::from_engine(&e, param))?;
    let prompt_tokens: Vec<usize> = handles.iter().map(RequestHandle::prompt_tokens).collect();
    let n_prompts = handles.len();
    let events: Events = stream::select_all(handles.into_iter().enumerate().map(|(i, h)| {
        let tag: Box<dyn FnMut(EventResult) -> (usize, EventResult) + Send> = Box::new(move |e| (i, e));
        h.map(tag)
    }));
    let prefix = match p.endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = Meta {
        id: format!("{prefix}-{}", random_id()),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: model.to_string(),
        endpoint: p.endpoint,
        n: p.n,
        include_usage: p.include_usage,
        top_logprobs: p.top_logprobs,
        tokenizer,
        metrics,
        arrived,
    };
    Ok(Running {
        meta,
        events,
        prompt_tokens,
        cached_tokens: vec![None; n_prompts],
        echo,
        choices: (0..n_prompts * p.n).map(|_| Choice::default()).collect(),
        slot: Some(slot),
        first_token: false,
        failed: false,
    })
}

fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{:016x}", h.finish())
}

/// What one engine event changed.
enum Step {
    /// `calls`: pieces of tool calls; `reasoning`: thought.
    Token {
        index: usize,
        text: String,
        logprob: Option<(u32, TokenLogprobs, usize)>,
        calls: Vec<ToolCall>,
        reasoning: String,
    },
    Done {
        index: usize,
        text: String,
        reason: FinishReason,
        calls: Vec<ToolCall>,
        reasoning: String,
    },
    Failed(EngineError),
}

impl Running {
    /// The next event, folded into the choices' state.
    async fn next(&mut self) -> Option<Step> {
        let (prompt, ev) = self.events.next().await?;
        self.slot = None;
        let now = Instant::now();
        Some(match ev {
            Ok(Event::Token { choice, id, text, logprobs, calls, reasoning, .. }) => {
                let index = prompt * self.meta.n + choice;
                let c = &mut self.choices[index];
                match c.last_token {
                    Some(t) => self.meta.metrics.inter_token(now.duration_since(t).as_secs_f64()),
                    None if !self.first_token => {
                        self.first_token = true;
                        self.meta.metrics.ttft(now.duration_since(self.meta.arrived).as_secs_f64());
                    }
                    None => {}
                }
                c.last_token = Some(now);
                c.count += 1;
                c.text.push_str(&text);
                c.reasoning.push_str(&reasoning);
                let logprob = match (self.meta.top_logprobs, logprobs) {
                    (Some(_), Some(lp)) => {
                        let at = c.offset;
                        c.offset += piece(&self.meta.tokenizer, id).chars().count();
                        c.logprobs.push((id, lp.clone(), at));
                        Some((id, lp, at))
                    }
                    _ => None,
                };
                let calls = c.add_calls(calls);
                Step::Token { index, text, logprob, calls, reasoning }
            }
            Ok(Event::Done { choice, summary, text, calls, reasoning }) => {
                let index = prompt * self.meta.n + choice;
                let c = &mut self.choices[index];
                c.text.push_str(&text);
                c.reasoning.push_str(&reasoning);
                let calls = c.add_calls(calls);
                c.finish = Some(summary.finish_reason);
                (c.drafted, c.accepted) = (summary.draft_tokens, summary.accepted_draft_tokens);
                let m = &self.meta.metrics;
                m.generated(summary.completion_tokens);
                m.finished(Some(summary.finish_reason));
                if self.cached_tokens[prompt].is_none() {
                    self.cached_tokens[prompt] = Some(summary.cached_prompt_tokens);
                    m.prompt(summary.prompt_tokens, summary.cached_prompt_tokens);
                }
                Step::Done { index, text, reason: summary.finish_reason, calls, reasoning }
            }
            Err(e) => {
                for _ in self.choices.iter().filter(|c| c.finish.is_none()) {
                    self.meta.metrics.finished(None);
                }
                self.failed = true;
                Step::Failed(e)
            }
        })
    }

    fn usage(&self) -> Value {
        let prompt: usize = self.prompt_tokens.iter().sum();
        let cached: usize = self.cached_tokens.iter().map(|c| c.unwrap_or(0)).sum();
        let completion: usize = self.choices.iter().map(|c| c.count).sum();
        let drafted: usize = self.choices.iter().map(|c| c.drafted).sum();
        let accepted: usize = self.choices.iter().map(|c| c.accepted).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            // Every draft verified (the request's prediction or the server's n-gram lookup).
            "completion_tokens_details": {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted},
        })
    }

    /// Runs to the end and answers with one body.
    pub async fn into_body(mut self) -> Response {
        while let Some(step) = self.next().await {
            if let Step::Failed(e) = step {
                return HttpError(ApiError::from_engine(&e, self.meta.endpoint.prompt_param())).into_response();
            }
        }
        let m = &self.meta;
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let reason = c.finish.map_or("abort", FinishReason::as_str);
                match m.endpoint {
                    Endpoint::Chat => json!({
                        "index": i,
                        "message": chat_message(c),
                        "logprobs": m.top_logprobs.map(|k| json!({"content": c.logprobs.iter().map(|(id, lp, _)| chat_logprob(&m.tokenizer, *id, lp, k)).collect::<Vec<_>>()})),
                        "finish_reason": reason,
                    }),
                    Endpoint::Completions => {
                        let echo = self.echo[i / m.n].as_deref().unwrap_or("");
                        json!({
                            "index": i,
                            "text": format!("{echo}{}", c.text),
                            "logprobs": m.top_logprobs.map(|k| completion_logprobs(&m.tokenizer, &c.logprobs, k)),
                            "finish_reason": reason,
                        })
                    }
                }
            })
            .collect();
        let object = match m.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        };
        let body = json!({"id": m.id, "object": object, "created": m.created, "model": m.model, "choices": choices, "usage": self.usage()});
        Json(body).into_response()
    }

    /// Answers with server-sent events as the tokens come.
    pub fn into_sse(self) -> Response {
        let mut first: VecDeque<Value> = VecDeque::new();
        for i in 0..self.choices.len() {
            match self.meta.endpoint {
                Endpoint::Chat => first.push_back(self.chunk(i, json!({"role": "assistant", "content": ""}), None, None)),
                Endpoint::Completions => {
                    if let Some(p) = &self.echo[i / self.meta.n] {
                        first.push_back(self.chunk(i, json!(p), None, None));
                    }
                }
            }
        }
        let state = (self, first.into_iter().map(|v| v.to_string()).collect::<VecDeque<String>>(), false);
        let events = stream::unfold(state, |(mut run, mut queue, mut ended)| async move {
            loop {
                if let Some(data) = queue.pop_front() {
                    return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), (run, queue, ended)));
                }
                if ended {
                    return None;
                }
                match run.next().await {
                    Some(Step::Token { index, text, logprob, calls, reasoning }) => {
                        if !reasoning.is_empty() {
                            queue.push_back(run.chunk(index, json!({"reasoning_content": reasoning}), None, None).to_string());
                        }
                        if !text.is_empty() || logprob.is_some() {
                            let lp = logprob.map(|(id, lp, at)| run.chunk_logprobs(id, &lp, at));
                            let delta = match run.meta.endpoint {
                                Endpoint::Chat => json!({"content": text}),
                                Endpoint::Completions => json!(text),
                            };
                            queue.push_back(run.chunk(index, delta, lp, None).to_string());
                        }
                        for call in &calls {
                            queue.push_back(run.chunk(index, json!({"tool_calls": [call_json(call, true)]}), None, None).to_string());
                        }
                    }
                    Some(Step::Done { index, text, reason, calls, reasoning }) => {
                        if !reasoning.is_empty() {
                            queue.push_back(run.chunk(index, json!({"reasoning_content": reasoning}), None, None).to_string());
                        }
                        let text = if calls.is_empty() && run.choices[index].calls.is_empty() { text } else { text.trim_end().to_string() };
                        if !text.is_empty() && !calls.is_empty() {
                            queue.push_back(run.chunk(index, json!({"content": text}), None, None).to_string());
                        }
                        for call in &calls {
                            queue.push_back(run.chunk(index, json!({"tool_calls": [call_json(call, true)]}), None, None).to_string());
                        }
                        let text = if calls.is_empty() { text } else { String::new() };
                        let delta = match run.meta.endpoint {
                            Endpoint::Chat if text.is_empty() => json!({}),
                            Endpoint::Chat => json!({"content": text}),
                            Endpoint::Completions => json!(text),
                        };
                        queue.push_back(run.chunk(index, delta, None, Some(reason)).to_string());
                    }
                    Some(Step::Failed(e)) => {
                        let err = ApiError::from_engine(&e, run.meta.endpoint.prompt_param());
                        queue.push_back(err.body().to_string());
                        queue.push_back("[DONE]".into());
                        ended = true;
                    }
                    None => {
                        if run.meta.include_usage {
                            let mut last = run.envelope(Vec::new());
                            last["usage"] = run.usage();
                            queue.push_back(last.to_string());
                        }
                        queue.push_back("[DONE]".into());
                        ended = true;
                    }
                }
            }
        });
        Sse::new(events).into_response()
    }

    /// A chunk's outer object with `choices`.
    fn envelope(&self, choices: Vec<Value>) -> Value {
        let object = match self.meta.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut v = json!({"id": self.meta.id, "object": object, "created": self.meta.created, "model": self.meta.model, "choices": choices});
        if self.meta.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// A chunk for choice `index`: a chat `delta` or a completion's `text`.
    fn chunk(&self, index: usize, delta: Value, logprobs: Option<Value>, finish: Option<FinishReason>) -> Value {
        let finish = finish.map(FinishReason::as_str);
        let choice = match self.meta.endpoint {
            Endpoint::Chat => json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Completions => json!({"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}),
        };
        self.envelope(vec![choice])
    }

    fn chunk_logprobs(&self, id: u32, lp: &TokenLogprobs, at: usize) -> Value {
        let k = self.meta.top_logprobs.unwrap_or(0);
        match self.meta.endpoint {
            Endpoint::Chat => json!({"content": [chat_logprob(&self.meta.tokenizer, id, lp, k)]}),
            Endpoint::Completions => completion_logprobs(&self.meta.tokenizer, &[(id, lp.clone(), at)], k),
        }
    }
}

fn piece(t: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&t.token_bytes(id)).into_owned()
}

fn chat_logprob(t: &Tokenizer, id: u32, lp: &TokenLogprobs, k: usize) -> Value {
    let entry = |id: u32, logprob: f32| json!({"token": piece(t, id), "logprob": logprob, "bytes": t.token_bytes(id)});
    let mut v = entry(id, lp.logprob);
    v["top_logprobs"] = json!(lp.top.iter().take(k).map(|&(i, l)| entry(i, l)).collect::<Vec<_>>());
    v
}

fn completion_logprobs(t: &Tokenizer, toks: &[(u32, TokenLogprobs, usize)], k: usize) -> Value {
    json!({
        "tokens": toks.iter().map(|(id, _, _)| piece(t, *id)).collect::<Vec<_>>(),
        "token_logprobs": toks.iter().map(|(_, lp, _)| lp.logprob).collect::<Vec<_>>(),
        "top_logprobs": toks.iter().map(|(_, lp, _)| {
            let mut m = serde_json::Map::new();
            for &(i, l) in lp.top.iter().take(k) {
                m.insert(piece(t, i), json!(l));
            }
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": toks.iter().map(|(_, _, at)| at).collect::<Vec<_>>(),
    })
}
