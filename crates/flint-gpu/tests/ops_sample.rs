//! The row sampler against flint_core::sampling: argmax over full-size vocabularies
//! (max first/last/middle, ties), Gumbel-max draws checked by chi-square against
//! `Sampler::distribution`, the exact survivor set of top-k/top-p/min-p on large vocabularies
//! (with ties at the boundary), and reproducibility of seeded draws. With `ops::penalize` in
//! front: log-probabilities against `log_softmax_top`, penalized/biased/masked draws by
//! chi-square, and seeded reproducibility of those. Then 1, 3 and 8 rows with their own
//! logits and settings in one step: each row passes its own chi-square test and draws exactly
//! what it draws alone.

use flint_core::sampling::{self, log_softmax_top, DraftLink, Sampled, SamplingParams};
use flint_gpu::buffer::{read_f32, read_u32, storage};
use flint_gpu::ops::penalize::{mask_words, Penalize, StepEdits};
use flint_gpu::ops::sample::{state, SampleRow, Sampler};
use flint_gpu::pipeline::PipelineCache;
use flint_gpu::testing::{pipelines, submit, TestRng};
use flint_gpu::GpuContext;

struct Rig {
    sampler: Sampler,
    penalize: Penalize,
    n_vocab: usize,
    max_draws: u32,
    logits: wgpu::Buffer,
}

async fn rig(ctx: &GpuContext, cache: &PipelineCache, n_vocab: usize, max_draws: u32) -> Rig {
    rig_rows(ctx, cache, n_vocab, 1, max_draws).await
}

async fn rig_rows(ctx: &GpuContext, cache: &PipelineCache, n_vocab: usize, max_rows: u32, max_draws: u32) -> Rig {
    let logits = storage(ctx, "logits", max_rows as u64 * n_vocab as u64 * 4).unwrap();
    let sampler = Sampler::new(ctx, cache, n_vocab as u32, max_rows, max_draws, &logits).await.unwrap();
    let mut penalize = Penalize::new(ctx, cache, n_vocab as u32, max_rows, &logits, None).await.unwrap();
    // Nothing to edit yet (a prepared empty step records nothing).
    penalize.prepare(ctx, &[]).unwrap();
    Rig { sampler, penalize, n_vocab, max_draws, logits }
}

/// One row of a step: its logits and its sampler (settings, seed, history, mask).
struct Row<'a> {
    logits: &'a [f32],
    cpu: &'a sampling::Sampler,
}

impl Rig {
    async fn argmax(&self, ctx: &GpuContext, logits: &[f32]) -> u32 {
        let (draws, _) = self.sample(ctx, logits, &SamplingParams::greedy(), 0, 1).await;
        draws[0]
    }

    /// `n` draws for `params` at counters step..step+n, plus the sampler state.
    async fn sample(&self, ctx: &GpuContext, logits: &[f32], params: &SamplingParams, step: u32, n: u32) -> (Vec<u32>, Vec<u32>) {
        ctx.queue.write_buffer(&self.logits, 0, bytemuck::cast_slice(logits));
        let rows = [SampleRow::new(params, params.seed.unwrap_or(0), 0, step)];
        let plan = self.sampler.prepare(ctx, &rows, n).unwrap();
        submit(ctx, |p| self.sampler.encode(p, &plan));
        let out = self.sampler.read(ctx, &plan, &rows).await.unwrap();
        let st = read_u32(ctx, self.sampler.state_buffer(), 0, state::WORDS).await.unwrap();
        ctx.check().unwrap();
        (out[0].iter().map(|s| s.id).collect(), st)
    }

