//! `ops::matmul` against the CPU reference (`flint_core::quant::dequantize` and an f64 dot):
//! every format, odd shapes, every token block, offsets into a wider y, bias, accumulate, a
//! folded grid, and sentinels around every written range. And batch invariance: a token's
//! row is bit-identical whatever token block (1, 4, 8, 16, tiles) its step takes, on both
//! kernel families.

use flint_core::arch::Activation;
use flint_core::quant::{self, QuantType};
use flint_gpu::buffer::{read_f32, storage_init};
use flint_gpu::ops::matmul::{Matmul, MatmulDesc, TOKEN_BLOCKS};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{f16_nearest, gpu_like, nmse, pipelines, random_quant, run_cases, run_cases_on, submit, TestRng, NMSE_F32, NMSE_QUANT, SENTINEL};
use flint_gpu::weights::layout;
use flint_gpu::GpuContext;

/// Extra rows of x and y past n_tok in batch mode: filled, never read or written.
const SPARE_TOKENS: usize = 2;

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
    /// The exact mode (no tiled GEMM past 16 tokens on GPUs).
    exact: bool,
    /// The step must take the tiled GEMM, with tiles of this many (rows, tokens) (GPUs).
    gemm: Option<(u32, u32)>,
    seed: u64,
}

impl Case {
    fn new(ty: QuantType, n_rows: u32, n_tok: u32, seed: u64) -> Case {
        Case {
            ty,
            n_in: odd_n_in(ty),
            n_rows,
            n_tok,
            row_offset: 0,
            y_stride: n_rows,
            max_tokens: None,
            bias: false,
            accumulate: false,
            exact: false,
            gemm: None,
            seed,
        }
    }
}

/// Runs `case` with the shared context's kernels.
async fn run(ctx: &GpuContext, case: Case) {
    let e = run_in(ctx, pipelines(), case).await;
    eprintln!("{case:?}: nmse {e:.2e}");
}

/// Runs `case` on the GPU and checks it against the CPU reference; returns the NMSE.
async fn run_in(ctx: &GpuContext, cache: &PipelineCache, case: Case) -> f64 {
    run_products(ctx, cache, case).await.0
}

/// [`run_in`], returning also the products it checked.
async fn run_products(ctx: &GpuContext, cache: &PipelineCache, case: Case) -> (f64, Vec<f32>) {
    let Case { ty, n_in, n_rows, n_tok, row_offset, y_stride, max_tokens, bias, accumulate, exact, gemm, seed } = case;
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
    let desc = MatmulDesc {
        label: "test",
        ty,
        n_in: n_in as u32,
        n_rows: n_rows as u32,
        row_offset,
        y_stride,
        max_tokens,
        accumulate,
        ids: None,
        output: flint_gpu::ops::matmul::Output::Rows,
        norm: None,
        exact,
    };
    let mm = Matmul::new(ctx, cache, &batch.info, &desc, &w_buf, &x_buf, &y_buf, bias.then_some(&b_buf)).await.unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let shape = mm.shape(n_tok);
    if exact || ctx.caps.cpu_like {
        assert!(!shape.gemm, "{case:?}: the tiled GEMM runs only on GPUs outside the exact mode");
    } else if let Some((rows, tokens)) = gemm {
        assert_eq!((shape.gemm, shape.per, shape.tokens), (true, rows, tokens), "{case:?}: not the GEMM tile expected");
    }
    // What the adapter's tuning asks of the lane-team kernels (`FLINT_TUNE`).
    let tune = ctx.caps.tune;
    if !ctx.caps.cpu_like && !shape.gemm {
        assert!(shape.wg <= tune.max_wg && shape.tokens <= tune.max_block, "{case:?}: {shape:?} past max_wg or max_block ({tune})");
        if let Some(lanes) = tune.lanes {
            assert_eq!(shape.per, lanes, "{case:?}: {shape:?} not the lanes asked for");
        }
    }
    if shape.gemm {
        let rows_a_lane = shape.per / (shape.tokens / 4);
        assert!(
            tune.gemm_min_groups.is_some() && shape.tokens <= 4 * tune.gemm_side && rows_a_lane <= tune.gemm_rows,
            "{case:?}: {shape:?}: the GEMM is off or its tile too large"
        );
    }
    submit(ctx, |p| mm.encode(p, n_tok));
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
    (e, got_in)
}

/// The formats whose multi-token kernels run here: the test models' (Q4_K, Q5_0, Q6_K, Q8_0)
/// and the families' tiny models' (f16). The others' dequantization, the only code of a
/// kernel that depends on the format, runs through the one-token kernel here and through the
/// lane-team kernels of every step size below (`on_lane_teams`). On a CPU-type adapter each
/// multi-token kernel costs a compile of 2–27 s at its first dispatch (lavapipe, an empty
/// Mesa cache), which a fresh CI machine pays in full.
const MULTI_TOKEN: [QuantType; 5] = [QuantType::F16, QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4K, QuantType::Q6K];

