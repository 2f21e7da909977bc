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
    let params = GenerateParams { max_tokens: Some(8), sampling, ..Default::default() };
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
    let opts = LoadOptions { backend, ..LoadOptions::default() };
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
    let plain = Engine::load_path(&path, &LoadOptions { backend, ..LoadOptions::default() }).unwrap();
    let spec = Engine::load_path(&path, &LoadOptions { backend, spec: SpecConfig::ngram(), ..LoadOptions::default() }).unwrap();
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