    /// One step over `rows` (row r's logits at row r): each row's edits and settings on the
    /// device, `n` draws at counters step.. for every row, its record when asked, and the
    /// edited logits (read back for oracles).
    async fn sample_rows(&mut self, ctx: &GpuContext, rows: &[Row<'_>], step: u32, n: u32) -> Vec<(Vec<u32>, Option<Sampled>, Vec<f32>)> {
        assert!(n <= self.max_draws);
        for (r, row) in rows.iter().enumerate() {
            ctx.queue.write_buffer(&self.logits, (r * self.n_vocab * 4) as u64, bytemuck::cast_slice(row.logits));
        }
        let edits: Vec<StepEdits> = rows.iter().map(|r| StepEdits::from_sampler(r.cpu)).collect();
        let edit_plan = self.penalize.prepare(ctx, &edits).unwrap();
        let specs: Vec<SampleRow> = rows.iter().map(|r| SampleRow::new(r.cpu.params(), r.cpu.seed(), r.cpu.stream(), step)).collect();
        let plan = self.sampler.prepare(ctx, &specs, n).unwrap();
        submit(ctx, |p| {
            self.penalize.encode(p, &edit_plan);
            self.sampler.encode(p, &plan);
        });
        let out = self.sampler.read(ctx, &plan, &specs).await.unwrap();
        let edited = read_f32(ctx, &self.logits, 0, rows.len() * self.n_vocab).await.unwrap();
        ctx.check().unwrap();
        out.into_iter()
            .zip(edited.chunks_exact(self.n_vocab))
            .zip(&specs)
            .map(|((draws, e), spec)| {
                let record = (spec.n_logprobs > 0).then(|| draws[0].clone());
                (draws.iter().map(|d| d.id).collect(), record, e.to_vec())
            })
            .collect()
    }

    /// `cpu`'s edits and settings on the device for one row.
    async fn sample_full(&mut self, ctx: &GpuContext, logits: &[f32], cpu: &sampling::Sampler, step: u32, n: u32) -> (Vec<u32>, Option<Sampled>, Vec<f32>) {
        let n = if cpu.params().temperature <= 0.0 { 1 } else { n };
        self.sample_rows(ctx, &[Row { logits, cpu }], step, n).await.pop().unwrap()
    }
}

fn params(temperature: f32, top_k: i32, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, seed: Some(seed), ..Default::default() }
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

/// The logits the argmax cases take, by name: random, a maximum first, last or in the middle,
/// ties (the lower id wins), all equal, all negative, all −inf but one.
const ARGMAX_LOGITS: [&str; 9] = ["random", "first", "last", "middle", "tie", "tie first/last", "constant", "all negative", "-inf but one"];

/// The `logits` case of [`ARGMAX_LOGITS`] on a vocabulary of `n`.
#[derive(Clone, Copy, Debug)]
struct Argmax {
    n: usize,
    logits: &'static str,
}

fn argmax_logits(n: usize, name: &str) -> Vec<f32> {
    let mut rng = TestRng::new(n as u64);
    let base: Vec<f32> = rng.vec(n).iter().map(|v| v * 10.0).collect();
    let maxima = |at: &[usize]| {
        let mut l = base.clone();
        for &i in at {
            l[i] = 20.0;
        }
        l
    };
    match name {
        "random" => base.clone(),
        "first" => maxima(&[0]),
        "last" => maxima(&[n - 1]),
        "middle" => maxima(&[n / 2]),
        "tie" => maxima(&[n / 3, 2 * n / 3]),
        "tie first/last" => maxima(&[n - 1, 0]),
        "constant" => vec![1.5; n],
        "all negative" => base.iter().map(|v| -v.abs() - 100.0).collect(),
        "-inf but one" => {
            let mut ninf = vec![f32::NEG_INFINITY; n];
            ninf[n - 1] = -1e30;
            ninf
        }
        _ => panic!("no argmax logits {name:?}"),
    }
}

fn argmax_cases(n: usize) -> impl Iterator<Item = Argmax> {
    ARGMAX_LOGITS.into_iter().map(move |logits| Argmax { n, logits })
}

async fn argmax(ctx: &GpuContext, Argmax { n, logits }: Argmax) {
    let r = rig(ctx, pipelines(), n, 1).await;
    let l = argmax_logits(n, logits);
    let got = r.argmax(ctx, &l).await;
    assert_eq!(got, sampling::argmax(&l), "n {n} {logits}");
}

flint_gpu::op_tests! { argmax;
    argmax_vocab_262144 => argmax_cases(262_144),
    argmax_vocab_151936 => argmax_cases(151_936),
    argmax_vocab_1000 => argmax_cases(1000),
    argmax_vocab_7 => argmax_cases(7),
    argmax_vocab_1 => argmax_cases(1),
}

/// Logits to draw from: [`SMALL`], or 300 seeded ones (untruncated they still spread).
#[derive(Clone, Copy, Debug)]
enum Logits {
    Small,
    Wide { seed: u64 },
}

/// 10^4 draws of `params` from `logits`.
#[derive(Clone, Debug)]
struct Draws {
    logits: Logits,
    params: SamplingParams,
}

async fn draws(ctx: &GpuContext, Draws { logits, params: p }: Draws) {
    let logits = match logits {
        Logits::Small => SMALL.to_vec(),
        Logits::Wide { seed } => TestRng::new(seed).vec(300).iter().map(|v| v * 4.0).collect(),
    };
    let r = rig(ctx, pipelines(), logits.len(), 10_000).await;
    check_distribution(ctx, &r, &logits, &p).await;
}

fn temperature_only() -> Vec<Draws> {
    let mut cases: Vec<Draws> = [0.7f32, 1.0, 1.9].map(|t| Draws { logits: Logits::Small, params: params(t, 0, 1.0, 0.0, 42) }).into();
    // A wider vocabulary, still untruncated.
    cases.push(Draws { logits: Logits::Wide { seed: 5 }, params: params(1.0, 0, 1.0, 0.0, 7) });
    cases
}

fn truncated() -> Vec<Draws> {
    let small = [
        params(0.7, 5, 1.0, 0.0, 42),
        params(1.0, 0, 0.8, 0.0, 1),
        params(1.3, 0, 1.0, 0.2, 2),
        params(0.8, 40, 0.95, 0.05, 3),
        params(1.5, 3, 0.9, 0.0, 4),
        params(0.5, 6, 0.99, 0.01, 5),
    ];
    let wide = [params(1.0, 50, 0.9, 0.0, 8), params(0.9, 0, 0.7, 0.02, 9)];
    let small = small.into_iter().map(|params| Draws { logits: Logits::Small, params });
    small.chain(wide.into_iter().map(|params| Draws { logits: Logits::Wide { seed: 6 }, params })).collect()
}

flint_gpu::op_tests! { draws;
    gumbel_temperature_only_matches_softmax => temperature_only(),
    gumbel_truncated_matches_distribution => truncated(),
}

fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The tokens the GPU's state says survive (sorted ids).
fn gpu_survivors(logits: &[f32], st: &[u32], p: &SamplingParams) -> Vec<u32> {
    let n = logits.len() as u32;
    let lmax = f32::from_bits(st[state::MAX_BITS]);
    let log_min_p = if p.min_p > 0.0 { (p.min_p as f64).ln() as f32 } else { -f32::MAX };
    let thr = (st[state::THR_V], st[state::THR_I]);
    (0..n)
        .filter(|&i| {
            let l = logits[i as usize];
            l - lmax >= log_min_p && (order_key(l), n - 1 - i) >= thr
        })
        .collect()
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

/// Top-k/top-p/min-p `params` on a vocabulary of `n`, smooth logits or quarter steps (`ties`:
/// ~n/64 tokens share each value, so boundaries fall in ties).
#[derive(Clone, Debug)]
struct Survivors {
    n: usize,
    ties: bool,
    params: SamplingParams,
}

fn survivor_cases(n: usize) -> Vec<Survivors> {
    let configs = [
        params(1.0, 40, 1.0, 0.0, 1),
        params(0.8, 40, 0.95, 0.05, 2),
        params(1.0, 0, 0.9, 0.0, 3),
        params(1.0, 0, 0.5, 0.01, 4),
        params(1.0, 5000, 0.3, 0.0, 5),
    ];
    let tie_configs = [
        params(1.0, 1000, 1.0, 0.0, 6),
        params(1.0, 3000, 1.0, 0.0, 7),
        params(1.0, 3000, 0.6, 0.0, 8),
        params(1.0, 0, 0.3, 0.0, 9),
        params(1.0, 0, 1.0, 0.9, 10),
    ];
    // The largest vocabulary runs a subset: lavapipe is slow.
    let every = if n > 200_000 { 2 } else { 1 };
    let smooth = configs.into_iter().step_by(every).map(|params| Survivors { n, ties: false, params });
    smooth.chain(tie_configs.into_iter().step_by(every).map(|params| Survivors { n, ties: true, params })).collect()
}

async fn survivors(ctx: &GpuContext, Survivors { n, ties, params: p }: Survivors) {
    let r = rig(ctx, pipelines(), n, 64).await;
    let mut rng = TestRng::new(n as u64 + 1);
    let smooth: Vec<f32> = rng.vec(n).iter().map(|v| v * 8.0).collect();
    if ties {
        let ties: Vec<f32> = smooth.iter().map(|v| (v * 4.0).round() / 4.0).collect();
        check_survivors(ctx, &r, &ties, &p, &format!("n {n} ties")).await;
    } else {
        check_survivors(ctx, &r, &smooth, &p, &format!("n {n} smooth")).await;
    }
}

flint_gpu::op_tests! { survivors;
    truncation_threshold_is_exact_vocab_151936 => survivor_cases(151_936),
    truncation_threshold_is_exact_vocab_262144 => survivor_cases(262_144),
}

#[test]
fn seeded_draws_are_reproducible() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
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

/// Log-probability tolerance against the f64 CPU log-softmax.
const LOGPROB_TOL: f32 = 1e-5;

fn check_record(label: &str, rec: &Sampled, edited: &[f32], n_top: usize) {
    let (want_lp, want_top) = log_softmax_top(edited, rec.id, n_top);
    let got_ids: Vec<u32> = rec.top_logprobs.iter().map(|t| t.0).collect();
    let want_ids: Vec<u32> = want_top.iter().map(|t| t.0).collect();
    assert_eq!(got_ids, want_ids, "{label}: top ids");
    for (g, w) in rec.top_logprobs.iter().zip(&want_top) {
        assert!((g.1 - w.1).abs() <= LOGPROB_TOL, "{label}: token {} log p {} want {}", g.0, g.1, w.1);
    }
    let lp = rec.logprob.unwrap();
    assert!((lp - want_lp).abs() <= LOGPROB_TOL, "{label}: chosen {} log p {lp} want {want_lp}", rec.id);
}

fn cpu_sampler(p: SamplingParams) -> sampling::Sampler {
    sampling::Sampler::new(p).unwrap()
}

/// `n_top` log-probabilities at temperature `t` on a vocabulary of `n`, smooth logits or
/// quarter steps (`ties`: the top-n boundary falls inside runs of equal logits).
#[derive(Clone, Copy, Debug)]
struct Logprobs {
    n: usize,
    ties: bool,
    t: f32,
    n_top: usize,
}

fn logprob_cases(n: usize) -> impl Iterator<Item = Logprobs> {
    [false, true].into_iter().flat_map(move |ties| [(0.0f32, 20usize), (1.0, 5), (0.8, 1), (0.0, 3)].map(|(t, n_top)| Logprobs { n, ties, t, n_top }))
}

async fn logprobs(ctx: &GpuContext, Logprobs { n, ties, t, n_top }: Logprobs) {
    let mut r = rig(ctx, pipelines(), n, 4).await;
    let mut rng = TestRng::new(n as u64 + 3);
    let smooth: Vec<f32> = rng.vec(n).iter().map(|v| v * 8.0).collect();
    let logits: Vec<f32> = if ties { smooth.iter().map(|v| (v * 4.0).round() / 4.0).collect() } else { smooth };
    let label = format!("n {n} {} T {t} top {n_top}", if ties { "ties" } else { "smooth" });
    let cpu = cpu_sampler(SamplingParams { n_logprobs: n_top, ..params(t, 40, 0.95, 0.0, 5) });
    let (draws, rec, edited) = r.sample_full(ctx, &logits, &cpu, 9, 1).await;
    let rec = rec.expect("a record");
    assert_eq!(edited, logits, "{label}: nothing to edit");
    assert_eq!(rec.id, draws[0], "{label}");
    if t == 0.0 {
        assert_eq!(rec.id, sampling::argmax(&logits), "{label}");
    }
    assert_eq!(rec.top_logprobs.len(), n_top.min(n), "{label}");
    check_record(&label, &rec, &edited, n_top);
}

flint_gpu::op_tests! { logprobs;
    logprobs_match_cpu_log_softmax_vocab_151936 => logprob_cases(151_936),
    logprobs_match_cpu_log_softmax_vocab_5000 => logprob_cases(5000),
    logprobs_match_cpu_log_softmax_vocab_300 => logprob_cases(300),
    logprobs_match_cpu_log_softmax_vocab_7 => logprob_cases(7),
}

/// Vocabulary 300, four tokens allowed, one of them banned by bias as well: three remain.
async fn logprobs_banned(ctx: &GpuContext, t: f32) {
    let n = 300;
    let mut r = rig(ctx, pipelines(), n, 1).await;
    let mut rng = TestRng::new(31);
    let logits: Vec<f32> = rng.vec(n).iter().map(|v| v * 3.0).collect();
    let allowed = [17u32, 64, 65, 250];
    let mut mask = vec![0u32; mask_words(n as u32)];
    for &a in &allowed {
        mask[a as usize / 32] |= 1 << (a % 32);
    }
    let mut cpu = cpu_sampler(SamplingParams { n_logprobs: 5, logit_bias: vec![(64, f32::NEG_INFINITY)], ..params(t, 0, 1.0, 0.0, 8) });
    cpu.set_mask(Some(mask.clone()));
    let (draws, rec, edited) = r.sample_full(ctx, &logits, &cpu, 0, 1).await;
    let rec = rec.unwrap();
    assert!([17, 65, 250].contains(&draws[0]), "T {t}: drew {}", draws[0]);
    assert_eq!(rec.top_logprobs.len(), 3, "T {t}: {:?}", rec.top_logprobs);
    check_record(&format!("banned T {t}"), &rec, &edited, 5);
    let sum: f32 = rec.top_logprobs.iter().map(|t| t.1.exp()).sum();
    assert!((sum - 1.0).abs() < 1e-5, "T {t}: the three allowed tokens hold all the mass: {sum}");
}

flint_gpu::op_tests! { logprobs_banned;
    logprobs_skip_banned_tokens => [0.0f32, 1.0],
}

/// Vocabulary 300: penalties over a history, bias (a ban on the favourite, a boost for an
/// outsider) and a mask allowing about three tokens in four.
fn penalized_case(rng: &mut TestRng, p: SamplingParams) -> (Vec<f32>, sampling::Sampler) {
    let n = 300;
    let logits: Vec<f32> = rng.vec(n).iter().map(|v| v * 4.0).collect();
    let best = sampling::argmax(&logits);
    let worst = logits.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
    let p = SamplingParams {
        repeat_penalty: 1.4,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        repeat_last_n: 32,
        logit_bias: vec![(best, f32::NEG_INFINITY), (worst, 6.0)],
        ..p
    };
    let mut cpu = cpu_sampler(p);
    let top: Vec<u32> = {
        let mut ids: Vec<u32> = (0..n as u32).collect();
        ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        ids[..20].to_vec()
    };
    // The history repeats the likeliest tokens so the penalties matter.
    for k in 0..40 {
        cpu.accept(top[(k * 7) % 20]);
    }
    let mask: Vec<u32> = (0..mask_words(n as u32)).map(|_| rng.next_u32() | rng.next_u32()).collect();
    cpu.set_mask(Some(mask));
    (logits, cpu)
}

/// The settings of the penalized draws, in the order they draw from one generator.
fn penalized_settings() -> [SamplingParams; 4] {
    [params(1.0, 0, 1.0, 0.0, 1), params(0.8, 40, 1.0, 0.0, 2), params(1.2, 0, 0.9, 0.02, 3), params(0.7, 25, 0.95, 0.05, 4)]
}

/// Penalized, biased and masked draws of `penalized_settings()[i]`.
async fn penalized(ctx: &GpuContext, i: usize) {
    let mut r = rig(ctx, pipelines(), 300, 10_000).await;
    let mut rng = TestRng::new(77);
    // The settings before this one draw their cases from the same generator first.
    for p in &penalized_settings()[..i] {
        penalized_case(&mut rng, p.clone());
    }
    let p = penalized_settings()[i].clone();
    let (logits, cpu) = penalized_case(&mut rng, p.clone());
    let mut want = logits.clone();
    cpu.penalize(&mut want);
    let (draws, _, edited) = r.sample_full(ctx, &logits, &cpu, 500, 10_000).await;
    let e = flint_gpu::testing::finite_nmse(&edited, &want).unwrap_or_else(|| panic!("{p:?}: bans"));
    assert!(e <= flint_gpu::testing::NMSE_F32, "{p:?}: edited logits nmse {e}");
    let dist: Vec<(u32, f64)> = cpu.distribution(&want).into_iter().filter(|d| d.1 > 0.0).collect();
    let allowed: std::collections::HashSet<u32> = dist.iter().map(|d| d.0).collect();
    let banned: Vec<u32> = draws.iter().copied().filter(|&d| want[d as usize] == f32::NEG_INFINITY).collect();
    assert!(banned.is_empty(), "{p:?}: drew banned/masked tokens {:?}", &banned[..banned.len().min(5)]);
    let outside = draws.iter().filter(|d| !allowed.contains(d)).count();
    assert_eq!(outside, 0, "{p:?}: {outside} draws outside the distribution");
    let (ok, chi2, cells) = chi_square_ok(&dist, &draws);
    eprintln!(
        "penalized T {} top_k {} top_p {} min_p {}: {} candidates, chi2 {chi2:.2} over {cells} cells",
        p.temperature,
        p.top_k,
        p.top_p,
        p.min_p,
        dist.len()
    );
    assert!(ok, "{p:?}: chi2 {chi2} over {cells} cells");
    // Greedy with the same edits: the CPU's choice.
    let mut gs = cpu_sampler(SamplingParams { temperature: 0.0, ..cpu.params().clone() });
    gs.set_mask(cpu.mask().map(|m| m.to_vec()));
    for e in cpu.edits() {
        for _ in 0..e.count {
            gs.accept(e.id);
        }
    }
    assert_eq!(gs.edits(), cpu.edits());
    let (gd, _, _) = r.sample_full(ctx, &logits, &gs, 0, 1).await;
    assert_eq!(gd[0], gs.sample(&logits), "{p:?}: greedy after the edits");
}

flint_gpu::op_tests! { penalized;
    penalized_biased_masked_draws_match_distribution => 0..penalized_settings().len(),
}

#[test]
fn seeded_penalized_draws_are_reproducible() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let mut r = rig(ctx, &cache, 300, 32).await;
        let mut rng = TestRng::new(123);
        let (logits, cpu) = penalized_case(&mut rng, SamplingParams { n_logprobs: 4, ..params(1.0, 0, 0.95, 0.0, 99) });
        let (a, ra, _) = r.sample_full(ctx, &logits, &cpu, 40, 32).await;
        let (b, rb, _) = r.sample_full(ctx, &logits, &cpu, 40, 32).await;
        assert_eq!(a, b, "same seed, step and edits must draw the same tokens");
        assert_eq!(ra, rb, "and report the same log-probabilities");
        let (c, _, _) = r.sample_full(ctx, &logits, &cpu, 41, 32).await;
        assert_eq!(&c[..31], &a[1..], "draw d of a batch is the draw at counter step + d");
        let other = {
            let (l2, cpu2) = penalized_case(&mut TestRng::new(123), SamplingParams { n_logprobs: 4, ..params(1.0, 0, 0.95, 0.0, 100) });
            assert_eq!(l2, logits);
            r.sample_full(ctx, &l2, &cpu2, 40, 32).await.0
        };
        assert_ne!(a, other, "another seed should draw differently");
    });
}