/// Every case of format `ty`.
fn cases(ty: QuantType) -> Vec<Case> {
    use QuantType::*;
    let mut cases = Vec::new();
    // Dequantization is per format, the token blocks' code is not: every format through the
    // one-token kernel, the formats of MULTI_TOKEN through the 16-token kernel too, the 4- and
    // 8-token blocks with two formats.
    let steps: &[u32] = if MULTI_TOKEN.contains(&ty) { &[1, 13] } else { &[1] };
    for &n_tok in steps {
        cases.push(Case::new(ty, 67, n_tok, 10 + n_tok as u64));
    }
    if [Q4K, Q8_0].contains(&ty) {
        for n_tok in [2, 3, 4, 6, 8] {
            cases.push(Case { max_tokens: Some(16), ..Case::new(ty, 67, n_tok, 90 + n_tok as u64) });
        }
    }
    // One token into a wider y.
    cases.push(Case { row_offset: 5, y_stride: 19, max_tokens: Some(4), ..Case::new(ty, 7, 1, 20) });
    if [F16, Q8_0, Q4K, Q6K].contains(&ty) {
        // Bias, accumulate and a row offset, batched and single-token.
        for (bias, accumulate) in [(true, false), (false, true), (true, true)] {
            for (max_tokens, n_tok) in [(13, 13), (1, 1), (3, 1)] {
                cases.push(Case { row_offset: 3, y_stride: 16, max_tokens: Some(max_tokens), bias, accumulate, ..Case::new(ty, 7, n_tok, 30) });
            }
        }
    }
    if [Q4_0, Q5_0, Q5K, BF16].contains(&ty) {
        // A single row.
        cases.push(Case::new(ty, 1, steps[steps.len() - 1], 40));
    }
    if layout::repacked(ty) || [Q5K, BF16].contains(&ty) {
        // 41 chunks a row (16 lanes a row, a ragged last round; in the GPU layout
        // (weights::layout) five full groups and a short one) or 14 super-blocks (Qwen2.5-7B's
        // 3584: a full group of 8 and a short one of 6), through both kernels (MULTI_TOKEN)
        // or the one-token kernel; the short rows above take 8 lanes and one short group.
        let long = if ty.block_elems() == 256 { 14 * 256 } else { 41 * 32 };
        let steps: &[u32] = if ty == Q6K { &[1, 13, 37] } else { steps };
        for &n_tok in steps {
            cases.push(Case { n_in: long, ..Case::new(ty, 9, n_tok, 41) });
        }
    }
    if [Q5_0, Q8_0, Q4K, Q6K].contains(&ty) {
        // 37 tokens: three 16-token tiles, the last ragged; 43 rows: a ragged 16-row block.
        for (bias, accumulate) in [(false, false), (true, true)] {
            cases.push(Case { row_offset: 2, y_stride: 47, bias, accumulate, ..Case::new(ty, 43, 37, 45) });
        }
    }
    cases
}

flint_gpu::op_tests! { run;
    matmul_f32 => cases(QuantType::F32),
    matmul_f16 => cases(QuantType::F16),
    matmul_bf16 => cases(QuantType::BF16),
    matmul_q4_0 => cases(QuantType::Q4_0),
    matmul_q4_1 => cases(QuantType::Q4_1),
    matmul_q5_0 => cases(QuantType::Q5_0),
    matmul_q5_1 => cases(QuantType::Q5_1),
    matmul_q8_0 => cases(QuantType::Q8_0),
    matmul_q2_k => cases(QuantType::Q2K),
    matmul_q3_k => cases(QuantType::Q3K),
    matmul_q4_k => cases(QuantType::Q4K),
    matmul_q5_k => cases(QuantType::Q5K),
    matmul_q6_k => cases(QuantType::Q6K),
    matmul_iq4_nl => cases(QuantType::IQ4NL),
    matmul_iq4_xs => cases(QuantType::IQ4XS),
    // 600000 rows at 8 rows a workgroup is 75000 groups, past the 65535 per dimension.
    matmul_folded_grid_over_65535_groups => [2, 1].map(|n_tok| Case { n_in: 32, ..Case::new(QuantType::Q8_0, 600_000, n_tok, 50) }),
}

#[test]
fn every_format_has_its_matmul_test() {
    // The named tests above take these formats; a new one needs its own.
    use QuantType::*;
    assert_eq!(QuantType::ALL, [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS]);
}

/// The kernels a discrete GPU takes (lanes sharing a row; subgroup shuffles where the adapter
/// has subgroups and `subgroups` allows them), run on this adapter by a second context that is
/// told it is not CPU-like: lavapipe and SwiftShader otherwise only run their own kernels.
fn on_lane_teams(test: &str, subgroups: bool) {
    let Some((ctx, cache)) = gpu_like(subgroups) else { return };
    // Rows of 5, 41 and 64 chunks: teams of 8, 16 and 32 lanes; the other formats, whose
    // multi-token dequantization no other case here runs (see MULTI_TOKEN), with rows of 5 to
    // 72 chunks.
    let formats = [(QuantType::Q5_0, 5 * 32), (QuantType::Q8_0, 41 * 32), (QuantType::Q4K, 2048)];
    let added = [
        (QuantType::F32, 41 * 32),
        (QuantType::BF16, 5 * 32),
        (QuantType::Q4_0, 2048),
        // Three full groups and a short one of 3 in the GPU layout.
        (QuantType::Q4_1, 27 * 32),
        (QuantType::Q5_1, 41 * 32),
        (QuantType::Q2K, 9 * 256),
        (QuantType::Q3K, 3 * 256),
        (QuantType::Q5K, 2048),
        // A full group of 8 super-blocks and a short one in the GPU layout (weights::layout).
        (QuantType::Q6K, 9 * 256),
        (QuantType::IQ4NL, 41 * 32),
        (QuantType::IQ4XS, 5 * 256),
    ];
    // 43 rows: 1 and 13 tokens, and 37 tokens in 16-token tiles (too few rows for the GEMM
    // to spread); 1030 rows and 37 tokens: the tiled GEMM's 32 × 32 tiles (66 workgroups),
    // and the same in the exact mode's 16-token tiles.
    let cases = formats.into_iter().chain(added).flat_map(|(ty, n_in)| {
        [(1, 43, false), (13, 43, false), (37, 43, false), (37, 1030, false), (37, 1030, true)].map(|(n_tok, n_rows, exact)| Case {
            n_in,
            row_offset: 1,
            y_stride: n_rows + 1,
            bias: true,
            accumulate: n_tok == 13,
            exact,
            gemm: (n_rows > 43).then_some((32, 32)),
            ..Case::new(ty, n_rows, n_tok, 60 + n_tok as u64)
        })
    });
    // The GEMM over several row and token tiles, ragged in both, accumulating into a wider y:
    // 4100 rows × 260 tokens in 64 × 64 tiles (65 × 5 workgroups), 2100 × 130 in 32 × 32.
    let tiles = [(QuantType::Q8_0, 4100, 260, 64), (QuantType::Q6K, 2100, 130, 32)].map(|(ty, n_rows, n_tok, tile)| Case {
        n_in: 512,
        row_offset: 3,
        y_stride: n_rows + 5,
        accumulate: true,
        gemm: Some((tile, tile)),
        ..Case::new(ty, n_rows, n_tok, 70)
    });
    let cases = cases.chain(tiles);
    run_cases_on(ctx, test, cases, |ctx, case| async move {
        run_in(ctx, cache, case).await;
    });
}

