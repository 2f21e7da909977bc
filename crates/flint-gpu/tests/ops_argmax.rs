//! Greedy argmax and GPU sampling against flint_core::sampling: argmax over full-size
//! vocabularies (max first/last/middle, ties), Gumbel-max draws checked by chi-square against
//! `Sampler::distribution`, the exact survivor set of top-k/top-p/min-p on large vocabularies
//! (with ties at the boundary), and reproducibility of seeded draws.

use flint_core::sampling::{self, SamplingParams};
use flint_gpu::buffer::{read_u32, storage, storage_init};
use flint_gpu::ops::argmax::{state, SampleStep, Sampler};
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::TestRng;
use flint_gpu::GpuContext;

fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        f(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

struct Rig {
    sampler: Sampler,
    logits: wgpu::Buffer,
    out: wgpu::Buffer,
}

async fn rig(ctx: &GpuContext, cache: &PipelineCache, n_vocab: usize, max_draws: u32) -> Rig {
    let logits = storage(ctx, "logits", n_vocab as u64 * 4).unwrap();
    // One spare word past the draws: a sentinel for out-of-bounds writes.
    let out = storage_init(ctx, "out", bytemuck::cast_slice(&vec![u32::MAX; max_draws as usize + 1])).unwrap();
    let sampler = Sampler::with_max_draws(ctx, cache, n_vocab as u32, max_draws, &logits, &out).await.unwrap();
    Rig { sampler, logits, out }
}

impl Rig {
    async fn argmax(&self, ctx: &GpuContext, logits: &[f32]) -> u32 {
        ctx.queue.write_buffer(&self.logits, 0, bytemuck::cast_slice(logits));
        submit(ctx, |p| self.sampler.encode_argmax(p));
        let out = read_u32(ctx, &self.out, 0, 1).await.unwrap();
        ctx.check().unwrap();
        out[0]
    }

    /// `n` draws for `params` at counters step..step+n, plus the sampler state.
    async fn sample(&self, ctx: &GpuContext, logits: &[f32], params: &SamplingParams, step: u32, n: u32) -> (Vec<u32>, Vec<u32>) {
        ctx.queue.write_buffer(&self.logits, 0, bytemuck::cast_slice(logits));
        let plan = self.sampler.prepare(ctx, &SampleStep::new(params, params.seed.unwrap_or(0), step), n).unwrap();
        submit(ctx, |p| self.sampler.encode_sample(p, &plan));
        let out = read_u32(ctx, &self.out, 0, self.out.size() as usize / 4).await.unwrap();
        let st = read_u32(ctx, self.sampler.state_buffer(), 0, state::WORDS).await.unwrap();
        ctx.check().unwrap();
        assert_eq!(*out.last().unwrap(), u32::MAX, "wrote past the draws");
        (out[..n as usize].to_vec(), st)
    }
}

fn params(temperature: f32, top_k: i32, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, seed: Some(seed) }
}

/// Chi-square goodness of fit at p = 0.001, pooling categories expected below 5 draws.
/// Critical values by Wilson–Hilferty (within 1% of the tables for ≥ 2 degrees of freedom).
fn chi_square_ok(dist: &[(u32, f64)], draws: &[u32]) -> (bool, f64, usize) {
    let n = draws.len() as f64;
    let mut counts = std::collections::HashMap::new();
    for &d in draws {
        *counts.entry(d).or_insert(0usize) += 1;
    }
    let mut chi2 = 0.0;
    let mut cells = 0;
    let (mut pool_e, mut pool_o) = (0.0, 0.0);
    for &(id, p) in dist {
        let e = p * n;
        let o = *counts.get(&id).unwrap_or(&0) as f64;
        if e < 5.0 {
            pool_e += e;
            pool_o += o;
        } else {
            chi2 += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        chi2 += (pool_o - pool_e).powi(2) / pool_e.max(1.0);
        cells += 1;
    }
    let k = (cells.max(2) - 1) as f64;
    let z = 3.090; // one-sided 0.001
    let crit = if k == 1.0 { 10.83 } else { k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3) };
    (chi2 < crit, chi2, cells)
}

/// Draws 10^4 samples in one batch and checks them against the CPU distribution.
async fn check_distribution(ctx: &GpuContext, rig: &Rig, logits: &[f32], p: &SamplingParams) {
    let n = 10_000;
    let (draws, _) = rig.sample(ctx, logits, p, 1000, n).await;
    let dist = sampling::Sampler::new(p.clone()).unwrap().distribution(logits);
    let allowed: std::collections::HashSet<u32> = dist.iter().map(|d| d.0).collect();
    let outside: Vec<u32> = draws.iter().copied().filter(|d| !allowed.contains(d)).collect();
    assert!(outside.is_empty(), "{p:?}: drew {} tokens outside the distribution, e.g. {:?}", outside.len(), &outside[..outside.len().min(5)]);
    let (ok, chi2, cells) = chi_square_ok(&dist, &draws);
    eprintln!("{p:?}: {} candidates, chi2 {chi2:.2} over {cells} cells", dist.len());
    assert!(ok, "{p:?}: chi2 {chi2} over {cells} cells");
}

