//! `ops::matmul` against the CPU reference (`flint_core::quant::dequantize` and an f64 dot):
//! every format, odd shapes, every token block, offsets into a wider y, bias, accumulate, a
//! folded grid, and sentinels around every written range. And batch invariance: a token's
//! row is bit-identical whatever token block (1, 4, 8, 16, tiles) its step takes, on both
//! kernel families.

use std::sync::LazyLock;

use flint_core::quant::{self, QuantType};
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::matmul::{Matmul, MatmulDesc, TOKEN_BLOCKS};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{f16_nearest, nmse, random_quant, TestRng, NMSE_F32, NMSE_QUANT};
use flint_gpu::weights::layout;
use flint_gpu::GpuContext;

/// Written into every cell of y the op must not touch.
const SENTINEL: f32 = 1234.5;
/// Extra rows of x and y past n_tok in batch mode: filled, never read or written.
const SPARE_TOKENS: usize = 2;

static CACHE: LazyLock<PipelineCache> = LazyLock::new(PipelineCache::new);

/// Seeded random rows of `ty` with sane f16 scales (no NaN or inf).
fn random_weights(ty: QuantType, n_elems: usize, rng: &mut TestRng) -> Vec<u8> {
    random_quant(ty, n_elems, rng, f16_nearest)
}

/// A row length that is an odd number of blocks and of 32-element chunks.
fn odd_n_in(ty: QuantType) -> u32 {
    if ty.block_elems() == 256 {
        3 * 256
    } else {
        5 * 32
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    ty: QuantType,
    n_in: u32,
    n_rows: u32,
    n_tok: u32,
    row_offset: u32,
    y_stride: u32,
    /// The op's most tokens (buffers hold it plus spare rows); default n_tok.
    max_tokens: Option<u32>,
    bias: bool,
    accumulate: bool,
}

impl Case {
    fn new(ty: QuantType, n_rows: u32, n_tok: u32) -> Case {
        Case { ty, n_in: odd_n_in(ty), n_rows, n_tok, row_offset: 0, y_stride: n_rows, max_tokens: None, bias: false, accumulate: false }
    }
}

/// Runs `case` on the GPU and checks it against the CPU reference; returns the NMSE.
async fn run(ctx: &GpuContext, case: Case, seed: u64) -> f64 {
    run_in(ctx, &CACHE, case, seed).await
}

async fn run_in(ctx: &GpuContext, cache: &PipelineCache, case: Case, seed: u64) -> f64 {
    let Case { ty, n_in, n_rows, n_tok, row_offset, y_stride, max_tokens, bias, accumulate } = case;
    let (n_in, n_rows, n_tok_u, y_stride_u) = (n_in as usize, n_rows as usize, n_tok as usize, y_stride as usize);
    let mut rng = TestRng::new(seed);
    let max_tokens = max_tokens.unwrap_or(n_tok).max(n_tok);
    // Token rows in the buffers: the op's most tokens and spare rows past them.
    let (buf_tok, want_tok) = (max_tokens as usize + SPARE_TOKENS, n_tok_u);
    let batch = Batch::new(ctx, buf_tok as u32, 1, 1, 16).unwrap();
    let ids = vec![0u32; n_tok_u];
    let pos: Vec<u32> = (0..n_tok).collect();
    batch.write(ctx, &ids, &pos, &vec![0; n_tok_u], &[&[0]]);

    let w_bytes = random_weights(ty, n_rows * n_in, &mut rng);
    let x = rng.vec(buf_tok * n_in);
    let b = rng.vec(n_rows);
    // y: old values (read when accumulating) inside the written range, sentinels elsewhere.
    let inside = |t: usize, c: usize| t < want_tok && (row_offset as usize..row_offset as usize + n_rows).contains(&c);
    let y0: Vec<f32> = (0..buf_tok * y_stride_u).map(|i| if inside(i / y_stride_u, i % y_stride_u) { rng.f32() } else { SENTINEL }).collect();

    let w_buf = storage_init(ctx, "w", &layout::to_gpu(ty, n_in, &w_bytes)).unwrap();
    let x_buf = storage_init(ctx, "x", bytemuck::cast_slice(&x)).unwrap();
    let y_buf = storage_init(ctx, "y", bytemuck::cast_slice(&y0)).unwrap();
    let b_buf = storage_init(ctx, "bias", bytemuck::cast_slice(&b)).unwrap();
    let desc = MatmulDesc { label: "test", ty, n_in: n_in as u32, n_rows: n_rows as u32, row_offset, y_stride, max_tokens, accumulate, ids: None };
    let mm = Matmul::new(ctx, cache, &batch.info, &desc, &w_buf, &x_buf, &y_buf, bias.then_some(&b_buf)).await.unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        mm.encode(&mut pass, n_tok);
    }
    ctx.queue.submit([enc.finish()]);
    let got = read_f32(ctx, &y_buf, 0, y0.len()).await.unwrap();
    ctx.check().unwrap_or_else(|e| panic!("{case:?}: {e}"));

    let mut w = vec![0f32; n_rows * n_in];
    quant::dequantize(ty, &w_bytes, &mut w).unwrap();
    let (mut got_in, mut want_in) = (Vec::new(), Vec::new());
    for t in 0..buf_tok {
        for c in 0..y_stride_u {
            let i = t * y_stride_u + c;
            if !inside(t, c) {
                assert_eq!(got[i].to_bits(), SENTINEL.to_bits(), "{case:?}: y[{t}, {c}] overwritten: {}", got[i]);
                continue;
            }
            let r = c - row_offset as usize;
            let row = &w[r * n_in..][..n_in];
            let mut v: f64 = row.iter().zip(&x[t * n_in..][..n_in]).map(|(&a, &b)| a as f64 * b as f64).sum();
            if bias {
                v += b[r] as f64;
            }
            if accumulate {
                v += y0[i] as f64;
            }
            got_in.push(got[i]);
            want_in.push(v as f32);
        }
    }
    let e = nmse(&got_in, &want_in);
    let tol = if ty == QuantType::F32 { NMSE_F32 } else { NMSE_QUANT };
    assert!(e <= tol, "{case:?}: nmse {e:e} > {tol:e}");
    e
}