#[test]
fn matmul_lane_teams_with_subgroups() {
    on_lane_teams("matmul_lane_teams_with_subgroups", true);
}

#[test]
fn matmul_lane_teams_without_subgroups() {
    on_lane_teams("matmul_lane_teams_without_subgroups", false);
}

/// The variants a tuned run takes (`FLINT_TUNE`, see `flint_gpu::tune`) against the CPU
/// reference, each tuning checked to pick what it names (`run_in`): teams of 8 lanes in
/// workgroups of 64 and the GEMM's 32 × 32 tiles even for a grid of a few workgroups; teams of
/// 32, no GEMM, and 8-token blocks at most (13 and 37 tokens in 8-token tiles).
#[test]
fn tuned_variants_compute_the_same_products() {
    let tunings =
        [("lanes=8,max_wg=64,min_groups=100000,gemm_min_groups=1,gemm_side=8", Some((32, 32))), ("lanes=32,max_wg=128,gemm_min_groups=off,max_block=8", None)];
    for (tune, gemm) in tunings {
        let Some(ctx) = flint_gpu::testing::gpu_tuned(tune) else { return };
        let cache = &ctx.pipelines;
        for (ty, n_in) in [(QuantType::Q8_0, 41 * 32), (QuantType::Q4K, 2048)] {
            for (n_tok, n_rows) in [(1, 43), (13, 43), (37, 130)] {
                let case = Case { n_in, bias: true, gemm: gemm.filter(|_| n_tok > 16), ..Case::new(ty, n_rows, n_tok, 80 + n_tok as u64) };
                let e = futures::executor::block_on(run_in(&ctx, cache, case));
                eprintln!("{tune}: {case:?}: nmse {e:.2e}");
            }
        }
    }
}

/// The tiled GEMM in f16 (`FLINT_TUNE` `gemm_in=f16`, adapters with shader-f16) against the
/// CPU reference within the quantized bound: both tile sizes, ragged rows and tokens,
/// accumulation, and the fusions (GLU, split outputs, the folded norm, whose activations are
/// staged normalized). An adapter without shader-f16 must not build it.
#[test]
fn gemm_in_f16_stays_within_the_quantized_bound() {
    let Some(ctx) = flint_gpu::testing::gpu_tuned("gemm_in=f16") else { return };
    if !ctx.caps.shader_f16 {
        assert!(!flint_gpu::ops::matmul::gemm_f16(&ctx.caps), "the f16 GEMM needs shader-f16");
        eprintln!("{}: no shader-f16, so no f16 GEMM to test", ctx.adapter_name());
        return;
    }
    assert!(flint_gpu::ops::matmul::gemm_f16(&ctx.caps));
    let cache = &ctx.pipelines;
    let cases = [(QuantType::Q8_0, 41 * 32, 1030, 37, 32), (QuantType::Q4K, 512, 4100, 260, 64), (QuantType::Q6K, 512, 2100, 130, 32)].map(
        |(ty, n_in, n_rows, n_tok, tile)| Case {
            n_in,
            row_offset: 3,
            y_stride: n_rows + 5,
            bias: n_tok == 37,
            accumulate: n_tok != 37,
            gemm: Some((tile, tile)),
            ..Case::new(ty, n_rows, n_tok, 90 + n_tok as u64)
        },
    );
    for case in cases {
        let e = futures::executor::block_on(run_in(&ctx, cache, case));
        eprintln!("f16: {case:?}: nmse {e:.2e}");
        // f16 rounding shows (about 4e-7 here; the f32 GEMM's is about 1e-13): the kernel
        // that ran is the f16 one.
        assert!(e > 1e-9, "{case:?}: nmse {e:e}, as if summed in f32");
    }
    for case in fused_cases(true).into_iter().filter(|c| c.n_tok > 16 && !c.exact) {
        futures::executor::block_on(run_fused(&ctx, cache, case));
    }
}