/// Logits of vocabulary `n` whose spread differs per seed.
fn row_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = TestRng::new(seed);
    let scale = 1.0 + (seed % 4) as f32;
    rng.vec(n).iter().map(|v| v * scale).collect()
}

/// Rows with their own logits and settings: a mix of greedy, plain, top-k, top-p, min-p, with
/// penalties, bias and masks on some; seeds and streams differ.
fn mixed_rows(n_rows: usize, n: usize) -> Vec<(Vec<f32>, sampling::Sampler)> {
    (0..n_rows)
        .map(|r| {
            let seed = 100 + r as u64;
            let logits = row_logits(seed, n);
            let p = match r % 4 {
                0 => params(1.0, 0, 1.0, 0.0, seed),
                1 => params(0.8, 12, 1.0, 0.0, seed),
                2 => SamplingParams { repeat_penalty: 1.3, presence_penalty: 0.2, logit_bias: vec![(3, 2.0)], ..params(1.2, 0, 0.9, 0.02, seed) },
                _ => params(0.7, 30, 0.95, 0.05, seed),
            };
            let mut cpu = sampling::Sampler::with_stream(p, seed, r as u32).unwrap();
            if r % 4 == 2 {
                cpu.accept_all(&[1, 2, 2, 5, 8]);
                let mut mask = vec![u32::MAX; mask_words(n as u32)];
                mask[0] &= !(1 << 7);
                cpu.set_mask(Some(mask));
            }
            (logits, cpu)
        })
        .collect()
}

