//! The full CPU sampler: repetition/presence/frequency penalties and logit bias against
//! hand-computed values, the allowed-token mask, log-probabilities, every validation range,
//! a chi-square test of a penalized + biased + top-k + temperature draw, and seeded runs.

use flint_core::sampling::{log_softmax_top, LogitEdit, Sampler, SamplingError, SamplingParams, MAX_LOGPROBS};

const LOGITS: [f32; 8] = [1.0, 2.0, -1.0, 3.0, 0.5, -2.0, 0.0, 4.0];

fn params() -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(1), ..Default::default() }
}

fn penalized(p: SamplingParams, history: &[u32], logits: &[f32]) -> Vec<f32> {
    let mut s = Sampler::new(p).unwrap();
    s.accept_all(history);
    let mut l = logits.to_vec();
    s.penalize(&mut l);
    l
}

fn assert_close(got: &[f32], want: &[f32], label: &str) {
    assert_eq!(got.len(), want.len(), "{label}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0);
        assert!(ok, "{label}: logit {i} is {g}, want {w}\n got  {got:?}\n want {want:?}");
    }
}

#[test]
fn penalties_match_hand_computed_values() {
    let history = [1, 2, 2, 6, 3, 5, 5, 1];
    let p = SamplingParams { repeat_penalty: 1.5, repeat_last_n: 5, presence_penalty: 0.5, frequency_penalty: 0.25, ..params() };
    // Window [6, 3, 5, 5, 1]: positive logits / 1.5, others × 1.5, then − (0.25·count + 0.5).
    let want = [1.0, 2.0 / 1.5 - 0.75, -1.0, 3.0 / 1.5 - 0.75, 0.5, -2.0 * 1.5 - 1.0, 0.0 - 0.75, 4.0];
    assert_close(&penalized(p.clone(), &history, &LOGITS), &want, "window 5");

    // The whole context: 1 ×2, 2 ×2, 3, 5 ×2, 6.
    let whole = SamplingParams { repeat_last_n: -1, ..p.clone() };
    let want = [1.0, 2.0 / 1.5 - 1.0, -1.5 - 1.0, 3.0 / 1.5 - 0.75, 0.5, -2.0 * 1.5 - 1.0, 0.0 - 0.75, 4.0];
    assert_close(&penalized(whole, &history, &LOGITS), &want, "whole context");

    // Each penalty alone.
    let rep = SamplingParams { repeat_penalty: 2.0, repeat_last_n: 3, ..params() };
    let want = [1.0, 1.0, -1.0, 3.0, 0.5, -4.0, 0.0, 4.0];
    assert_close(&penalized(rep, &history, &LOGITS), &want, "repeat only");
    let pres = SamplingParams { presence_penalty: -1.0, repeat_last_n: 3, ..params() };
    let want = [1.0, 3.0, -1.0, 3.0, 0.5, -1.0, 0.0, 4.0];
    assert_close(&penalized(pres, &history, &LOGITS), &want, "presence only");
    let freq = SamplingParams { frequency_penalty: 2.0, repeat_last_n: 3, ..params() };
    let want = [1.0, 0.0, -1.0, 3.0, 0.5, -6.0, 0.0, 4.0];
    assert_close(&penalized(freq, &history, &LOGITS), &want, "frequency only");

    // repeat_last_n = 0 switches every penalty off.
    let off = SamplingParams { repeat_last_n: 0, ..p };
    assert_eq!(penalized(off, &history, &LOGITS), LOGITS.to_vec());
}

#[test]
fn window_slides_and_edits_are_sorted_and_unique() {
    let p = SamplingParams { repeat_penalty: 1.1, repeat_last_n: 3, logit_bias: vec![(4, 1.0), (1, 0.5), (4, 0.25), (9, -1.0)], ..params() };
    let mut s = Sampler::new(p).unwrap();
    s.accept_all(&[7, 7, 1, 2]);
    // Window [7, 1, 2]: the first 7 has left it.
    let e = s.edits();
    let want = [
        LogitEdit { id: 1, count: 1, bias: 0.5 },
        LogitEdit { id: 2, count: 1, bias: 0.0 },
        LogitEdit { id: 4, count: 0, bias: 1.25 },
        LogitEdit { id: 7, count: 1, bias: 0.0 },
        LogitEdit { id: 9, count: 0, bias: -1.0 },
    ];
    assert_eq!(e, want);
    s.accept_all(&[2, 2, 2]);
    assert_eq!(s.edits().iter().map(|e| (e.id, e.count)).collect::<Vec<_>>(), [(1, 0), (2, 3), (4, 0), (9, 0)]);
    // Without a penalty, accepting is free and nothing is counted.
    let mut s = Sampler::new(params()).unwrap();
    s.accept_all(&[1, 2, 3]);
    assert!(s.edits().is_empty() && !s.has_edits());
}

