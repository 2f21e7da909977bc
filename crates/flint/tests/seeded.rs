//! Seeded sampling is reproducible from run to run on each backend: the same seed and
//! settings give the same tokens, alone or beside other requests; another seed gives other
//! tokens; the choices of an `n > 1` request draw from their own streams, choice 0 exactly as
//! a single request does. Speculative decoding with n-gram drafts draws exactly the same tokens
//! as decoding without it, seed for seed (so the same distribution), and its drafts are both
//! accepted and rejected along the way.

mod common;

use flint::{BackendKind, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams, SpecConfig};
use futures::StreamExt;

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.95, min_p: 0.0, seed: Some(seed), ..SamplingParams::default() }
}

/// Token ids of each choice.
fn run(engine: &Engine, prompt: &str, seed: u64, n: usize) -> Vec<Vec<u32>> {
    run_with(engine, prompt, sampling(seed), n).0
}

/// Token ids of each choice, and the drafted and accepted tokens of all of them.
fn run_with(engine: &Engine, prompt: &str, sampling: SamplingParams, n: usize) -> (Vec<Vec<u32>>, usize, usize) {
    run_n(engine, prompt, sampling, n, 8)
}

/// [`run_with`] for `max_tokens` tokens.
fn run_n(engine: &Engine, prompt: &str, sampling: SamplingParams, n: usize, max_tokens: usize) -> (Vec<Vec<u32>>, usize, usize) {
    let params = GenerateParams { max_tokens: Some(max_tokens), sampling, ..Default::default() };
    let mut req = Request::new(Input::Text(prompt.into()), params);
    req.n = n;
    futures::executor::block_on(async {
        let (mut ids, mut drafted, mut accepted) = (vec![Vec::new(); n], 0, 0);
        let mut stream = engine.submit(req).unwrap();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                Event::Token { choice, id, .. } => ids[choice].push(id),
                Event::Done { summary, .. } => {
                    drafted += summary.draft_tokens;
                    accepted += summary.accepted_draft_tokens;
                }
            }
        }
        (ids, drafted, accepted)
    })
}

fn reproducible(backend: BackendKind) {
    let opts = LoadOptions { backend, ..LoadOptions::exact() };
    let engine = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    let a = run(&engine, "Once upon a time", 1234, 1).remove(0);
    assert_eq!(run(&engine, "Once upon a time", 1234, 1)[0], a, "same seed, same settings, different tokens");
    // Three choices: choice 0 is the single request's draw, the others their own streams.
    let three = run(&engine, "Once upon a time", 1234, 3);
    assert_eq!(three[0], a, "choice 0 draws from the seed's stream 0");
    assert!(three[1] != three[0] || three[2] != three[0], "choices 1 and 2 drew what choice 0 drew: {three:?}");
    // A fresh engine (a new run) draws the same tokens too.
    drop(engine);
    let fresh = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    assert_eq!(run(&fresh, "Once upon a time", 1234, 1)[0], a);
    let others: Vec<Vec<u32>> = (1..=2).map(|s| run(&fresh, "Once upon a time", s, 1).remove(0)).collect();
    assert!(others.iter().any(|o| *o != a), "other seeds all drew {a:?}");
}

#[test]
fn cpu_seeded_sampling_is_reproducible() {
    reproducible(BackendKind::Cpu);
}

#[test]
fn gpu_seeded_sampling_is_reproducible() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    reproducible(BackendKind::Gpu);
}

