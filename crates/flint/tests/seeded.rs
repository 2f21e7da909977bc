//! Seeded sampling is reproducible from run to run on each backend: the same seed and
//! settings give the same tokens; another seed gives other tokens.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use flint::{BackendKind, Engine, Event, GenerateParams, LoadOptions, SamplingParams};
use futures::StreamExt;

fn sample(engine: &mut Engine, seed: u64) -> Vec<u32> {
    let prompt = engine.tokenize_raw("Once upon a time").unwrap();
    let sampling = SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.95, min_p: 0.0, seed: Some(seed), ..SamplingParams::default() };
    let params = GenerateParams { max_tokens: Some(8), sampling, stop: Vec::new() };
    engine.reset();
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        let mut stream = engine.generate(prompt, params, Arc::new(AtomicBool::new(false))).unwrap();
        while let Some(ev) = stream.next().await {
            if let Event::Token { id, .. } = ev.unwrap() {
                ids.push(id);
            }
        }
        ids
    })
}

fn reproducible(backend: BackendKind) {
    let opts = LoadOptions { backend, ..LoadOptions::default() };
    let mut engine = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    let a = sample(&mut engine, 1234);
    let b = sample(&mut engine, 1234);
    assert_eq!(a, b, "same seed, same settings, different tokens");
    // A fresh engine (a new run) draws the same tokens too.
    let mut fresh = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    assert_eq!(sample(&mut fresh, 1234), a);
    let others: Vec<Vec<u32>> = (1..=2).map(|s| sample(&mut engine, s)).collect();
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