#[test]
fn logit_bias_adds_after_penalties_and_bans() {
    let p =
        SamplingParams { temperature: 0.0, repeat_penalty: 2.0, logit_bias: vec![(0, 1.5), (7, f32::NEG_INFINITY), (0, 0.5), (4, -2.0), (3, 1.0)], ..params() };
    let mut s = Sampler::new(p.clone()).unwrap();
    s.accept(3);
    let mut l = LOGITS.to_vec();
    s.penalize(&mut l);
    // Token 3 is penalized first (3 / 2) and then biased (+1).
    assert_close(&l, &[3.0, 2.0, -1.0, 2.5, -1.5, -2.0, 0.0, f32::NEG_INFINITY], "bias");
    // Greedy: the banned 4.0 loses to the biased 3.0.
    assert_eq!(s.sample(&LOGITS), 0);
    assert_eq!(s.sample_full(&LOGITS).id, 0);
    // Sampling never draws a banned token.
    let mut s = Sampler::new(SamplingParams { temperature: 1.5, ..p }).unwrap();
    assert!((0..2000).all(|_| s.sample(&LOGITS) != 7));
}

#[test]
fn mask_allows_only_set_bits() {
    let n = 40;
    let logits: Vec<f32> = (0..n).map(|i| ((i * 7) % 13) as f32 * 0.3).collect();
    let allowed = [1u32, 3, 6, 33];
    let mut mask = vec![0u32; 2];
    for &a in &allowed {
        mask[a as usize / 32] |= 1 << (a % 32);
    }
    let mut s = Sampler::new(SamplingParams { temperature: 0.0, ..params() }).unwrap();
    s.set_mask(Some(mask.clone()));
    assert!(s.check_vocab(n).is_ok());
    let best = *allowed.iter().max_by(|&&a, &&b| logits[a as usize].total_cmp(&logits[b as usize]).then(b.cmp(&a))).unwrap();
    assert_eq!(s.sample(&logits), best);
    let mut l = logits.clone();
    s.penalize(&mut l);
    for (i, &v) in l.iter().enumerate() {
        assert_eq!(v.is_finite(), allowed.contains(&(i as u32)), "token {i}");
    }
    let mut s = Sampler::new(SamplingParams { temperature: 2.0, ..params() }).unwrap();
    s.set_mask(Some(mask));
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2000 {
        let id = s.sample(&logits);
        assert!(allowed.contains(&id), "drew disallowed {id}");
        seen.insert(id);
    }
    assert_eq!(seen.len(), allowed.len());
    s.set_mask(None);
    assert!(!s.has_edits());
    // A mask banning everything: token 0, as the GPU sampler.
    s.set_mask(Some(vec![0, 0]));
    assert_eq!(s.sample(&logits), 0);
}

#[test]
fn logprobs_are_sorted_normalized_and_temperature_free() {
    let logits: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.11).collect();
    let mut tied = logits.clone();
    tied[10] = 9.0;
    tied[20] = 9.0;
    let n = 7;
    let base = SamplingParams { n_logprobs: n, logit_bias: vec![(5, f32::NEG_INFINITY)], ..params() };
    let mut runs = Vec::new();
    for t in [0.0f32, 0.5, 1.7] {
        let mut s = Sampler::new(SamplingParams { temperature: t, ..base.clone() }).unwrap();
        let r = s.sample_full(&tied);
        assert_eq!(r.top_logprobs.len(), n);
        // The tie at the top: lower id first.
        assert_eq!(r.top_logprobs[0].0, 10);
        assert_eq!(r.top_logprobs[1].0, 20);
        assert!(r.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1), "not descending: {:?}", r.top_logprobs);
        assert!(r.top_logprobs.iter().all(|&(id, lp)| id != 5 && lp <= 0.0));
        let chosen = r.logprob.unwrap();
        if let Some(&(_, lp)) = r.top_logprobs.iter().find(|e| e.0 == r.id) {
            assert_eq!(lp, chosen);
        }
        if t == 0.0 {
            assert_eq!(r.id, 10);
        }
        runs.push(r.top_logprobs);
    }
    assert!(runs.windows(2).all(|w| w[0] == w[1]), "log-probabilities must not depend on temperature");
    // Over the whole vocabulary the probabilities sum to 1; the banned token is absent.
    let (_, all) = log_softmax_top(&tied, 0, tied.len());
    assert_eq!(all.len(), tied.len());
    let sum: f64 = all.iter().map(|&(_, lp)| (lp as f64).exp()).sum();
    assert!((sum - 1.0).abs() < 1e-5, "sum {sum}");
    let s = Sampler::new(SamplingParams { n_logprobs: tied.len().min(MAX_LOGPROBS), ..base }).unwrap();
    let mut banned = tied.clone();
    s.penalize(&mut banned);
    let (lp5, all) = log_softmax_top(&banned, 5, banned.len());
    assert_eq!(lp5, f32::NEG_INFINITY);
    assert_eq!(all.len(), tied.len() - 1);
    // No logprobs unless asked.
    let r = Sampler::new(params()).unwrap().sample_full(&tied);
    assert!(r.logprob.is_none() && r.top_logprobs.is_empty());
}

