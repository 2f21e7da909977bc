//! GGUF quantization blocks, laid out byte for byte as ggml stores them, each with the
//! reference dequantization every GPU kernel is tested against.
//!
//! Float operations follow ggml's `dequantize_row_*` order (which gguf-py mirrors) so that
//! results are bit-identical to the reference, not merely close.

use bytemuck::{Pod, Zeroable};

use super::float::f16_to_f32;
use super::QuantType;

/// Elements in a legacy block (Q4_0 .. Q8_0).
pub const QK: usize = 32;
/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K (and of Q3_K's 6-bit scales).
pub const K_SCALE_SIZE: usize = 12;
/// The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// One block of a quantized format: `N` elements stored in `size_of::<Self>()` bytes.
pub trait QuantBlock<const N: usize>: Pod {
    const TYPE: QuantType;
    /// Writes the block's `N` values to `y`, exactly as ggml does.
    fn dequantize(&self, y: &mut [f32; N]);
}

/// `y = (q - 8) * d`, 4-bit quants: low nibbles are elements 0..16, high nibbles 16..32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// `y = q * d + m`, 4-bit quants, nibble order as in Q4_0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}

/// `y = (q - 16) * d`, 5-bit quants: nibbles as in Q4_0, bit 4 of element j is bit j of `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `y = q * d + m`, 5-bit quants laid out as in Q5_0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `y = q * d`, signed 8-bit quants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

/// 8 sub-blocks of 32 with 6-bit scales and mins: `y = d*sc * q - dmin*m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q4_K plus a fifth bit per element in `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 16 sub-blocks of 16 with signed 8-bit scales: `y = d*sc * (q - 32)`, q 6 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}

/// 16 sub-blocks of 16 with 4-bit scales and mins (`scales[i]`: scale low, min high):
/// `y = d*sc * q - dmin*m`, q 2 bits. Each 32-byte half of qs holds 128 elements: bits
/// 2j..2j+2 of byte l are element 32j + l of the half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}

/// 16 sub-blocks of 16 with 6-bit scales: `y = d*(sc - 32) * (q - 4·!h)`, q 2 bits laid out
/// as in Q2_K and h bit 4n + j of `hmask[l]` for element 32j + l of half n.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: u16,
}

/// `y = d * KVALUES_IQ4NL[q]`, 4-bit indices in Q4_0's nibble order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// 8 sub-blocks of 32 as IQ4_NL blocks, each with a 6-bit scale (low nibble in `scales_l`,
/// top two bits in `scales_h`): `y = d*(ls - 32) * KVALUES_IQ4NL[q]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: u16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(core::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(core::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(core::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(core::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(core::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(core::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(core::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(core::mem::size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(core::mem::size_of::<BlockIQ4XS>() == 136);

/// Splits a legacy block's output into its low-nibble and high-nibble halves.
#[inline(always)]
fn halves(y: &mut [f32; QK]) -> (&mut [f32], &mut [f32]) {
    y.split_at_mut(QK / 2)
}

impl QuantBlock<QK> for BlockQ4_0 {
    const TYPE: QuantType = QuantType::Q4_0;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        let d = f16_to_f32(self.d);
        let (lo, hi) = halves(y);
        for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&self.qs) {
            *lo = ((q & 0xf) as i32 - 8) as f32 * d;
            *hi = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl QuantBlock<QK> for BlockQ4_1 {
    const TYPE: QuantType = QuantType::Q4_1;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let (lo, hi) = halves(y);
        for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&self.qs) {
            *lo = (q & 0xf) as f32 * d + m;
            *hi = (q >> 4) as f32 * d + m;
        }
    }
}

/// The two 5-bit quants (elements j and j + 16) held by nibble byte `q` and bit field `qh`.
#[inline(always)]
fn q5_pair(q: u8, qh: u32, j: usize) -> (u8, u8) {
    let h0 = ((qh >> j) << 4) as u8 & 0x10;
    let h1 = (qh >> (j + 12)) as u8 & 0x10;
    ((q & 0xf) | h0, (q >> 4) | h1)
}

impl BlockQ4_0 {
    /// The block's quants as the signed integers its scale multiplies.
    pub fn integers(&self) -> [i8; QK] {
        let mut q = [0i8; QK];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = (b & 0xf) as i8 - 8;
            q[j + QK / 2] = (b >> 4) as i8 - 8;
        }
        q
    }
}

impl BlockQ5_0 {
    /// The block's quants as the signed integers its scale multiplies.
    pub fn integers(&self) -> [i8; QK] {
        let qh = u32::from_le_bytes(self.qh);
        let mut q = [0i8; QK];
        for (j, &b) in self.qs.iter().enumerate() {
            let (q0, q1) = q5_pair(b, qh, j);
            q[j] = q0 as i8 - 16;
            q[j + QK / 2] = q1 as i8 - 16;
        }
        q
    }
}

