//! What `flint bench` and the browser's benchmark share, so their figures compare: a fixed
//! ordinary-text prompt, one stream's timings, and many streams submitted at once.

use futures::StreamExt;

use flint_core::generate::Clock;

use crate::{Engine, EngineError, Event, GenerateParams, Input, Request, SamplingParams};

/// Ordinary text, repeated to the requested length.
const BENCH_TEXT: &str = "The history of the printing press begins in the fifteenth century, when movable type spread across Europe. ";

/// Timings of one benchmark repetition, in seconds.
#[derive(Clone, Debug)]
pub struct BenchRun {
    pub ttft_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tok_s: f64,
    /// Generated tokens per second of decode.
    pub decode_tok_s: f64,
    /// Prompt tokens prefilled (at a depth: those the prefix cache did not hold).
    pub prefilled: usize,
}

/// One stream of a concurrent run: milliseconds from the submission of all streams.
#[derive(Clone, Debug)]
pub struct StreamRun {
    pub first_ms: f64,
    pub last_ms: f64,
    pub tokens: usize,
    /// When each token arrived, in order (`tokens` entries).
    pub token_ms: Vec<f64>,
}

impl StreamRun {
    fn new(n_tokens: usize) -> StreamRun {
        StreamRun { first_ms: 0.0, last_ms: 0.0, tokens: 0, token_ms: Vec::with_capacity(n_tokens) }
    }

    /// A token arrived `now` ms after the submission.
    fn arrive(&mut self, now: f64) {
        if self.tokens == 0 {
            self.first_ms = now;
        }
        self.last_ms = now;
        self.tokens += 1;
        self.token_ms.push(now);
    }

    /// One stream's repetition figures, for a prompt of `prompt_tokens`.
    fn bench_run(&self, prompt_tokens: usize) -> BenchRun {
        let (prefill_s, decode_s) = (self.first_ms / 1e3, (self.last_ms - self.first_ms) / 1e3);
        let prefill_tok_s = if prefill_s > 0.0 { prompt_tokens as f64 / prefill_s } else { 0.0 };
        BenchRun { ttft_s: prefill_s, prefill_s, decode_s, prefill_tok_s, decode_tok_s: self.decode_tok_s(), prefilled: prompt_tokens }
    }

    /// Tokens after the first per second.
    pub fn decode_tok_s(&self) -> f64 {
        let ms = self.last_ms - self.first_ms;
        if ms > 0.0 {
            (self.tokens.saturating_sub(1)) as f64 * 1e3 / ms
        } else {
            0.0
        }
    }
}

pub(crate) fn host_copy_bandwidth_gbs(clock: Clock) -> f64 {
    const BYTES: usize = 256 << 20;
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    let t0 = clock();
    dst.copy_from_slice(&src);
    let ms = clock() - t0;
    std::hint::black_box(&dst);
    if ms > 0.0 {
        2.0 * BYTES as f64 / (ms * 1e6)
    } else {
        0.0
    }
}

/// One run of `flint bench --spec-type`: a prompt and greedy tokens, with or without drafts.
#[derive(Clone, Debug)]
pub struct SpecRun {
    pub run: BenchRun,
    /// The tokens generated (with and without drafts they must be the same).
    pub ids: Vec<u32>,
    pub drafted: usize,
    pub accepted: usize,
    /// Forward steps after the one that gave the first token.
    pub decode_steps: u64,
}