#[test]
fn validation_rejects_each_range() {
    let bad = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        p.validate().unwrap_err()
    };
    let good = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        p.validate().unwrap_or_else(|e| panic!("{p:?}: {e}"))
    };
    use SamplingError as E;
    assert_eq!(bad(&|p| p.temperature = -0.1), E::Temperature(-0.1));
    assert_eq!(bad(&|p| p.temperature = 2.01), E::Temperature(2.01));
    assert!(matches!(bad(&|p| p.temperature = f32::INFINITY), E::Temperature(_)));
    assert!(matches!(bad(&|p| p.temperature = f32::NAN), E::Temperature(_)));
    assert_eq!(bad(&|p| p.top_p = 0.0), E::TopP(0.0));
    assert_eq!(bad(&|p| p.top_p = 1.01), E::TopP(1.01));
    assert!(matches!(bad(&|p| p.top_p = f32::NAN), E::TopP(_)));
    assert_eq!(bad(&|p| p.top_k = -2), E::TopK(-2));
    assert_eq!(bad(&|p| p.min_p = -0.01), E::MinP(-0.01));
    assert_eq!(bad(&|p| p.min_p = 1.01), E::MinP(1.01));
    assert_eq!(bad(&|p| p.repeat_penalty = 0.0), E::RepeatPenalty(0.0));
    assert_eq!(bad(&|p| p.repeat_penalty = -1.0), E::RepeatPenalty(-1.0));
    assert_eq!(bad(&|p| p.repeat_penalty = f32::INFINITY), E::RepeatPenalty(f32::INFINITY));
    assert!(matches!(bad(&|p| p.repeat_penalty = f32::NAN), E::RepeatPenalty(_)));
    assert_eq!(bad(&|p| p.repeat_last_n = -2), E::RepeatLastN(-2));
    assert_eq!(bad(&|p| p.presence_penalty = 2.5), E::PresencePenalty(2.5));
    assert_eq!(bad(&|p| p.presence_penalty = -2.5), E::PresencePenalty(-2.5));
    assert!(matches!(bad(&|p| p.presence_penalty = f32::NAN), E::PresencePenalty(_)));
    assert_eq!(bad(&|p| p.frequency_penalty = 2.1), E::FrequencyPenalty(2.1));
    assert_eq!(bad(&|p| p.frequency_penalty = -2.1), E::FrequencyPenalty(-2.1));
    assert_eq!(bad(&|p| p.n_logprobs = 21), E::NLogprobs(21));
    assert!(matches!(bad(&|p| p.logit_bias = vec![(3, 1.0), (4, f32::NAN)]), E::LogitBias { id: 4, .. }));
    assert_eq!(bad(&|p| p.logit_bias = vec![(9, f32::INFINITY)]), E::LogitBias { id: 9, bias: f32::INFINITY });
    // Every boundary that is allowed.
    good(&|p| p.temperature = 2.0);
    good(&|p| p.temperature = 0.0);
    good(&|p| p.top_p = 1.0);
    good(&|p| p.top_k = -1);
    good(&|p| p.min_p = 1.0);
    good(&|p| p.repeat_penalty = 1e-3);
    good(&|p| p.repeat_last_n = -1);
    good(&|p| {
        p.presence_penalty = -2.0;
        p.frequency_penalty = 2.0;
    });
    good(&|p| p.n_logprobs = 20);
    good(&|p| p.logit_bias = vec![(0, f32::NEG_INFINITY), (1, -100.0)]);
    // Messages name the setting and the value.
    assert_eq!(E::RepeatLastN(-2).to_string(), "repeat_last_n must be -1 (the whole context), 0 (off) or positive, got -2");
    // Sampler::new validates too.
    assert!(Sampler::new(SamplingParams { n_logprobs: 99, ..Default::default() }).is_err());
}