#[test]
fn every_type_1_and_13_tokens() {
    // Dequantization is per format, the token blocks' code is not: every format through the
    // 1- and 16-token kernels, the 4- and 8-token blocks below with two formats.
    flint_gpu::gpu_test!(ctx => {
        for ty in QuantType::ALL {
            for n_tok in [1, 13] {
                let e = run(ctx, Case::new(ty, 67, n_tok), 10 + n_tok as u64).await;
                eprintln!("{ty} n_rows 67 n_tok {n_tok}: nmse {e:.2e}");
            }
        }
    });
}

#[test]
fn small_token_blocks() {
    flint_gpu::gpu_test!(ctx => {
        for ty in [QuantType::Q4K, QuantType::Q8_0] {
            for n_tok in [2, 3, 4, 6, 8] {
                let e = run(ctx, Case { max_tokens: Some(16), ..Case::new(ty, 67, n_tok) }, 90 + n_tok as u64).await;
                eprintln!("{ty} n_rows 67 n_tok {n_tok}: nmse {e:.2e}");
            }
        }
    });
}

#[test]
fn every_type_one_token_into_wider_y() {
    flint_gpu::gpu_test!(ctx => {
        for ty in QuantType::ALL {
            let case = Case { row_offset: 5, y_stride: 19, max_tokens: Some(4), ..Case::new(ty, 7, 1) };
            run(ctx, case, 20).await;
        }
    });
}

