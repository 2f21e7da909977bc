//! Exact, target-independent half-precision (F16, BF16) to f32 conversions.

const F16_EXP_MASK: u16 = 0x7c00;
/// Bits of the smallest normal f16 magnitude.
const F16_MIN_NORMAL: u32 = 0x0400;
/// f32 exponent bias (127) minus f16 exponent bias (15).
const F16_TO_F32_BIAS: u32 = 112;
/// Smallest f16 subnormal, 2^-24: a subnormal's value is its mantissa times this.
const F16_SUBNORMAL_UNIT: f32 = 1.0 / 16_777_216.0;

/// Converts IEEE binary16 bits to f32 exactly.
///
/// Done in software, not through `half` or F16C, so every target gives the same bits: NaN
/// payloads pass through unchanged (as numpy's portable path does; F16C quiets signalling NaNs).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let magnitude = u32::from(bits & 0x7fff);
    // All three cases are computed and one selected, so row loops stay branch-free and vectorize.
    let normal = (magnitude << 13) + (F16_TO_F32_BIAS << 23);
    let inf_nan = (magnitude << 13) | 0x7f80_0000;
    // Zero or subnormal: the mantissa times 2^-24 is exact in f32.
    let subnormal = (magnitude as f32 * F16_SUBNORMAL_UNIT).to_bits();
    let out = if magnitude >= u32::from(F16_EXP_MASK) {
        inf_nan
    } else if magnitude < F16_MIN_NORMAL {
        subnormal
    } else {
        normal
    };
    f32::from_bits(sign | out)
}

/// Converts bfloat16 bits to f32 exactly (bfloat16 is the top half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_matches_half_for_every_non_nan_pattern() {
        for bits in 0..=u16::MAX {
            let ours = f16_to_f32(bits);
            let theirs = half::f16::from_bits(bits).to_f32();
            if theirs.is_nan() {
                // Payload kept as is: sign, all-ones exponent, mantissa shifted up.
                let expected = (u32::from(bits & 0x8000) << 16) | 0x7f80_0000 | (u32::from(bits & 0x03ff) << 13);
                assert_eq!(ours.to_bits(), expected, "{bits:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn bf16_matches_half() {
        for bits in 0..=u16::MAX {
            let theirs = half::bf16::from_bits(bits).to_f32();
            if !theirs.is_nan() {
                assert_eq!(bf16_to_f32(bits).to_bits(), theirs.to_bits(), "{bits:#06x}");
            }
        }
    }
}