const SMALL: [f32; 7] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -5.0];

#[test]
fn argmax_full_vocabularies() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &n in &[262_144usize, 151_936, 1000, 7, 1] {
            let r = rig(ctx, &cache, n, 1).await;
            let mut rng = TestRng::new(n as u64);
            let base: Vec<f32> = rng.vec(n).iter().map(|v| v * 10.0).collect();
            let mut cases: Vec<(String, Vec<f32>)> = vec![("random".into(), base.clone())];
            for (name, at) in [("first", vec![0]), ("last", vec![n - 1]), ("middle", vec![n / 2]), ("tie", vec![n / 3, 2 * n / 3]), ("tie first/last", vec![n - 1, 0])] {
                let mut l = base.clone();
                for &i in &at {
                    l[i] = 20.0;
                }
                cases.push((name.into(), l));
            }
            cases.push(("constant".into(), vec![1.5; n]));
            cases.push(("all negative".into(), base.iter().map(|v| -v.abs() - 100.0).collect()));
            let mut ninf = vec![f32::NEG_INFINITY; n];
            ninf[n - 1] = -1e30;
            cases.push(("-inf but one".into(), ninf));
            for (name, l) in &cases {
                let got = r.argmax(ctx, l).await;
                assert_eq!(got, sampling::argmax(l), "n {n} {name}");
            }
        }
    });
}

#[test]
fn gumbel_temperature_only_matches_softmax() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let r = rig(ctx, &cache, SMALL.len(), 10_000).await;
        for t in [0.7f32, 1.0, 1.9] {
            check_distribution(ctx, &r, &SMALL, &params(t, 0, 1.0, 0.0, 42)).await;
        }
        // A wider vocabulary, still untruncated.
        let mut rng = TestRng::new(5);
        let wide: Vec<f32> = rng.vec(300).iter().map(|v| v * 4.0).collect();
        let r = rig(ctx, &cache, wide.len(), 10_000).await;
        check_distribution(ctx, &r, &wide, &params(1.0, 0, 1.0, 0.0, 7)).await;
    });
}

#[test]
fn gumbel_truncated_matches_distribution() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let r = rig(ctx, &cache, SMALL.len(), 10_000).await;
        for p in [
            params(0.7, 5, 1.0, 0.0, 42),
            params(1.0, 0, 0.8, 0.0, 1),
            params(1.3, 0, 1.0, 0.2, 2),
            params(0.8, 40, 0.95, 0.05, 3),
            params(1.5, 3, 0.9, 0.0, 4),
            params(0.5, 6, 0.99, 0.01, 5),
        ] {
            check_distribution(ctx, &r, &SMALL, &p).await;
        }
        let mut rng = TestRng::new(6);
        let wide: Vec<f32> = rng.vec(300).iter().map(|v| v * 4.0).collect();
        let r = rig(ctx, &cache, wide.len(), 10_000).await;
        check_distribution(ctx, &r, &wide, &params(1.0, 50, 0.9, 0.0, 8)).await;
        check_distribution(ctx, &r, &wide, &params(0.9, 0, 0.7, 0.02, 9)).await;
    });
}

fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
}

/// The tokens the GPU's state says survive (sorted ids).
fn gpu_survivors(logits: &[f32], st: &[u32], p: &SamplingParams) -> Vec<u32> {
    let n = logits.len() as u32;
    let lmax = f32::from_bits(st[state::MAX_BITS]);
    let log_min_p = if p.min_p > 0.0 { (p.min_p as f64).ln() as f32 } else { -f32::MAX };
    let thr = (st[state::THR_V], st[state::THR_I]);
    (0..n).filter(|&i| {
        let l = logits[i as usize];
        l - lmax >= log_min_p && (order_key(l), n - 1 - i) >= thr
    }).collect()
}

