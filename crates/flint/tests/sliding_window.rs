//! Sliding-window layers keep only their window: on a small synthetic gemma3 model (random
//! F32 weights, window 64) a 3,000-token context on the GPU, whose local layers have their own
//! block group and free the blocks that fall out of the window, matches the CPU reference's
//! logits; so do the greedy tokens that follow, and a rollback within the slack, while one
//! past it is refused.

#[path = "../../flint-core/tests/common/gguf_writer.rs"]
mod gguf_writer;
#[path = "../../flint-core/tests/common/tiny.rs"]
mod tiny;

use std::sync::Arc;

use flint::{BackendError, KvError, ModelConfig};
use flint_core::backend::{Backend, BackendOptions, Solo};
use flint_core::kv::WINDOW_SLACK;
use flint_core::reference::CpuBackend;
use flint_core::sampling::{argmax, Sampler, SamplingParams};
use flint_gpu::backend::GpuBackend;

const WINDOW: u32 = 64;
const CONTEXT: usize = 3000;
const MAX_NMSE: f64 = 1e-5;

use flint_gpu::testing::nmse;

fn greedy(backend: &mut dyn Backend, seq: &mut Solo, first: u32, n: usize) -> Vec<u32> {
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut out = vec![first];
    while out.len() < n {
        let last = *out.last().unwrap();
        out.push(futures::executor::block_on(seq.forward_sample(backend, &[last], &mut sampler)).unwrap().id);
    }
    out
}

#[test]
#[allow(clippy::arc_with_non_send_sync)] // the backends share the file on this one thread
fn three_thousand_tokens_through_windowed_layers_match_the_cpu_reference() {
    let Some(ctx) = flint_gpu::testing::context() else { return };
    let file = Arc::new(tiny::gemma3(6, WINDOW));
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(cfg.layers.iter().filter(|l| l.sliding_window == Some(WINDOW)).count(), 5);
    let tokens = tiny::tokens(1, CONTEXT);
    let opts = BackendOptions {
        n_ctx: 4096,
        max_seqs: 4,
        max_batch_tokens: 256,
        max_outputs: 4,
        kv_budget_bytes: None,
        cache_k: Default::default(),
        cache_v: Default::default(),
        exact: true,
    };

    let mut cpu = futures::executor::block_on(CpuBackend::new(file.clone(), cfg.clone(), &opts)).unwrap();
    let mut cpu_seq = Solo::new(&cpu);
    let want = futures::executor::block_on(cpu_seq.forward(&mut cpu, &tokens)).unwrap();
    // Reuse the shared context's adapter through a fresh device for this model.
    let gpu_ctx = Arc::new(futures::executor::block_on(flint_gpu::GpuContext::with_adapter(Some(&ctx.info.name))).unwrap());
    let mut gpu = futures::executor::block_on(GpuBackend::new(gpu_ctx, &file, cfg.clone(), &opts, None)).unwrap();
    let mut gpu_seq = Solo::new(&gpu);
    let got = futures::executor::block_on(gpu_seq.forward(&mut gpu, &tokens)).unwrap();
    let e = nmse(&got, &want);
    assert!(e <= MAX_NMSE, "3000-token logits NMSE {e:e}");
    eprintln!("3000-token context: GPU vs CPU reference logits NMSE {e:.2e}");

    // The local layers' group holds a sequence's window, slack and one step, not its context.
    let layout = gpu.kv_layout().clone();
    assert_eq!(layout.groups.len(), 2);
    let (global, local) = (&layout.groups[0], &layout.groups[1]);
    assert_eq!((global.layers.clone(), local.window), (vec![5], Some(WINDOW)));
    let span = (WINDOW + WINDOW_SLACK + 256).div_ceil(16) + 1;
    assert!(local.n_blocks <= span * 4 * 5 / 4 + 1 && local.n_blocks < global.n_blocks, "{layout:?}");
    assert_eq!(gpu.model().kv_bytes(), layout.bytes(&cfg));

    // The greedy continuation agrees, position 3000 onwards.
    let first = argmax(&want);
    let cpu_ids = greedy(&mut cpu, &mut cpu_seq, first, 8);
    let gpu_ids = greedy(&mut gpu, &mut gpu_seq, first, 8);
    assert_eq!(gpu_ids, cpu_ids);

    // A rollback within the slack reuses the cache; one past it is refused.
    let n_past = gpu_seq.len();
    assert!(matches!(gpu_seq.truncate(n_past - 1000), Err(BackendError::Kv(KvError::RollbackTooFar { .. }))));
    gpu_seq.truncate(n_past - 100).unwrap();
    cpu_seq.truncate(n_past - 100).unwrap();
    let redo = &tokens[..3];
    let a = futures::executor::block_on(gpu_seq.forward(&mut gpu, redo)).unwrap();
    let b = futures::executor::block_on(cpu_seq.forward(&mut cpu, redo)).unwrap();
    assert!(nmse(&a, &b) <= MAX_NMSE);
}
