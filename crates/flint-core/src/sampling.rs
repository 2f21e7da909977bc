//! Sampling settings, their validation, and the CPU sampler: greedy, temperature, top-k,
//! top-p and min-p over the full vocabulary, with a seeded, platform-independent PRNG.

use thiserror::Error;

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
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: None }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature)) {
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
        Ok(())
    }
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

/// Draws tokens from logits with the configured settings.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    seed: u64,
    steps: u32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(clock_seed);
        Ok(Sampler { rng: Rng::new(seed), params, seed, steps: 0 })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (drawn from the clock when the settings gave none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A fresh counter for a device-side draw: devices key their random numbers by
    /// (seed, step), so the same seed and settings give the same tokens on every run.
    pub fn next_step(&mut self) -> u32 {
        let s = self.steps;
        self.steps = self.steps.wrapping_add(1);
        s
    }

    /// The probabilities the settings define, over the surviving candidates, sorted by
    /// descending probability: top-k, then top-p and min-p on the untempered softmax,
    /// then temperature (llama.cpp's default order).
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

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let dist = self.distribution(logits);
        let mut u = self.rng.next_f64();
        for &(id, p) in &dist {
            if u < p {
                return id;
            }
            u -= p;
        }
        dist.last().map_or(0, |d| d.0)
    }
}

fn softmax_f64(logits: impl Iterator<Item = f64> + Clone, temperature: f64) -> Vec<f64> {
    let max = logits.clone().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.map(|l| ((l - max) / temperature).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

fn clock_seed() -> u64 {
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

    #[test]
    fn greedy_picks_first_maximum() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(7) };
        let draw = || {
            let mut s = Sampler::new(params.clone()).unwrap();
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(), draw());
    }

    #[test]
    fn truncation_keeps_what_settings_say() {
        let logits = [5.0f32, 4.0, 3.0, 2.0, 1.0];
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 3, top_p: 1.0, min_p: 0.0, seed: Some(1) }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 3);
        // softmax of [5,4,3,2,1]: 0.636, 0.234, 0.086, ... -> top_p 0.8 keeps two
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.8, min_p: 0.0, seed: Some(1) }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 2);
        // min_p 0.2: keeps p >= 0.127 -> two
        let s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.2, seed: Some(1) }).unwrap();
        assert_eq!(s.distribution(&logits).len(), 2);
    }

    #[test]
    fn empirical_distribution_matches_intended() {
        // Chi-square goodness of fit over 10^4 draws, 4 degrees of freedom at p = 0.001: 18.47.
        let logits = [2.0f32, 1.5, 1.0, 0.5, 0.0, -0.5, -5.0];
        let params = SamplingParams { temperature: 0.7, top_k: 5, top_p: 1.0, min_p: 0.0, seed: Some(42) };
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
