//! GGUF/ggml tensor formats: type ids and block sizes, and bit-exact CPU dequantization.

mod blocks;
mod float;
mod rows;

use core::fmt;

pub use blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, QuantBlock, KVALUES_IQ4NL,
    K_SCALE_SIZE, QK, QK_K,
};
pub use float::{bf16_to_f32, f16_to_f32};

/// A tensor storage format Flint can read, named and numbered as ggml does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
}

impl QuantType {
    pub const ALL: [QuantType; 15] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::IQ4NL,
        Self::IQ4XS,
    ];

    /// The format for a GGUF tensor's `ggml_type`; None for ids Flint does not read
    /// (Q8_1, Q8_K, the IQ formats but IQ4_NL and IQ4_XS, ...).
    pub fn from_ggml_id(id: u32) -> Option<QuantType> {
        Self::ALL.into_iter().find(|ty| ty.ggml_id() == id)
    }

    /// The `ggml_type` enum value stored in GGUF tensor infos.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::IQ4NL => 20,
            Self::IQ4XS => 23,
            Self::BF16 => 30,
        }
    }

    /// The name ggml and gguf-py use ("Q4_K", not "Q4K").
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::IQ4NL => "IQ4_NL",
            Self::IQ4XS => "IQ4_XS",
        }
    }

    /// Elements per block: 1 for plain floats, 32 for legacy quants and IQ4_NL, 256 for
    /// K-quants and IQ4_XS.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::IQ4NL => QK,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use core::mem::size_of;
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => size_of::<BlockQ4_0>(),
            Self::Q4_1 => size_of::<BlockQ4_1>(),
            Self::Q5_0 => size_of::<BlockQ5_0>(),
            Self::Q5_1 => size_of::<BlockQ5_1>(),
            Self::Q8_0 => size_of::<BlockQ8_0>(),
            Self::Q2K => size_of::<BlockQ2K>(),
            Self::Q3K => size_of::<BlockQ3K>(),
            Self::Q4K => size_of::<BlockQ4K>(),
            Self::Q5K => size_of::<BlockQ5K>(),
            Self::Q6K => size_of::<BlockQ6K>(),
            Self::IQ4NL => size_of::<BlockIQ4NL>(),
            Self::IQ4XS => size_of::<BlockIQ4XS>(),
        }
    }

    /// Bytes for `n_elems` elements; None if n_elems is not a multiple of block_elems or on overflow.
    pub fn bytes_for(self, n_elems: u64) -> Option<u64> {
        let block_elems = self.block_elems() as u64;
        if !n_elems.is_multiple_of(block_elems) {
            return None;
        }
        (n_elems / block_elems).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A byte buffer and an element count that do not agree for a format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{op}: {elems} elements of {ty} is not a whole number of {block_elems}-element blocks")]
    PartialBlock { op: &'static str, ty: QuantType, elems: usize, block_elems: usize },
    #[error("{op}: {bytes} bytes of {ty} do not hold {elems} elements ({block_bytes} bytes per {block_elems})")]
    LengthMismatch { op: &'static str, ty: QuantType, bytes: usize, elems: usize, block_bytes: usize, block_elems: usize },
}

/// Checks that `bytes` of `ty` hold exactly `elems` elements in whole blocks.
fn check_lengths(op: &'static str, ty: QuantType, bytes: usize, elems: usize) -> Result<(), QuantError> {
    let block_elems = ty.block_elems();
    if !elems.is_multiple_of(block_elems) {
        return Err(QuantError::PartialBlock { op, ty, elems, block_elems });
    }
    if ty.bytes_for(elems as u64) != Some(bytes as u64) {
        let block_bytes = ty.block_bytes();
        return Err(QuantError::LengthMismatch { op, ty, bytes, elems, block_bytes, block_elems });
    }
    Ok(())
}

// Float elements are little-endian in GGUF; `from_le` is free on little-endian targets.
#[inline(always)]
fn read_f32(bits: u32) -> f32 {
    f32::from_bits(u32::from_le(bits))
}

#[inline(always)]
fn read_f16(bits: u16) -> f32 {
    f16_to_f32(u16::from_le(bits))
}

#[inline(always)]
fn read_bf16(bits: u16) -> f32 {
    bf16_to_f32(u16::from_le(bits))
}

/// Dequantize `src` (whole blocks of `ty`) into `dst`; dst.len() must equal the element count.
pub fn dequantize(ty: QuantType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use rows::{dequantize_blocks as blocks, dequantize_elems as elems};
    check_lengths("dequantize", ty, src.len(), dst.len())?;
    match ty {
        QuantType::F32 => elems(src, dst, read_f32),
        QuantType::F16 => elems(src, dst, read_f16),
        QuantType::BF16 => elems(src, dst, read_bf16),
        QuantType::Q4_0 => blocks::<QK, BlockQ4_0>(src, dst),
        QuantType::Q4_1 => blocks::<QK, BlockQ4_1>(src, dst),
        QuantType::Q5_0 => blocks::<QK, BlockQ5_0>(src, dst),
        QuantType::Q5_1 => blocks::<QK, BlockQ5_1>(src, dst),
        QuantType::Q8_0 => blocks::<QK, BlockQ8_0>(src, dst),
        QuantType::Q2K => blocks::<QK_K, BlockQ2K>(src, dst),
        QuantType::Q3K => blocks::<QK_K, BlockQ3K>(src, dst),
        QuantType::Q4K => blocks::<QK_K, BlockQ4K>(src, dst),
        QuantType::Q5K => blocks::<QK_K, BlockQ5K>(src, dst),
        QuantType::Q6K => blocks::<QK_K, BlockQ6K>(src, dst),
        QuantType::IQ4NL => blocks::<QK, BlockIQ4NL>(src, dst),
        QuantType::IQ4XS => blocks::<QK_K, BlockIQ4XS>(src, dst),
    }
    Ok(())
}

/// Whole blocks of `ty` re-encoded as Q8_0 blocks that hold the same values bit for bit: a
/// Q4_0 or Q5_0 block is an f16 scale times small integers, which Q8_0 holds with the same
/// scale (and the same f32 product when dequantized). None for any other format, whose values
/// need a minimum or finer scales, or for a partial block.
pub fn exact_q8_0(ty: QuantType, src: &[u8]) -> Option<Vec<u8>> {
    fn recode<B: bytemuck::Pod>(src: &[u8], parts: impl Fn(&B) -> (u16, [i8; QK])) -> Option<Vec<u8>> {
        let size = size_of::<B>();
        if !src.len().is_multiple_of(size) {
            return None;
        }
        let mut out = Vec::with_capacity(src.len() / size * size_of::<BlockQ8_0>());
        for b in src.chunks_exact(size) {
            let (d, qs) = parts(&bytemuck::pod_read_unaligned::<B>(b));
            out.extend_from_slice(bytemuck::bytes_of(&BlockQ8_0 { d, qs }));
        }
        Some(out)
    }
    match ty {
        QuantType::Q8_0 => src.len().is_multiple_of(size_of::<BlockQ8_0>()).then(|| src.to_vec()),
        QuantType::Q4_0 => recode::<BlockQ4_0>(src, |b| (b.d, b.integers())),
        QuantType::Q5_0 => recode::<BlockQ5_0>(src, |b| (b.d, b.integers())),
        _ => None,
    }
}

/// dot(dequantize(row), x) without allocating: the CPU reference forward pass's inner loop.
/// `row` holds `x.len()` elements of `ty`. The sum is taken in a fixed order (16 lanes, then
/// pairwise), so it is deterministic across targets but not bit-equal to a sequential sum.
pub fn dot_row(ty: QuantType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    use rows::{dot_blocks as blocks, dot_elems as elems};
    check_lengths("dot_row", ty, row.len(), x.len())?;
    Ok(match ty {
        QuantType::F32 => elems(row, x, read_f32),
        QuantType::F16 => elems(row, x, read_f16),
        QuantType::BF16 => elems(row, x, read_bf16),
        QuantType::Q4_0 => blocks::<QK, BlockQ4_0>(row, x),
        QuantType::Q4_1 => blocks::<QK, BlockQ4_1>(row, x),
        QuantType::Q5_0 => blocks::<QK, BlockQ5_0>(row, x),
        QuantType::Q5_1 => blocks::<QK, BlockQ5_1>(row, x),
        QuantType::Q8_0 => blocks::<QK, BlockQ8_0>(row, x),
        QuantType::Q2K => blocks::<QK_K, BlockQ2K>(row, x),
        QuantType::Q3K => blocks::<QK_K, BlockQ3K>(row, x),
        QuantType::Q4K => blocks::<QK_K, BlockQ4K>(row, x),
        QuantType::Q5K => blocks::<QK_K, BlockQ5K>(row, x),
        QuantType::Q6K => blocks::<QK_K, BlockQ6K>(row, x),
        QuantType::IQ4NL => blocks::<QK, BlockIQ4NL>(row, x),
        QuantType::IQ4XS => blocks::<QK_K, BlockIQ4XS>(row, x),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_and_q5_0_recode_to_q8_0_with_the_same_values() {
        // Every byte value in every position over a few blocks, with f16 scales of both signs.
        for ty in [QuantType::Q4_0, QuantType::Q5_0, QuantType::Q8_0] {
            let n_blocks = 300;
            let size = ty.block_bytes();
            let mut src: Vec<u8> = (0..n_blocks * size).map(|i| (i * 37 + i / size * 11) as u8).collect();
            for (k, b) in src.chunks_exact_mut(size).enumerate() {
                // Finite scales: 0x3c00 is 1.0, 0xb800 is -0.5, 0x1400 a small normal.
                b[..2].copy_from_slice(&[0x3c00u16, 0xb800, 0x1400][k % 3].to_le_bytes());
            }
            let q8 = exact_q8_0(ty, &src).unwrap();
            let n = n_blocks * QK;
            let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
            dequantize(ty, &src, &mut want).unwrap();
            dequantize(QuantType::Q8_0, &q8, &mut got).unwrap();
            assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty}");
        }
        assert!(exact_q8_0(QuantType::Q4_1, &[0; 20]).is_none());
        assert!(exact_q8_0(QuantType::Q4K, &[0; 144]).is_none());
        assert!(exact_q8_0(QuantType::Q5_0, &[0; 21]).is_none());
    }

    fn check_block<const N: usize, B: QuantBlock<N>>() {
        assert_eq!(B::TYPE.block_elems(), N, "{}", B::TYPE);
        assert_eq!(B::TYPE.block_bytes(), core::mem::size_of::<B>(), "{}", B::TYPE);
    }

    #[test]
    fn block_structs_agree_with_quant_type() {
        check_block::<QK, BlockQ4_0>();
        check_block::<QK, BlockQ4_1>();
        check_block::<QK, BlockQ5_0>();
        check_block::<QK, BlockQ5_1>();
        check_block::<QK, BlockQ8_0>();
        check_block::<QK_K, BlockQ4K>();
        check_block::<QK_K, BlockQ5K>();
        check_block::<QK_K, BlockQ6K>();
        check_block::<QK_K, BlockQ2K>();
        check_block::<QK_K, BlockQ3K>();
        check_block::<QK, BlockIQ4NL>();
        check_block::<QK_K, BlockIQ4XS>();
    }
}
