//! How K and V elements are stored (llama.cpp's `--cache-type-k/-v`): f32, f16, or q8_0
//! blocks of 32 (an f16-rounded scale and 32 signed bytes). Backends store rows of `dim`
//! elements as [`KvType::row_bytes`] says; [`KvType::read_back`] is what a stored row reads
//! back as, which the CPU reference keeps so that it computes what the GPU does.
//!
//! A quantized cache first rotates each head by an orthonormal Walsh–Hadamard matrix H, as
//! llama.cpp does (`attn_rot_k/v`): some models' keys carry a few channels a hundred times
//! larger than the rest (Qwen2's K biases), and a block scaled to such a channel rounds the
//! others away (qwen2.5-0.5b's last-position logits: NMSE 0.24 against f32 without the
//! rotation). H spreads every channel over the whole group. Scores are unchanged, as
//! (Hq)·(Hk) = q·k: attention rotates q by the same H; values are rotated back after the
//! weighted sum (H = H⁻¹). Keys rotate in groups of the largest power of two ≥ 64 dividing
//! the head size, values in groups of 64; heads that are not multiples of 64 are not rotated.

use std::fmt;
use std::str::FromStr;

/// The storage type of the K or the V cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    #[default]
    F32,
    /// IEEE half precision, round to nearest even (`pack2x16float` on the GPU).
    F16,
    /// Blocks of 32: d = max|x| / 127 rounded to f16, q = round(x / d) (half away from zero)
    /// in an i8; an element reads back as q · d. On the GPU a block is 9 words: d as f32 bits,
    /// then the 32 bytes.
    Q8_0,
}

/// Elements of one q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// The name llama.cpp's flags use.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Elements one stored unit holds (a kernel invocation writes whole units).
    pub fn unit(self) -> usize {
        match self {
            KvType::F32 => 1,
            KvType::F16 => 2,
            KvType::Q8_0 => Q8_0_BLOCK,
        }
    }

    /// Bytes one row of `dim` elements takes (`dim` a multiple of [`KvType::unit`]).
    pub fn row_bytes(self, dim: usize) -> u64 {
        let dim = dim as u64;
        match self {
            KvType::F32 => dim * 4,
            KvType::F16 => dim * 2,
            KvType::Q8_0 => dim / Q8_0_BLOCK as u64 * 36,
        }
    }

    /// Whether heads of `head_dim` elements can be stored: q8_0 blocks never cross a head.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), String> {
        match self {
            KvType::Q8_0 if !head_dim.is_multiple_of(Q8_0_BLOCK) => {
                Err(format!("a q8_0 KV cache needs head sizes that are multiples of {Q8_0_BLOCK}; this model's is {head_dim}"))
            }
            KvType::F16 if !head_dim.is_multiple_of(2) => Err(format!("an f16 KV cache needs even head sizes; this model's is {head_dim}")),
            _ => Ok(()),
        }
    }

    /// The Hadamard group size the cache rotates heads of `head_dim` by: keys (`is_k`) and
    /// values differ (see the module); None for f32 and f16, which are not rotated.
    pub fn rotation(self, head_dim: usize, is_k: bool) -> Option<usize> {
        if self != KvType::Q8_0 || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut n = 64;
        while is_k && head_dim.is_multiple_of(2 * n) {
            n *= 2;
        }
        Some(n)
    }

    /// Replaces `row` (heads of `head_dim`, a whole number of units) by what storing it and
    /// reading it back gives, in the original basis: rotated, rounded, rotated back.
    pub fn read_back(self, row: &mut [f32], head_dim: usize, is_k: bool) {
        match self.rotation(head_dim, is_k) {
            Some(n) => {
                row.chunks_mut(n).for_each(hadamard);
                self.round_trip(row);
                row.chunks_mut(n).for_each(hadamard);
            }
            None => self.round_trip(row),
        }
    }

    /// Replaces `row` (a whole number of units) by what storing it and reading it back gives,
    /// without a rotation.
    pub fn round_trip(self, row: &mut [f32]) {
        match self {
            KvType::F32 => {}
            KvType::F16 => row.iter_mut().for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
            KvType::Q8_0 => {
                for block in row.chunks_mut(Q8_0_BLOCK) {
                    let (q, d) = quantize_q8_0(block);
                    block.iter_mut().zip(q).for_each(|(x, q)| *x = q as f32 * d);
                }
            }
        }
    }
}