#[test]
fn vocabulary_checks() {
    let n_vocab = 100;
    let s = Sampler::new(SamplingParams { logit_bias: vec![(99, 1.0), (100, 1.0)], ..Default::default() }).unwrap();
    assert_eq!(s.check_vocab(n_vocab), Err(SamplingError::OutOfVocab { what: "logit_bias", id: 100, n_vocab }));
    let mut s = Sampler::new(SamplingParams { repeat_penalty: 1.3, ..Default::default() }).unwrap();
    s.accept_all(&[5, 150]);
    assert_eq!(s.check_vocab(n_vocab), Err(SamplingError::OutOfVocab { what: "the token history", id: 150, n_vocab }));
    let mut s = Sampler::new(SamplingParams::default()).unwrap();
    s.set_mask(Some(vec![u32::MAX; 3]));
    assert_eq!(s.check_vocab(n_vocab), Err(SamplingError::MaskLength { words: 3, n_vocab, needed: 4 }));
    s.set_mask(Some(vec![u32::MAX; 4]));
    assert!(s.check_vocab(n_vocab).is_ok());
}

#[test]
fn penalized_topk_temperature_draws_match_intended_distribution() {
    // Chi-square over 10^4 seeded draws; 5 degrees of freedom at p = 0.001: 20.52.
    let logits = [2.0f32, 1.8, 1.5, 1.2, 1.0, 0.7, 0.4, -0.3, -1.0, -3.0, 2.2, 0.1];
    let history = [0u32, 10, 10, 3, 11];
    let p = SamplingParams {
        temperature: 0.8,
        top_k: 6,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(99),
        repeat_penalty: 1.3,
        repeat_last_n: 8,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        logit_bias: vec![(1, -0.5), (8, 2.5), (2, f32::NEG_INFINITY)],
        n_logprobs: 0,
    };
    let mut s = Sampler::new(p).unwrap();
    s.accept_all(&history);
    // By hand: 0: 2/1.3 − 0.3; 10: 2.2/1.3 − 0.4; 3: 1.2/1.3 − 0.3; 11: 0.1/1.3 − 0.3;
    // 1: 1.8 − 0.5; 8: −1 + 2.5; 2: banned.
    let mut want = logits;
    want[0] = 2.0 / 1.3 - 0.3;
    want[10] = 2.2 / 1.3 - 0.4;
    want[3] = 1.2 / 1.3 - 0.3;
    want[11] = 0.1 / 1.3 - 0.3;
    want[1] = 1.8 - 0.5;
    want[8] = -1.0 + 2.5;
    want[2] = f32::NEG_INFINITY;
    let mut got = logits.to_vec();
    s.penalize(&mut got);
    assert_close(&got, &want, "edited logits");
    let dist = s.distribution(&want);
    assert_eq!(dist.len(), 6);
    let n = 10_000;
    let mut counts = [0usize; 12];
    for _ in 0..n {
        counts[s.sample_full(&logits).id as usize] += 1;
    }
    let kept: Vec<u32> = dist.iter().map(|d| d.0).collect();
    for (id, &c) in counts.iter().enumerate() {
        assert!(c == 0 || kept.contains(&(id as u32)), "drew {id}, outside the top-k set {kept:?}");
    }
    let chi2: f64 = dist
        .iter()
        .map(|&(id, p)| {
            let e = p * n as f64;
            (counts[id as usize] as f64 - e).powi(2) / e
        })
        .sum();
    eprintln!("chi2 {chi2:.2}, counts {counts:?}");
    assert!(chi2 < 20.52, "chi2 = {chi2}, counts {counts:?}, dist {dist:?}");
}

/// A generation-like run: each drawn token is fed back into the history.
fn run(seed: u64, steps: usize) -> Vec<(u32, Option<f32>)> {
    let p = SamplingParams {
        seed: Some(seed),
        repeat_penalty: 1.2,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        logit_bias: vec![(3, 0.7)],
        n_logprobs: 3,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(p).unwrap();
    s.accept_all(&[1, 2, 3]);
    let mut out = Vec::new();
    for step in 0..steps {
        let logits: Vec<f32> = (0..64).map(|i| (((i * 31 + step * 17) % 23) as f32) * 0.2).collect();
        let r = s.sample_full(&logits);
        s.accept(r.id);
        out.push((r.id, r.logprob));
    }
    out
}

#[test]
fn seeded_runs_are_reproducible() {
    let a = run(2024, 200);
    assert_eq!(a, run(2024, 200));
    assert_ne!(a, run(2025, 200));
    let distinct: std::collections::HashSet<u32> = a.iter().map(|r| r.0).collect();
    assert!(distinct.len() > 5, "the penalties should spread the draws: {distinct:?}");
}
