//! A mixture of experts' kernels against flint_core's reference on seeded data: the routing
//! (top-k of the router logits with ties to the lower id, renormalized softmax weights, and
//! every expert's list of entries in token order), the matmul by expert on both kernel
//! families (x per token and per entry, experts split over two weight parts), and the
//! weighted combination, with sentinels past every written range.

use flint_core::quant::{self, QuantType};
use flint_core::reference::ops;
use flint_gpu::buffer::{read_f32, read_u32, storage_init};
use flint_gpu::ops::matmul::{Matmul, MatmulDesc, MatmulIds};
use flint_gpu::ops::moe::{MoeCombine, MoeDesc, MoeRoute, MoeRoutes};
use flint_gpu::ops::Batch;
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{
    assert_untouched, f16_nearest, gpu_like, nmse, pipelines, random_quant, run_cases_on, submit, TestRng, NMSE_F32, NMSE_QUANT, SENTINEL, SENTINEL_U32,
};
use flint_gpu::weights::layout;
use flint_gpu::GpuContext;

/// Token rows the buffers hold past n_tok.
const SPARE: usize = 3;

fn u32s(ctx: &GpuContext, label: &str, v: &[u32]) -> wgpu::Buffer {
    storage_init(ctx, label, bytemuck::cast_slice(v)).unwrap()
}

fn f32s(ctx: &GpuContext, label: &str, v: &[f32]) -> wgpu::Buffer {
    storage_init(ctx, label, bytemuck::cast_slice(v)).unwrap()
}

/// Routing buffers for `max_tokens` tokens, every word a sentinel.
fn sentinel_routes(ctx: &GpuContext, d: MoeDesc, max_tokens: usize) -> MoeRoutes {
    let slots = max_tokens * d.n_used as usize;
    MoeRoutes {
        ids: u32s(ctx, "ids", &vec![SENTINEL_U32; slots]),
        weights: f32s(ctx, "weights", &vec![SENTINEL; slots]),
        count: u32s(ctx, "count", &vec![SENTINEL_U32; d.n_expert as usize]),
        rows: u32s(ctx, "rows", &vec![SENTINEL_U32; d.n_expert as usize * max_tokens]),
    }
}

/// Router logits for `n_tok` tokens; with `ties`, values from a small set so that equal
/// logits compete for the last slots.
fn logits(rng: &mut TestRng, n_tok: usize, n_expert: usize, ties: bool) -> Vec<f32> {
    (0..n_tok * n_expert).map(|_| if ties { (rng.next_u32() % 4) as f32 * 0.5 } else { rng.f32() * 8.0 }).collect()
}

/// Each token's (expert, weight) per slot.
type Routes = Vec<Vec<(usize, f32)>>;

/// The reference's routes of every token and each expert's entries in token order.
fn reference(logits: &[f32], d: MoeDesc) -> (Routes, Vec<Vec<u32>>) {
    let (n, k) = (d.n_expert as usize, d.n_used as usize);
    let routes: Routes = logits.chunks(n).map(|row| ops::moe_route(row, k)).collect();
    let mut lists = vec![Vec::new(); n];
    for (t, r) in routes.iter().enumerate() {
        for (s, &(e, _)) in r.iter().enumerate() {
            lists[e].push((t * k + s) as u32);
        }
    }
    (routes, lists)
}

/// Runs the routing of `lg` (n_tok tokens, buffers for max_tokens) and returns the routes.
async fn route(ctx: &GpuContext, cache: &PipelineCache, batch: &Batch, d: MoeDesc, lg: &[f32], n_tok: usize) -> MoeRoutes {
    let max_tokens = batch.max_tokens as usize;
    let mut padded = lg.to_vec();
    padded.resize(max_tokens * d.n_expert as usize, 0.0);
    let lb = f32s(ctx, "logits", &padded);
    let routes = sentinel_routes(ctx, d, max_tokens);
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let op = MoeRoute::new(ctx, cache, batch, d, &lb, &routes).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    routes
}

/// Top `n_used` of `n_expert` for `n_tok` tokens; with `ties`, equal logits at the boundary.
#[derive(Clone, Copy, Debug)]
struct Routing {
    n_expert: u32,
    n_used: u32,
    n_tok: usize,
    ties: bool,
}

