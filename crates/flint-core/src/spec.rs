//! Speculative decoding's pure logic: where drafts come from, how long they are, and which
//! drafted tokens a verify step accepts. A sequence with k drafted tokens runs as one step
//! entry of k + 1 tokens with an output row at every position (see [`crate::sched`]); the
//! target's samples at those rows decide.
//!
//! Drafts here come from n-gram prompt lookup: the continuation of the most recent earlier
//! occurrence of the sequence's last n tokens (prompt and generated), the longest n first, as
//! llama.cpp's n-gram drafts and prompt-lookup decoding do. No second model.

/// Where a sequence's drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecKind {
    #[default]
    None,
    /// N-gram prompt lookup in the sequence's own tokens.
    Ngram,
    /// A draft model (`--model-draft`) with the target's vocabulary drafts greedily.
    Draft,
}

impl std::str::FromStr for SpecKind {
    type Err = String;
    fn from_str(s: &str) -> Result<SpecKind, String> {
        match s {
            "none" => Ok(SpecKind::None),
            "ngram" => Ok(SpecKind::Ngram),
            _ => Err(format!("unknown speculative type {s:?} (none, ngram)")),
        }
    }
}

/// Speculation settings (flag names as llama.cpp's: `--spec-type`, `--draft-max`,
/// `--draft-min`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    pub kind: SpecKind,
    /// The most tokens drafted per step.
    pub draft_max: usize,
    /// Drafts shorter than this are not verified (the step decodes one token instead).
    pub draft_min: usize,
    /// Requests may bring drafts of their own (OpenAI's predicted outputs): the engine keeps
    /// room to verify them even when `kind` is `None`.
    pub predictions: bool,
}

/// Default `--draft-max`.
pub const DRAFT_MAX: usize = 8;
/// Default `--draft-p-min` (llama.cpp's): a draft model stops where its top probability is
/// below this.
pub const DRAFT_P_MIN: f32 = 0.75;
/// The longest n-gram looked up, and the shortest: a 1-token match predicts too little to be
/// worth a verify step's extra tokens.
pub const NGRAM_MAX: usize = 4;
pub const NGRAM_MIN: usize = 2;
/// Sequences a step verifies full drafts for when only predictions draft (see
/// [`SpecConfig::draft_rows`]); more wait for a later step's rows.
pub const PREDICTION_SEQS: usize = 4;
/// Tokens of the sequence searched back from its end (bounds the lookup's cost per step).
pub const NGRAM_WINDOW: usize = 4096;

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig { kind: SpecKind::None, draft_max: DRAFT_MAX, draft_min: 0, predictions: false }
    }
}

impl SpecConfig {
    pub fn ngram() -> SpecConfig {
        SpecConfig { kind: SpecKind::Ngram, ..SpecConfig::default() }
    }

    /// Whether any sequence may verify drafts (the engine reserves output rows for them).
    pub fn drafts(&self) -> bool {
        (self.kind != SpecKind::None || self.predictions) && self.draft_max > 0
    }

    /// Whether every sequence drafts (n-gram lookup or a draft model), rather than only the
    /// requests that bring a prediction.
    pub fn drafts_every_sequence(&self) -> bool {
        self.kind != SpecKind::None && self.draft_max > 0
    }

    /// Output rows an engine of `max_seqs` sequences reserves for drafts: a full draft for
    /// each sequence when every sequence drafts (`kind`); with predictions alone, full drafts
    /// for [`PREDICTION_SEQS`] sequences a step, so that a server that merely accepts
    /// predictions does not grow its logits buffer with its sequence count.
    pub fn draft_rows(&self, max_seqs: usize) -> usize {
        if self.drafts_every_sequence() {
            max_seqs * self.draft_max
        } else if self.drafts() {
            max_seqs.min(PREDICTION_SEQS) * self.draft_max
        } else {
            0
        }
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        if self.draft_min > self.draft_max {
            return Err(SpecError::MinAboveMax { min: self.draft_min, max: self.draft_max });
        }
        if self.draft_max > DRAFT_MAX_LIMIT {
            return Err(SpecError::MaxTooLarge { max: self.draft_max, limit: DRAFT_MAX_LIMIT });
        }
        Ok(())
    }
}

