//! The prefix index: a prompt that starts with full KV blocks of any earlier request (not only
//! the last one) reuses them, its reply equals a cold run, and a small KV budget evicts the
//! least recently used blocks while replies stay correct.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use flint::{BackendKind, Engine, Event, GenerateParams, LoadOptions, SamplingParams, Summary};
use futures::StreamExt;

/// Positions per KV block on the GPU.
const BLOCK: usize = 16;
/// Tokens per reply: small, lavapipe is slow.
const N_GEN: usize = 3;

fn generate(engine: &mut Engine, prompt: &[u32]) -> (Vec<u32>, Summary) {
    let params = GenerateParams { max_tokens: Some(N_GEN), sampling: SamplingParams::greedy(), stop: Vec::new() };
    futures::executor::block_on(async {
        let mut ids = Vec::new();
        let mut stream = engine.generate(prompt.to_vec(), params, Arc::new(AtomicBool::new(false))).unwrap();
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
fn cold(engine: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    engine.reset();
    let (ids, s) = generate(engine, prompt);
    assert_eq!(s.cached_prompt_tokens, 0, "reset must drop the index too");
    ids
}

fn tokens(engine: &Engine, text: &str) -> Vec<u32> {
    engine.tokenizer().encode(text, false, false).unwrap()
}

/// Requests A, B, then C = A's first two full blocks + new text. Returns C's cached count.
fn earlier_prefix_is_reused(backend: BackendKind) -> usize {
    let opts = LoadOptions { backend, n_ctx: 256, ..LoadOptions::default() };
    let mut engine = Engine::load_path(&common::model_path("qwen2.5-coder-0.5b"), &opts).unwrap();
    let a = engine
        .tokenize_raw("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed iteratively.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):")
        .unwrap();
    assert!(a.len() > 2 * BLOCK, "prompt A has {} tokens", a.len());
    let b = engine.tokenize_raw("Translate to French: good morning").unwrap();
    assert_ne!(a[0], b[0], "B must share nothing with A");
    let mut c = a[..2 * BLOCK].to_vec();
    c.extend(tokens(&engine, "\n        print(a)"));

    let (_, sa) = generate(&mut engine, &a);
    let (_, sb) = generate(&mut engine, &b);
    assert_eq!((sa.cached_prompt_tokens, sb.cached_prompt_tokens), (0, 0));
    let (warm, sc) = generate(&mut engine, &c);
    let want = cold(&mut engine, &c);
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
fn cpu_earlier_prefix_requests_match_cold_runs() {
    // The CPU reference has no index: it reuses only the last request's prefix (none here).
    assert_eq!(earlier_prefix_is_reused(BackendKind::Cpu), 0);
}

/// A 4-block pool (48 positions and one spare block, whatever the budget says below it):
/// after A, B, A and a short E, a 33-token D must evict one indexed block, and LRU picks B's
/// (A's was used since), where FIFO or MRU would pick A's.
#[test]
fn gpu_tiny_kv_budget_evicts_least_recently_used() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    // gemma-3-270m: its 512-position window exceeds this context, so no ring and an index.
    let opts = LoadOptions { backend: BackendKind::Gpu, n_ctx: 48, kv_budget_mb: Some(1), ..LoadOptions::default() };
    let mut engine = Engine::load_path(&common::model_path("gemma-3-270m"), &opts).unwrap();
    // BOS and at least one full block each; D needs three blocks.
    let a = engine.tokenize_raw("The capital of France is Paris, and the capital of Germany is Berlin. The").unwrap();
    let b = engine
        .tokenize_raw("Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees. It")
        .unwrap();
    let d = engine
        .tokenize_raw("One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen, fifteen, sixteen, seventeen,")
        .unwrap();
    let e = engine.tokenize_raw("Hello").unwrap();
    let fits = |n: usize| n > BLOCK && n + N_GEN <= 2 * BLOCK;
    assert!(fits(a.len()) && fits(b.len()), "A has {}, B {} tokens", a.len(), b.len());
    assert!(d.len() > 2 * BLOCK && d.len() + N_GEN <= 48, "D has {} tokens", d.len());
    let (cold_a, cold_b, cold_d) = (cold(&mut engine, &a), cold(&mut engine, &b), cold(&mut engine, &d));
    engine.reset();

    // Every prompt starts with BOS, so the live sequence always shares one position.
    let mut run = |p: &[u32]| generate(&mut engine, p);
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a.clone(), 0));
    let (rb, s) = run(&b);
    assert_eq!((rb, s.cached_prompt_tokens), (cold_b.clone(), 1));
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a.clone(), BLOCK), "A's first block from the index");
    // E has no full block, so the live sequence holds none of A's or B's blocks when D comes.
    let (_, s) = run(&e);
    assert_eq!(s.cached_prompt_tokens, 1);
    let (rd, s) = run(&d);
    assert_eq!((rd, s.cached_prompt_tokens), (cold_d, 1));
    let (ra, s) = run(&a);
    assert_eq!((ra, s.cached_prompt_tokens), (cold_a, BLOCK), "A, used more recently than B, must survive");
    let (rb, s) = run(&b);
    assert_eq!((rb, s.cached_prompt_tokens), (cold_b, 1), "B, the least recently used, must be evicted");
}

/// The block pool follows the budget: never below the context plus one block, a quarter more
/// by default, and no prefix index where sliding-window rings cannot be shared.
#[test]
fn gpu_kv_pool_follows_the_budget() {
    use flint::Backend;
    use flint_gpu::backend::GpuBackend;

    let Some(ctx) = flint_gpu::testing::context() else { return };
    let file = flint::GgufFile::open(&common::model_path("gemma-3-270m")).unwrap();
    let cfg = flint::ModelConfig::from_gguf(&file).unwrap();
    let bytes_per_block = (cfg.n_layer * (cfg.kv_dim() + cfg.v_dim()) * 4 * BLOCK) as u64;
    let gpu_ctx =
        Arc::new(futures::executor::block_on(flint_gpu::GpuContext::with_adapter(Some(&ctx.info.name))).unwrap());
    let pool = |n_ctx: usize, budget: Option<u64>| {
        let load = GpuBackend::with_kv_budget(gpu_ctx.clone(), &file, cfg.clone(), n_ctx, None, budget);
        let gpu = futures::executor::block_on(load).unwrap();
        (gpu.model().kv_pool_blocks(), gpu.model().kv_bytes())
    };
    // 48 positions = 3 blocks: at least 4, by default 4 + ⌈3/4⌉.
    assert_eq!(pool(48, Some(1)).0, 4);
    assert_eq!(pool(48, None).0, 5);
    let (n, bytes) = pool(48, Some(20 * bytes_per_block + 7));
    assert_eq!(n, 20);
    assert_eq!(bytes, 20 * bytes_per_block, "every layer's K and V hold the whole pool");
    // 4096 positions: the local layers keep a ring, so there is no index and no spare block.
    let mut gpu =
        futures::executor::block_on(GpuBackend::with_kv_budget(gpu_ctx, &file, cfg, 4096, None, None)).unwrap();
    assert_eq!(gpu.model().kv_pool_blocks(), 4096 / BLOCK as u32);
    let prompt: Vec<u32> = (0..2 * BLOCK as u32 + 1).map(|i| 1000 + i).collect();
    futures::executor::block_on(gpu.forward(&prompt)).unwrap();
    gpu.commit(&prompt);
    assert_eq!(gpu.model().indexed_blocks(), 0);
    assert_eq!(gpu.restore_prefix(&prompt[..BLOCK]), BLOCK, "the live sequence is still reused");
}
