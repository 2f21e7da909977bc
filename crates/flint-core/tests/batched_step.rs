//! The CPU reference's batched step equals its single-sequence path bit for bit: prompts of
//! different lengths share steps (prefill chunks beside decodes, requests joining later, a
//! pool small enough to force preemption), on a qwen2-style and a gemma3-style tiny model
//! whose sliding-window layers free their old blocks.

mod common {
    #[path = "drive.rs"]
    pub mod drive;
    #[path = "gguf_writer.rs"]
    pub mod gguf_writer;
    #[path = "tiny.rs"]
    pub mod tiny;
}

use std::sync::Arc;

use common::drive::{assert_same, batched, solo, Job};
use common::tiny;
use flint_core::arch::ModelConfig;
use flint_core::backend::{Backend, BackendOptions};
use flint_core::gguf::GgufFile;
use flint_core::reference::CpuBackend;
use flint_core::sampling::SamplingParams;
use flint_core::sched::SchedConfig;

// The backend takes the file shared (`Arc`), though a file is not `Sync` (in the browser its
// bytes come through JS); the test runs on one thread.
#[allow(clippy::arc_with_non_send_sync)]
fn cpu(file: GgufFile, n_ctx: usize, max_batch_tokens: usize, kv_budget_bytes: Option<u64>) -> CpuBackend {
    let file = Arc::new(file);
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let opts = BackendOptions {
        n_ctx,
        max_seqs: 4,
        max_batch_tokens,
        max_outputs: 8,
        kv_budget_bytes,
        cache_k: Default::default(),
        cache_v: Default::default(),
        exact: true,
    };
    futures::executor::block_on(CpuBackend::new(file, cfg, &opts)).unwrap()
}

fn jobs() -> Vec<Job> {
    vec![
        Job::greedy(tiny::tokens(1, 5), 0, 6),
        Job::greedy(tiny::tokens(2, 70), 0, 4),
        Job::greedy(tiny::tokens(3, 33), 2, 5),
        Job { prompt: tiny::tokens(4, 150), arrive: 3, n_gen: 5, sampling: SamplingParams { temperature: 0.9, seed: Some(7), ..Default::default() } },
    ]
}

#[test]
fn qwen2_batched_equals_alone() {
    let mut b = cpu(tiny::qwen2(3), 512, 48, None);
    let jobs = jobs();
    let alone = solo(&mut b, &jobs);
    let cfg = SchedConfig { max_batch_tokens: 48, max_seqs: 4, n_ctx: 512 };
    let (together, stats) = batched(&mut b, &jobs, cfg);
    assert!(stats.mixed_steps > 0 && stats.max_entries >= 3, "{stats:?}");
    assert_same("qwen2 cpu", &alone, &together);
}

#[test]
fn gemma3_batched_equals_alone_past_the_window() {
    // Window 16: a 150-token prompt outgrows window + slack only with a small slack, so use
    // long prompts; the windowed group exists because 16 + 256 + 48 positions < 2048.
    let mut b = cpu(tiny::gemma3(6, 16), 2048, 48, None);
    assert_eq!(b.kv_layout().groups.len(), 2, "the local layers get their own block group");
    let mut jobs = jobs();
    jobs.push(Job::greedy(tiny::tokens(5, 700), 1, 3));
    let alone = solo(&mut b, &jobs);
    let cfg = SchedConfig { max_batch_tokens: 48, max_seqs: 4, n_ctx: 2048 };
    let (together, stats) = batched(&mut b, &jobs, cfg);
    assert!(stats.mixed_steps > 0, "{stats:?}");
    assert_same("gemma3 cpu", &alone, &together);
}

#[test]
fn preempted_sequences_recompute_to_the_same_tokens() {
    // Two contexts' worth of blocks; four requests that each grow to most of one.
    let file = tiny::qwen2(2);
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let per_pos = (cfg.n_layer * (cfg.kv_dim() + cfg.v_dim()) * 4) as u64;
    let mut b = cpu(file, 128, 64, Some(2 * (128 + 16) * per_pos));
    let jobs: Vec<Job> = (0..4).map(|i| Job::greedy(tiny::tokens(10 + i, 60 + 5 * i), 0, 50)).collect();
    let alone = solo(&mut b, &jobs);
    let (together, stats) = batched(&mut b, &jobs, SchedConfig { max_batch_tokens: 64, max_seqs: 4, n_ctx: 128 });
    assert!(stats.preemptions > 0, "the pool never ran short: {stats:?}");
    assert_same("preemption cpu", &alone, &together);
}
