//! The load-time self-test: a short fixed input through the embedding, the first layer and the
//! head, on the GPU and on the CPU reference, compared at named taps (the residual stream
//! after the attention block and after the feed-forward block, and the logits). WebGPU drivers
//! differ; a driver that computes wrongly fails the load here, naming the adapter and the
//! first tap that differs, instead of talking nonsense later.
//!
//! The probe is a 7-token prompt step (its first and last rows through the head) followed by a
//! 1-token decode step over it: the two kernel families a request meets most (multi-token
//! tiles and the one-token path), and attention over a cached prefix.

use thiserror::Error;

/// The largest normalized mean squared error a tap may show: Σ(gpu − cpu)² / Σ cpu².
pub const MAX_NMSE: f64 = 1e-5;
/// The bound where the backend's kernels round activations to 8 bits (`FLINT_TUNE`
/// `q8_act=on` on a GPU, outside the exact mode; see `Backend::self_test_bound`): llama.cpp's
/// bound for quantized matmuls. A driver that computes wrongly lands far past it (a gated
/// activation that loses one row in 16 is about 6e-2).
pub const MAX_NMSE_Q8: f64 = 5e-4;

/// One step of the probe: `tokens` from position `start`; `outputs` are the rows (indices
/// into `tokens`) that go through the head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStep {
    pub tokens: Vec<u32>,
    pub start: usize,
    pub outputs: Vec<usize>,
    /// What the step is, in reports: `prompt` or `decode`.
    pub kind: &'static str,
}

/// The fixed input: one sequence whose KV sits in blocks 0.. of every group (a probe runs at
/// load, before any request holds a block).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub steps: Vec<ProbeStep>,
}

/// Where a tap reads the activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapPoint {
    /// Layer 0's residual stream after its attention block (norms and residual add included).
    Attention,
    /// Layer 0's residual stream after its feed-forward block.
    FeedForward,
    /// The head over layer 0's output: the final norm, the logits and any soft cap.
    Logits,
}

impl TapPoint {
    pub const ALL: [TapPoint; 3] = [TapPoint::Attention, TapPoint::FeedForward, TapPoint::Logits];

    pub fn describe(self) -> &'static str {
        match self {
            TapPoint::Attention => "layer 0 after attention",
            TapPoint::FeedForward => "layer 0 after the feed-forward block",
            TapPoint::Logits => "logits",
        }
    }
}

/// The activations at one tap of one probe step: [rows, row length] f32, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tap {
    pub step: usize,
    pub point: TapPoint,
    pub values: Vec<f32>,
}

