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
    #[error("a stop string may not be empty")]
    EmptyStop,
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
    /// Prompt tokens whose KV was reused from earlier requests (not prefilled again).
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token and the text it completes (empty while a UTF-8 character is split
    /// or while it may begin a stop string), with log-probabilities when asked for.
    Token { id: u32, text: String, logprobs: Option<TokenLogprobs> },
    /// The end; `text` holds whatever the detokenizer still had buffered.
    Done { summary: Summary, text: String },
}

/// log p of the chosen token and of the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug, Default)]
pub struct GenerateParams {
    /// None: until an end-of-generation token or the end of the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Generation ends when the text contains one of these (matched across token
    /// boundaries); the stop string itself is not emitted.
    pub stop: Vec<String>,
}

impl GenerateParams {
    pub fn validate(&self) -> Result<(), GenerateError> {
        if self.max_tokens == Some(0) {
            return Err(GenerateError::MaxTokens);
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return Err(GenerateError::EmptyStop);
        }
        self.sampling.validate()?;
        Ok(())
    }
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

/// One request in flight. `cache` lists the tokens whose KV the backend holds (from earlier
/// requests); the longest common prefix with the new prompt is reused, not prefilled again,
/// or a longer one the backend's prefix index holds (see [`Backend::restore_prefix`]).
pub struct Generation<'a> {
    backend: &'a mut dyn Backend,
    tokenizer: &'a Tokenizer,
    cache: &'a mut Vec<u32>,
    sampler: Sampler,
    decoder: StreamDecoder,
    prompt: Vec<u32>,
    /// Prompt tokens already in the KV cache.
    reused: usize,
    stop: Vec<String>,
    /// Decoded text not yet emitted because it might begin a stop string.
    held: String,
    /// A stop string appeared; the next step ends the generation.
    stop_hit: bool,
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
        cache: &'a mut Vec<u32>,
        prompt: Vec<u32>,
        params: GenerateParams,
        abort: Arc<AtomicBool>,
        clock: Clock,
    ) -> Result<Generation<'a>, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        params.validate()?;
        let n_ctx = backend.n_ctx();
        if prompt.len() + 1 > n_ctx {
            return Err(GenerateError::ContextExceeded { prompt: prompt.len(), n_ctx });
        }
        let mut sampler = Sampler::new(params.sampling)?;
        sampler.check_vocab(backend.config().n_vocab)?;
        // Repetition penalties see the whole prompt, reused prefix included.
        sampler.accept_all(&prompt);
        // Reuse the longest cached prefix, keeping at least one prompt token to run: what the
        // live sequence shares with the prompt, or a longer prefix from the backend's index.
        cache.truncate(backend.n_past());
        let common = cache.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
        let runnable = &prompt[..prompt.len() - 1];
        backend.truncate(backend.reusable_prefix(common.min(runnable.len())));
        let keep = backend.restore_prefix(runnable).min(runnable.len());
        cache.clear();
        cache.extend_from_slice(&prompt[..keep]);
        Ok(Generation {
            backend,
            tokenizer,
            cache,
            sampler,
            decoder: StreamDecoder::new(),
            prompt,
            reused: keep,
            stop: params.stop,
            held: String::new(),
            stop_hit: false,
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
        if self.stop_hit {
            return Ok(self.finish(FinishReason::Stop));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Ok(self.finish(FinishReason::Abort));
        }
        if !self.prefilled {
            self.t_start = (self.clock)();
        }
        let sampled = if !self.prefilled {
            self.prefilled = true;
            let new = &self.prompt[self.reused..];
            let sampled = self.backend.forward_sample(new, &mut self.sampler).await?;
            self.cache.extend_from_slice(new);
            // The prompt's blocks serve later requests even if this one is abandoned.
            self.backend.commit(self.cache.as_slice());
            sampled
        } else {
            let Some(tok) = self.last else { return Ok(self.finish(FinishReason::Stop)) };
            if self.max_tokens.is_some_and(|m| self.completion >= m) || self.backend.n_past() >= self.backend.n_ctx() {
                return Ok(self.finish(FinishReason::Length));
            }
            let sampled = self.backend.forward_sample(std::slice::from_ref(&tok), &mut self.sampler).await?;
            self.cache.push(tok);
            sampled
        };
        let id = sampled.id;
        let logprobs = sampled.logprob.map(|logprob| TokenLogprobs { logprob, top: sampled.top_logprobs });
        if self.completion == 0 {
            self.t_first = (self.clock)();
        }
        if self.tokenizer.is_eog(id) {
            return Ok(self.finish(FinishReason::Stop));
        }
        self.last = Some(id);
        self.completion += 1;
        self.sampler.accept(id);
        let piece = self.decoder.push(self.tokenizer, id);
        if self.stop.is_empty() {
            return Ok(Event::Token { id, text: piece, logprobs });
        }
        self.held.push_str(&piece);
        if let Some(at) = self.stop.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let text = self.held[..at].to_string();
            self.held.clear();
            self.stop_hit = true;
            return Ok(Event::Token { id, text, logprobs });
        }
        // Emit all but the longest tail that could still begin a stop string.
        let keep = self.stop.iter().map(|s| longest_prefix_suffix(&self.held, s)).max().unwrap_or(0);
        let cut = self.held.len() - keep;
        let text: String = self.held.drain(..cut).collect();
        Ok(Event::Token { id, text, logprobs })
    }

    fn finish(&mut self, finish_reason: FinishReason) -> Event {
        self.backend.commit(self.cache.as_slice());
        let mut text = std::mem::take(&mut self.held);
        let now = (self.clock)();
        let ttft_ms = if self.prefilled { self.t_first - self.t_start } else { 0.0 };
        let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        // The first token comes from the prefill; the rest each cost one decode step.
        let decode_steps = self.completion.saturating_sub(1);
        let summary = Summary {
            finish_reason,
            prompt_tokens: self.prompt.len(),
            cached_prompt_tokens: self.reused,
            completion_tokens: self.completion,
            ttft_ms,
            prefill_tok_s: per_s(self.prompt.len() - self.reused, ttft_ms),
            decode_tok_s: per_s(decode_steps, now - self.t_first),
        };
        let tail = self.decoder.finish();
        if !self.stop_hit {
            text.push_str(&tail);
        }
        Event::Done { summary, text }
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop` (at a char boundary).
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && stop.is_char_boundary(n) && text.ends_with(&stop[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::longest_prefix_suffix;

    #[test]
    fn held_tail_is_the_longest_possible_stop_start() {
        assert_eq!(longest_prefix_suffix("hello wor", "world"), 3);
        assert_eq!(longest_prefix_suffix("hello", "world"), 0);
        assert_eq!(longest_prefix_suffix("abcab", "abcd"), 2);
        assert_eq!(longest_prefix_suffix("x", "x"), 0);
        assert_eq!(longest_prefix_suffix("é", "éa"), 2);
    }
}
