//! Row loops shared by every format: whole-row dequantization and the allocation-free dot
//! product of a quantized row with an f32 vector.

use core::mem::size_of;

use bytemuck::Pod;

use super::blocks::QuantBlock;

/// Independent partial sums in `dot`: wide enough for two AVX or four SSE/wasm-simd registers,
/// so the loop vectorizes and hides add latency. The sum order is fixed, so results are the
/// same on every target.
const LANES: usize = 16;
/// Elements of a float row (F32/F16/BF16) converted per step before accumulating.
const FLOAT_GROUP: usize = 64;

/// Dequantizes whole blocks of `B`; the caller has checked that `src` and `dst` agree.
pub(super) fn dequantize_blocks<const N: usize, B: QuantBlock<N>>(src: &[u8], dst: &mut [f32]) {
    let mut buf = [0f32; N];
    for (block, out) in src.chunks_exact(size_of::<B>()).zip(dst.chunks_exact_mut(N)) {
        bytemuck::pod_read_unaligned::<B>(block).dequantize(&mut buf);
        out.copy_from_slice(&buf);
    }
}

/// Converts a float row of `E`-sized elements; the caller has checked the lengths.
#[inline(always)]
pub(super) fn dequantize_elems<E: Pod>(src: &[u8], dst: &mut [f32], decode: impl Fn(E) -> f32) {
    for (bytes, y) in src.chunks_exact(size_of::<E>()).zip(dst) {
        *y = decode(bytemuck::pod_read_unaligned(bytes));
    }
}

/// `dot(dequantize(row), x)` one block at a time through a stack buffer.
pub(super) fn dot_blocks<const N: usize, B: QuantBlock<N>>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut buf = [0f32; N];
    for (block, xs) in row.chunks_exact(size_of::<B>()).zip(x.chunks_exact(N)) {
        bytemuck::pod_read_unaligned::<B>(block).dequantize(&mut buf);
        accumulate(&mut acc, &buf, xs);
    }
    reduce(acc)
}

/// `dot(row, x)` for a float row of `E`-sized elements; any length, tail included.
#[inline(always)]
pub(super) fn dot_elems<E: Pod>(row: &[u8], x: &[f32], decode: impl Fn(E) -> f32) -> f32
where
    [E; FLOAT_GROUP]: Pod,
{
    let mut acc = [0f32; LANES];
    let mut buf = [0f32; FLOAT_GROUP];
    let groups = row.chunks_exact(size_of::<[E; FLOAT_GROUP]>());
    let x_groups = x.chunks_exact(FLOAT_GROUP);
    let (row_tail, x_tail) = (groups.remainder(), x_groups.remainder());
    for (group, xs) in groups.zip(x_groups) {
        // One unaligned copy of the whole group lets the conversion below vectorize.
        let elems: [E; FLOAT_GROUP] = bytemuck::pod_read_unaligned(group);
        for (y, &e) in buf.iter_mut().zip(&elems) {
            *y = decode(e);
        }
        accumulate(&mut acc, &buf, xs);
    }
    let mut sum = reduce(acc);
    for (bytes, &x) in row_tail.chunks_exact(size_of::<E>()).zip(x_tail) {
        sum += decode(bytemuck::pod_read_unaligned(bytes)) * x;
    }
    sum
}

/// Adds `w[i] * x[i]` into lane `i % LANES`; both lengths are multiples of `LANES`.
#[inline(always)]
fn accumulate(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    for (w, x) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for ((a, &w), &x) in acc.iter_mut().zip(w).zip(x) {
            *a += w * x;
        }
    }
}

/// Pairwise sum of the lanes.
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            acc[i] += acc[i + n];
        }
    }
    acc[0]
}
