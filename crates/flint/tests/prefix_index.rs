//! The prefix index: a prompt that starts with full KV blocks of any earlier request (not only
//! the last one) reuses them, its reply equals a cold run, and a small KV budget evicts the
//! least recently used blocks while replies stay correct; on both backends, since the
//! scheduler and its index are the same above either.

mod common;

use flint::{BackendKind, Engine, Event, GenerateParams, Input, LoadOptions, Request, SamplingParams, Summary};
use futures::StreamExt;

/// Positions per KV block on the GPU.
const BLOCK: usize = 16;
/// Tokens per reply: small, lavapipe is slow.
const N_GEN: usize = 3;

fn generate(engine: &Engine, prompt: &[u32]) -> (Vec<u32>, Summary) {
    let params = GenerateParams { max_tokens: Some(N_GEN), sampling: SamplingParams::greedy(), ..Default::default() };
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        let mut stream = engine.submit(Request::new(Input::Tokens(prompt.to_vec()), params)).unwrap();
        while let Some(ev) = stream.next().await {
            match ev.unwrap() {
                Event::Token { id, .. } => ids.push(id),
                Event::Done { summary, .. } => return (ids, summary),
            }
        }
        unreachable!("the stream ends with Done")
    })
}

/// The reply to `prompt` from an empty cache.
fn cold(engine: &Engine, prompt: &[u32]) -> Vec<u32> {
    engine.clear_cache();
    let (ids, s) = generate(engine, prompt);
    assert_eq!(s.cached_prompt_tokens, 0, "reset must drop the index too");
    ids
}

fn tokens(engine: &Engine, text: &str) -> Vec<u32> {
    engine.tokenizer().encode(text, false, false).unwrap()
}

/// Requests A, B, then C = A's first two full blocks + new text. Returns C's cached count.
fn earlier_prefix_is_reused(backend: BackendKind) -> usize {
    let opts = LoadOptions { backend, n_ctx: 256, ..LoadOptions::exact() };
    let engine = Engine::load_path(&common::model_path("qwen2.5-coder-0.5b"), &opts).unwrap();
    let a = engine
        .tokenize_raw("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed iteratively.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):")
        .unwrap();
    assert!(a.len() > 2 * BLOCK, "prompt A has {} tokens", a.len());
    let b = engine.tokenize_raw("Translate to French: good morning").unwrap();
    assert_ne!(a[0], b[0], "B must share nothing with A");
    let mut c = a[..2 * BLOCK].to_vec();
    c.extend(tokens(&engine, "\n        print(a)"));

    let (_, sa) = generate(&engine, &a);
    let (_, sb) = generate(&engine, &b);
    assert_eq!((sa.cached_prompt_tokens, sb.cached_prompt_tokens), (0, 0));
    let (warm, sc) = generate(&engine, &c);
    let want = cold(&engine, &c);
    assert_eq!(warm, want, "a reply from A's cached blocks must equal a cold run");
    sc.cached_prompt_tokens
}

#[test]
fn gpu_prompt_reuses_blocks_of_any_earlier_request() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    assert_eq!(earlier_prefix_is_reused(BackendKind::Gpu), 2 * BLOCK);
}

#[test]
fn cpu_prompt_reuses_blocks_of_any_earlier_request() {
    assert_eq!(earlier_prefix_is_reused(BackendKind::Cpu), 2 * BLOCK);
}

/// A 4-block pool (48 positions and one spare block): after A, B, A and a short E, a
/// 33-token D must evict one indexed block, and LRU picks B's (A's was used since), where
/// FIFO or MRU would pick A's.
#[test]
fn gpu_tiny_kv_budget_evicts_least_recently_used() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    // gemma-3-270m: its 512-position window exceeds this context, so no ring and an index.
    let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 48, kv_budget_positions: Some(4 * BLOCK), ..LoadOptions::exact() };
    let engine = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    // BOS and at least one full block each; D needs three blocks.
    let a = engine.tokenize_raw("The capital of France is Paris, and the capital of Germany is Berlin. The").unwrap();
    let b = engine.tokenize_raw("Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees. It").unwrap();
    let d = engine
        .tokenize_raw("One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen, sixteen, seventeen,")
        .unwrap();
    let e = engine.tokenize_raw("Hello").unwrap();
    let fits = |n: usize| n > BLOCK && n + N_GEN <= 2 * BLOCK;
    assert!(fits(a.len()) && fits(b.len()), "A has {}, B {} tokens", a.len(), b.len());
    assert!(d.len() > 2 * BLOCK && d.len() + N_GEN <= 48, "D has {} tokens", d.len());
    let (cold_a, cold_b, cold_d) = (cold(&engine, &a), cold(&engine, &b), cold(&engine, &d));
    engine.clear_cache();

    // Only whole blocks are reused.
    let run = |p: &[u32]| generate(&engine, p);
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a.clone(), 0));
    let (rb, s) = run(&b);
    assert_eq!((rb, s.cached_prompt_tokens), (cold_b.clone(), 0));
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a.clone(), BLOCK), "A's first block from the index");
    let (_, s) = run(&e);
    assert_eq!(s.cached_prompt_tokens, 0);
    let (rd, s) = run(&d);
    assert_eq!((rd, s.cached_prompt_tokens), (cold_d, 0));
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a, BLOCK), "A, used more recently than B, must survive");
    let (rb, s) = run(&b);
    assert_eq!((rb, s.cached_prompt_tokens), (cold_b, 0), "B, the least recently used, must be evicted");
}

/// The block pool follows the budget: a budget below one context is a typed error at load,
/// naming both sizes.
#[test]
fn gpu_kv_pool_follows_the_budget() {
    use flint::{BackendError, EngineError, KvError};

    if flint_gpu::testing::context().is_none() {
        return;
    }
    let path = common::model_path("gemma-3-270m");
    let tiny = LoadOptions { n_ctx: 48, kv_budget_positions: Some(3 * BLOCK), ..LoadOptions::exact() };
    match Engine::load_path(&path, &tiny) {
        Err(EngineError::Backend(BackendError::Kv(KvError::ContextTooLarge { n_ctx: 48, .. }))) => {}
        Err(e) => panic!("a budget of three blocks for a three-block context plus one: {e}"),
        Ok(_) => panic!("a budget below one context must be refused"),
    }
}