/// Sampled requests with n-gram drafts: every seed's tokens equal those drawn without
/// speculation (each verify row draws with the random number of its position, and a draft
/// is kept only where the row drew it), at temperature 1 with and without top-k/top-p.
fn speculation_draws_what_plain_decoding_draws(backend: BackendKind) {
    let path = common::model_path("gemma-3-270m");
    let plain = Engine::load_path(&path, &LoadOptions { backend, ..LoadOptions::exact() }).unwrap();
    let spec = Engine::load_path(&path, &LoadOptions { backend, spec: SpecConfig::ngram(), ..LoadOptions::exact() }).unwrap();
    // A pattern the model continues most of the time, so drafts are often, not always, right.
    let prompt = "red green blue red green blue red green blue red green blue red green";
    let settings = [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, top_k: 5, top_p: 0.9, min_p: 0.0, ..SamplingParams::default() },
    ];
    let (mut drafted, mut accepted) = (0, 0);
    for (i, s) in settings.iter().enumerate() {
        for seed in 1..=3 {
            let sampling = SamplingParams { seed: Some(seed), ..s.clone() };
            let (want, d0, _) = run_with(&plain, prompt, sampling.clone(), 4);
            let (got, d, a) = run_with(&spec, prompt, sampling, 4);
            assert_eq!(d0, 0, "the plain engine drafted");
            assert_eq!(got, want, "settings {i}, seed {seed}: speculation changed the draws");
            (drafted, accepted) = (drafted + d, accepted + a);
        }
    }
    eprintln!("{backend:?}: drafted {drafted}, accepted {accepted}");
    assert!(accepted > 0, "no draft was accepted ({drafted} drafted)");
    assert!(accepted < drafted, "no draft was rejected ({drafted} drafted)");
}

#[test]
fn cpu_speculation_draws_what_plain_decoding_draws() {
    speculation_draws_what_plain_decoding_draws(BackendKind::Cpu);
}

#[test]
fn gpu_speculation_draws_what_plain_decoding_draws() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    speculation_draws_what_plain_decoding_draws(BackendKind::Gpu);
}

/// The model at `src` with its final norm's weights scaled by `scale` (its logits
/// sharpened): a draft model with the same vocabulary that disagrees with it.
fn sharpened(src: &std::path::Path, scale: f32) -> std::path::PathBuf {
    let dst = std::env::temp_dir().join(format!("flint-test-sharpened-{}-{scale}.gguf", std::process::id()));
    let file = flint_core::gguf::GgufFile::open(src).unwrap();
    let t = file.tensor("output_norm.weight").expect("the model has output_norm.weight");
    assert_eq!(t.ty, flint_core::quant::QuantType::F32, "output_norm.weight is not f32");
    let at = (file.data_offset + t.offset) as usize;
    let mut bytes = std::fs::read(src).unwrap();
    for w in bytes[at..at + t.n_elems as usize * 4].chunks_exact_mut(4) {
        let v = f32::from_le_bytes(w.try_into().unwrap());
        w.copy_from_slice(&(v * scale).to_le_bytes());
    }
    std::fs::write(&dst, bytes).unwrap();
    dst
}