/// `n_rows` rows of [`mixed_rows`] in one step: each row's edits, its chi-square test, and
/// the same draws and edits alone.
async fn own_distributions(ctx: &GpuContext, n_rows: usize) {
    let n = 200;
    let draws = 10_000;
    let cases = mixed_rows(n_rows, n);
    let mut r = rig_rows(ctx, pipelines(), n, n_rows as u32, draws).await;
    let rows: Vec<Row> = cases.iter().map(|(l, cpu)| Row { logits: l, cpu }).collect();
    let together = r.sample_rows(ctx, &rows, 300, draws).await;
    for (i, ((logits, cpu), (got, _, edited))) in cases.iter().zip(&together).enumerate() {
        let mut want = logits.clone();
        cpu.penalize(&mut want);
        // Within f32 rounding of the CPU's (the NVIDIA H200 differs by 1 ulp in a
        // repetition penalty); a row's edits are the same bits alone as batched (below).
        let e = flint_gpu::testing::finite_nmse(edited, &want).unwrap_or_else(|| panic!("{n_rows} rows: row {i}'s bans"));
        assert!(e <= flint_gpu::testing::NMSE_F32, "{n_rows} rows: row {i}'s edits, nmse {e}");
        let dist: Vec<(u32, f64)> = cpu.distribution(&want).into_iter().filter(|d| d.1 > 0.0).collect();
        let (ok, chi2, cells) = chi_square_ok(&dist, got);
        eprintln!("{n_rows} rows, row {i}: {} candidates, chi2 {chi2:.2} over {cells} cells", dist.len());
        assert!(ok, "{n_rows} rows: row {i} chi2 {chi2} over {cells} cells");
    }
    // Each row alone, at the same counters, draws the same tokens.
    for (i, (logits, cpu)) in cases.iter().enumerate() {
        let alone = r.sample_rows(ctx, &[Row { logits, cpu }], 300, 64).await.pop().unwrap();
        assert_eq!(alone.0[..], together[i].0[..64], "{n_rows} rows: row {i} drew otherwise alone");
        assert!(alone.2.iter().zip(&together[i].2).all(|(a, b)| a.to_bits() == b.to_bits()), "{n_rows} rows: row {i}'s edits differ alone");
    }
}