/// The mat-vec kernels on 8-bit activations (`FLINT_TUNE` `q8_act=on`) against the CPU
/// reference within the quantized bound: every format with integer weight chunks through the
/// one-token and 13-token blocks (bias, accumulation, ragged rows), rows of 41 chunks or 14
/// super-blocks (short groups in the GPU layout; staged in slices, the last ragged, at 13
/// tokens), and the fusions up to 16 tokens (GLU, split
/// outputs, the folded norm, whose activations are staged normalized). The activations'
/// rounding must show (the f32 kernels' NMSE is about 1e-13), so the kernel that ran is the
/// 8-bit one; in the exact mode it must not. And a token's row must not depend on its step.
#[test]
fn matmul_on_8_bit_activations_stays_within_the_quantized_bound() {
    use flint_gpu::ops::matmul::Q8_FORMATS;
    let Some(ctx) = flint_gpu::testing::gpu_tuned("q8_act=on") else { return };
    let cache = &ctx.pipelines;
    let rounded = |e: f64, what: &dyn std::fmt::Debug| assert!(e > 1e-9, "{what:?}: nmse {e:e}, as if the activations were f32");
    for ty in Q8_FORMATS {
        let long = if ty.block_elems() == 256 { 14 * 256 } else { 41 * 32 };
        // The long rows' 13-token steps stage them in slices (32 chunks of 16 tokens at a time).
        for (n_in, n_tok, n_rows) in [(odd_n_in(ty), 1, 43), (odd_n_in(ty), 13, 43), (long, 1, 9), (long, 4, 9), (long, 13, 9)] {
            let case = Case {
                n_in,
                row_offset: 1,
                y_stride: n_rows + 1,
                max_tokens: Some(16),
                bias: n_tok == 1,
                accumulate: n_tok > 1,
                ..Case::new(ty, n_rows, n_tok, 100 + n_tok as u64)
            };
            let e = futures::executor::block_on(run_in(&ctx, cache, case));
            eprintln!("q8: {case:?}: nmse {e:.2e}");
            rounded(e, &case);
        }
    }
    let exact = Case { exact: true, ..Case::new(QuantType::Q4K, 43, 1, 110) };
    let e = futures::executor::block_on(run_in(&ctx, cache, exact));
    assert!(e < 1e-9, "{exact:?}: nmse {e:e}: the exact mode took the 8-bit activations");
    for case in fused_cases(true).into_iter().filter(|c| c.n_tok <= *TOKEN_BLOCKS.last().unwrap() && !c.exact) {
        rounded(futures::executor::block_on(run_fused(&ctx, cache, case)), &case);
    }
    // Every token block quantizes a token's activations alike and sums its chunks in one
    // order: a token's row is the same bits in steps of 1, 3, 8, 9 and 16 tokens.
    let sizes = [1u32, 3, 8, 9, 16];
    for case in INVARIANCE.into_iter().chain([INVARIANCE_FUSED]) {
        let by_step = futures::executor::block_on(rows_by_step(&ctx, cache, case, &sizes, false));
        for (k, rows) in by_step.iter().enumerate() {
            for (t, row) in rows.iter().enumerate() {
                assert!(row == &by_step[sizes.len() - 1][t], "{case:?}: token {t} differs in a step of {} tokens", sizes[k]);
            }
        }
    }
}

/// The tiled GEMM on 8-bit integers (`FLINT_TUNE` `gemm_in=q8`) against the CPU reference
/// within the quantized bound: every format with integer weight chunks through both tile
/// sizes (with bias, with accumulation, ragged rows and tokens; the legacy formats' rows of 41
/// chunks end in a part-filled stage), and the fusions past 16 tokens (GLU, split outputs, the
/// folded norm, whose activations are quantized normalized). The activations' rounding must
/// show (the f32 GEMM's NMSE is about 1e-13), so the kernel that ran is the 8-bit one; a format
/// without integer chunks (Q3_K) keeps the f32 GEMM.
#[test]
fn gemm_on_8_bit_integers_stays_within_the_quantized_bound() {
    use flint_gpu::ops::matmul::Q8_FORMATS;
    // min_groups=16: the 64-token tile takes grids small enough for the CPU reference.
    let Some(ctx) = flint_gpu::testing::gpu_tuned("gemm_in=q8,min_groups=16") else { return };
    let cache = &ctx.pipelines;
    let rounded = |e: f64, what: &dyn std::fmt::Debug| assert!(e > 1e-9, "{what:?}: nmse {e:e}, as if the GEMM were f32");
    for ty in Q8_FORMATS.into_iter().chain([QuantType::Q3K]) {
        let n_in = if ty.block_elems() == 256 { 3 * 256 } else { 41 * 32 };
        // 17 row tiles of 64 × one token tile; 16 row tiles of 32 × 2 token tiles.
        for (n_rows, n_tok, tile) in [(1030, 37, 64), (500, 40, 32)] {
            let case = Case {
                n_in,
                row_offset: 2,
                y_stride: n_rows + 3,
                bias: tile == 64,
                accumulate: tile == 32,
                gemm: Some((tile, tile)),
                ..Case::new(ty, n_rows, n_tok, 120 + n_tok as u64)
            };
            let e = futures::executor::block_on(run_in(&ctx, cache, case));
            eprintln!("q8 gemm: {case:?}: nmse {e:.2e}");
            if Q8_FORMATS.contains(&ty) {
                rounded(e, &case);
            } else {
                assert!(e < 1e-9, "{case:?}: nmse {e:e}: a format without integer chunks took the 8-bit GEMM");
            }
        }
    }
    for case in fused_cases(true).into_iter().filter(|c| c.n_tok > 16 && !c.exact) {
        rounded(futures::executor::block_on(run_fused(&ctx, cache, case)), &case);
    }
    // The mat-vec kernels on 8-bit activations (16-token tiles: the GEMM off; 64-lane
    // workgroups, whose sums leave room to stage a slice here) quantize and scale alike: the
    // same step's products differ only in the order of the f32 sums, far below the
    // quantization's own error (about 1e-5 here).
    let mat_vec = flint_gpu::testing::gpu_tuned("q8_act=on,gemm_min_groups=off,max_wg=64").unwrap();
    // Its own pipeline cache: pipelines belong to their device.
    let mat_vec_cache = &mat_vec.pipelines;
    for ty in [QuantType::Q4_1, QuantType::Q5_0, QuantType::Q4K, QuantType::Q6K] {
        let n_in = if ty.block_elems() == 256 { 4 * 256 } else { 41 * 32 };
        let case = Case { n_in, max_tokens: Some(40), ..Case::new(ty, 500, 40, 130) };
        let (e, gemm) = futures::executor::block_on(run_products(&ctx, cache, Case { gemm: Some((32, 32)), ..case }));
        let (_, lanes) = futures::executor::block_on(run_products(&mat_vec, mat_vec_cache, case));
        let apart = nmse(&gemm, &lanes);
        eprintln!("q8 {ty}: the GEMM's products against the mat-vec kernels': nmse {apart:.2e} (against the reference {e:.2e})");
        rounded(e, &case);
        assert!(apart < 1e-10, "{case:?}: the 8-bit GEMM and mat-vec kernels differ by nmse {apart:e}");
    }
}

