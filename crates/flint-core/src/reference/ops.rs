//! Plain f32 operations of the reference forward pass; the oracle GPU kernels are tested against.

use crate::arch::RopeStyle;
use crate::quant::{self, QuantType};

/// Rows of a weight matrix handled by one parallel task (dequantized once per call).
const ROWS_PER_TASK: usize = 16;
/// Tokens whose activations are reused against a band of rows while in cache.
const TOKENS_PER_TILE: usize = 16;

/// Dot product with eight independent accumulators so the compiler vectorizes it.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// y[t, r] = Σ_i W[r, i] · x[t, i] for a raw GGUF weight `w` of `n_out` rows of `n_in` elements.
/// x: [n_tok, n_in] f32, returns [n_tok, n_out] f32. Each task dequantizes a band of rows once
/// and walks the tokens in tiles, so both stay in cache for long prompts.
pub fn matmul(ty: QuantType, w: &[u8], n_in: usize, n_out: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), n_tok * n_in);
    let row_bytes = w.len() / n_out;
    let mut yt = vec![0f32; n_out * n_tok];
    let task = |(chunk_idx, out): (usize, &mut [f32])| {
        let rows = out.len() / n_tok;
        let first = chunk_idx * ROWS_PER_TASK;
        let mut deq = vec![0f32; rows * n_in];
        for (j, dst) in deq.chunks_mut(n_in).enumerate() {
            let r = first + j;
            quant::dequantize(ty, &w[r * row_bytes..(r + 1) * row_bytes], dst).expect("row size checked at load");
        }
        for t0 in (0..n_tok).step_by(TOKENS_PER_TILE) {
            let t1 = (t0 + TOKENS_PER_TILE).min(n_tok);
            for (j, row) in deq.chunks(n_in).enumerate() {
                for t in t0..t1 {
                    out[j * n_tok + t] = dot(row, &x[t * n_in..(t + 1) * n_in]);
                }
            }
        }
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        yt.par_chunks_mut(ROWS_PER_TASK * n_tok).enumerate().for_each(task);
    }
    #[cfg(target_arch = "wasm32")]
    yt.chunks_mut(ROWS_PER_TASK * n_tok).enumerate().for_each(task);
    if n_tok == 1 {
        return yt;
    }
    let mut y = vec![0f32; n_tok * n_out];
    for r in 0..n_out {
        for t in 0..n_tok {
            y[t * n_out + r] = yt[r * n_tok + t];
        }
    }
    y
}

/// In-place RMSNorm of each `w.len()`-sized row of `x`: x / sqrt(mean(x²) + eps) · w.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_mut(w.len()) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
        let scale = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Rotates the first `2 * inv_freq.len()` values of one head at position `pos`, pair i at
/// angle pos · freq_scale · inv_freq[i] (`arch::rope_inv_freq`).
pub fn rope(head: &mut [f32], pos: usize, inv_freq: &[f32], freq_scale: f32, style: RopeStyle) {
    rope_scaled(head, pos, inv_freq, freq_scale, style, 1.0);
}

/// [`rope`] with cos and sin multiplied by `mscale` (YaRN's and LongRoPE's attention factor).
pub fn rope_scaled(head: &mut [f32], pos: usize, inv_freq: &[f32], freq_scale: f32, style: RopeStyle, mscale: f32) {
    let half = inv_freq.len();
    for (i, &inv_freq) in inv_freq.iter().enumerate() {
        let theta = pos as f32 * freq_scale * inv_freq;
        let (sin, cos) = theta.sin_cos();
        let (sin, cos) = (sin * mscale, cos * mscale);
        let (a, b) = match style {
            RopeStyle::Neox => (i, i + half),
            RopeStyle::Normal => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// cap · tanh(x / cap): gemma2's soft cap of attention scores and final logits.
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation (gemma's `gelu_pytorch_tanh`).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// A mixture of experts' routing of one token: the `n_used` experts with the largest router
/// logits (ties to the lower id), best first, each weighted by its softmax probability
/// renormalized over the chosen (qwen3moe). `shaders/moe.wgsl` routes the same way.
pub fn moe_route(logits: &[f32], n_used: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut p = logits.to_vec();
    softmax(&mut p);
    let chosen = &order[..n_used.min(order.len())];
    let sum: f32 = chosen.iter().map(|&e| p[e]).sum();
    chosen.iter().map(|&e| (e, p[e] / sum)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_neox_at_zero_is_identity_and_preserves_norm() {
        let mut h: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let orig = h.clone();
        rope(&mut h, 0, &crate::arch::rope_inv_freq(8, 10000.0, None), 1.0, RopeStyle::Neox);
        assert_eq!(h, orig);
        rope(&mut h, 17, &crate::arch::rope_inv_freq(8, 10000.0, None), 1.0, RopeStyle::Neox);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = h.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(h, orig);
    }

    #[test]
    fn matmul_matches_naive_f32() {
        let (n_in, n_out, n_tok) = (40, 70, 3);
        let w: Vec<f32> = (0..n_in * n_out).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let x: Vec<f32> = (0..n_in * n_tok).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let y = matmul(QuantType::F32, &bytes, n_in, n_out, &x, n_tok);
        for t in 0..n_tok {
            for r in 0..n_out {
                let want: f32 = (0..n_in).map(|i| w[r * n_in + i] * x[t * n_in + i]).sum();
                assert!((y[t * n_out + r] - want).abs() < 1e-4, "t={t} r={r}");
            }
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0, 2.0, 3.0, -1e30];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[3] == 0.0);
    }
}