flint_gpu::op_tests! { own_distributions;
    rows_draw_from_their_own_distributions_and_as_they_do_alone => [1usize, 3, 8],
}

#[test]
fn rows_greedy_and_logprobs_mixed_in_one_step() {
    flint_gpu::gpu_test!(ctx => {
        let cache = PipelineCache::for_context(ctx);
        let n = 151_936;
        let mut r = rig_rows(ctx, &cache, n, 3, 1).await;
        let logits: Vec<Vec<f32>> = (0..3).map(|s| row_logits(900 + s, n)).collect();
        let cpus = [
            cpu_sampler(SamplingParams { n_logprobs: 5, ..SamplingParams::greedy() }),
            cpu_sampler(params(1.0, 40, 0.95, 0.0, 3)),
            cpu_sampler(SamplingParams { n_logprobs: 20, ..params(0.9, 0, 1.0, 0.0, 4) }),
        ];
        let rows: Vec<Row> = logits.iter().zip(&cpus).map(|(l, cpu)| Row { logits: l, cpu }).collect();
        let out = r.sample_rows(ctx, &rows, 7, 1).await;
        assert_eq!(out[0].0[0], sampling::argmax(&logits[0]));
        assert!(out[1].1.is_none(), "a row without log-probabilities gets no record");
        for (i, k) in [(0usize, 5usize), (2, 20)] {
            let rec = out[i].1.clone().expect("a record");
            assert_eq!(rec.id, out[i].0[0]);
            check_record(&format!("row {i}"), &rec, &logits[i], k);
        }
        // The sampled row's draw is among its top-40.
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by(|&a, &b| logits[1][b as usize].total_cmp(&logits[1][a as usize]));
        assert!(order[..40].contains(&out[1].0[0]));
    });
}