fn bench_request(prompt: Vec<u32>, n_tokens: usize) -> Request {
    let params = GenerateParams { max_tokens: Some(n_tokens), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
    Request::new(Input::Tokens(prompt), params)
}

impl Engine {
    /// A fixed, ordinary-text prompt of exactly `n` tokens; `variant` k starts k tokens into
    /// the text, so prompts of different variants share no KV block.
    pub fn bench_prompt(&self, n: usize, variant: usize) -> Result<Vec<u32>, EngineError> {
        let t = &self.info.tokenizer;
        let base = t.encode(BENCH_TEXT, false, false)?;
        let mut p: Vec<u32> = t.bos_id().filter(|_| t.add_bos_default()).into_iter().collect();
        p.extend(base.iter().cycle().skip(variant % base.len().max(1)).take(n.saturating_sub(p.len())).copied());
        p.truncate(n);
        Ok(p)
    }

    /// One benchmark repetition from an empty prefix cache: prefill `prompt`, then `n_gen`
    /// greedy decode steps (end-of-generation tokens are not honoured, so every rep does equal
    /// work).
    pub async fn bench_once(&self, prompt: &[u32], n_gen: usize) -> Result<BenchRun, EngineError> {
        let runs = self.bench_streams(&[prompt.to_vec()], n_gen + 1).await?;
        Ok(runs[0].bench_run(prompt.len()))
    }

    /// One benchmark repetition at a depth (llama-bench's `-d`): `prompt[..depth]` runs first,
    /// untimed, and stays in the prefix cache; then `prompt` is timed as [`Engine::bench_once`]
    /// times it, its prefill rate counting only the tokens the cache did not hold.
    pub async fn bench_at_depth(&self, prompt: &[u32], depth: usize, n_gen: usize) -> Result<BenchRun, EngineError> {
        if depth == 0 || depth >= prompt.len() {
            return self.bench_once(prompt, n_gen).await;
        }
        self.clear_cache();
        let mut fill = self.submit(bench_request(prompt[..depth].to_vec(), 1))?;
        while let Some(ev) = fill.next().await {
            ev?;
        }
        let clock = self.info.clock;
        let t0 = clock();
        let mut events = self.submit(bench_request(prompt.to_vec(), n_gen + 1))?;
        let (mut stream, mut cached) = (StreamRun::new(n_gen + 1), 0);
        while let Some(ev) = events.next().await {
            match ev? {
                Event::Token { .. } => stream.arrive(clock() - t0),
                Event::Done { summary, .. } => cached = summary.cached_prompt_tokens,
            }
        }
        Ok(stream.bench_run(prompt.len() - cached.min(prompt.len())))
    }

    /// One greedy run of `n_gen` tokens after the first (end-of-generation ignored) from an
    /// empty prefix cache, alone on the engine, drafting or not (the engine must have been
    /// loaded with speculation on for `speculative` to draft). `prefill_steps`: the steps the
    /// prompt takes (its length over the step's token budget, rounded up).
    pub async fn bench_spec_once(&self, prompt: &[u32], n_gen: usize, speculative: bool, prefill_steps: u64) -> Result<SpecRun, EngineError> {
        self.clear_cache();
        let steps0 = self.stats().await?.steps;
        let clock = self.info.clock;
        let params = GenerateParams {
            max_tokens: Some(n_gen + 1),
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            speculative: Some(speculative),
            ..Default::default()
        };
        let t0 = clock();
        let mut events = self.submit(Request::new(Input::Tokens(prompt.to_vec()), params))?;
        let (mut stream, mut ids, mut summary) = (StreamRun::new(n_gen + 1), Vec::with_capacity(n_gen + 1), None);
        while let Some(ev) = events.next().await {
            match ev? {
                Event::Token { id, .. } => {
                    stream.arrive(clock() - t0);
                    ids.push(id);
                }
                Event::Done { summary: s, .. } => summary = Some(s),
            }
        }
        let steps = self.stats().await?.steps - steps0;
        let s = summary.ok_or(EngineError::Closed)?;
        let run = stream.bench_run(prompt.len());
        Ok(SpecRun { run, ids, drafted: s.draft_tokens, accepted: s.accepted_draft_tokens, decode_steps: steps.saturating_sub(prefill_steps) })
    }

    /// Submits one request per prompt at once (from an empty prefix cache), each generating
    /// `n_tokens` with end-of-generation ignored, and returns each stream's token
    /// arrival times.
    pub async fn bench_streams(&self, prompts: &[Vec<u32>], n_tokens: usize) -> Result<Vec<StreamRun>, EngineError> {
        self.clear_cache();
        let clock = self.info.clock;
        let t0 = clock();
        let handles = prompts.iter().map(|p| self.submit(bench_request(p.clone(), n_tokens))).collect::<Result<Vec<_>, _>>()?;
        let mut events = futures::stream::select_all(handles.into_iter().enumerate().map(|(i, h)| h.map(move |e| (i, e))));
        let mut runs = vec![StreamRun::new(n_tokens); prompts.len()];
        while let Some((i, ev)) = events.next().await {
            if let Event::Token { .. } = ev? {
                runs[i].arrive(clock() - t0);
            }
        }
        Ok(runs)
    }
}