/// 4 of 2 (the oracle), 128 top 8 (Qwen3-30B-A3B), more experts than the routing's 64
/// invocations and entries past one 256-entry grouping tile, 1024 experts top 64.
fn routings(ties: bool) -> impl Iterator<Item = Routing> {
    [(4u32, 2u32, 5usize), (128, 8, 40), (100, 3, 1), (1024, 64, 6), (8, 8, 3)].into_iter().map(move |(n_expert, n_used, n_tok)| Routing {
        n_expert,
        n_used,
        n_tok,
        ties,
    })
}

async fn routing(ctx: &GpuContext, Routing { n_expert, n_used, n_tok, ties }: Routing) {
    let d = MoeDesc { n_expert, n_used };
    let mut rng = TestRng::new(n_expert as u64 * 7 + n_tok as u64);
    let lg = logits(&mut rng, n_tok, n_expert as usize, ties);
    let max_tokens = n_tok + SPARE;
    let batch = Batch::new(ctx, max_tokens as u32, 1, 1, 16).unwrap();
    let routes = route(ctx, pipelines(), &batch, d, &lg, n_tok).await;
    let k = n_used as usize;
    let ids = read_u32(ctx, &routes.ids, 0, max_tokens * k).await.unwrap();
    let w = read_f32(ctx, &routes.weights, 0, max_tokens * k).await.unwrap();
    let count = read_u32(ctx, &routes.count, 0, n_expert as usize).await.unwrap();
    let rows = read_u32(ctx, &routes.rows, 0, n_expert as usize * max_tokens).await.unwrap();
    ctx.check().unwrap();
    let (want, lists) = reference(&lg, d);
    for (t, r) in want.iter().enumerate() {
        for (s, &(e, wt)) in r.iter().enumerate() {
            assert_eq!(ids[t * k + s], e as u32, "token {t} slot {s}");
            let got = w[t * k + s];
            assert!((got - wt).abs() <= 1e-5 * wt + 1e-7, "token {t} slot {s} weight {got} want {wt}");
        }
    }
    assert_untouched(&ids[n_tok * k..], "ids written past n_tok");
    assert_untouched(&w[n_tok * k..], "weights written past n_tok");
    for (e, list) in lists.iter().enumerate() {
        assert_eq!(count[e] as usize, list.len(), "expert {e}'s count");
        let got = &rows[e * max_tokens..][..max_tokens];
        assert_eq!(&got[..list.len()], &list[..], "expert {e}'s entries");
        assert_untouched(&got[list.len()..], &format!("expert {e}'s list written past its count"));
    }
}

flint_gpu::op_tests! { routing;
    routing_with_distinct_logits => routings(false),
    routing_with_tied_logits => routings(true),
}

/// One matmul-by-expert case: a stack of `n_expert` experts of `n_rows` × `n_in` in `ty`.
#[derive(Clone, Copy, Debug)]
struct Case {
    ty: QuantType,
    n_in: u32,
    n_rows: u32,
    n_expert: u32,
    n_used: u32,
    n_tok: usize,
    /// x holds a row per token (else per entry).
    x_per_token: bool,
    /// The experts in two weight parts (split after the first third).
    split: bool,
    seed: u64,
}