/// Rows holding NaN, +inf or f32::MAX (a broken model file or driver) come back as
/// `NON_FINITE`, greedy or sampled, with and without log-probabilities, as the CPU sampler
/// returns; rows beside them, and rows with −inf (banned) logits, sample as usual.
async fn broken_rows(ctx: &GpuContext, p: SamplingParams) {
    let n = 3000;
    let mut r = rig_rows(ctx, pipelines(), n, 6, 4).await;
    let clean = row_logits(7, n);
    let with = |at: usize, v: f32| {
        let mut l = clean.clone();
        l[at] = v;
        l
    };
    let rows_logits = [clean.clone(), with(2999, f32::NAN), with(0, f32::INFINITY), with(1500, f32::MAX), with(5, f32::NEG_INFINITY), with(9, -f32::NAN)];
    let cpus: Vec<sampling::Sampler> = (0..rows_logits.len()).map(|i| sampling::Sampler::with_stream(p.clone(), 11, i as u32).unwrap()).collect();
    let rows: Vec<Row> = rows_logits.iter().zip(&cpus).map(|(l, cpu)| Row { logits: l, cpu }).collect();
    let draws = if p.temperature <= 0.0 { 1 } else { 4 };
    let out = r.sample_rows(ctx, &rows, 0, draws).await;
    for (i, (ids, _, _)) in out.iter().enumerate() {
        let broken = rows_logits[i].iter().any(|&v| sampling::is_broken(v));
        let mut cpu = sampling::Sampler::with_stream(p.clone(), 11, i as u32).unwrap();
        assert_eq!(broken, cpu.sample_full(&rows_logits[i]).id == sampling::NON_FINITE, "row {i}: the CPU sampler disagrees");
        if broken {
            assert!(ids.iter().all(|&id| id == sampling::NON_FINITE), "row {i} {p:?}: {ids:?}");
        } else {
            assert!(ids.iter().all(|&id| (id as usize) < n), "row {i} {p:?}: {ids:?}");
        }
    }
}

