//! Seeded sampling is reproducible from run to run on each backend: the same seed and
//! settings give the same tokens, alone or beside other requests; another seed gives other
//! tokens; the choices of an `n > 1` request draw from their own streams, choice 0 exactly as
//! a single request does.

mod common;

use flint::{BackendKind, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams};
use futures::StreamExt;

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.95, min_p: 0.0, seed: Some(seed), ..SamplingParams::default() }
}

/// Token ids of each choice.
fn run(engine: &Engine, prompt: &str, seed: u64, n: usize) -> Vec<Vec<u32>> {
    let params = GenerateParams { max_tokens: Some(8), sampling: sampling(seed), ..Default::default() };
    let mut req = Request::new(Input::Text(prompt.into()), params);
    req.n = n;
    futures::executor::block_on(async {
        let mut ids = vec![Vec::new(); n];
        let mut stream = engine.submit(req).unwrap();
        while let Some(ev) = stream.next().await {
            if let Event::Token { choice, id, .. } = ev.unwrap() {
                ids[choice].push(id);
            }
        }
        ids
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