/// The tall GEMM tile (`FLINT_TUNE` `gemm_rows=8`: 128 rows × 64 tokens, 8 rows a lane)
/// against the CPU reference and against the 64 × 64 tile. A lane sums a (row, token)'s
/// chunks in the same order whatever its tile, so the two tiles' products must be the same
/// bits, in f32 and on 8-bit integers (`gemm_in=q8`, where the tall tile's first half of the
/// lanes stages the tokens): a row or token addressed wrongly in either shows at once. Then
/// the fusions past 16 tokens through the tall tile, in f32 and in 8 bits (GLU: 1,075 rows, 17
/// tiles of 64 gated rows; split outputs and the folded norm: 9 tiles of 128 rows;
/// min_groups=8 lets it take those grids).
#[test]
fn tall_gemm_tiles_compute_the_square_tiles_bits() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    for input in ["f32", "q8"] {
        // A pipeline cache per context: pipelines belong to their device.
        let tall = flint_gpu::testing::gpu_tuned(&format!("gemm_in={input},gemm_rows=8,min_groups=8")).unwrap();
        let square = flint_gpu::testing::gpu_tuned(&format!("gemm_in={input},min_groups=8")).unwrap();
        let (tall_cache, square_cache) = (&tall.pipelines, &square.pipelines);
        // 17 tall tiles (the last of 52 rows) × 2 token tiles (the last of 6 tokens), with
        // bias or accumulating.
        for (k, ty) in [QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4K, QuantType::Q6K].into_iter().enumerate() {
            let n_in = if ty.block_elems() == 256 { 3 * 256 } else { 41 * 32 };
            let case = Case { n_in, row_offset: 1, y_stride: 2101, bias: k % 2 == 0, accumulate: k % 2 == 1, ..Case::new(ty, 2100, 70, 140 + k as u64) };
            let (e, rows) = futures::executor::block_on(run_products(&tall, tall_cache, Case { gemm: Some((128, 64)), ..case }));
            let (_, square_rows) = futures::executor::block_on(run_products(&square, square_cache, Case { gemm: Some((64, 64)), ..case }));
            eprintln!("{input} tall tile: {case:?}: nmse {e:.2e}");
            let same = rows.iter().zip(&square_rows).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{input}: {case:?}: the 128 × 64 tile's products differ from the 64 × 64 tile's");
        }
        for case in fused_cases(true).into_iter().filter(|c| c.n_tok > 16 && !c.exact) {
            let e = futures::executor::block_on(run_fused(&tall, tall_cache, case));
            assert!(input == "f32" || e > 1e-9, "{case:?}: nmse {e:e}, as if the GEMM were f32");
        }
    }
}

/// The matmul kernels compute the same bits whatever runtime checks wgpu compiles into them
/// (`testing::assert_same_whatever_the_checks`): the one-token and 16-token mat-vec kernels,
/// the tiled GEMM (both tiles: the 128-row one where its grid has 8 workgroups), and the
/// fusions with a folded norm at 1 and 37 tokens (their NMSE against the reference must be
/// the same number).
#[test]
fn matmul_kernels_compute_the_same_bits_whatever_runtime_checks_wgpu_adds() {
    let cases = [
        Case { bias: true, ..Case::new(QuantType::Q4K, 43, 1, 150) },
        Case { accumulate: true, row_offset: 1, y_stride: 44, ..Case::new(QuantType::Q6K, 43, 13, 151) },
        Case { n_in: 41 * 32, gemm: Some((64, 64)), ..Case::new(QuantType::Q5_0, 300, 70, 152) },
        Case { n_in: 3 * 256, gemm: Some((128, 64)), ..Case::new(QuantType::Q4K, 700, 70, 153) },
    ];
    let fused: Vec<FusedCase> = fused_cases(true).into_iter().filter(|c| c.norm && !c.exact && (c.n_tok == 1 || c.n_tok == 37)).collect();
    flint_gpu::testing::assert_same_whatever_the_checks("gemm_rows=8,min_groups=8", |ctx| {
        let mut results = Vec::new();
        for &case in &cases {
            let (e, rows) = futures::executor::block_on(run_products(ctx, &ctx.pipelines, case));
            eprintln!("{}: {case:?}: nmse {e:.2e}", ctx.caps.tune);
            results.push((format!("{case:?}: the products"), rows.iter().map(|v| v.to_bits() as u64).collect()));
        }
        for &case in &fused {
            let e = futures::executor::block_on(run_fused(ctx, &ctx.pipelines, case));
            results.push((format!("{case:?}: the NMSE"), vec![e.to_bits()]));
        }
        results
    });
}

#[test]
fn rejects_bad_shapes() {
    flint_gpu::gpu_test!(ctx => {
        let batch = Batch::new(ctx, 4, 1, 1, 16).unwrap();
        let buf = storage_init(ctx, "any", &[0u8; 1 << 16]).unwrap();
        let ok = MatmulDesc {
            label: "bad",
            ty: QuantType::Q4K,
            n_in: 256,
            n_rows: 4,
            row_offset: 0,
            y_stride: 4,
            max_tokens: 4,
            accumulate: false,
            ids: None,
            output: flint_gpu::ops::matmul::Output::Rows,
            norm: None,
            exact: false,
        };
        let bad = [
            MatmulDesc { n_in: 128, ..ok },           // not whole super-blocks
            MatmulDesc { ty: QuantType::F32, n_in: 48, ..ok }, // not whole chunks
            MatmulDesc { row_offset: 1, ..ok },      // past y_stride
            MatmulDesc { n_rows: 1000, y_stride: 1000, ..ok }, // w too small
            MatmulDesc { max_tokens: 0, ..ok },      // no tokens
        ];
        for d in bad {
            assert!(Matmul::new(ctx, pipelines(), &batch.info, &d, &buf, &buf, &buf, None).await.is_err(), "{d:?}");
        }
        ctx.check().unwrap();
    });
}

