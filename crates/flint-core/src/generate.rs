//! One choice of a request as it generates: its sampler (settings, seed and random stream,
//! penalty history), the streaming detokenizer, the stop-string matcher, its limits and
//! timings. It holds no backend and no KV: the engine's run loop feeds it each token a step
//! sampled for it and forwards the events it returns, whatever else shares the step.

use thiserror::Error;

use crate::backend::BackendError;
use crate::constrain::{Constraint, ConstraintError};
use crate::reasoning::ThoughtStream;
use crate::sampling::{Sampled, Sampler, SamplingError, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::tools::{ToolCall, ToolStream};

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx} (one more is needed to generate)")]
    ContextExceeded { prompt: usize, n_ctx: usize },
    /// The prompt and `max_tokens` together are longer than the context (asked to fit).
    #[error("this model's context holds {n_ctx} tokens; the prompt has {prompt} and max_tokens asks for {max_tokens} more")]
    ReplyExceedsContext { prompt: usize, max_tokens: usize, n_ctx: usize },
    #[error("max_tokens must be at least 1")]
    MaxTokens,
    #[error("a stop string may not be empty")]
    EmptyStop,
    #[error("n must be in 1..={max}, got {n}")]
    BadN { n: usize, max: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (not emitted) or a stop string.
    Stop,
    /// The token limit or the end of the context.
    Length,
    /// The caller asked to stop.
    Abort,
    /// The reply called tools (it ended as `Stop` would, with at least one call).
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from earlier or concurrent requests (not prefilled).
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    /// From the request's submission to its first token (queueing included).
    pub ttft_ms: f64,
    /// Prompt tokens prefilled per second, from the first step that ran them to the first token.
    pub prefill_tok_s: f64,
    /// Tokens after the first per second.
    pub decode_tok_s: f64,
    /// Speculative decoding: tokens drafted for this choice and how many the model accepted.
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token of choice `choice` and the text it completes (empty while a UTF-8
    /// character is split or while it may begin a stop string), with log-probabilities when
    /// asked for, and the logits it was drawn from when the request asked for them (tests).
    /// With tools, `text` is content only, and `calls` the pieces of tool calls this token
    /// gave. With thoughts split out, `reasoning` is the thought's text and `text` the answer's.
    Token { choice: usize, id: u32, text: String, logprobs: Option<TokenLogprobs>, logits: Option<Vec<f32>>, calls: Vec<ToolCall>, reasoning: String },
    /// The end of choice `choice`; `text` holds whatever the detokenizer still had buffered.
    /// `calls` and `reasoning`: what the end of the reply gave.
    Done { choice: usize, summary: Summary, text: String, calls: Vec<ToolCall>, reasoning: String },
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
    /// End-of-generation tokens are generated like any other (benchmarks).
    pub ignore_eos: bool,
    /// Speculative decoding for this request where the engine has it on: None = the engine's
    /// setting, Some(false) = never. It changes speed only, never the tokens.
    pub speculative: Option<bool>,
    /// Control and special tokens appear in the text (llama.cpp's `--special`); otherwise they
    /// render as nothing, as llama.cpp prints them by default.
    pub special: bool,
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

/// One choice in flight.
pub struct Generation {
    choice: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: Vec<String>,
    /// Decoded text not yet emitted because it might begin a stop string.
    held: String,
    stop_hit: bool,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    prompt_tokens: usize,
    cached: usize,
    completion: usize,
    t_submit: f64,
    t_start: Option<f64>,
    t_first: Option<f64>,
    done: bool,
    spec: crate::spec::SpecCounts,
    speculate: bool,
    /// The grammar the reply is held to, if any.
    constraint: Option<Constraint>,
    /// The constraint could not go on: the request fails with this.
    constraint_error: Option<ConstraintError>,
    /// With tools: the reply's text split into content and calls.
    tools: Option<ToolStream>,
    /// A thinking model's reply split into thought and answer.
    thoughts: Option<ThoughtStream>,
}

impl Generation {
    /// Choice `choice` of a request for `prompt`; it draws from the random stream
    /// (`seed`, `choice`). Settings are validated here, so a request that cannot run fails
    /// before any work.
    pub fn new(prompt: &[u32], params: &GenerateParams, seed: u64, choice: usize, n_vocab: usize, t_submit: f64) -> Result<Generation, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        params.validate()?;
        let mut sampler = Sampler::with_stream(params.sampling.clone(), seed, choice as u32)?;
        // Repetition penalties see the whole prompt, reused prefix included.
        sampler.accept_all(prompt);
        sampler.check_vocab(n_vocab)?;
        Ok(Generation {
            choice,
            sampler,
            decoder: StreamDecoder::new().skip_special(!params.special),
            stop: params.stop.clone(),
            held: String::new(),
            stop_hit: false,
            max_tokens: params.max_tokens,
            ignore_eos: params.ignore_eos,
            prompt_tokens: prompt.len(),
            cached: 0,
            completion: 0,
            t_submit,
            t_start: None,
            t_first: None,
            done: false,
            spec: Default::default(),
            speculate: params.speculative.unwrap_or(true),
            constraint: None,
            constraint_error: None,
            tools: None,
            thoughts: None,
        })
    }

    /// Splits the reply into content and tool calls with `stream`.
    pub fn with_tools(mut self, stream: ToolStream) -> Generation {
        self.tools = Some(stream);
        self
    }

    /// Splits the reply's thought (given as `reasoning`) from its answer (the text, and the
    /// tool calls with tools).
    pub fn with_thoughts(mut self, stream: ThoughtStream) -> Generation {
        self.thoughts = Some(stream);
        self
    }

    /// Holds the reply to `constraint`'s grammar.
    pub fn with_constraint(mut self, constraint: Constraint) -> Generation {
        self.constraint = Some(constraint);
        self
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Why the reply's constraint cannot go on, once (the request then fails with it).
    pub fn take_constraint_error(&mut self) -> Option<ConstraintError> {
        self.constraint_error.take()
    }

    /// The choice's sampler, and its mask work when it is constrained: apart, so that a step
    /// can hold the sampler while the masks are computed.
    pub fn split_mut(&mut self) -> (&mut Sampler, Option<MaskJob<'_>>) {
        let job = self.constraint.as_mut().map(|constraint| MaskJob { constraint, error: &mut self.constraint_error });
        (&mut self.sampler, job)
    }

    /// Up to `max` tokens the reply's grammar forces from here (none, unconstrained): the
    /// only continuation it allows, tokenized as the grammar's tokenizer would.
    pub fn forced_tokens(&mut self, max: usize) -> Vec<u32> {
        let Some(c) = self.constraint.as_mut() else { return Vec::new() };
        let mut ids = c.forced();
        ids.truncate(max);
        ids
    }

    /// How much of `draft` the reply's grammar allows from here (all of it, unconstrained).
    pub fn grammar_prefix(&mut self, draft: &[u32]) -> usize {
        self.constraint.as_mut().map_or(draft.len(), |c| c.valid_prefix(draft))
    }

    pub fn choice(&self) -> usize {
        self.choice
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Tokens generated so far.
    pub fn completion_tokens(&self) -> usize {
        self.completion
    }

    /// Tokens it may still generate (None: no `max_tokens`).
    pub fn remaining(&self) -> Option<usize> {
        self.max_tokens.map(|m| m.saturating_sub(self.completion))
    }

    /// It may draft where the engine speculates (it did not opt out). Greedy and sampled
    /// choices alike: drafts are verified by equality with the token the target draws at
    /// each row ([`crate::spec::accepted_prefix`]).
    pub fn speculates(&self) -> bool {
        self.speculate
    }

    /// A verify step drafted `drafted` tokens for this choice and the model took `accepted`.
    pub fn record_drafts(&mut self, drafted: usize, accepted: usize) {
        self.spec.add(drafted, accepted);
    }

    /// The first step that runs this choice's prompt starts at `now`, `cached` prompt tokens
    /// having come from the prefix cache.
    pub fn started(&mut self, now: f64, cached: usize) {
        if self.t_start.is_none() {
            self.t_start = Some(now);
            self.cached = cached;
        }
    }

    /// The token a step sampled for this choice. Returns the events to emit and whether the
    /// choice goes on (the token then joins its sequence); `room` says whether the context
    /// has a position left for it.
    pub fn on_sampled(&mut self, tokenizer: &Tokenizer, sampled: Sampled, now: f64, room: bool) -> (Vec<Event>, bool) {
        self.t_first.get_or_insert(now);
        let id = sampled.id;
        if !self.ignore_eos && tokenizer.is_eog(id) {
            return (vec![self.finish(FinishReason::Stop, now)], false);
        }
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.consume(id) {
                self.constraint_error = Some(e);
                return (Vec::new(), false);
            }
        }
        let logprobs = sampled.logprob.map(|logprob| TokenLogprobs { logprob, top: sampled.top_logprobs });
        self.completion += 1;
        self.sampler.accept(id);
        let mut piece = self.decoder.push(tokenizer, id);
        let mut reasoning = String::new();
        if let Some(t) = self.thoughts.as_mut() {
            let out = t.push(&piece);
            (reasoning, piece) = (out.reasoning, out.content);
        }
        let mut calls = Vec::new();
        if let Some(t) = self.tools.as_mut() {
            let out = t.push(id, &piece);
            (piece, calls) = (out.content, out.calls);
        }
        let choice = self.choice;
        let mut events = Vec::with_capacity(2);
        if self.stop.is_empty() {
            events.push(Event::Token { choice, id, text: piece, logprobs, logits: None, calls, reasoning });
        } else {
            self.held.push_str(&piece);
            if let Some(at) = self.stop.iter().filter_map(|s| self.held.find(s.as_str())).min() {
                let text = self.held[..at].to_string();
                self.held.clear();
                self.stop_hit = true;
                events.push(Event::Token { choice, id, text, logprobs, logits: None, calls, reasoning });
                events.push(self.finish(FinishReason::Stop, now));
                return (events, false);
            }
            // Emit all but the longest tail that could still begin a stop string.
            let keep = self.stop.iter().map(|s| longest_prefix_suffix(&self.held, s)).max().unwrap_or(0);
            let cut = self.held.len() - keep;
            let text: String = self.held.drain(..cut).collect();
            events.push(Event::Token { choice, id, text, logprobs, logits: None, calls, reasoning });
        }
        if self.constraint.as_ref().is_some_and(Constraint::is_finished) {
            // The grammar is complete: nothing may follow.
            events.push(self.finish(FinishReason::Stop, now));
            return (events, false);
        }
        if self.max_tokens.is_some_and(|m| self.completion >= m) || !room {
            events.push(self.finish(FinishReason::Length, now));
            return (events, false);
        }
        (events, true)
    }

    /// Ends the choice: the summary, and any text still buffered (unless a stop string cut it).
    pub fn finish(&mut self, mut finish_reason: FinishReason, now: f64) -> Event {
        self.done = true;
        let mut text = std::mem::take(&mut self.held);
        let mut tail = self.decoder.finish();
        let mut reasoning = String::new();
        if let Some(t) = self.thoughts.as_mut() {
            let (pushed, end) = (t.push(&tail), t.finish());
            reasoning = pushed.reasoning + &end.reasoning;
            tail = pushed.content + &end.content;
        }
        let mut calls = Vec::new();
        if let Some(t) = self.tools.as_mut() {
            let pushed = t.push(u32::MAX, &tail);
            let end = t.finish();
            tail = pushed.content + &end.content;
            calls = pushed.calls.into_iter().chain(end.calls).collect();
            if finish_reason == FinishReason::Stop && t.calls() > 0 {
                finish_reason = FinishReason::ToolCalls;
            }
        }
        let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        let (ttft_ms, prefill_tok_s) = match (self.t_start, self.t_first) {
            (Some(start), Some(first)) => (first - self.t_submit, per_s(self.prompt_tokens - self.cached, first - start)),
            _ => (0.0, 0.0),
        };
        // The first token comes from the prefill; the rest each cost one decode step.
        let decode_tok_s = self.t_first.map_or(0.0, |first| per_s(self.completion.saturating_sub(1), now - first));
        let summary = Summary {
            finish_reason,
            prompt_tokens: self.prompt_tokens,
            cached_prompt_tokens: self.cached,
            completion_tokens: self.completion,
            ttft_ms,
            prefill_tok_s,
            decode_tok_s,
            draft_tokens: self.spec.drafted as usize,
            accepted_draft_tokens: self.spec.accepted as usize,
        };
        if !self.stop_hit {
            text.push_str(&tail);
        }
        Event::Done { choice: self.choice, summary, text, calls, reasoning }
    }
}

/// A constrained choice's masks for one step.
pub struct MaskJob<'a> {
    constraint: &'a mut Constraint,
    error: &'a mut Option<ConstraintError>,
}

impl MaskJob<'_> {
    /// The masks of the rows a step draws for this choice: row 0 from where the reply is, row
    /// j after the first j of `drafts` (a verify step). Drafts must be ones the grammar allows
    /// ([`Generation::grammar_prefix`]). On an error the rows allow only end-of-generation
    /// tokens and the error waits in [`Generation::take_constraint_error`].
    pub fn masks(self, drafts: &[u32], rows: usize) -> Vec<Vec<u32>> {
        let c = self.constraint;
        let mut masks = Vec::with_capacity(rows);
        let mut fed = 0;
        let mut result = Ok(());
        for j in 0..rows {
            if j > 0 {
                result = c.consume(drafts[j - 1]);
                if result.is_err() {
                    break;
                }
                fed += 1;
            }
            match c.mask() {
                Ok(m) => masks.push(m),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = result.and(c.rollback(fed)) {
            *self.error = Some(e);
            return vec![c.end_mask(); rows];
        }
        masks
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop` (at a char boundary).
pub(crate) fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max).rev().find(|&n| text.is_char_boundary(text.len() - n) && stop.is_char_boundary(n) && text.ends_with(&stop[..n])).unwrap_or(0)
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