/// Chi-square test of homogeneity of two samples at p = 0.001, pooling the cells expected
/// below 5 in either sample; returns (passes, statistic, cells).
fn same_distribution(a: &[(u32, u32)], b: &[(u32, u32)]) -> (bool, f64, usize) {
    let mut cells: std::collections::BTreeMap<(u32, u32), (f64, f64)> = std::collections::BTreeMap::new();
    for x in a {
        cells.entry(*x).or_default().0 += 1.0;
    }
    for x in b {
        cells.entry(*x).or_default().1 += 1.0;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let n = na + nb;
    let (mut rows, mut pool) = (Vec::new(), (0.0, 0.0));
    for &(ca, cb) in cells.values() {
        let t = ca + cb;
        if t * na.min(nb) / n < 5.0 {
            pool = (pool.0 + ca, pool.1 + cb);
        } else {
            rows.push((ca, cb));
        }
    }
    if pool.0 + pool.1 > 0.0 {
        rows.push(pool);
    }
    let chi2: f64 = rows
        .iter()
        .map(|&(ca, cb)| {
            let t = ca + cb;
            let (ea, eb) = (t * na / n, t * nb / n);
            (ca - ea).powi(2) / ea + (cb - eb).powi(2) / eb
        })
        .sum();
    let k = (rows.len().max(2) - 1) as f64;
    // Wilson–Hilferty, one-sided 0.001.
    let crit = if k == 1.0 { 10.83 } else { k * (1.0 - 2.0 / (9.0 * k) + 3.090 * (2.0 / (9.0 * k)).sqrt()).powi(3) };
    (chi2 < crit, chi2, rows.len())
}

/// A draft model that disagrees with the target (the tiny random-weight qwen3 of
/// golden/families drafting for itself with sharpened logits): sampled drafts are verified
/// against the draft's distribution, and the first two tokens after a fixed prompt follow
/// the distribution of decoding without speculation (400 draws each, at temperature 1 with
/// and without top-k/top-p), while drafts are both kept and rejected. The draft's own
/// distribution is told apart by the same test, so a verification that kept every draft
/// would fail it.
#[test]
fn gpu_draft_model_speculation_keeps_the_distribution() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let path = common::shared().join("golden/families/qwen3/model.gguf");
    let draft = sharpened(&path, 2.0);
    // One drafted token per step: the second token is a verified row.
    let spec = SpecConfig { draft_max: 1, ..SpecConfig::default() };
    // Room for every sequence and its mirror in the draft model, prefilled in one step.
    let opts = LoadOptions { max_seqs: 80, max_batch_tokens: 2048, n_ctx: 64, kv_budget_positions: Some(80 * 32), spec, ..LoadOptions::exact() };
    let plain = Engine::load_path(&path, &opts).unwrap();
    let draft_alone = Engine::load_path(&draft, &opts).unwrap();
    let drafting = Engine::load_path(&path, &LoadOptions { draft_model: Some(draft.clone()), draft_p_min: 0.0, ..opts.clone() }).unwrap();
    let prompt = "The quick brown fox jumps over the lazy dog";
    let settings = [
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() },
        SamplingParams { temperature: 1.0, top_k: 5, top_p: 0.9, min_p: 0.0, ..SamplingParams::default() },
    ];
    let pairs = |engine: &Engine, s: &SamplingParams| {
        let (mut out, mut drafted, mut accepted) = (Vec::new(), 0, 0);
        for seed in 1..=5 {
            let (ids, d, a) = run_n(engine, prompt, SamplingParams { seed: Some(seed), ..s.clone() }, 80, 3);
            out.extend(ids.iter().map(|t| (t[0], t.get(1).copied().unwrap_or(u32::MAX))));
            (drafted, accepted) = (drafted + d, accepted + a);
        }
        (out, drafted, accepted)
    };
    for (i, s) in settings.iter().enumerate() {
        let (want, d0, _) = pairs(&plain, s);
        let (got, drafted, accepted) = pairs(&drafting, s);
        let (other, _, _) = pairs(&draft_alone, s);
        assert_eq!(d0, 0, "the plain engine drafted");
        let (ok, chi2, cells) = same_distribution(&want, &got);
        let (differs, chi2_q, cells_q) = same_distribution(&want, &other);
        let distinct = want.iter().collect::<std::collections::HashSet<_>>().len();
        eprintln!("settings {i}: {distinct} distinct pairs, chi2 {chi2:.2} over {cells} cells (the draft's own: {chi2_q:.2} over {cells_q}); drafted {drafted}, accepted {accepted}");
        assert!(ok, "settings {i}: the first two tokens changed distribution with speculation (chi2 {chi2:.2} over {cells} cells)");
        assert!(!differs, "settings {i}: the test cannot tell the draft's distribution from the target's (chi2 {chi2_q:.2} over {cells_q} cells)");
        assert!(accepted > 0 && accepted < drafted, "settings {i}: drafts were not both kept and rejected ({accepted} of {drafted})");
    }
    let _ = std::fs::remove_file(draft);
}