impl QuantBlock<QK> for BlockQ5_0 {
    const TYPE: QuantType = QuantType::Q5_0;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        let d = f16_to_f32(self.d);
        let qh = u32::from_le_bytes(self.qh);
        let (lo, hi) = halves(y);
        for (j, ((lo, hi), &q)) in lo.iter_mut().zip(hi).zip(&self.qs).enumerate() {
            let (q0, q1) = q5_pair(q, qh, j);
            *lo = (q0 as i32 - 16) as f32 * d;
            *hi = (q1 as i32 - 16) as f32 * d;
        }
    }
}

impl QuantBlock<QK> for BlockQ5_1 {
    const TYPE: QuantType = QuantType::Q5_1;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let qh = u32::from_le_bytes(self.qh);
        let (lo, hi) = halves(y);
        for (j, ((lo, hi), &q)) in lo.iter_mut().zip(hi).zip(&self.qs).enumerate() {
            let (q0, q1) = q5_pair(q, qh, j);
            *lo = q0 as f32 * d + m;
            *hi = q1 as f32 * d + m;
        }
    }
}

impl QuantBlock<QK> for BlockQ8_0 {
    const TYPE: QuantType = QuantType::Q8_0;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        let d = f16_to_f32(self.d);
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) from Q4_K/Q5_K's 12 packed bytes: sub-blocks 0..4
/// use the low 6 bits of bytes j and j + 4; 4..8 take a nibble from byte j + 4 and their top
/// two bits from the spare high bits of bytes j - 4 and j.
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Per-sub-block `(d * sc, dmin * m)`, each product rounded to f32 as ggml does.
#[inline(always)]
fn k4_scales(d: u16, dmin: u16, scales: &[u8; K_SCALE_SIZE]) -> [(f32, f32); 8] {
    let d = f16_to_f32(d);
    let min = f16_to_f32(dmin);
    core::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        (d * sc as f32, min * m as f32)
    })
}

