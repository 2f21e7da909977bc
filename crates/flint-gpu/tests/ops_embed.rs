//! `ops::embed` against `flint_core::quant::dequantize`, bit for bit (up to a driver's FMA
//! fusion in the mul-add formats): every format, a table split into two parts with ids in
//! both, more chunks than a workgroup, and sentinels on the rows no part may write.

use flint_core::quant::{self, QuantType};
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::embed::Embed;
use flint_gpu::ops::Batch;
use flint_gpu::testing::{pipelines, random_quant, submit, TestRng, SENTINEL};
use flint_gpu::weights::layout;
use flint_gpu::GpuContext;

/// Rows of x past n_tok, never written.
const SPARE_TOKENS: usize = 2;
/// One f16 value in this many is a subnormal, to check the exact f16 conversion.
const SUBNORMAL_EVERY: u32 = 7;

/// f16 bits of `v`, or now and then a random subnormal.
fn f16_bits(v: f32, rng: &mut TestRng) -> u16 {
    if rng.next_u32().is_multiple_of(SUBNORMAL_EVERY) {
        return (rng.next_u32() & 0x83ff) as u16;
    }
    half::f16::from_f32(v).to_bits()
}

/// Seeded random rows of `ty` with finite f16 scales, some of them subnormal.
fn random_table(ty: QuantType, n_elems: usize, rng: &mut TestRng) -> Vec<u8> {
    random_quant(ty, n_elems, rng, f16_bits)
}

/// A lookup of `ids` in a `vocab`-row table of `ty`, `n_embd` wide, split at row `split`.
#[derive(Clone, Copy, Debug)]
struct Case {
    ty: QuantType,
    n_embd: usize,
    vocab: usize,
    split: usize,
    ids: &'static [u32],
    scale: f32,
    seed: u64,
}

/// Runs `case`, encoding part 0 alone first and then both, and checks each state bit for bit
/// against the CPU.
async fn run(ctx: &GpuContext, Case { ty, n_embd, vocab, split, ids, scale, seed }: Case) {
    let mut rng = TestRng::new(seed);
    let n_tok = ids.len();
    let rows = n_tok + SPARE_TOKENS;
    let batch = Batch::new(ctx, rows as u32, 1, 1, 16).unwrap();
    let pos: Vec<u32> = (0..n_tok as u32).collect();
    batch.write(ctx, ids, &pos, &vec![0; n_tok], &[&[0]]);

    let table = random_table(ty, vocab * n_embd, &mut rng);
    let mut want = vec![0f32; vocab * n_embd];
    quant::dequantize(ty, &table, &mut want).unwrap();
    // The table as the uploader lays it out on the GPU (weights::layout).
    let gpu_table = layout::to_gpu(ty, n_embd, &table);
    let row_bytes = gpu_table.len() / vocab;
    let parts = [(0, split), (split, vocab - split)];
    let x = storage_init(ctx, "x", bytemuck::cast_slice(&vec![SENTINEL; rows * n_embd])).unwrap();
    let mut ops = Vec::new();
    for &(first, count) in &parts {
        let buf = storage_init(ctx, "table_part", &gpu_table[first * row_bytes..(first + count) * row_bytes]).unwrap();
        let op =
            Embed::new(ctx, pipelines(), &batch, ty, n_embd as u32, count as u32, first as u32, &buf, &x, scale).await.unwrap_or_else(|e| panic!("{ty}: {e}"));
        ops.push((op, buf));
    }

    for n_parts in [1, 2] {
        submit(ctx, |pass| ops[..n_parts].iter().for_each(|(op, _)| op.encode(pass, n_tok as u32)));
        let got = read_f32(ctx, &x, 0, rows * n_embd).await.unwrap();
        ctx.check().unwrap();
        let covered = parts[n_parts - 1].0 + parts[n_parts - 1].1;
        let mut inexact = 0;
        for t in 0..rows {
            let id = ids.get(t).map(|&id| id as usize).filter(|&id| id < covered);
            for i in 0..n_embd {
                let g = got[t * n_embd + i];
                let w = id.map_or(SENTINEL, |id| want[id * n_embd + i] * scale);
                if g.to_bits() == w.to_bits() {
                    continue;
                }
                let tol = id.map_or(0.0, |id| fused_tolerance(ty, &want[id * n_embd..][..n_embd], i) * scale.abs());
                assert!((g - w).abs() <= tol, "{ty} parts {n_parts}: x[{t}, {i}] = {g}, want {w} (id {id:?})");
                inexact += 1;
            }
        }
        if inexact > 0 {
            eprintln!("{ty}: {inexact} values within an FMA's rounding of the CPU, not bit-equal");
        }
    }
}