#[test]
fn bias_accumulate_and_row_offset() {
    flint_gpu::gpu_test!(ctx => {
        for ty in [QuantType::F32, QuantType::Q8_0, QuantType::Q4K, QuantType::Q6K] {
            for (bias, accumulate) in [(true, false), (false, true), (true, true)] {
                for (max_tokens, n_tok) in [(13, 13), (1, 1), (3, 1)] {
                    let case = Case { row_offset: 3, y_stride: 16, max_tokens: Some(max_tokens), bias, accumulate, ..Case::new(ty, 7, n_tok) };
                    run(ctx, case, 30).await;
                }
            }
        }
    });
}

#[test]
fn single_row_and_long_rows() {
    flint_gpu::gpu_test!(ctx => {
        for ty in [QuantType::Q5_0, QuantType::Q5K, QuantType::BF16] {
            run(ctx, Case::new(ty, 1, 13), 40).await;
            // 41 chunks a row (16 lanes a row, a ragged last round) or 64 (32 lanes), through
            // both kernels; the short rows above take 8 lanes.
            let long = if ty.block_elems() == 256 { 2048 } else { 41 * 32 };
            for n_tok in [1, 13] {
                run(ctx, Case { n_in: long, ..Case::new(ty, 9, n_tok) }, 41).await;
            }
        }
    });
}

#[test]
fn several_token_tiles_and_ragged_row_blocks() {
    flint_gpu::gpu_test!(ctx => {
        // 37 tokens: three 16-token tiles, the last ragged; 43 rows: a ragged 16-row block.
        for ty in [QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4K, QuantType::Q6K] {
            for (bias, accumulate) in [(false, false), (true, true)] {
                let case = Case { row_offset: 2, y_stride: 47, bias, accumulate, ..Case::new(ty, 43, 37) };
                run(ctx, case, 45).await;
            }
        }
    });
}

#[test]
fn gpu_kernels_lane_teams_with_and_without_subgroups() {
    // The kernels a discrete GPU takes (lanes sharing a row; subgroup shuffles where the
    // adapter has subgroups), run on this adapter by a second context that is told it is not
    // CPU-like: lavapipe and SwiftShader otherwise only run their own kernels.
    flint_gpu::gpu_test!(shared => {
        for subgroups in [true, false] {
            let mut ctx = GpuContext::new().await.unwrap();
            ctx.caps.cpu_like = false;
            if !subgroups {
                ctx.caps.subgroups = false;
                ctx.caps.subgroup_min_size = 0;
            }
            eprintln!("{} as a GPU, subgroups {} (smallest {})", shared.adapter_name(), ctx.caps.subgroups, ctx.caps.subgroup_min_size);
            let cache = PipelineCache::new();
            // Rows of 5, 41 and 64 chunks: teams of 8, 16 and 32 lanes.
            for (ty, n_in) in [(QuantType::Q5_0, 5 * 32), (QuantType::Q8_0, 41 * 32), (QuantType::Q4K, 2048)] {
                for n_tok in [1, 13, 37] {
                    let case = Case { n_in, row_offset: 1, y_stride: 44, bias: true, accumulate: n_tok == 13, ..Case::new(ty, 43, n_tok) };
                    run_in(&ctx, &cache, case, 60 + n_tok as u64).await;
                }
            }
        }
    });
}

#[test]
fn folded_grid_over_65535_groups() {
    flint_gpu::gpu_test!(ctx => {
        // 600000 rows at 8 rows a workgroup is 75000 groups, past the 65535 per dimension.
        for n_tok in [2, 1] {
            let case = Case { n_in: 32, ..Case::new(QuantType::Q8_0, 600_000, n_tok) };
            run(ctx, case, 50).await;
        }
    });
}

