//! Sampling settings, their validation, and the CPU sampler: repetition, presence and
//! frequency penalties over a window of past tokens, logit bias, an allowed-token mask,
//! then greedy or a draw after temperature, top-k, top-p and min-p, with log-probabilities
//! of the chosen token and the top alternatives. The PRNG is seeded and platform-independent.
//!
//! The logit edits (penalties → bias → mask) are expressed as a sorted list of
//! [`LogitEdit`]s plus a bitset so the GPU sampler applies exactly the same arithmetic.

use std::collections::{BTreeMap, VecDeque};

use thiserror::Error;

/// Most alternatives `n_logprobs` may ask for (OpenAI's and vLLM's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Largest |presence_penalty| and |frequency_penalty| (vLLM's range).
pub const MAX_PRESENCE_FREQUENCY: f32 = 2.0;
/// Highest temperature (vLLM's range).
pub const MAX_TEMPERATURE: f32 = 2.0;

#[derive(Debug, Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number in [0, 2], got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("top_k must be -1, 0 (both mean off) or positive, got {0}")]
    TopK(i32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("repeat_penalty must be a finite number > 0 (1 = off), got {0}")]
    RepeatPenalty(f32),
    #[error("repeat_last_n must be -1 (the whole context), 0 (off) or positive, got {0}")]
    RepeatLastN(i32),
    #[error("presence_penalty must be in [-2, 2], got {0}")]
    PresencePenalty(f32),
    #[error("frequency_penalty must be in [-2, 2], got {0}")]
    FrequencyPenalty(f32),
    #[error("n_logprobs must be at most {MAX_LOGPROBS}, got {0}")]
    NLogprobs(usize),
    #[error("logit_bias for token {id} must be a finite number or -inf (a ban), got {bias}")]
    LogitBias { id: u32, bias: f32 },
    #[error("{what} names token {id}, outside the vocabulary of {n_vocab}")]
    OutOfVocab { what: &'static str, id: u32, n_vocab: usize },
    #[error("the allowed-token mask has {words} words; a vocabulary of {n_vocab} needs {needed} (1 bit per token)")]
    MaskLength { words: usize, n_vocab: usize, needed: usize },
}

/// Sampling settings with llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 or -1 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// None = seeded from the clock.
    pub seed: Option<u64>,
    /// Repetition penalty (llama.cpp): a positive logit of a token in the window is divided
    /// by it, a non-positive one multiplied. 1 = off.
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over, prompt included: -1 = the whole context, 0 = off.
    pub repeat_last_n: i32,
    /// Subtracted once from the logit of every token in the window. 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window. 0 = off.
    pub frequency_penalty: f32,
    /// (token id, bias) added to the logits after the penalties; -inf bans the token.
    /// Biases of a repeated id add up.
    pub logit_bias: Vec<(u32, f32)>,
    /// Log-probabilities of the chosen token and this many alternatives (0 = none, ≤ 20).
    pub n_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: None,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            n_logprobs: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    /// Checks every range that does not depend on the vocabulary; bias ids are checked by
    /// [`Sampler::check_vocab`].
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&self.temperature)) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if self.top_k < -1 {
            return Err(SamplingError::TopK(self.top_k));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(SamplingError::RepeatPenalty(self.repeat_penalty));
        }
        if self.repeat_last_n < -1 {
            return Err(SamplingError::RepeatLastN(self.repeat_last_n));
        }
        let pf = -MAX_PRESENCE_FREQUENCY..=MAX_PRESENCE_FREQUENCY;
        if !pf.contains(&self.presence_penalty) {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        if !pf.contains(&self.frequency_penalty) {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        if self.n_logprobs > MAX_LOGPROBS {
            return Err(SamplingError::NLogprobs(self.n_logprobs));
        }
        if let Some(&(id, bias)) = self.logit_bias.iter().find(|(_, b)| !(b.is_finite() || *b == f32::NEG_INFINITY)) {
            return Err(SamplingError::LogitBias { id, bias });
        }
        Ok(())
    }

    /// Whether the repetition/presence/frequency penalties change anything.
    pub fn penalties_on(&self) -> bool {
        self.repeat_last_n != 0 && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }

    pub fn penalties(&self) -> Penalties {
        Penalties { repeat: self.repeat_penalty, presence: self.presence_penalty, frequency: self.frequency_penalty }
    }
}