/// Formats whose dequantization is `a * q ± b`, which a driver may fuse into one FMA
/// (WGSL cannot forbid it); lavapipe does not, and there the results are bit-equal.
const MUL_ADD: [QuantType; 5] = [QuantType::Q4_1, QuantType::Q5_1, QuantType::Q2K, QuantType::Q4K, QuantType::Q5K];
/// Ulps (of the chunk's largest term) a fused multiply-add may move a value.
const FUSED_ULPS: f32 = 4.0;

/// How far a fused `a * q ± b` may land from the separately rounded one for element `i` of
/// `row`: a few ulps of the 32-element chunk's largest term (|a·q| ≤ max|y| + spread of y).
fn fused_tolerance(ty: QuantType, row: &[f32], i: usize) -> f32 {
    if !MUL_ADD.contains(&ty) {
        return 0.0;
    }
    let chunk = &row[i / 32 * 32..][..32];
    let max = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let spread = chunk.iter().fold(f32::MIN, |m, &v| m.max(v)) - chunk.iter().fold(f32::MAX, |m, &v| m.min(v));
    (max + spread) * f32::EPSILON * FUSED_ULPS
}

/// Ids at both ends of both parts, repeated, out of order.
const IDS: [u32; 9] = [0, 19, 20, 36, 5, 25, 19, 0, 31];

/// `ty`'s rows (an odd number of blocks and chunks) in two parts, unscaled and scaled.
fn two_parts(ty: QuantType) -> [Case; 2] {
    let n_embd = if ty.block_elems() == 256 { 3 * 256 } else { 5 * 32 };
    [(1.0, 1), (25.298_22, 2)].map(|(scale, seed)| Case { ty, n_embd, vocab: 37, split: 20, ids: &IDS, scale, seed })
}

flint_gpu::op_tests! { run;
    embed_f32 => two_parts(QuantType::F32),
    embed_f16 => two_parts(QuantType::F16),
    embed_bf16 => two_parts(QuantType::BF16),
    embed_q4_0 => two_parts(QuantType::Q4_0),
    embed_q4_1 => two_parts(QuantType::Q4_1),
    embed_q5_0 => two_parts(QuantType::Q5_0),
    embed_q5_1 => two_parts(QuantType::Q5_1),
    embed_q8_0 => two_parts(QuantType::Q8_0),
    embed_q2_k => two_parts(QuantType::Q2K),
    embed_q3_k => two_parts(QuantType::Q3K),
    embed_q4_k => two_parts(QuantType::Q4K),
    embed_q5_k => two_parts(QuantType::Q5K),
    embed_q6_k => two_parts(QuantType::Q6K),
    embed_iq4_nl => two_parts(QuantType::IQ4NL),
    embed_iq4_xs => two_parts(QuantType::IQ4XS),
    // 72 and 80 chunks per row: three workgroups in x, the last one partial.
    embed_rows_wider_than_a_workgroup => [
        Case { ty: QuantType::Q8_0, n_embd: 72 * 32, vocab: 11, split: 4, ids: &[10, 3, 4, 0, 7], scale: 25.298_22, seed: 3 },
        Case { ty: QuantType::Q6K, n_embd: 10 * 256, vocab: 11, split: 9, ids: &[10, 3, 4, 0, 7, 8, 9], scale: 1.0, seed: 4 },
    ],
}

#[test]
fn every_format_has_its_embed_test() {
    // The named tests above take these formats; a new one needs its own.
    use QuantType::*;
    assert_eq!(QuantType::ALL, [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS]);
}

#[test]
fn rejects_bad_shapes() {
    flint_gpu::gpu_test!(ctx => {
        let batch = Batch::new(ctx, 4, 1, 1, 16).unwrap();
        let buf = storage_init(ctx, "any", &[0u8; 4096]).unwrap();
        let x = storage_init(ctx, "x", &[0u8; 4096]).unwrap();
        // Not whole super-blocks; not whole chunks; a table part too small for its rows.
        for (ty, n_embd, rows) in [(QuantType::Q4K, 128, 1), (QuantType::F16, 48, 1), (QuantType::Q8_0, 256, 100)] {
            assert!(Embed::new(ctx, pipelines(), &batch, ty, n_embd, rows, 0, &buf, &x, 1.0).await.is_err(), "{ty} {n_embd}");
        }
        ctx.check().unwrap();
    });
}