#[test]
fn rejects_bad_shapes() {
    flint_gpu::gpu_test!(ctx => {
        let batch = Batch::new(ctx, 4, 1, 1, 16).unwrap();
        let buf = storage_init(ctx, "any", &[0u8; 1 << 16]).unwrap();
        let ok = MatmulDesc { label: "bad", ty: QuantType::Q4K, n_in: 256, n_rows: 4, row_offset: 0, y_stride: 4, max_tokens: 4, accumulate: false, ids: None };
        let bad = [
            MatmulDesc { n_in: 128, ..ok },           // not whole super-blocks
            MatmulDesc { ty: QuantType::F32, n_in: 48, ..ok }, // not whole chunks
            MatmulDesc { row_offset: 1, ..ok },      // past y_stride
            MatmulDesc { n_rows: 1000, y_stride: 1000, ..ok }, // w too small
            MatmulDesc { max_tokens: 0, ..ok },      // no tokens
        ];
        for d in bad {
            assert!(Matmul::new(ctx, &CACHE, &batch.info, &d, &buf, &buf, &buf, None).await.is_err(), "{d:?}");
        }
        ctx.check().unwrap();
    });
}

/// Every token's y row for steps of each size in `sizes` (one op, x shared), per size.
async fn rows_by_step(ctx: &GpuContext, cache: &PipelineCache, ty: QuantType, n_in: u32, n_rows: u32, sizes: &[u32]) -> Vec<Vec<Vec<f32>>> {
    let max = *sizes.iter().max().unwrap();
    let mut rng = TestRng::new(77);
    let w = storage_init(ctx, "w", &layout::to_gpu(ty, n_in as usize, &random_weights(ty, (n_rows * n_in) as usize, &mut rng))).unwrap();
    let x = storage_init(ctx, "x", bytemuck::cast_slice(&rng.vec((max * n_in) as usize))).unwrap();
    let y = storage_init(ctx, "y", &vec![0u8; (max * n_rows * 4) as usize]).unwrap();
    let batch = Batch::new(ctx, max, 1, 1, 16).unwrap();
    let desc = MatmulDesc { label: "invariance", ty, n_in, n_rows, row_offset: 0, y_stride: n_rows, max_tokens: max, accumulate: false, ids: None };
    let mm = Matmul::new(ctx, cache, &batch.info, &desc, &w, &x, &y, None).await.unwrap();
    let mut out = Vec::new();
    for &n in sizes {
        let shape = mm.shape(n);
        let want_block = TOKEN_BLOCKS.iter().copied().find(|&b| b >= n).unwrap_or(*TOKEN_BLOCKS.last().unwrap());
        assert_eq!(shape.tokens, want_block, "{n} tokens take the smallest block that holds them");
        batch.write(ctx, &vec![0; n as usize], &(0..n).collect::<Vec<_>>(), &vec![0; n as usize], &[&[0]]);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            mm.encode(&mut pass, n);
        }
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(ctx, &y, 0, (n * n_rows) as usize).await.unwrap();
        ctx.check().unwrap();
        out.push(got.chunks_exact(n_rows as usize).map(|r| r.to_vec()).collect());
    }
    out
}

#[test]
fn token_rows_are_bit_identical_whatever_the_step_size() {
    // Steps of 1, 3 (block 4), 8, 9 and 16 (block 16) and 37 (tiles) tokens over the same x:
    // token t's row must not change with the step. Both kernel families.
    flint_gpu::gpu_test!(shared => {
        let sizes = [1u32, 3, 8, 9, 16, 37];
        // One format per block layout family (legacy, K-quant): the block code is the same for all.
        for cpu_like in [shared.caps.cpu_like, false] {
            let mut ctx = GpuContext::new().await.unwrap();
            ctx.caps.cpu_like = cpu_like;
            let cache = PipelineCache::new();
            for (ty, n_in, n_rows) in [(QuantType::Q5_0, 5 * 32, 70), (QuantType::Q6K, 256, 1100)] {
                let by_step = rows_by_step(&ctx, &cache, ty, n_in, n_rows, &sizes).await;
                for (k, rows) in by_step.iter().enumerate() {
                    for (t, row) in rows.iter().enumerate() {
                        // Token t's row in the largest step is the reference.
                        let want = &by_step[sizes.len() - 1][t];
                        assert!(row == want, "{ty} cpu_like {cpu_like}: token {t} differs in a step of {} tokens", sizes[k]);
                    }
                }
            }
        }
    });
}