flint_gpu::op_tests! { broken_rows;
    broken_logits_yield_non_finite => [SamplingParams::greedy(), params(1.0, 40, 0.9, 0.0, 3), SamplingParams { n_logprobs: 3, ..params(0.8, 0, 1.0, 0.0, 4) }],
}

/// One sampled step over `rows` (logits, settings, link), `n` draws each at counters 500..;
/// returns each row's draws and the sampler state of every row.
async fn linked_step(ctx: &GpuContext, r: &Rig, rows: &[(&[f32], &SamplingParams, Option<DraftLink>)], n: u32) -> (Vec<Vec<u32>>, Vec<u32>) {
    for (i, row) in rows.iter().enumerate() {
        ctx.queue.write_buffer(&r.logits, (i * r.n_vocab * 4) as u64, bytemuck::cast_slice(row.0));
    }
    let specs: Vec<SampleRow> = rows.iter().map(|(_, p, link)| SampleRow { link: *link, ..SampleRow::new(p, p.seed.unwrap_or(0), 0, 500) }).collect();
    let plan = r.sampler.prepare(ctx, &specs, n).unwrap();
    assert_eq!(plan.verify, specs.iter().any(|s| matches!(s.link, Some(DraftLink::Verify { .. }))));
    submit(ctx, |p| r.sampler.encode(p, &plan));
    let out = r.sampler.read(ctx, &plan, &specs).await.unwrap();
    let st = read_u32(ctx, r.sampler.state_buffer(), 0, rows.len() * state::WORDS).await.unwrap();
    ctx.check().unwrap();
    (out.into_iter().map(|d| d.iter().map(|s| s.id).collect()).collect(), st)
}

