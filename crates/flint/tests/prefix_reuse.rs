//! Multi-turn prefix reuse: a second request whose prompt extends the first conversation
//! prefills only what lies past the first's full KV blocks, and its reply equals a cold run
//! of the whole prompt.

mod common;

use flint::{BackendKind, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams, Summary};
use futures::StreamExt;

/// Positions per KV block.
const BLOCK: usize = 16;

fn generate(engine: &Engine, prompt: Vec<u32>, n: usize) -> (Vec<u32>, Summary) {
    let params = GenerateParams { max_tokens: Some(n), sampling: SamplingParams::greedy(), ..Default::default() };
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        let mut stream = engine.submit(Request::new(Input::Tokens(prompt), params)).unwrap();
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
    let opts = LoadOptions { backend, ..LoadOptions::exact() };
    let engine = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    let first = engine.tokenize_raw("The capital of France is Paris. The capital of Germany is Berlin, and the capital of Spain is").unwrap();
    let (reply, s1) = generate(&engine, first.clone(), 6);
    assert_eq!(s1.cached_prompt_tokens, 0);

    let mut second = first.clone();
    second.extend(&reply);
    second.extend(engine.tokenizer().encode(" The capital of Italy is", false, false).unwrap());
    let (warm, s2) = generate(&engine, second.clone(), 6);
    // Every full block the first request computed is reused: its prompt and all but the last
    // reply token were computed.
    let computed = first.len() + reply.len() - 1;
    assert!(computed >= BLOCK, "the first request fills a block");
    assert_eq!(s2.cached_prompt_tokens, computed / BLOCK * BLOCK, "{s2:?}");

    engine.clear_cache();
    let (cold, s3) = generate(&engine, second, 6);
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

/// A step budget smaller than the sequences and the self-test's probe (`flint serve
/// --max-batch-tokens 3 --parallel 8`): the self-test passes with a 3-token prompt step, the
/// warm-up's decode steps of up to 8 sequences keep to 3 tokens a step, and a prompt
/// prefilled 3 tokens a step gives the greedy ids of one prefilled in a single step (the exact
/// mode: a token's bits do not depend on its step).
#[test]
fn gpu_a_small_step_budget_warms_up_and_prefills_in_pieces() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let path = common::shared().join("golden/families/qwen3/model.gguf");
    let whole = LoadOptions { n_ctx: 128, ..LoadOptions::exact() };
    let small = Engine::load_path(&path, &LoadOptions { max_batch_tokens: 3, max_seqs: 8, self_test: true, ..whole.clone() }).unwrap();
    let report = small.info().self_test.as_ref().expect("the self-test ran");
    assert!(report.summary().contains("passed"), "{}", report.summary());
    futures::executor::block_on(small.warm_up()).unwrap();
    let prompt = small.tokenize_raw("The quick brown fox jumps over the lazy dog").unwrap();
    assert!(prompt.len() > 3, "{prompt:?}");
    let (pieces, _) = generate(&small, prompt.clone(), 8);
    let (one_step, _) = generate(&Engine::load_path(&path, &whole).unwrap(), prompt, 8);
    assert_eq!(pieces, one_step, "prefilled 3 tokens a step");
}