/// One tap's agreement.
#[derive(Clone, Debug, PartialEq)]
pub struct TapReport {
    /// `prompt step: layer 0 after attention`.
    pub name: String,
    pub nmse: f64,
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum SelfTestError {
    #[error("{name} differs from the CPU reference (NMSE {nmse:.2e} > {bound:.0e})")]
    Mismatch { name: String, nmse: f64, bound: f64 },
    #[error("{name}: {got} values from the GPU, {want} from the CPU reference")]
    Shape { name: String, got: usize, want: usize },
    #[error("the {which} produced no tap {name}")]
    Missing { name: String, which: &'static str },
}

impl Probe {
    /// Tokens in the prompt step.
    pub const PROMPT: usize = 7;

    /// The standard probe for a vocabulary of `n_vocab`: ids spread over it by a fixed
    /// sequence (the same on every machine), so several embedding rows and formats' blocks
    /// are read.
    pub fn standard(n_vocab: usize) -> Probe {
        Self::within(n_vocab, Self::PROMPT, 2)
    }

    /// The standard probe cut to a backend's step limits (`flint serve --max-batch-tokens 3`):
    /// a prompt step of at most `max_tokens` tokens (at least one), its first and last rows
    /// out where `max_outputs` allows two, else its last. Requests under the same limits take
    /// the same kernels.
    pub fn within(n_vocab: usize, max_tokens: usize, max_outputs: usize) -> Probe {
        let n = n_vocab.max(1) as u64;
        let id = |i: u64| ((i * 2_654_435_761 + 1_013) % n) as u32;
        let len = Self::PROMPT.min(max_tokens).max(1);
        let prompt: Vec<u32> = (0..len as u64).map(id).collect();
        let decode = vec![id(len as u64)];
        let outputs = if len > 1 && max_outputs >= 2 { vec![0, len - 1] } else { vec![len - 1] };
        Probe {
            steps: vec![
                ProbeStep { tokens: prompt, start: 0, outputs, kind: "prompt" },
                ProbeStep { tokens: decode, start: len, outputs: vec![0], kind: "decode" },
            ],
        }
    }

    /// Positions the probe's sequence holds at the end.
    pub fn len(&self) -> usize {
        self.steps.iter().map(|s| s.start + s.tokens.len()).max().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The block table of every group: blocks 0.. covering the probe's positions.
    pub fn table(&self, block_size: usize) -> Vec<u32> {
        (0..self.len().div_ceil(block_size.max(1)) as u32).collect()
    }

    /// The most tokens and output rows one of its steps has.
    pub fn max_step(&self) -> (usize, usize) {
        let tokens = self.steps.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        let outputs = self.steps.iter().map(|s| s.outputs.len()).max().unwrap_or(0);
        (tokens, outputs)
    }

    /// `prompt step: logits`.
    pub fn tap_name(&self, step: usize, point: TapPoint) -> String {
        let kind = self.steps.get(step).map_or("probe", |s| s.kind);
        format!("{kind} step: {}", point.describe())
    }
}

/// Σ(got − want)² / Σ want², in f64; infinite when either holds NaN or infinity, or when
/// `want` is all zeros and `got` is not.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() || !w.is_finite() {
            return f64::INFINITY;
        }
        let d = g as f64 - w as f64;
        err += d * d;
        norm += w as f64 * w as f64;
    }
    match (err, norm) {
        (0.0, _) => 0.0,
        (_, 0.0) => f64::INFINITY,
        (e, n) => e / n,
    }
}