/// The CPU's cumulative top-p mass at each kept position near the boundary, to tell a real
/// error from a threshold that sits within rounding of top_p.
fn topp_margin(logits: &[f32], p: &SamplingParams, keep: usize) -> f64 {
    let mut cand: Vec<f32> = logits.to_vec();
    cand.sort_by(|a, b| b.total_cmp(a));
    if p.top_k > 0 {
        cand.truncate(p.top_k as usize);
    }
    let max = cand[0] as f64;
    let e: Vec<f64> = cand.iter().map(|&l| (l as f64 - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let cum_before: f64 = e[..keep.saturating_sub(1)].iter().sum::<f64>() / z;
    let cum_at: f64 = e[..keep].iter().sum::<f64>() / z;
    (cum_before - p.top_p as f64).abs().min((cum_at - p.top_p as f64).abs())
}

async fn check_survivors(ctx: &GpuContext, r: &Rig, logits: &[f32], p: &SamplingParams, label: &str) {
    let (draws, st) = r.sample(ctx, logits, p, 77, 64).await;
    let cpu = sampling::Sampler::new(p.clone()).unwrap().distribution(logits);
    let mut want: Vec<u32> = cpu.iter().map(|d| d.0).collect();
    want.sort_unstable();
    let got = gpu_survivors(logits, &st, p);
    assert_eq!(st[state::MAX_ID], sampling::argmax(logits), "{label}: max id");
    if got != want {
        let margin = topp_margin(logits, p, cpu.len());
        let close = p.top_p < 1.0 && got.len().abs_diff(want.len()) == 1 && margin < 1e-6;
        assert!(close, "{label} {p:?}: GPU keeps {} tokens, CPU {} (top-p margin {margin:e})", got.len(), want.len());
        eprintln!("{label}: top-p boundary within {margin:e} of top_p; GPU {} vs CPU {}", got.len(), want.len());
    }
    let kept: std::collections::HashSet<u32> = got.iter().copied().collect();
    assert!(draws.iter().all(|d| kept.contains(d)), "{label}: a draw outside the survivors");
    eprintln!("{label} {p:?}: {} survivors", got.len());
}

#[test]
fn truncation_threshold_is_exact_on_large_vocabularies() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        for &n in &[151_936usize, 262_144] {
            let r = rig(ctx, &cache, n, 64).await;
            let mut rng = TestRng::new(n as u64 + 1);
            let smooth: Vec<f32> = rng.vec(n).iter().map(|v| v * 8.0).collect();
            // Quarter-step logits: ~n/64 tokens share each value, so boundaries fall in ties.
            let ties: Vec<f32> = smooth.iter().map(|v| (v * 4.0).round() / 4.0).collect();
            let configs = [
                params(1.0, 40, 1.0, 0.0, 1),
                params(0.8, 40, 0.95, 0.05, 2),
                params(1.0, 0, 0.9, 0.0, 3),
                params(1.0, 0, 0.5, 0.01, 4),
                params(1.0, 5000, 0.3, 0.0, 5),
            ];
            // The largest vocabulary runs a subset: lavapipe is slow.
            let every = if n > 200_000 { 2 } else { 1 };
            for p in configs.iter().step_by(every) {
                check_survivors(ctx, &r, &smooth, p, &format!("n {n} smooth")).await;
            }
            let tie_configs = [
                params(1.0, 1000, 1.0, 0.0, 6),
                params(1.0, 3000, 1.0, 0.0, 7),
                params(1.0, 3000, 0.6, 0.0, 8),
                params(1.0, 0, 0.3, 0.0, 9),
                params(1.0, 0, 1.0, 0.9, 10),
            ];
            for p in tie_configs.iter().step_by(every) {
                check_survivors(ctx, &r, &ties, p, &format!("n {n} ties")).await;
            }
        }
    });
}

#[test]
fn seeded_draws_are_reproducible() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::new();
        let mut rng = TestRng::new(11);
        let logits: Vec<f32> = rng.vec(5000).iter().map(|v| v * 2.0).collect();
        let r = rig(ctx, &cache, logits.len(), 16).await;
        let p = params(1.0, 0, 0.95, 0.0, 1234);
        let (a, _) = r.sample(ctx, &logits, &p, 100, 16).await;
        let (b, _) = r.sample(ctx, &logits, &p, 100, 16).await;
        assert_eq!(a, b, "same seed and step must draw the same tokens");
        // Draw d of a batch is the single draw at counter step + d.
        for d in [0u32, 5, 15] {
            let (one, _) = r.sample(ctx, &logits, &p, 100 + d, 1).await;
            assert_eq!(one[0], a[d as usize], "draw {d}");
        }
        let (c, _) = r.sample(ctx, &logits, &params(1.0, 0, 0.95, 0.0, 1235), 100, 16).await;
        assert_ne!(a, c, "another seed should draw differently");
        let distinct: std::collections::HashSet<u32> = a.iter().copied().collect();
        assert!(distinct.len() > 8, "16 draws over ~5000 candidates should mostly differ: {a:?}");
        // Greedy ignores the seed and truncation.
        let (g, _) = r.sample(ctx, &logits, &params(0.0, 40, 0.5, 0.1, 1), 0, 1).await;
        assert_eq!(g[0], sampling::argmax(&logits));
    });
}