/// Every token's y row for steps of each size in `sizes` (one op, x shared), per size; with
/// `fused`, of a gate-and-up matmul with its norm folded; in the exact mode or (steps of up to
/// 16 tokens) not, where the kernels must be on 8-bit activations as the tuning says.
async fn rows_by_step(
    ctx: &GpuContext,
    cache: &PipelineCache,
    Invariance { ty, n_in, n_rows, fused }: Invariance,
    sizes: &[u32],
    exact: bool,
) -> Vec<Vec<Vec<f32>>> {
    let max = *sizes.iter().max().unwrap();
    let mut rng = TestRng::new(77);
    let w_rows = if fused { 2 * n_rows } else { n_rows };
    let w = storage_init(ctx, "w", &layout::to_gpu(ty, n_in as usize, &random_weights(ty, (w_rows * n_in) as usize, &mut rng))).unwrap();
    let g = storage_init(ctx, "norm_w", bytemuck::cast_slice(&rng.vec(n_in as usize))).unwrap();
    let x = storage_init(ctx, "x", bytemuck::cast_slice(&rng.vec((max * n_in) as usize))).unwrap();
    let y = storage_init(ctx, "y", &vec![0u8; (max * n_rows * 4) as usize]).unwrap();
    let batch = Batch::new(ctx, max, 1, 1, 16).unwrap();
    let desc = MatmulDesc {
        label: "invariance",
        ty,
        n_in,
        n_rows,
        row_offset: 0,
        y_stride: n_rows,
        max_tokens: max,
        accumulate: false,
        ids: None,
        output: if fused { flint_gpu::ops::matmul::Output::Glu(Activation::Silu) } else { flint_gpu::ops::matmul::Output::Rows },
        norm: fused.then_some(flint_gpu::ops::matmul::MatmulNorm { w: &g, eps: NORM_EPS }),
        exact,
    };
    let mm = Matmul::new(ctx, cache, &batch.info, &desc, &w, &x, &y, None).await.unwrap();
    let mut out = Vec::new();
    for &n in sizes {
        let shape = mm.shape(n);
        let want_block = TOKEN_BLOCKS.iter().copied().find(|&b| b >= n).unwrap_or(*TOKEN_BLOCKS.last().unwrap());
        assert_eq!((shape.tokens, shape.gemm), (want_block, false), "{n} tokens take the smallest block that holds them");
        assert_eq!(shape.q8 > 0, !exact && ctx.caps.tune.q8_act, "{n} tokens: {shape:?} (exact {exact}, {})", ctx.caps.tune);
        batch.write(ctx, &vec![0; n as usize], &(0..n).collect::<Vec<_>>(), &vec![0; n as usize], &[&[0]]);
        submit(ctx, |p| mm.encode(p, n));
        let got = read_f32(ctx, &y, 0, (n * n_rows) as usize).await.unwrap();
        ctx.check().unwrap();
        out.push(got.chunks_exact(n_rows as usize).map(|r| r.to_vec()).collect());
    }
    out
}

/// One format per block layout family (legacy, K-quant): the block code is the same for all;
/// and the fused gate-and-up matmul with its norm folded (each workgroup sums its tokens'
/// squares itself).
#[derive(Clone, Copy, Debug)]
struct Invariance {
    ty: QuantType,
    n_in: u32,
    n_rows: u32,
    fused: bool,
}

const INVARIANCE: [Invariance; 2] =
    [Invariance { ty: QuantType::Q5_0, n_in: 5 * 32, n_rows: 70, fused: false }, Invariance { ty: QuantType::Q6K, n_in: 256, n_rows: 1100, fused: false }];

/// The lane-team kernels also with the gate-and-up matmul and its norm folded (CPU adapters do
/// not fold norms).
const INVARIANCE_FUSED: Invariance = Invariance { ty: QuantType::Q5_0, n_in: 41 * 32, n_rows: 70, fused: true };

/// Steps of 1, 3 (block 4), 8, 9 and 16 (block 16) and 37 (tiles) tokens over the same x:
/// token t's row must not change with the step (the exact mode's promise).
async fn rows_are_bit_identical(ctx: &GpuContext, cache: &PipelineCache, case: Invariance) {
    let ty = case.ty;
    let sizes = [1u32, 3, 8, 9, 16, 37];
    let by_step = rows_by_step(ctx, cache, case, &sizes, true).await;
    for (k, rows) in by_step.iter().enumerate() {
        for (t, row) in rows.iter().enumerate() {
            // Token t's row in the largest step is the reference.
            let want = &by_step[sizes.len() - 1][t];
            assert!(row == want, "{ty} cpu_like {}: token {t} differs in a step of {} tokens", ctx.caps.cpu_like, sizes[k]);
        }
    }
}

#[test]
fn token_rows_are_bit_identical_whatever_the_step_size_adapter_kernels() {
    run_cases("token_rows_are_bit_identical_whatever_the_step_size_adapter_kernels", INVARIANCE, |ctx, case| rows_are_bit_identical(ctx, pipelines(), case));
}

#[test]
fn token_rows_are_bit_identical_whatever_the_step_size_lane_team_kernels() {
    let Some((ctx, cache)) = gpu_like(true) else { return };
    let cases = INVARIANCE.into_iter().chain([INVARIANCE_FUSED]);
    run_cases_on(ctx, "token_rows_are_bit_identical_whatever_the_step_size_lane_team_kernels", cases, |ctx, case| rows_are_bit_identical(ctx, cache, case));
}

/// A fused output (`Output::Glu`, `Output::Split`) against the CPU reference.
#[derive(Clone, Copy, Debug)]
struct FusedCase {
    ty: QuantType,
    n_in: u32,
    n_tok: u32,
    /// The op's most tokens (at least n_tok).
    max_tokens: u32,
    kind: Fused,
    /// Fold an RMSNorm of x into the matmul.
    norm: bool,
    /// The exact mode (no tiled GEMM past 16 tokens on GPUs).
    exact: bool,
    seed: u64,
}