/// The draft side and the target side of speculative decoding with a sampled draft, against
/// flint_core::spec's exact computation on small hand-made distributions: a draft sampler
/// (vocabulary 60) records q into a store of the target's width (64) with the tail zeroed;
/// the target keeps a draft with probability min(1, p/q) (p(x) and q(x) checked against the
/// CPU's) and otherwise draws from norm(max(0, p − q)), so every draw lies in p's support
/// and the draws follow the exact verified distribution (chi-square over 6,000 draws).
async fn draft_verification(ctx: &GpuContext, (si, sp): (usize, SamplingParams)) {
    let sp = &sp;
    let cache = pipelines();
    let (n, n_draft, draws) = (64usize, 60usize, 6_000u32);
    let q_store = storage(ctx, "q", 4 * n as u64 * 4).unwrap();
    ctx.queue.write_buffer(&q_store, 0, bytemuck::cast_slice(&vec![7.0f32; 4 * n]));
    let mut target = rig_rows(ctx, cache, n, 2, draws).await;
    target.sampler.attach_q(ctx, cache, &q_store, n as u32).await.unwrap();
    let mut draft = rig_rows(ctx, cache, n_draft, 1, 1).await;
    draft.sampler.attach_q(ctx, cache, &q_store, n as u32).await.unwrap();
    assert_eq!(target.sampler.q_rows(), 4);
    // A row linked past the store is refused.
    let far = [SampleRow { link: Some(DraftLink::Record { q_row: 4 }), ..SampleRow::new(&params(1.0, 0, 1.0, 0.0, 1), 1, 0, 0) }];
    assert!(draft.sampler.prepare(ctx, &far, 1).is_err());

    let mut rng = TestRng::new(41);
    let logits: Vec<f32> = rng.vec(n).iter().map(|v| v * 3.0).collect();
    let draft_logits: Vec<f32> = logits[..n_draft].iter().zip(rng.vec(n_draft)).map(|(l, e)| l + e).collect();
    let cpu = sampling::Sampler::new(sp.clone()).unwrap();
    let p = cpu.distribution(&logits);
    let q_of = |d: &[f32]| {
        let mut q = vec![0.0f64; n];
        for (id, v) in cpu.distribution(d) {
            q[id as usize] = v;
        }
        q
    };
    // The draft side records q of its own logits, and of the target's (p = q).
    for (q_row, d) in [(0u32, &draft_logits[..]), (1, &logits[..n_draft])] {
        linked_step(ctx, &draft, &[(d, sp, Some(DraftLink::Record { q_row }))], 1).await;
        let got = read_f32(ctx, &q_store, q_row as u64 * n as u64, n).await.unwrap();
        let want = q_of(d);
        for (id, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - w).abs() < 1e-6, "settings {si}, q row {q_row}: id {id} recorded {g}, the CPU gives {w}");
        }
    }
    // Hand-made q rows: disjoint from p's support (three banned ids past the draft's
    // vocabulary), and mass on a banned token.
    let outside: Vec<u32> = (61..64).collect();
    let mut outside_logits = logits.clone();
    for &id in &outside {
        outside_logits[id as usize] = f32::NEG_INFINITY;
    }
    let mut disjoint = vec![0.0f32; n];
    for &id in &outside {
        disjoint[id as usize] = 1.0 / outside.len() as f32;
    }
    let mut banned_logits = logits.clone();
    let banned = p[0].0;
    banned_logits[banned as usize] = f32::NEG_INFINITY;
    let mut on_banned = vec![0.0f32; n];
    on_banned[banned as usize] = 0.6;
    on_banned[p[1].0 as usize] = 0.4;
    ctx.queue.write_buffer(&q_store, 2 * n as u64 * 4, bytemuck::cast_slice(&disjoint));
    ctx.queue.write_buffer(&q_store, 3 * n as u64 * 4, bytemuck::cast_slice(&on_banned));
    let q_prefix = |d: &[f32]| {
        let mut q = q_of(d);
        q.truncate(n_draft);
        q
    };
    let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    // (label, target logits, q row, q, drafted token)
    type Case = (String, Vec<f32>, u32, Vec<f64>, u32);
    let mut cases: Vec<Case> = Vec::new();
    // p = q: the target's ids past the draft's vocabulary banned.
    let mut short = logits.clone();
    short[n_draft..].fill(f32::NEG_INFINITY);
    let x = cpu.distribution(&short)[0].0;
    cases.push((format!("p = q, x = {x}"), short, 1, q_prefix(&logits[..n_draft]), x));
    let qd = q_prefix(&draft_logits);
    let mut by_q: Vec<u32> = (0..n_draft as u32).filter(|&i| qd[i as usize] > 0.0).collect();
    by_q.sort_by(|&a, &b| qd[b as usize].total_cmp(&qd[a as usize]));
    for &x in by_q.iter().take(2) {
        cases.push((format!("draft q, x = {x}"), logits.clone(), 0, qd.clone(), x));
    }
    cases.push(("disjoint supports".into(), outside_logits, 2, f64s(&disjoint), outside[0]));
    cases.push(("banned draft".into(), banned_logits.clone(), 3, f64s(&on_banned), banned));
    for (label, tl, q_row, q, x) in &cases {
        let tp = cpu.distribution(tl);
        let (keep, _) = flint_core::spec::verify_exact(&tp, q, *x);
        let want = flint_core::spec::verified_distribution(&tp, q, *x);
        // Row 0 verifies; row 1, unlinked, still draws plainly beside it.
        let rows = [(&tl[..], sp, Some(DraftLink::Verify { token: *x, q_row: *q_row })), (&tl[..], sp, None)];
        let (out, st) = linked_step(ctx, &target, &rows, draws).await;
        let px = tp.iter().find(|e| e.0 == *x).map_or(0.0, |e| e.1);
        let (gpx, gqx) = (f32::from_bits(st[state::PX_BITS]) as f64, f32::from_bits(st[state::QX_BITS]) as f64);
        assert!(
            (gpx - px).abs() < 1e-5 && (gqx - q[*x as usize]).abs() < 1e-6,
            "settings {si}, {label}: p(x), q(x) = {gpx}, {gqx}; the CPU gives {px}, {}",
            q[*x as usize]
        );
        let support: std::collections::HashSet<u32> = tp.iter().map(|e| e.0).collect();
        let kept = out[0].iter().filter(|&&t| t == *x).count();
        assert!(out[0].iter().all(|t| support.contains(t)), "settings {si}, {label}: a draw outside p's support");
        if keep == 1.0 {
            assert_eq!(kept, draws as usize, "settings {si}, {label}: a draft kept with probability 1 was rejected");
        }
        if keep == 0.0 {
            assert_eq!(kept, 0, "settings {si}, {label}: a draft p gives nothing was kept");
        }
        let (ok, chi2, cells) = chi_square_ok(&want, &out[0]);
        eprintln!("settings {si}, {label}: keep {keep:.3}, kept {kept}/{draws}, chi2 {chi2:.2} over {cells} cells");
        assert!(ok, "settings {si}, {label}: chi2 {chi2} over {cells} cells");
        let (ok, chi2, _) = chi_square_ok(&tp, &out[1]);
        assert!(ok, "settings {si}, {label}: the unlinked row's chi2 {chi2}");
    }
}

flint_gpu::op_tests! { draft_verification;
    sampled_draft_verification_matches_the_exact_rule => [params(1.0, 0, 1.0, 0.0, 7), params(0.8, 5, 0.9, 0.0, 8), params(1.3, 0, 0.95, 0.05, 9)]
        .into_iter()
        .enumerate(),
}