/// The penalty factors one step applies (see [`LogitEdit::apply`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub presence: f32,
    pub frequency: f32,
}

/// One token's edit: its occurrences in the penalty window (0 = not penalized) and its
/// bias (0 = none). `#[repr(C)]` so the GPU sampler uploads the list as it is.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LogitEdit {
    pub id: u32,
    pub count: u32,
    pub bias: f32,
}

impl LogitEdit {
    /// llama.cpp's penalties, then the bias, in f32 in this exact order (the GPU kernel
    /// `shaders/penalize.wgsl` mirrors it).
    pub fn apply(&self, logit: f32, p: &Penalties) -> f32 {
        let mut l = logit;
        if self.count > 0 {
            l = if l > 0.0 { l / p.repeat } else { l * p.repeat };
            l -= self.count as f32 * p.frequency + p.presence;
        }
        l + self.bias
    }
}

/// Whether the mask (1 bit per token id, bit i%32 of word i/32) allows token `i`; ids past
/// the mask are disallowed.
pub fn mask_allows(mask: &[u32], i: usize) -> bool {
    mask.get(i / 32).is_some_and(|w| (w >> (i % 32)) & 1 == 1)
}

/// xoshiro256** seeded through splitmix64: small, fast and identical on every platform.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One drawn token, with log-probabilities when the settings ask for them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampled {
    pub id: u32,
    /// log p(id) under the model's (penalized, biased, masked) distribution at temperature 1.
    pub logprob: Option<f32>,
    /// The `n_logprobs` most likely tokens and their log-probabilities, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The id a sampler returns for a row of logits it must not sample from (one holds NaN, +inf
/// or f32::MAX: a broken model file or GPU driver). The engine fails the request instead of
/// emitting a token. The GPU sampler returns the same (`shaders/sample_common.wgsl`).
pub const NON_FINITE: u32 = u32::MAX;

/// Whether a logit is broken: NaN, +inf or f32::MAX (−inf is a banned token).
pub fn is_broken(v: f32) -> bool {
    v.is_nan() || v >= f32::MAX
}

/// Index of the largest value; the lowest index wins ties (as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Log-softmax of `logits` at temperature 1: the value at `id`, and the `n` most likely
/// tokens with theirs, most likely first (descending logit in total order, lowest id on ties). Tokens at
/// -inf (banned) are never listed. Computed in f64.
pub fn log_softmax_top(logits: &[f32], id: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let live = |l: f32| l >= -f32::MAX;
    let max = logits.iter().copied().filter(|&l| live(l)).fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().filter(|&&l| live(l)).map(|&l| (l as f64 - max).exp()).sum();
    let log_z = sum.ln();
    let lp = |l: f32| ((l as f64 - max) - log_z) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if !live(l) || (top.len() == n && l.total_cmp(&top[n - 1].1).is_le()) {
                continue;
            }
            // Total order (as the GPU's keys); after earlier ids with the same logit.
            let at = top.partition_point(|&(_, t)| t.total_cmp(&l).is_ge());
            top.insert(at, (i as u32, l));
            top.truncate(n);
        }
    }
    let chosen = logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    (chosen, top.into_iter().map(|(i, l)| (i, lp(l))).collect())
}

/// Speculative decoding with a sampled draft model, on a device sampler: the draft's rows
/// record their distribution q (under the request's settings) in a store on the device, and
/// the target's rows verify each drafted token against it by the rule of Leviathan et al.
/// (see [`crate::spec::verify_exact`]). The CPU sampler ignores links: its draw follows p and
/// the host compares it with the draft, which is exact for any draft too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftLink {
    /// Record this row's distribution in row `q_row` of the store (draft side).
    Record { q_row: u32 },
    /// Verify drafted `token` against the distribution in row `q_row` (target side).
    Verify { token: u32, q_row: u32 },
}