/// Compares the GPU's taps with the reference's, in probe order (step by step, tap by tap):
/// every tap's NMSE, or the first that exceeds `bound` ([`MAX_NMSE`], or [`MAX_NMSE_Q8`] for
/// kernels on 8-bit activations).
pub fn compare(probe: &Probe, gpu: &[Tap], cpu: &[Tap], bound: f64) -> Result<Vec<TapReport>, SelfTestError> {
    let mut reports = Vec::new();
    for step in 0..probe.steps.len() {
        for point in TapPoint::ALL {
            let name = probe.tap_name(step, point);
            fn find<'t>(taps: &'t [Tap], step: usize, point: TapPoint, name: &str, which: &'static str) -> Result<&'t Tap, SelfTestError> {
                taps.iter().find(|t| t.step == step && t.point == point).ok_or_else(|| SelfTestError::Missing { name: name.to_string(), which })
            }
            let (g, c) = (find(gpu, step, point, &name, "GPU")?, find(cpu, step, point, &name, "CPU reference")?);
            if g.values.len() != c.values.len() {
                return Err(SelfTestError::Shape { name, got: g.values.len(), want: c.values.len() });
            }
            let e = nmse(&g.values, &c.values);
            // Not `e > MAX`: a NaN fails too.
            if e.is_nan() || e > bound {
                return Err(SelfTestError::Mismatch { name, nmse: e, bound });
            }
            reports.push(TapReport { name, nmse: e });
        }
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taps(probe: &Probe, scale: impl Fn(usize, TapPoint) -> f32) -> Vec<Tap> {
        let mut v = Vec::new();
        for step in 0..probe.steps.len() {
            for point in TapPoint::ALL {
                let values = (0..64).map(|i| (i as f32 * 0.37).sin() * scale(step, point)).collect();
                v.push(Tap { step, point, values });
            }
        }
        v
    }

    #[test]
    fn the_standard_probe_stays_in_the_vocabulary_and_one_block() {
        for n_vocab in [1, 2, 7, 1000, 262_144] {
            let p = Probe::standard(n_vocab);
            assert!(p.steps.iter().flat_map(|s| &s.tokens).all(|&t| (t as usize) < n_vocab));
            assert_eq!(p.len(), Probe::PROMPT + 1);
            assert_eq!(p.table(16), vec![0]);
            assert_eq!(p.table(4), vec![0, 1]);
            assert_eq!(p.max_step(), (Probe::PROMPT, 2));
        }
        // Different rows of a real vocabulary.
        let p = Probe::standard(151_936);
        let mut ids = p.steps[0].tokens.clone();
        ids.dedup();
        assert_eq!(ids.len(), Probe::PROMPT);
    }

    #[test]
    fn a_probe_within_small_step_limits_fits_them() {
        for (max_tokens, max_outputs, step, outputs) in
            [(3, 9, 3, vec![0, 2]), (3, 1, 3, vec![2]), (1, 9, 1, vec![0]), (0, 0, 1, vec![0]), (64, 64, 7, vec![0, 6])]
        {
            let p = Probe::within(1000, max_tokens, max_outputs);
            assert_eq!(p.steps[0].tokens.len(), step, "{max_tokens} / {max_outputs}");
            assert_eq!(p.steps[0].outputs, outputs, "{max_tokens} / {max_outputs}");
            assert_eq!((p.steps[1].start, p.len()), (step, step + 1));
            assert_eq!(p.steps[0].tokens, Probe::standard(1000).steps[0].tokens[..step]);
        }
    }

    #[test]
    fn nmse_is_relative_and_catches_non_finite_values() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = nmse(&[1.1, 2.0], &[1.0, 2.0]);
        assert!((e - 0.01 / 5.0).abs() < 1e-9, "{e}");
        assert_eq!(nmse(&[f32::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(nmse(&[1.0], &[f32::INFINITY]), f64::INFINITY);
        assert_eq!(nmse(&[1.0], &[0.0]), f64::INFINITY);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
    }

    #[test]
    fn compare_names_the_first_tap_that_differs() {
        let p = Probe::standard(1000);
        let cpu = taps(&p, |_, _| 1.0);
        let same = compare(&p, &cpu, &cpu, MAX_NMSE).unwrap();
        assert_eq!(same.len(), 6);
        assert_eq!(same[0].name, "prompt step: layer 0 after attention");
        assert_eq!(same[5].name, "decode step: logits");
        // The feed-forward tap of the prompt step is 1% off (NMSE 1e-4); later taps are too.
        let gpu = taps(&p, |s, t| if s == 0 && t == TapPoint::Attention { 1.0 } else { 1.01 });
        match compare(&p, &gpu, &cpu, MAX_NMSE) {
            Err(e @ SelfTestError::Mismatch { .. }) => {
                assert!(e.to_string().contains("> 1e-5"), "{e}");
                let SelfTestError::Mismatch { name, nmse, .. } = e else { unreachable!() };
                assert_eq!(name, "prompt step: layer 0 after the feed-forward block");
                assert!((nmse - 1e-4).abs() < 1e-6, "{nmse}");
            }
            other => panic!("{other:?}"),
        }
        // The 8-bit activations' bound lets 1% pass, not 5%.
        assert!(compare(&p, &gpu, &cpu, MAX_NMSE_Q8).is_ok());
        let far = taps(&p, |_, _| 1.05);
        assert!(matches!(compare(&p, &far, &cpu, MAX_NMSE_Q8), Err(SelfTestError::Mismatch { .. })));
        // Within the bound: 0.1% off is NMSE 1e-6.
        let close = taps(&p, |_, _| 1.001);
        assert!(compare(&p, &close, &cpu, MAX_NMSE).is_ok());
        let mut short = cpu.clone();
        short[2].values.pop();
        assert!(matches!(compare(&p, &short, &cpu, MAX_NMSE), Err(SelfTestError::Shape { .. })));
        assert!(matches!(compare(&p, &cpu[..3], &cpu, MAX_NMSE), Err(SelfTestError::Missing { which: "GPU", .. })));
    }
}