#[derive(Clone, Copy, Debug)]
enum Fused {
    /// `rows` gate rows over as many up rows.
    Glu { act: Activation, rows: u32 },
    /// Rows of y, y1 and (when not 0) y2, each written from column `col` of a row of
    /// `rows + 3` elements (the first with a row offset, the others at 0), with bias and
    /// accumulation.
    Split { rows: [u32; 3], bias: bool, accumulate: bool },
}

fn act_f64(act: Activation, v: f64) -> f64 {
    match act {
        Activation::GeluTanh => 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()),
        _ => v / (1.0 + (-v).exp()),
    }
}

/// Runs `case` on the GPU and checks it against the CPU reference; returns the NMSE.
async fn run_fused(ctx: &GpuContext, cache: &PipelineCache, case: FusedCase) -> f64 {
    use flint_gpu::ops::matmul::{Output, SplitOut};
    let FusedCase { ty, n_in, n_tok, max_tokens, kind, norm, exact, seed } = case;
    let (n_in_u, n_tok_u) = (n_in as usize, n_tok as usize);
    let mut rng = TestRng::new(seed);
    let buf_tok = max_tokens as usize + SPARE_TOKENS;
    let batch = Batch::new(ctx, buf_tok as u32, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok_u], &(0..n_tok).collect::<Vec<_>>(), &vec![0; n_tok_u], &[&[0]]);
    // Weight rows in the stack, and the products' rows.
    let (w_rows, n_rows) = match kind {
        Fused::Glu { rows, .. } => (2 * rows as usize, rows),
        Fused::Split { rows, .. } => (rows.iter().sum::<u32>() as usize, rows.iter().sum()),
    };
    let w_bytes = random_weights(ty, w_rows * n_in_u, &mut rng);
    let mut w = vec![0f32; w_rows * n_in_u];
    quant::dequantize(ty, &w_bytes, &mut w).unwrap();
    // Scaled so the mean square is far from 1 where a norm is folded.
    let x: Vec<f32> = rng.vec(buf_tok * n_in_u).iter().map(|v| if norm { v * 3.0 } else { *v }).collect();
    let norm_w: Vec<f32> = rng.vec(n_in_u).iter().map(|v| 1.0 + 0.5 * v).collect();
    // The matmul's input as the reference sees it: x, or the normalized x.
    let xin: Vec<f64> = x
        .chunks_exact(n_in_u)
        .flat_map(|row| {
            let rms = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n_in_u as f64 + NORM_EPS as f64).sqrt();
            row.iter().zip(&norm_w).map(move |(&v, &g)| if norm { v as f64 / rms * g as f64 } else { v as f64 }).collect::<Vec<_>>()
        })
        .collect();
    let dot = |r: usize, t: usize| -> f64 { w[r * n_in_u..][..n_in_u].iter().zip(&xin[t * n_in_u..][..n_in_u]).map(|(&a, &b)| a as f64 * b).sum() };
    let g_buf = storage_init(ctx, "norm_w", bytemuck::cast_slice(&norm_w)).unwrap();
    let w_buf = storage_init(ctx, "w", &layout::to_gpu(ty, n_in_u, &w_bytes)).unwrap();
    let x_buf = storage_init(ctx, "x", bytemuck::cast_slice(&x)).unwrap();
    // Outputs: (row offset, rows, stride) each; old values inside the written range.
    let outs: Vec<(usize, usize, usize)> = match kind {
        Fused::Glu { rows, .. } => vec![(0, rows as usize, rows as usize)],
        Fused::Split { rows, .. } => {
            rows.iter().enumerate().filter(|(_, &r)| r > 0).map(|(k, &r)| (if k == 0 { 2 } else { 0 }, r as usize, r as usize + 3)).collect()
        }
    };
    let inits: Vec<Vec<f32>> = outs
        .iter()
        .map(|&(off, rows, stride)| {
            (0..buf_tok * stride).map(|i| if i / stride < n_tok_u && (off..off + rows).contains(&(i % stride)) { rng.f32() } else { SENTINEL }).collect()
        })
        .collect();
    let bufs: Vec<wgpu::Buffer> = inits.iter().map(|v| storage_init(ctx, "y", bytemuck::cast_slice(v)).unwrap()).collect();
    let bias = rng.vec(n_rows as usize);
    let b_buf = storage_init(ctx, "bias", bytemuck::cast_slice(&bias)).unwrap();
    let rest: Vec<SplitOut> =
        outs.iter().zip(&bufs).skip(1).map(|(&(_, rows, stride), y)| SplitOut { rows: rows as u32, y, y_stride: stride as u32 }).collect();
    let (output, use_bias, accumulate) = match kind {
        Fused::Glu { act, .. } => (Output::Glu(act), false, false),
        Fused::Split { bias, accumulate, .. } => (Output::Split(&rest), bias, accumulate),
    };
    let folded = norm.then_some(flint_gpu::ops::matmul::MatmulNorm { w: &g_buf, eps: NORM_EPS });
    let desc = MatmulDesc {
        label: "fused",
        ty,
        n_in,
        n_rows,
        row_offset: outs[0].0 as u32,
        y_stride: outs[0].2 as u32,
        max_tokens,
        accumulate,
        ids: None,
        output,
        norm: folded,
        exact,
    };
    let mm =
        Matmul::new(ctx, cache, &batch.info, &desc, &w_buf, &x_buf, &bufs[0], use_bias.then_some(&b_buf)).await.unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let gemm = !exact && !ctx.caps.cpu_like && n_tok > *TOKEN_BLOCKS.last().unwrap();
    assert_eq!(mm.shape(n_tok).gemm, gemm, "{case:?}: the tiled GEMM takes these steps on GPUs, outside the exact mode");
    submit(ctx, |p| mm.encode(p, n_tok));
    let (mut got_in, mut want_in) = (Vec::new(), Vec::new());
    let mut first_row = 0;
    for (k, &(off, rows, stride)) in outs.iter().enumerate() {
        let got = read_f32(ctx, &bufs[k], 0, inits[k].len()).await.unwrap();
        for (i, &g) in got.iter().enumerate() {
            let (t, c) = (i / stride, i % stride);
            if t >= n_tok_u || !(off..off + rows).contains(&c) {
                assert_eq!(g.to_bits(), SENTINEL.to_bits(), "{case:?}: output {k}[{t}, {c}] overwritten: {g}");
                continue;
            }
            let r = first_row + c - off;
            let mut v = match kind {
                Fused::Glu { act, rows } => act_f64(act, dot(r, t)) * dot(r + rows as usize, t),
                Fused::Split { .. } => dot(r, t),
            };
            if use_bias {
                v += bias[r] as f64;
            }
            if accumulate {
                v += inits[k][i] as f64;
            }
            got_in.push(g);
            want_in.push(v as f32);
        }
        first_row += rows;
    }
    ctx.check().unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let e = nmse(&got_in, &want_in);
    assert!(e <= NMSE_QUANT, "{case:?}: nmse {e:e} > {NMSE_QUANT:e}");
    eprintln!("{case:?}: {:?}: nmse {e:.2e}", mm.shape(n_tok));
    e
}