/// The most tokens one step may draft.
pub const DRAFT_MAX_LIMIT: usize = 64;

/// Speculation settings that cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("--draft-min {min} is above --draft-max {max}")]
    MinAboveMax { min: usize, max: usize },
    #[error("--draft-max {max} is above {limit}")]
    MaxTooLarge { max: usize, limit: usize },
}

/// Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix of
/// `tokens` (NGRAM_MAX down to NGRAM_MIN tokens) within the last NGRAM_WINDOW tokens; empty
/// when there is none.
pub fn ngram_draft(tokens: &[u32], k: usize) -> Vec<u32> {
    let hay = &tokens[tokens.len().saturating_sub(NGRAM_WINDOW)..];
    let len = hay.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let suffix = &hay[len - n..];
        // Most recent first; the match must end before the suffix starts, so that at least
        // one token follows it.
        for start in (0..len - n).rev() {
            if &hay[start..start + n] == suffix {
                let from = start + n;
                return hay[from..(from + k).min(len)].to_vec();
            }
        }
    }
    Vec::new()
}

/// Up to `k` tokens of a request's predicted output (`prediction`) that follow where the end
/// of its generated tokens (`generated`, at least one) matches it: the longest tail, NGRAM_MAX
/// tokens down to 1, and among its occurrences the one ending nearest position
/// `generated.len()`, where an output that follows the prediction token for token would be (a
/// repeated line of the prediction is then taken at the copy the output has reached). Empty
/// when no tail occurs.
pub fn prediction_draft(prediction: &[u32], generated: &[u32], k: usize) -> Vec<u32> {
    let (len, at) = (prediction.len(), generated.len());
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=NGRAM_MAX.min(at)).rev() {
        let tail = &generated[at - n..];
        let end = (n..len).filter(|&e| &prediction[e - n..e] == tail).min_by_key(|&e| e.abs_diff(at));
        if let Some(e) = end {
            return prediction[e..(e + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// How many of `n` drafts to verify so that the entry (the pending token and the drafts) ends
/// at the largest of `sizes` it reaches: a 9-token entry becomes 8, a 6-token one 4; entries
/// below the smallest size, and every entry when `sizes` is empty, keep all drafts. Depends on
/// the sequence's own draft only, never on other traffic.
pub fn fit_draft(n: usize, sizes: &[usize]) -> usize {
    match sizes.iter().copied().filter(|&s| s <= n + 1).max() {
        Some(s) => s - 1,
        None => n,
    }
}

/// How many leading drafts the target's samples confirm: draft i is accepted while it equals
/// the token the target drew at row i (the row before it). `target` has one more row than
/// `draft`; the token emitted after the accepted drafts is `target[accepted]`.
///
/// For greedy requests this is the longest prefix equal to the target's argmax. For sampled
/// requests it is the rule of Leviathan et al. and Chen et al. (2023) for a draft that is a
/// point mass q = δ(x) (n-gram lookup, predicted outputs): the row draws y from p; y = x has
/// probability p(x) = min(1, p(x)/q(x)), the acceptance probability, and a y ≠ x is
/// distributed as p with x removed and renormalized, which is norm(max(0, p − q)). Row j
/// draws with the random number plain decoding would use at its position
/// ([`crate::sampling::Sampler::after`]), so the tokens are exactly plain decoding's.
///
/// A draft model that samples its drafts links its rows to the target's on the device
/// ([`crate::sampling::DraftLink`]): there the row keeps x with probability min(1, p(x)/q(x))
/// and otherwise draws from the residual, which never gives x back ([`verify_exact`]), so the
/// same comparison finds the accepted prefix.
pub fn accepted_prefix(draft: &[u32], target: &[u32]) -> usize {
    draft.iter().zip(target).take_while(|(d, t)| d == t).count()
}

/// The rule of Leviathan et al. and Chen et al. (2023), computed exactly: for a drafted token
/// `x` drawn from the draft's distribution `q` (indexed by id; ids past its end have
/// probability 0) and the target's distribution `p` (ids and probabilities, as
/// [`crate::sampling::Sampler::distribution`] gives them), the probability that the row keeps
/// x, min(1, p(x)/q(x)) (1 when p(x) > 0 = q(x), which a draft drawn from q never gives), and
/// the residual norm(max(0, p − q)) the row draws from otherwise (empty when p ≤ q
/// everywhere; then x is always kept). The row's token then follows p: for every y,
/// q(y)·min(1, p(y)/q(y)) + (1 − Σ_x q(x) min(1, p(x)/q(x)))·residual(y) = p(y).
pub fn verify_exact(p: &[(u32, f64)], q: &[f64], x: u32) -> (f64, Vec<(u32, f64)>) {
    let q_at = |id: u32| q.get(id as usize).copied().unwrap_or(0.0);
    let px = p.iter().find(|(id, _)| *id == x).map_or(0.0, |&(_, v)| v);
    let qx = q_at(x);
    let keep = if qx > 0.0 {
        (px / qx).min(1.0)
    } else if px > 0.0 {
        1.0
    } else {
        0.0
    };
    let rest: Vec<(u32, f64)> = p.iter().map(|&(id, v)| (id, v - q_at(id))).filter(|&(_, r)| r > 0.0).collect();
    let mass: f64 = rest.iter().map(|r| r.1).sum();
    (keep, rest.into_iter().map(|(id, r)| (id, r / mass)).collect())
}

/// The distribution of a verified row's token for drafted `x` (see [`verify_exact`]): x with
/// its keep probability, plus the residual's share of the rest; ids ascending.
pub fn verified_distribution(p: &[(u32, f64)], q: &[f64], x: u32) -> Vec<(u32, f64)> {
    let (keep, residual) = verify_exact(p, q, x);
    let mut out: std::collections::BTreeMap<u32, f64> = residual.into_iter().map(|(id, r)| (id, (1.0 - keep) * r)).collect();
    *out.entry(x).or_insert(0.0) += keep;
    out.into_iter().filter(|&(_, v)| v > 0.0).collect()
}

/// Steps a sequence skips drafting after its acceptance falls below [`Adapt::PAUSE_BELOW`].
const PAUSE_STEPS: u32 = 8;

/// One sequence's draft length, adapted to its own recent acceptance only (never to other
/// traffic, so that a seeded request's output does not depend on what else runs): the draft
/// grows back while its drafts are accepted and shrinks to what was accepted when they are
/// not; after a run of poor verify steps drafting pauses for a few steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapt {
    k: usize,
    /// Exponentially weighted acceptance rate of recent verify steps.
    rate: f64,
    verified: u32,
    paused: u32,
}

impl Adapt {
    const PAUSE_BELOW: f64 = 0.2;
    /// Verify steps before a pause can begin (the rate needs a few observations).
    const WARM: u32 = 3;

    pub fn new(cfg: &SpecConfig) -> Adapt {
        Adapt { k: cfg.draft_max, rate: 1.0, verified: 0, paused: 0 }
    }

    /// The most tokens to draft this step (0 while paused); counts a paused step.
    pub fn budget(&mut self, cfg: &SpecConfig) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        self.k.clamp(cfg.draft_min.max(1), cfg.draft_max)
    }

    /// Records a verify step: `drafted` tokens proposed, `accepted` of them taken.
    pub fn record(&mut self, cfg: &SpecConfig, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.verified += 1;
        self.rate = 0.7 * self.rate + 0.3 * accepted as f64 / drafted as f64;
        self.k = if accepted == drafted { (drafted * 2).min(cfg.draft_max) } else { accepted + 1 };
        if self.verified >= Self::WARM && self.rate < Self::PAUSE_BELOW {
            self.paused = PAUSE_STEPS;
            // Start over once drafting resumes.
            (self.rate, self.verified, self.k) = (Self::PAUSE_BELOW, 0, cfg.draft_max.min(2));
        }
    }
}

/// Drafted and accepted tokens, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    pub drafted: u64,
    pub accepted: u64,
}

impl SpecCounts {
    pub fn add(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drawing x from q and then the verified row gives p, for p and q of every shape.
    #[test]
    fn verification_gives_back_the_target_distribution() {
        type Case<'a> = (&'a [(u32, f64)], &'a [f64]);
        let cases: [Case; 5] = [
            // p = q
            (&[(0, 0.5), (1, 0.3), (2, 0.2)], &[0.5, 0.3, 0.2]),
            // disjoint supports
            (&[(0, 0.6), (1, 0.4)], &[0.0, 0.0, 0.7, 0.3]),
            // overlapping, q sharper, a token q lacks and ids past q's end
            (&[(0, 0.1), (1, 0.2), (3, 0.3), (5, 0.4)], &[0.0, 0.9, 0.05, 0.05]),
            // q flatter than p
            (&[(1, 0.9), (2, 0.1)], &[0.25, 0.25, 0.25, 0.25]),
            // p a point mass
            (&[(2, 1.0)], &[0.1, 0.2, 0.7]),
        ];
        for (i, (p, q)) in cases.iter().enumerate() {
            let mut total = [0.0f64; 8];
            for (x, &qx) in q.iter().enumerate().filter(|(_, &v)| v > 0.0) {
                for (id, v) in verified_distribution(p, q, x as u32) {
                    total[id as usize] += qx * v;
                }
            }
            for (id, &t) in total.iter().enumerate() {
                let want = p.iter().find(|e| e.0 == id as u32).map_or(0.0, |e| e.1);
                assert!((t - want).abs() < 1e-12, "case {i}: id {id} comes out with {t}, p gives {want}");
            }
        }
        // p = q keeps every draft; disjoint supports keep none and draw from p.
        assert_eq!(verify_exact(cases[0].0, cases[0].1, 1), (1.0, Vec::new()));
        let (keep, residual) = verify_exact(cases[1].0, cases[1].1, 2);
        assert_eq!(keep, 0.0);
        assert_eq!(residual, cases[1].0.to_vec());
    }

    #[test]
    fn predictions_draft_from_where_the_output_is() {
        let pred = [10, 11, 12, 13, 10, 11, 12, 13, 14];
        // One token out, following the prediction: its continuation.
        assert_eq!(prediction_draft(&pred, &[10], 3), vec![11, 12, 13]);
        // "12 13" occurs twice; five tokens out, the second copy is the nearer.
        assert_eq!(prediction_draft(&pred, &[10, 11, 12, 13, 10, 11, 12, 13], 4), vec![14]);
        assert_eq!(prediction_draft(&pred, &[10, 11, 12, 13], 4), vec![10, 11, 12, 13]);
        // An edit: the output left the prediction; the longest tail that matches realigns it.
        assert_eq!(prediction_draft(&pred, &[10, 99, 12], 2), vec![13, 10]);
        // Nothing matches, or the match ends the prediction: nothing.
        assert!(prediction_draft(&pred, &[7], 4).is_empty());
        assert!(prediction_draft(&pred, &[14], 4).is_empty());
        assert!(prediction_draft(&pred, &[10], 0).is_empty());
        assert!(prediction_draft(&[], &[10], 4).is_empty());
    }

    #[test]
    fn ngram_takes_the_longest_most_recent_match() {
        // "1 2 3 4" occurs twice; the last two tokens "3 4" also end both.
        let t = [1, 2, 3, 4, 9, 9, 1, 2, 3, 4, 5, 6, 7, 0, 2, 3, 4];
        // Suffix 4-gram "0 2 3 4" never occurred; the 3-gram "2 3 4" did, most recently at 7.
        assert_eq!(ngram_draft(&t, 3), vec![5, 6, 7]);
        assert_eq!(ngram_draft(&t, 10), vec![5, 6, 7, 0, 2, 3, 4]);
        assert_eq!(ngram_draft(&t, 0), Vec::<u32>::new());
        // No repeated bigram at the end: nothing.
        assert!(ngram_draft(&[1, 2, 3, 4, 5], 4).is_empty());
        // A single repeated token is below NGRAM_MIN.
        assert!(ngram_draft(&[7, 1, 2, 7], 4).is_empty());
        // Too short to search.
        assert!(ngram_draft(&[5, 5], 4).is_empty());
        // A run of one token drafts more of it.
        assert_eq!(ngram_draft(&[5, 5, 5, 5], 4), vec![5]);
    }

    #[test]
    fn drafts_fit_the_verify_sizes() {
        let sizes = [4, 8, 16];
        let fitted: Vec<usize> = (0..=16).map(|n| fit_draft(n, &sizes)).collect();
        assert_eq!(fitted, [0, 1, 2, 3, 3, 3, 3, 7, 7, 7, 7, 7, 7, 7, 7, 15, 15]);
        assert_eq!(fit_draft(8, &[]), 8);
    }

    #[test]
    fn greedy_acceptance_stops_at_the_first_mismatch() {
        assert_eq!(accepted_prefix(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(accepted_prefix(&[1, 2, 3], &[1, 5, 3, 4]), 1);
        assert_eq!(accepted_prefix(&[1, 2, 3], &[9, 2, 3, 4]), 0);
        assert_eq!(accepted_prefix(&[], &[9]), 0);
    }

    #[test]
    fn draft_length_follows_the_sequence_own_acceptance() {
        let cfg = SpecConfig { kind: SpecKind::Ngram, draft_max: 8, draft_min: 0, predictions: false };
        let mut a = Adapt::new(&cfg);
        assert_eq!(a.budget(&cfg), 8);
        a.record(&cfg, 8, 2);
        assert_eq!(a.budget(&cfg), 3);
        a.record(&cfg, 3, 3);
        assert_eq!(a.budget(&cfg), 6);
        // Rejections in a row pause drafting, then it resumes short.
        let mut rejected = 0;
        while a.paused == 0 {
            let k = a.budget(&cfg);
            a.record(&cfg, k, 0);
            rejected += 1;
            assert!(rejected < 10, "never paused");
        }
        let paused: Vec<usize> = (0..PAUSE_STEPS).map(|_| a.budget(&cfg)).collect();
        assert!(paused.iter().all(|&k| k == 0), "{paused:?}");
        assert_eq!(a.budget(&cfg), 2);
        // draft_min raises the floor.
        let cfg = SpecConfig { draft_min: 4, ..cfg };
        let mut a = Adapt::new(&cfg);
        a.record(&cfg, 8, 0);
        assert_eq!(a.budget(&cfg), 4);
    }

    #[test]
    fn settings_are_checked() {
        assert!(SpecConfig { draft_min: 5, draft_max: 4, kind: SpecKind::Ngram, predictions: false }.validate().is_err());
        let predictions = SpecConfig { predictions: true, ..SpecConfig::default() };
        assert_eq!((SpecConfig::default().draft_rows(8), SpecConfig::ngram().draft_rows(8)), (0, 64));
        assert_eq!((predictions.draft_rows(8), predictions.draft_rows(2)), (PREDICTION_SEQS * 8, 16));
        assert!(SpecConfig::ngram().validate().is_ok());
        assert_eq!("ngram".parse::<SpecKind>(), Ok(SpecKind::Ngram));
        assert!("draft".parse::<SpecKind>().is_err());
    }
}
