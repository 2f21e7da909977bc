//! The generation loop: prefill the prompt, then sample, stream and feed back one token at
//! a time until an end-of-generation token, the token limit, a full context or an abort.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::backend::{Backend, BackendError};
use crate::sampling::{Sampler, SamplingError, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx} (one more is needed to generate)")]
    ContextExceeded { prompt: usize, n_ctx: usize },
    #[error("max_tokens must be at least 1")]
    MaxTokens,
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (not emitted).
    Stop,
    /// The token limit or the end of the context.
    Length,
    /// The caller asked to stop.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token and the text it completes (empty while a UTF-8 character is split).
    Token { id: u32, text: String },
    /// The end; `text` holds whatever the detokenizer still had buffered.
    Done { summary: Summary, text: String },
}

#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// None: until an end-of-generation token or the end of the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
}

/// Milliseconds from an arbitrary origin; injected so wasm can use `performance.now()`.
pub type Clock = fn() -> f64;

#[cfg(not(target_arch = "wasm32"))]
pub fn default_clock() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
}

#[cfg(target_arch = "wasm32")]
pub fn default_clock() -> f64 {
    0.0
}

/// One request in flight over a backend whose KV cache holds nothing else.
pub struct Generation<'a> {
    backend: &'a mut dyn Backend,
    tokenizer: &'a Tokenizer,
    sampler: Sampler,
    decoder: StreamDecoder,
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    abort: Arc<AtomicBool>,
    clock: Clock,
    last: Option<u32>,
    prefilled: bool,
    finished: bool,
    completion: usize,
    t_start: f64,
    t_first: f64,
}

impl<'a> Generation<'a> {
    /// Validates everything up front: a request that cannot run fails before any work.
    pub fn new(
        backend: &'a mut dyn Backend,
        tokenizer: &'a Tokenizer,
        prompt: Vec<u32>,
        params: GenerateParams,
        abort: Arc<AtomicBool>,
        clock: Clock,
    ) -> Result<Generation<'a>, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if params.max_tokens == Some(0) {
            return Err(GenerateError::MaxTokens);
        }
        let n_ctx = backend.n_ctx();
        if prompt.len() + 1 > n_ctx {
            return Err(GenerateError::ContextExceeded { prompt: prompt.len(), n_ctx });
        }
        let sampler = Sampler::new(params.sampling)?;
        backend.truncate(0);
        Ok(Generation {
            backend,
            tokenizer,
            sampler,
            decoder: StreamDecoder::new(),
            prompt,
            max_tokens: params.max_tokens,
            abort,
            clock,
            last: None,
            prefilled: false,
            finished: false,
            completion: 0,
            t_start: 0.0,
            t_first: 0.0,
        })
    }

    /// The next event, or None after `Done`.
    pub async fn next_event(&mut self) -> Option<Result<Event, GenerateError>> {
        if self.finished {
            return None;
        }
        let r = self.step().await;
        if !matches!(r, Ok(Event::Token { .. })) {
            self.finished = true;
        }
        Some(r)
    }

    async fn step(&mut self) -> Result<Event, GenerateError> {
        if self.abort.load(Ordering::Relaxed) {
            return Ok(self.finish(FinishReason::Abort));
        }
        if !self.prefilled {
            self.t_start = (self.clock)();
        }
        let id = if !self.prefilled {
            self.prefilled = true;
            self.backend.forward_sample(&self.prompt, &mut self.sampler).await?.id
        } else {
            let Some(tok) = self.last else { return Ok(self.finish(FinishReason::Stop)) };
            if self.max_tokens.is_some_and(|m| self.completion >= m) || self.backend.n_past() >= self.backend.n_ctx() {
                return Ok(self.finish(FinishReason::Length));
            }
            self.backend.forward_sample(std::slice::from_ref(&tok), &mut self.sampler).await?.id
        };
        if self.completion == 0 {
            self.t_first = (self.clock)();
        }
        if self.tokenizer.is_eog(id) {
            return Ok(self.finish(FinishReason::Stop));
        }
        self.last = Some(id);
        self.completion += 1;
        let text = self.decoder.push(self.tokenizer, id);
        Ok(Event::Token { id, text })
    }

    fn finish(&mut self, finish_reason: FinishReason) -> Event {
        let now = (self.clock)();
        let ttft_ms = if self.prefilled { self.t_first - self.t_start } else { 0.0 };
        let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        // The first token comes from the prefill; the rest each cost one decode step.
        let decode_steps = self.completion.saturating_sub(1);
        let summary = Summary {
            finish_reason,
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.completion,
            ttft_ms,
            prefill_tok_s: per_s(self.prompt.len(), ttft_ms),
            decode_tok_s: per_s(decode_steps, now - self.t_first),
        };
        Event::Done { summary, text: self.decoder.finish() }
    }
}