/// The folded norms' epsilon.
const NORM_EPS: f32 = 1e-6;

/// Both fusions through every token block (1, 3, 8 and 37 tokens: 16-token tiles, or on GPUs
/// outside the exact mode the tiled GEMM, with 25 times the rows so that its grid spreads), a
/// legacy
/// format through 1, 3 and 37 and a K-quant through 8 (the fusions' code does not depend on
/// the format); 43 rows leave ragged row blocks. With `norms` (the lane-team kernels: CPU
/// adapters do not fold norms) each also with a folded norm, and a folded norm alone on plain
/// rows. (On CPU adapters every variant costs seconds to compile.)
fn fused_cases(norms: bool) -> Vec<FusedCase> {
    let mut v = Vec::new();
    for (ty, n_in, n_toks) in [(QuantType::Q5_0, 41 * 32, &[1u32, 3, 37][..]), (QuantType::Q4K, 3 * 256, &[8][..])] {
        for (i, &n_tok) in n_toks.iter().enumerate() {
            let act = if i % 2 == 0 { Activation::Silu } else { Activation::GeluTanh };
            // Past 16 tokens, rows enough for the tiled GEMM's grid to spread (GPUs).
            let k = if n_tok > 16 { 25 } else { 1 };
            let base = FusedCase {
                ty,
                n_in,
                n_tok,
                max_tokens: n_tok.max(4),
                kind: Fused::Glu { act, rows: 43 * k },
                norm: false,
                exact: false,
                seed: 80 + n_tok as u64,
            };
            let rows = if i % 2 == 0 { [24 * k, 11 * k, 8 * k] } else { [43 * k, 5 * k, 0] };
            let split = FusedCase { kind: Fused::Split { rows, bias: i != 1, accumulate: i >= 2 }, ..base };
            v.extend([base, split]);
            if norms {
                v.extend([FusedCase { norm: true, ..base }, FusedCase { norm: true, ..split }]);
                // A plain matmul (a split into one output) with the norm folded.
                v.push(FusedCase { kind: Fused::Split { rows: [43 * k, 0, 0], bias: false, accumulate: false }, norm: true, ..base });
                if n_tok > 16 {
                    // The tiled GEMM took those; the exact mode's 16-token tiles too.
                    v.extend([FusedCase { norm: true, exact: true, ..base }, FusedCase { norm: true, exact: true, ..split }]);
                }
            }
        }
    }
    v
}

#[test]
fn fused_outputs_adapter_kernels() {
    run_cases("fused_outputs_adapter_kernels", fused_cases(false), |ctx, case| async move {
        run_fused(ctx, pipelines(), case).await;
    });
}

#[test]
fn fused_outputs_lane_team_kernels() {
    for subgroups in [true, false] {
        let Some((ctx, cache)) = gpu_like(subgroups) else { return };
        run_cases_on(ctx, "fused_outputs_lane_team_kernels", fused_cases(true), |ctx, case| async move {
            run_fused(ctx, cache, case).await;
        });
    }
}

#[test]
fn rejects_bad_fusions() {
    use flint_gpu::ops::matmul::{Output, SplitOut};
    flint_gpu::gpu_test!(ctx => {
        let batch = Batch::new(ctx, 4, 1, 1, 16).unwrap();
        let buf = storage_init(ctx, "any", &[0u8; 1 << 16]).unwrap();
        let ok = MatmulDesc {
            label: "bad",
            ty: QuantType::Q8_0,
            n_in: 64,
            n_rows: 8,
            row_offset: 0,
            y_stride: 8,
            max_tokens: 4,
            accumulate: false,
            ids: None,
            output: Output::Rows,
            norm: None,
            exact: false,
        };
        let glu = Output::Glu(Activation::Silu);
        let all = [SplitOut { rows: 8, y: &buf, y_stride: 8 }];
        let three = [SplitOut { rows: 1, y: &buf, y_stride: 8 }; 3];
        let wide = [SplitOut { rows: 4, y: &buf, y_stride: 2 }];
        let bad = [
            (MatmulDesc { output: glu, accumulate: true, ..ok }, None), // the activation takes no accumulation
            (MatmulDesc { output: glu, ..ok }, Some(&buf)),             // nor a bias
            (MatmulDesc { output: Output::Split(&all), ..ok }, None),   // no rows left for y
            (MatmulDesc { output: Output::Split(&three), ..ok }, None), // more outputs than the shader has
            (MatmulDesc { output: Output::Split(&wide), ..ok }, None),  // rows past an output's stride
        ];
        for (d, bias) in bad {
            assert!(Matmul::new(ctx, pipelines(), &batch.info, &d, &buf, &buf, &buf, bias).await.is_err(), "{d:?}");
        }
        ctx.check().unwrap();
    });
}