async fn matmul_case(ctx: &GpuContext, cache: &PipelineCache, c: Case) -> f64 {
    let (n_in, n_rows, k) = (c.n_in as usize, c.n_rows as usize, c.n_used as usize);
    let max_tokens = c.n_tok + SPARE;
    let mut rng = TestRng::new(c.seed);
    let d = MoeDesc { n_expert: c.n_expert, n_used: c.n_used };
    let batch = Batch::new(ctx, max_tokens as u32, 1, 1, 16).unwrap();
    let lg = logits(&mut rng, c.n_tok, c.n_expert as usize, false);
    let routes = route(ctx, cache, &batch, d, &lg, c.n_tok).await;
    let w_bytes = random_quant(c.ty, c.n_expert as usize * n_rows * n_in, &mut rng, f16_nearest);
    let x_rows = if c.x_per_token { max_tokens } else { max_tokens * k };
    let x = rng.vec(x_rows * n_in);
    let y_len = max_tokens * k * n_rows;
    let xb = f32s(ctx, "x", &x);
    let yb = f32s(ctx, "y", &vec![SENTINEL; y_len]);
    // The stack as the uploader lays it out on the GPU (weights::layout).
    let gpu_bytes = layout::to_gpu(c.ty, n_in, &w_bytes);
    let expert_bytes = gpu_bytes.len() / c.n_expert as usize;
    let cuts = if c.split { vec![0, c.n_expert / 3, c.n_expert] } else { vec![0, c.n_expert] };
    let mut ops_ = Vec::new();
    for p in cuts.windows(2).filter(|p| p[1] > p[0]) {
        let wb = storage_init(ctx, "w", &gpu_bytes[p[0] as usize * expert_bytes..p[1] as usize * expert_bytes]).unwrap();
        let ids = MatmulIds {
            n_expert: p[1] - p[0],
            expert_offset: p[0],
            n_used: c.n_used,
            x_div: if c.x_per_token { c.n_used } else { 1 },
            count: &routes.count,
            rows: &routes.rows,
        };
        let desc = MatmulDesc {
            label: "by_expert",
            ty: c.ty,
            n_in: c.n_in,
            n_rows: c.n_rows,
            row_offset: 0,
            y_stride: c.n_rows,
            max_tokens: max_tokens as u32,
            accumulate: false,
            ids: Some(ids),
            output: flint_gpu::ops::matmul::Output::Rows,
            norm: None,
            exact: false,
        };
        ops_.push(Matmul::new(ctx, cache, &batch.info, &desc, &wb, &xb, &yb, None).await.unwrap_or_else(|e| panic!("{c:?}: {e}")));
    }
    submit(ctx, |pass| ops_.iter().for_each(|m| m.encode(pass, c.n_tok as u32)));
    let got = read_f32(ctx, &yb, 0, y_len).await.unwrap();
    ctx.check().unwrap_or_else(|e| panic!("{c:?}: {e}"));

    let mut w = vec![0f32; c.n_expert as usize * n_rows * n_in];
    quant::dequantize(c.ty, &w_bytes, &mut w).unwrap();
    let (routes_want, _) = reference(&lg, d);
    let (mut g, mut want) = (Vec::new(), Vec::new());
    for (t, r) in routes_want.iter().enumerate() {
        for (s, &(e, _)) in r.iter().enumerate() {
            let entry = t * k + s;
            let xr = if c.x_per_token { t } else { entry };
            for row in 0..n_rows {
                let wr = &w[(e * n_rows + row) * n_in..][..n_in];
                let v: f64 = wr.iter().zip(&x[xr * n_in..][..n_in]).map(|(&a, &b)| a as f64 * b as f64).sum();
                g.push(got[entry * n_rows + row]);
                want.push(v as f32);
            }
        }
    }
    assert_untouched(&got[c.n_tok * k * n_rows..], &format!("{c:?}: y written past the step's entries"));
    let e = nmse(&g, &want);
    let tol = if c.ty == QuantType::F32 { NMSE_F32 } else { NMSE_QUANT };
    assert!(e <= tol, "{c:?}: nmse {e:e} > {tol:e}");
    e
}

/// `ty`'s cases: 1 token (the decode kernel), 4, 13 and 37 (past one 16-token tile), x per
/// token and per entry, the experts in one or two weight parts.
fn by_expert(ty: QuantType) -> Vec<Case> {
    let n_in = if ty.block_elems() == 256 { 256 } else { 96 };
    let mut cases = Vec::new();
    for (i, n_tok) in [1usize, 4, 13, 37].into_iter().enumerate() {
        for x_per_token in [true, false] {
            cases.push(Case { ty, n_in, n_rows: 19, n_expert: 6, n_used: 2, n_tok, x_per_token, split: i % 2 == 1, seed: 200 + i as u64 });
        }
    }
    cases
}

async fn by_expert_on_adapter_kernels(ctx: &GpuContext, case: Case) {
    let e = matmul_case(ctx, pipelines(), case).await;
    eprintln!("{case:?}: nmse {e:.2e}");
}

// The adapter's own kernels. On lavapipe each blocked variant compiles for tens of seconds
// with a cold shader cache, so this takes F16 only (the oracle model's format, whose variants
// the model test then finds cached); the formats' dequantization is ops_matmul's, and the
// lane-team tests below take four.
flint_gpu::op_tests! { by_expert_on_adapter_kernels;
    matmul_by_expert_f16 => by_expert(QuantType::F16),
}

/// The kernels a discrete GPU takes, run here by a context told it is not CPU-like.
fn by_expert_on_lane_teams(test: &str, ty: QuantType) {
    let Some((ctx, cache)) = gpu_like(true) else { return };
    run_cases_on(ctx, test, by_expert(ty), |ctx, case| async move {
        let e = matmul_case(ctx, cache, case).await;
        eprintln!("{case:?}: nmse {e:.2e}");
    });
}