/// Draws tokens from logits with the configured settings and keeps what the penalties need:
/// the tokens seen so far (feed them with [`Sampler::accept`]) and the allowed-token mask.
/// A clone continues independently (a verify step's row after drafted tokens).
#[derive(Clone)]
pub struct Sampler {
    params: SamplingParams,
    /// Where this row meets a sampled draft's distribution (device samplers; see [`DraftLink`]).
    link: Option<DraftLink>,
    rng: Rng,
    seed: u64,
    /// Which random stream of the seed this sampler draws from (a request's choice index).
    stream: u32,
    steps: u32,
    /// The last `repeat_last_n` accepted tokens, oldest first (when the window is bounded).
    window: VecDeque<u32>,
    /// Occurrences of each token in the window (only kept while a penalty is on).
    counts: BTreeMap<u32, u32>,
    /// `logit_bias` sorted by id, repeated ids summed in order.
    bias: Vec<(u32, f32)>,
    mask: Option<Vec<u32>>,
}

impl Sampler {
    /// A sampler with the settings' seed (or one from the clock), on stream 0.
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        let seed = params.seed.unwrap_or_else(clock_seed);
        Self::with_stream(params, seed, 0)
    }

    /// A sampler drawing from random stream `stream` of `seed` (the settings' own seed is
    /// ignored): choice i of a request uses stream i, so its draws do not depend on how many
    /// choices there are or what else runs.
    pub fn with_stream(params: SamplingParams, seed: u64, stream: u32) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let mut merged: BTreeMap<u32, f32> = BTreeMap::new();
        for &(id, b) in &params.logit_bias {
            *merged.entry(id).or_insert(0.0) += b;
        }
        let bias = merged.into_iter().collect();
        let rng = Rng::new(stream_seed(seed, stream));
        Ok(Sampler { link: None, rng, params, seed, stream, steps: 0, window: VecDeque::new(), counts: BTreeMap::new(), bias, mask: None })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The same sampler asking for log-probabilities of its draw and `n` alternatives.
    pub fn with_logprobs(mut self, n: usize) -> Sampler {
        self.params.n_logprobs = n.min(MAX_LOGPROBS);
        self
    }

    /// Links the sampler's next draws to a sampled draft's distribution (None: unlinked).
    pub fn set_link(&mut self, link: Option<DraftLink>) {
        self.link = link;
    }

    pub fn link(&self) -> Option<DraftLink> {
        self.link
    }

    /// The seed in use (drawn from the clock when the settings gave none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The random stream of the seed this sampler draws from.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// A fresh counter for a device-side draw: devices key their random numbers by
    /// (seed, step), so the same seed and settings give the same tokens on every run.
    pub fn next_step(&mut self) -> u32 {
        let s = self.steps;
        self.steps = self.steps.wrapping_add(1);
        s
    }

    /// Skips the next `n` draws (counters and CPU generator alike), as if `n` tokens had been
    /// sampled; greedy settings draw nothing, so nothing moves.
    pub fn advance(&mut self, n: u32) {
        if self.params.temperature <= 0.0 {
            return;
        }
        self.steps = self.steps.wrapping_add(n);
        for _ in 0..n {
            self.rng.next_u64();
        }
    }

    /// The sampler as it will be once `drafts` have been sampled and accepted: their penalty
    /// history, and the random draws of their positions skipped. Row j of a verify entry
    /// draws with `after(&drafts[..j])`, so it uses the very draw plain decoding would use at
    /// that position: with drafts that are a point mass (n-gram, predicted outputs) the step
    /// then gives exactly plain decoding's tokens, seeded or not.
    pub fn after(&self, drafts: &[u32]) -> Sampler {
        let mut s = self.clone();
        s.link = None;
        s.accept_all(drafts);
        s.advance(drafts.len() as u32);
        s
    }

    /// Records a token of the context (prompt or generated) for the penalties.
    pub fn accept(&mut self, id: u32) {
        if !self.params.penalties_on() {
            return;
        }
        *self.counts.entry(id).or_insert(0) += 1;
        let Ok(cap) = usize::try_from(self.params.repeat_last_n) else { return };
        self.window.push_back(id);
        if self.window.len() > cap {
            let old = self.window.pop_front().unwrap_or(id);
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
    }

    pub fn accept_all(&mut self, ids: &[u32]) {
        for &id in ids {
            self.accept(id);
        }
    }

    /// Sets (or clears) the allowed-token mask for the next draws: 1 bit per token id, bit
    /// i%32 of word i/32, set = allowed. Disallowed tokens get -inf before sampling, so a
    /// grammar or JSON-schema constraint only has to produce this bitset each step.
    pub fn set_mask(&mut self, mask: Option<Vec<u32>>) {
        self.mask = mask;
    }

    pub fn mask(&self) -> Option<&[u32]> {
        self.mask.as_deref()
    }

    /// Checks what only the vocabulary size can tell: bias ids, accepted ids, mask length.
    pub fn check_vocab(&self, n_vocab: usize) -> Result<(), SamplingError> {
        let out = |what, id: u32| SamplingError::OutOfVocab { what, id, n_vocab };
        if let Some(&(id, _)) = self.bias.last().filter(|b| b.0 as usize >= n_vocab) {
            return Err(out("logit_bias", id));
        }
        if let Some((&id, _)) = self.counts.last_key_value().filter(|c| *c.0 as usize >= n_vocab) {
            return Err(out("the token history", id));
        }
        let needed = n_vocab.div_ceil(32);
        match &self.mask {
            Some(m) if m.len() != needed => Err(SamplingError::MaskLength { words: m.len(), n_vocab, needed }),
            _ => Ok(()),
        }
    }

    /// This step's edits, sorted by id with each id once: every token in the penalty
    /// window with its count, and every biased token.
    pub fn edits(&self) -> Vec<LogitEdit> {
        self.edits_without(None)
    }

    /// [`Sampler::edits`] for a step whose pending token, the last one drawn, this sampler
    /// has not accepted yet (the host has not read it; the device counts it in): the window
    /// then ends one token early, so the oldest token, which the pending one pushes out of a
    /// full window, no longer counts. With the pending token's occurrence added (to its entry,
    /// or as an entry of count 1 without bias), these are the edits of the sampler that
    /// accepted it.
    pub fn edits_before_pending(&self) -> Vec<LogitEdit> {
        let full = usize::try_from(self.params.repeat_last_n).is_ok_and(|cap| cap > 0 && self.window.len() == cap);
        self.edits_without(self.window.front().copied().filter(|_| full))
    }

    /// The edits with one occurrence of `gone` taken out of the counts.
    fn edits_without(&self, gone: Option<u32>) -> Vec<LogitEdit> {
        let mut out = Vec::with_capacity(self.counts.len() + self.bias.len());
        let mut bias = self.bias.iter().peekable();
        for (&id, &count) in &self.counts {
            while let Some(&&(bid, b)) = bias.peek().filter(|b| b.0 < id) {
                out.push(LogitEdit { id: bid, count: 0, bias: b });
                bias.next();
            }
            let count = count - u32::from(gone == Some(id));
            let b = bias.next_if(|b| b.0 == id).map(|b| b.1);
            if count > 0 || b.is_some() {
                out.push(LogitEdit { id, count, bias: b.unwrap_or(0.0) });
            }
        }
        out.extend(bias.map(|&(id, bias)| LogitEdit { id, count: 0, bias }));
        out
    }

    /// Whether [`Sampler::penalize`] changes anything this step.
    pub fn has_edits(&self) -> bool {
        !self.counts.is_empty() || !self.bias.is_empty() || self.mask.is_some()
    }

    /// Applies the penalties, the bias and the mask to `logits` in place (ids outside
    /// `logits` are ignored; [`Sampler::check_vocab`] reports them).
    pub fn penalize(&self, logits: &mut [f32]) {
        let p = self.params.penalties();
        for e in self.edits() {
            if let Some(l) = logits.get_mut(e.id as usize) {
                *l = e.apply(*l, &p);
            }
        }
        if let Some(mask) = &self.mask {
            for (i, l) in logits.iter_mut().enumerate() {
                if !mask_allows(mask, i) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The probabilities the settings define, over the surviving candidates, sorted by
    /// descending probability: top-k, then top-p and min-p on the untempered softmax,
    /// then temperature (llama.cpp's default order). `logits` are taken as they are: pass
    /// them through [`Sampler::penalize`] first for the edited distribution.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let p = &self.params;
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k as usize);
        }
        let probs = softmax_f64(cand.iter().map(|c| c.1 as f64), 1.0);
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let threshold = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= threshold).count().max(1));
        }
        cand.truncate(keep);
        let probs = softmax_f64(cand.iter().map(|c| c.1 as f64), p.temperature as f64);
        cand.iter().map(|c| c.0).zip(probs).collect()
    }

    /// The next token: [`Sampler::sample_full`] without log-probabilities.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let edited = self.edited(logits);
        self.checked_draw(edited.as_deref().unwrap_or(logits))
    }

    /// Penalties → bias → mask → greedy or a draw, and the log-probabilities when the
    /// settings ask for them: the log-softmax at temperature 1 of the edited logits, before
    /// temperature and truncation, so the numbers describe the model under the request's
    /// penalties and constraints and do not depend on how the token was drawn. If the edits
    /// ban every token the step yields id 0 (as the GPU sampler does); if a logit is broken
    /// ([`is_broken`]) it yields [`NON_FINITE`].
    pub fn sample_full(&mut self, logits: &[f32]) -> Sampled {
        let edited = self.edited(logits);
        let logits = edited.as_deref().unwrap_or(logits);
        let id = self.checked_draw(logits);
        if id == NON_FINITE {
            return Sampled { id, ..Default::default() };
        }
        if self.params.n_logprobs == 0 {
            return Sampled { id, ..Default::default() };
        }
        let (logprob, top_logprobs) = log_softmax_top(logits, id, self.params.n_logprobs);
        Sampled { id, logprob: Some(logprob), top_logprobs }
    }

    fn edited(&self, logits: &[f32]) -> Option<Vec<f32>> {
        self.has_edits().then(|| {
            let mut l = logits.to_vec();
            self.penalize(&mut l);
            l
        })
    }

    /// [`Sampler::draw`], or [`NON_FINITE`] for a row with a broken logit.
    fn checked_draw(&mut self, logits: &[f32]) -> u32 {
        if logits.iter().any(|&v| is_broken(v)) {
            return NON_FINITE;
        }
        self.draw(logits)
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let dist = self.distribution(logits);
        let mut u = self.rng.next_f64();
        let mut last = None;
        for &(id, p) in &dist {
            // Zero (banned) and NaN (nothing allowed) probabilities are never drawn.
            if p.is_nan() || p <= 0.0 {
                continue;
            }
            if u < p {
                return id;
            }
            u -= p;
            last = Some(id);
        }
        last.unwrap_or_else(|| argmax(logits))
    }
}