impl QuantBlock<QK_K> for BlockQ4K {
    const TYPE: QuantType = QuantType::Q4K;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let sm = k4_scales(self.d, self.dmin, &self.scales);
        // Each 32-byte run of qs holds two sub-blocks: low nibbles, then high nibbles.
        for ((y, qs), sm) in y.chunks_exact_mut(64).zip(self.qs.chunks_exact(32)).zip(sm.chunks_exact(2)) {
            let ((d1, m1), (d2, m2)) = (sm[0], sm[1]);
            let (lo, hi) = y.split_at_mut(32);
            for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(qs) {
                *lo = d1 * (q & 0xf) as f32 - m1;
                *hi = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

impl QuantBlock<QK_K> for BlockQ5K {
    const TYPE: QuantType = QuantType::Q5K;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let sm = k4_scales(self.d, self.dmin, &self.scales);
        // As Q4_K; sub-blocks 2i and 2i + 1 take their fifth bit from bits 2i and 2i + 1 of qh.
        let runs = y.chunks_exact_mut(64).zip(self.qs.chunks_exact(32)).zip(sm.chunks_exact(2));
        for (i, ((y, qs), sm)) in runs.enumerate() {
            let ((d1, m1), (d2, m2)) = (sm[0], sm[1]);
            let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
            let (lo, hi) = y.split_at_mut(32);
            for (((lo, hi), &q), &h) in lo.iter_mut().zip(hi).zip(qs).zip(&self.qh) {
                let q0 = (q & 0xf) + if h & u1 != 0 { 16 } else { 0 };
                let q1 = (q >> 4) + if h & u2 != 0 { 16 } else { 0 };
                *lo = d1 * q0 as f32 - m1;
                *hi = d2 * q1 as f32 - m2;
            }
        }
    }
}

impl QuantBlock<QK_K> for BlockQ6K {
    const TYPE: QuantType = QuantType::Q6K;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        // Two halves of 128: 64 bytes of ql, 32 of qh and 8 scales each.
        let halves = y.chunks_exact_mut(128).zip(self.ql.chunks_exact(64)).zip(self.qh.chunks_exact(32));
        for (((y, ql), qh), sc) in halves.zip(self.scales.chunks_exact(8)) {
            let ds: [f32; 8] = core::array::from_fn(|k| d * sc[k] as f32);
            let (ql0, ql1) = ql.split_at(32);
            let (y01, y23) = y.split_at_mut(64);
            let (y0, y1) = y01.split_at_mut(32);
            let (y2, y3) = y23.split_at_mut(32);
            // Sub-block scale index is l / 16 plus 0, 2, 4, 6 for the four output quarters.
            for half in 0..2 {
                let r = half * 16..half * 16 + 16;
                let quarters = y0[r.clone()].iter_mut().zip(&mut y1[r.clone()]).zip(&mut y2[r.clone()]);
                let src = ql0[r.clone()].iter().zip(&ql1[r.clone()]).zip(&qh[r.clone()]);
                for ((((o0, o1), o2), o3), ((&a, &b), &h)) in quarters.zip(&mut y3[r]).zip(src) {
                    let q1 = ((a & 0xf) | ((h & 3) << 4)) as i32 - 32;
                    let q2 = ((b & 0xf) | (((h >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((a >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((b >> 4) | ((h >> 6) << 4)) as i32 - 32;
                    *o0 = ds[half] * q1 as f32;
                    *o1 = ds[half + 2] * q2 as f32;
                    *o2 = ds[half + 4] * q3 as f32;
                    *o3 = ds[half + 6] * q4 as f32;
                }
            }
        }
    }
}

/// For sub-block i (0..16) of a Q2_K/Q3_K super-block: the 16 bytes of qs holding it and the
/// shift of its 2-bit quants (half n = i / 8, quarter j = i / 2 % 4, shift 2j).
#[inline(always)]
fn k2_quants(qs: &[u8; QK_K / 4], i: usize) -> (&[u8], u32) {
    (&qs[32 * (i / 8) + 16 * (i % 2)..][..16], 2 * ((i / 2) % 4) as u32)
}

impl QuantBlock<QK_K> for BlockQ2K {
    const TYPE: QuantType = QuantType::Q2K;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for (i, (y, &sc)) in y.chunks_exact_mut(16).zip(&self.scales).enumerate() {
            let dl = d * (sc & 0xf) as f32;
            let ml = min * (sc >> 4) as f32;
            let (qs, shift) = k2_quants(&self.qs, i);
            for (y, &q) in y.iter_mut().zip(qs) {
                *y = dl * ((q >> shift) & 3) as f32 - ml;
            }
        }
    }
}

/// Q3_K's 16 signed scales (`sc - 32`) from its 12 packed bytes: the low nibble of sub-block
/// i is nibble i / 8 of byte i % 8, its top two bits bits 2(i / 4).. of byte 8 + i % 4.
#[inline(always)]
fn q3k_scales(s: &[u8; K_SCALE_SIZE]) -> [i32; 16] {
    core::array::from_fn(|i| {
        let lo = (s[i % 8] >> (4 * (i / 8))) & 0xf;
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (lo | (hi << 4)) as i32 - 32
    })
}

impl QuantBlock<QK_K> for BlockQ3K {
    const TYPE: QuantType = QuantType::Q3K;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        for (i, (y, &sc)) in y.chunks_exact_mut(16).zip(&scales).enumerate() {
            let dl = d * sc as f32;
            let (qs, shift) = k2_quants(&self.qs, i);
            // The high bit of the quarter (bit 4n + j) is set where the quant is not offset.
            let bit = 4 * (i / 8) as u32 + shift / 2;
            let hmask = &self.hmask[16 * (i % 2)..][..16];
            for ((y, &q), &h) in y.iter_mut().zip(qs).zip(hmask) {
                let offset = if (h >> bit) & 1 != 0 { 0 } else { 4 };
                *y = dl * (((q >> shift) & 3) as i32 - offset) as f32;
            }
        }
    }
}

/// 32 values from 16 bytes of IQ4 nibbles scaled by `d` (IQ4_NL's block, IQ4_XS's sub-block):
/// low nibbles are elements 0..16.
fn iq4_values(d: f32, qs: &[u8], y: &mut [f32]) {
    let (lo, hi) = y.split_at_mut(QK / 2);
    for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(qs) {
        *lo = d * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
        *hi = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

impl QuantBlock<QK> for BlockIQ4NL {
    const TYPE: QuantType = QuantType::IQ4NL;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK]) {
        iq4_values(f16_to_f32(self.d), &self.qs, y);
    }
}

impl QuantBlock<QK_K> for BlockIQ4XS {
    const TYPE: QuantType = QuantType::IQ4XS;
    #[inline]
    fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        for (ib, (y, qs)) in y.chunks_exact_mut(QK).zip(self.qs.chunks_exact(QK / 2)).enumerate() {
            let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
            let hi = ((self.scales_h >> (2 * ib)) & 3) as u8;
            let dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
            iq4_values(dl, qs, y);
        }
    }
}