#[test]
fn matmul_by_expert_on_lane_teams_f16() {
    by_expert_on_lane_teams("matmul_by_expert_on_lane_teams_f16", QuantType::F16);
}

#[test]
fn matmul_by_expert_on_lane_teams_f32() {
    by_expert_on_lane_teams("matmul_by_expert_on_lane_teams_f32", QuantType::F32);
}

#[test]
fn matmul_by_expert_on_lane_teams_q8_0() {
    by_expert_on_lane_teams("matmul_by_expert_on_lane_teams_q8_0", QuantType::Q8_0);
}

#[test]
fn matmul_by_expert_on_lane_teams_q4_k() {
    by_expert_on_lane_teams("matmul_by_expert_on_lane_teams_q4_k", QuantType::Q4K);
}

/// Rows of `n` from `k` entries a token, for `n_tok` tokens; added to the output or not.
#[derive(Clone, Copy, Debug)]
struct Combine {
    n: u32,
    k: u32,
    n_tok: usize,
    accumulate: bool,
}

fn combines(accumulate: bool) -> impl Iterator<Item = Combine> {
    [(64u32, 2u32, 5usize), (300, 8, 3), (7, 1, 1)].into_iter().map(move |(n, k, n_tok)| Combine { n, k, n_tok, accumulate })
}

async fn combine(ctx: &GpuContext, Combine { n, k, n_tok, accumulate }: Combine) {
    let max_tokens = n_tok + SPARE;
    let (nu, ku) = (n as usize, k as usize);
    let mut rng = TestRng::new(n as u64 + k as u64);
    let batch = Batch::new(ctx, max_tokens as u32, 1, 1, 16).unwrap();
    batch.write(ctx, &vec![0; n_tok], &vec![0; n_tok], &vec![0; n_tok], &[]);
    let wts: Vec<f32> = (0..max_tokens * ku).map(|_| rng.f32().abs()).collect();
    let y = rng.vec(max_tokens * ku * nu);
    let mut out0 = rng.vec(n_tok * nu);
    out0.resize(max_tokens * nu, SENTINEL);
    let routes = MoeRoutes {
        ids: u32s(ctx, "ids", &vec![0; max_tokens * ku]),
        weights: f32s(ctx, "weights", &wts),
        count: u32s(ctx, "count", &[0; 4]),
        rows: u32s(ctx, "rows", &[0; 4]),
    };
    let yb = f32s(ctx, "y", &y);
    let ob = f32s(ctx, "out", &out0);
    let op = MoeCombine::new(ctx, pipelines(), &batch, n, k, accumulate, &routes, &yb, &ob).await.unwrap();
    submit(ctx, |p| op.encode(p, n_tok as u32));
    let got = read_f32(ctx, &ob, 0, out0.len()).await.unwrap();
    ctx.check().unwrap();
    let mut want = Vec::new();
    for t in 0..n_tok {
        for c in 0..nu {
            let s: f32 = (0..ku).map(|s| wts[t * ku + s] * y[(t * ku + s) * nu + c]).sum();
            want.push(if accumulate { out0[t * nu + c] + s } else { s });
        }
    }
    let e = nmse(&got[..n_tok * nu], &want);
    assert!(e <= NMSE_F32, "nmse {e:e}");
    assert_untouched(&got[n_tok * nu..], "wrote past n_tok");
}

flint_gpu::op_tests! { combine;
    combine_overwrites => combines(false),
    combine_accumulates => combines(true),
}

#[test]
fn rejects_bad_routing_shapes() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let batch = Batch::new(ctx, 4, 1, 1, 16).unwrap();
        let ok = MoeDesc { n_expert: 8, n_used: 2 };
        let routes = sentinel_routes(ctx, ok, 4);
        let lb = f32s(ctx, "logits", &[0.0; 32]);
        for bad in [MoeDesc { n_used: 9, ..ok }, MoeDesc { n_used: 0, ..ok }, MoeDesc { n_expert: 2000, ..ok }, MoeDesc { n_expert: 16, ..ok }] {
            let e = MoeRoute::new(ctx, &cache, &batch, bad, &lb, &routes).await.err();
            assert!(e.is_some(), "{bad:?} accepted");
        }
        assert!(MoeRoute::new(ctx, &cache, &batch, ok, &lb, &routes).await.is_ok());
    });
}