fn softmax_f64(logits: impl Iterator<Item = f64> + Clone, temperature: f64) -> Vec<f64> {
    let max = logits.clone().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.map(|l| ((l - max) / temperature).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// The CPU generator's seed for stream `stream` of `seed`; stream 0 is the seed itself.
fn stream_seed(seed: u64, stream: u32) -> u64 {
    if stream == 0 {
        return seed;
    }
    let mut x = seed ^ (stream as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x = (x ^ (x >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

/// A seed from the clock, for requests that give none.
pub fn clock_seed() -> u64 {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::time::{SystemTime, UNIX_EPOCH};
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    }
    #[cfg(target_arch = "wasm32")]
    {
        // No clock in plain wasm32; the wasm crate passes a seed from JS.
        0x5EED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_out_of_range_values() {
        let ok = SamplingParams::default();
        assert!(ok.validate().is_ok());
        let bad = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            p.validate().unwrap_err()
        };
        assert_eq!(bad(|p| p.temperature = -0.1), SamplingError::Temperature(-0.1));
        assert!(matches!(bad(|p| p.temperature = f32::NAN), SamplingError::Temperature(_)));
        assert_eq!(bad(|p| p.temperature = 2.5), SamplingError::Temperature(2.5));
        assert_eq!(bad(|p| p.top_p = 0.0), SamplingError::TopP(0.0));
        assert_eq!(bad(|p| p.top_p = 1.5), SamplingError::TopP(1.5));
        assert_eq!(bad(|p| p.top_k = -2), SamplingError::TopK(-2));
        assert_eq!(bad(|p| p.min_p = 1.1), SamplingError::MinP(1.1));
    }

    /// `edits_before_pending` plus the pending token's occurrence (what the device adds) is
    /// `edits` of the sampler that accepted it: windows full and not, unbounded, the token
    /// already counted, sliding out, biased or new.
    #[test]
    fn edits_before_the_pending_token_plus_it_are_the_edits_after_it() {
        let mut state = 12345u64;
        let mut next = |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % n) as u32
        };
        for case in 0..400 {
            let repeat_last_n = [1, 2, 4, 8, -1][case % 5];
            let logit_bias = if case % 3 == 0 { vec![(2, 0.5), (5, -1.0)] } else { Vec::new() };
            let params = SamplingParams { repeat_penalty: 1.3, frequency_penalty: 0.2, repeat_last_n, logit_bias, ..SamplingParams::greedy() };
            let mut s = Sampler::new(params).unwrap();
            for _ in 0..next(12) {
                s.accept(next(7));
            }
            let pending = next(7);
            let mut got = s.edits_before_pending();
            match got.iter_mut().find(|e| e.id == pending) {
                Some(e) => e.count += 1,
                None => {
                    got.push(LogitEdit { id: pending, count: 1, bias: 0.0 });
                    got.sort_by_key(|e| e.id);
                }
            }
            let mut after = s.clone();
            after.accept(pending);
            assert_eq!(got, after.edits(), "case {case}: window {repeat_last_n}, {:?} then {pending}", s.window);
        }
    }

    #[test]
    fn greedy_picks_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(7), ..Default::default() };
        let draw = || {
            let mut s = Sampler::new(params.clone()).unwrap();
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(), draw());
    }

    #[test]
    fn a_verify_row_draws_what_plain_decoding_draws_there() {
        // Plain decoding: draw, accept, draw... Verify rows: row j draws with after(first j).
        let logits: Vec<Vec<f32>> = (0..6).map(|t| (0..40).map(|i| ((i * 7 + t * 13) % 17) as f32 * 0.25).collect()).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 20, top_p: 0.9, repeat_penalty: 1.5, seed: Some(3), ..Default::default() };
        let base = Sampler::new(params).unwrap();
        let mut plain = base.clone();
        let mut ids = Vec::new();
        for l in &logits {
            let id = plain.sample(l);
            plain.accept(id);
            ids.push(id);
        }
        for (j, l) in logits.iter().enumerate() {
            let mut row = base.after(&ids[..j]);
            assert_eq!(row.sample(l), ids[j], "row {j}");
            assert_eq!(row.next_step(), base.clone().next_step() + j as u32, "row {j}'s device counter");
        }
        let mut resumed = base.clone();
        resumed.sample(&logits[0]);
        resumed.accept(ids[0]);
        resumed.accept_all(&ids[1..3]);
        resumed.advance(2);
        assert_eq!(resumed.sample(&logits[3]), ids[3], "the choice's sampler after two accepted drafts");
    }

    #[test]
    fn truncation_keeps_what_settings_say() {
        let logits = [5.0f32, 4.0, 3.0, 2.0, 1.0];
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 3, top_p: 1.0, min_p: 0.0, seed: Some(1), ..Default::default() }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 3);
        // softmax of [5,4,3,2,1]: 0.636, 0.234, 0.086, ... -> top_p 0.8 keeps two
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.8, min_p: 0.0, seed: Some(1), ..Default::default() }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 2);
        // min_p 0.2: keeps p >= 0.127 -> two
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.2, seed: Some(1), ..Default::default() }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 2);
    }

    #[test]
    fn empirical_distribution_matches_intended() {
        // Chi-square goodness of fit over 10^4 draws, 4 degrees of freedom at p = 0.001: 18.47.
        let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5, -5.0];
        let params = SamplingParams { temperature: 0.7, top_k: 5, top_p: 1.0, min_p: 0.0, seed: Some(42), ..Default::default() };
        let mut s = Sampler::new(params).unwrap();
        let dist = s.distribution(&logits);
        assert_eq!(dist.len(), 5);
        let n = 10_000;
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(counts[5] + counts[6], 0, "top-k cut tokens were drawn");
        let chi2: f64 = dist
            .iter()
            .map(|&(id, p)| {
                let e = p * n as f64;
                (counts[id as usize] as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 18.47, "chi2 = {chi2}, counts {counts:?}");
    }
}
