//! Multi-turn prefix reuse: a second request whose prompt extends the first conversation
//! prefills only its new tokens, and its reply equals a cold run of the whole prompt.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use flint::{BackendKind, Engine, Event, GenerateParams, LoadOptions, SamplingParams, Summary};
use futures::StreamExt;

fn generate(engine: &mut Engine, prompt: Vec<u32>, n: usize) -> (Vec<u32>, Summary) {
    let params = GenerateParams { max_tokens: Some(n), sampling: SamplingParams::greedy(), stop: Vec::new() };
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        let mut stream = engine.generate(prompt, params, Arc::new(AtomicBool::new(false))).unwrap();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                Event::Token { id, .. } => ids.push(id),
                Event::Done { summary, .. } => return (ids, summary),
            }
        }
        unreachable!("the stream ends with Done")
    })
}

fn second_turn_reuses_the_first(backend: BackendKind) {
    let opts = LoadOptions { backend, ..LoadOptions::default() };
    let path = common::model_path("gemma-3-270m");
    let mut engine = Engine::load_path(&path, &opts).unwrap();
    let first = engine.tokenize_raw("The capital of France is Paris. The capital of Germany is").unwrap();
    let (reply, s1) = generate(&mut engine, first.clone(), 6);
    assert_eq!(s1.cached_prompt_tokens, 0);

    let mut second = first.clone();
    second.extend(&reply);
    second.extend(engine.tokenizer().encode(" The capital of Italy is", false, false).unwrap());
    let (warm, s2) = generate(&mut engine, second.clone(), 6);
    // Everything fed so far is reused: the prompt and all but the last reply token.
    assert_eq!(s2.cached_prompt_tokens, first.len() + reply.len() - 1, "{s2:?}");

    engine.reset();
    let (cold, s3) = generate(&mut engine, second, 6);
    assert_eq!(s3.cached_prompt_tokens, 0);
    assert_eq!(warm, cold, "a warm second turn must equal a cold run of the whole conversation");
}

#[test]
fn cpu_second_turn_prefills_only_new_tokens() {
    second_turn_reuses_the_first(BackendKind::Cpu);
}

#[test]
fn gpu_second_turn_prefills_only_new_tokens() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    second_turn_reuses_the_first(BackendKind::Gpu);
}