/// x ← H x for the orthonormal Walsh–Hadamard matrix of x's (power of two) size,
/// H[i][j] = (−1)^popcount(i & j) / √n, summed directly in order of j (as the kernels do).
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let scale = 1.0 / (n as f32).sqrt();
    let src = x.to_vec();
    for (i, out) in x.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (j, &v) in src.iter().enumerate() {
            acc += if (i & j).count_ones() & 1 == 0 { v } else { -v };
        }
        *out = acc * scale;
    }
}

/// One q8_0 block: its bytes and its (f16-rounded) scale, as ggml's `quantize_row_q8_0`.
pub fn quantize_q8_0(block: &[f32]) -> (Vec<i8>, f32) {
    let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = block.iter().map(|x| (x * id).round().clamp(-127.0, 127.0) as i8).collect();
    (q, half::f16::from_f32(d).to_f32())
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown KV cache type {s:?} (expected one of f32, f16, q8_0)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>(), Ok(t));
        }
        assert_eq!("Q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        assert!("q4_0".parse::<KvType>().unwrap_err().contains("f32, f16, q8_0"));
    }

    #[test]
    fn row_bytes_are_a_half_and_about_a_quarter() {
        assert_eq!(KvType::F32.row_bytes(128), 512);
        assert_eq!(KvType::F16.row_bytes(128), 256);
        // 4 blocks of 32 bytes and a 4-byte scale: 9/32 of f32.
        assert_eq!(KvType::Q8_0.row_bytes(128), 144);
        assert!(KvType::Q8_0.check_head_dim(80).is_err());
        assert!(KvType::Q8_0.check_head_dim(64).is_ok());
    }

    #[test]
    fn round_trips_stay_within_each_types_step() {
        let row: Vec<f32> = (0..64).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let mut h = row.clone();
        KvType::F16.round_trip(&mut h);
        for (a, b) in row.iter().zip(&h) {
            assert!((a - b).abs() <= a.abs() * 1e-3, "{a} {b}");
        }
        let mut q = row.clone();
        KvType::Q8_0.round_trip(&mut q);
        for (blk, qb) in row.chunks(32).zip(q.chunks(32)) {
            let amax = blk.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (a, b) in blk.iter().zip(qb) {
                assert!((a - b).abs() <= amax / 127.0 * 0.51 + amax * 1e-3, "{a} {b}");
            }
            // The largest element keeps its sign and reads back as ±127 · d.
            assert!(qb.iter().any(|b| (b.abs() - amax).abs() <= amax * 1e-3));
        }
        let mut zeros = vec![0.0f32; 32];
        KvType::Q8_0.round_trip(&mut zeros);
        assert!(zeros.iter().all(|&z| z == 0.0));
    }

    #[test]
    fn hadamard_is_its_own_inverse_and_spreads_an_outlier() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = x.clone();
        hadamard(&mut x);
        hadamard(&mut x);
        assert!(x.iter().zip(&orig).all(|(a, b)| (a - b).abs() < 1e-5));
        let mut spike = vec![0.0f32; 64];
        spike[5] = 8.0;
        hadamard(&mut spike);
        assert!(spike.iter().all(|v| (v.abs() - 1.0).abs() < 1e-6), "8/√64 = 1 everywhere");
    }

    #[test]
    fn rotations_follow_llama_cpp() {
        assert_eq!(KvType::Q8_0.rotation(64, true), Some(64));
        assert_eq!(KvType::Q8_0.rotation(128, true), Some(128));
        assert_eq!(KvType::Q8_0.rotation(256, true), Some(256));
        assert_eq!(KvType::Q8_0.rotation(192, true), Some(64));
        assert_eq!(KvType::Q8_0.rotation(256, false), Some(64));
        assert_eq!(KvType::Q8_0.rotation(96, true), None);
        assert_eq!(KvType::F16.rotation(128, true), None);
    }

    #[test]
    fn rotation_keeps_small_channels_beside_an_outlier() {
        // A head with one channel 100× the rest, as Qwen2's keys: without the rotation the
        // block's step (≈ 0.8) rounds the small channels away.
        let row: Vec<f32> = (0..64).map(|i| if i == 3 { 100.0 } else { ((i * 7 % 13) as f32 - 6.0) * 0.1 }).collect();
        let err = |r: &[f32]| r.iter().zip(&row).map(|(a, b)| (a - b).powi(2)).sum::<f32>();
        let (mut plain, mut rotated) = (row.clone(), row.clone());
        KvType::Q8_0.round_trip(&mut plain);
        KvType::Q8_0.read_back(&mut rotated, 64, true);
        assert!(err(&rotated) * 4.0 < err(&plain), "rotated {} plain {}", err(&rotated), err(&plain));
    }
}
