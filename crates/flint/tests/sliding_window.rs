//! Sliding-window layers keep only their window: on a small synthetic gemma3 model (random
//! F32 weights, window 64) a 3,000-token context on the GPU, whose local layers hold a ring of
//! window + one chunk positions, matches the CPU reference's logits; so do the greedy tokens
//! that follow, and a rollback within the ring's slack.

#[path = "../../flint-core/tests/common/gguf_writer.rs"]
#[allow(dead_code)]
mod gguf_writer;

use std::sync::Arc;

use flint::{Backend, GgufFile, ModelConfig};
use flint_core::reference::CpuBackend;
use flint_core::sampling::{argmax, Sampler, SamplingParams};
use flint_gpu::backend::GpuBackend;
use gguf_writer::{GgufWriter, TensorSpec, Val};

const N_EMBD: u64 = 64;
const HEAD_DIM: u64 = 32;
const N_HEAD: u64 = 2;
const N_FF: u64 = 128;
const N_VOCAB: u64 = 256;
const N_LAYER: usize = 6;
const WINDOW: u32 = 64;
const CONTEXT: usize = 3000;
const MAX_NMSE: f64 = 1e-5;

fn tiny_gemma3() -> GgufFile {
    let a = "gemma3";
    let mut w = GgufWriter::new()
        .kv("general.architecture", Val::string(a))
        .kv(&format!("{a}.context_length"), Val::u32(4096))
        .kv(&format!("{a}.embedding_length"), Val::u32(N_EMBD as u32))
        .kv(&format!("{a}.block_count"), Val::u32(N_LAYER as u32))
        .kv(&format!("{a}.feed_forward_length"), Val::u32(N_FF as u32))
        .kv(&format!("{a}.attention.head_count"), Val::u32(N_HEAD as u32))
        .kv(&format!("{a}.attention.head_count_kv"), Val::u32(1))
        .kv(&format!("{a}.attention.key_length"), Val::u32(HEAD_DIM as u32))
        .kv(&format!("{a}.attention.value_length"), Val::u32(HEAD_DIM as u32))
        .kv(&format!("{a}.attention.layer_norm_rms_epsilon"), Val::f32(1e-6))
        .kv(&format!("{a}.attention.sliding_window"), Val::u32(WINDOW))
        .kv(&format!("{a}.rope.freq_base"), Val::f32(1e6))
        .tensor_spec(TensorSpec::f32_seeded("token_embd.weight", &[N_EMBD, N_VOCAB]))
        .tensor_spec(TensorSpec::f32_seeded("output_norm.weight", &[N_EMBD]));
    let q = N_HEAD * HEAD_DIM;
    for i in 0..N_LAYER {
        let t = |name: &str, dims: &[u64]| TensorSpec::f32_seeded(&format!("blk.{i}.{name}"), dims);
        for spec in [
            t("attn_norm.weight", &[N_EMBD]),
            t("attn_q.weight", &[N_EMBD, q]),
            t("attn_k.weight", &[N_EMBD, HEAD_DIM]),
            t("attn_v.weight", &[N_EMBD, HEAD_DIM]),
            t("attn_output.weight", &[q, N_EMBD]),
            t("attn_q_norm.weight", &[HEAD_DIM]),
            t("attn_k_norm.weight", &[HEAD_DIM]),
            t("post_attention_norm.weight", &[N_EMBD]),
            t("ffn_norm.weight", &[N_EMBD]),
            t("ffn_gate.weight", &[N_EMBD, N_FF]),
            t("ffn_up.weight", &[N_EMBD, N_FF]),
            t("ffn_down.weight", &[N_FF, N_EMBD]),
            t("post_ffw_norm.weight", &[N_EMBD]),
        ] {
            w = w.tensor_spec(spec);
        }
    }
    GgufFile::from_bytes(w.finish()).expect("valid synthetic gemma3")
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / want.len() as f64;
    let num: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|&b| (b as f64 - mean).powi(2)).sum();
    num / den
}

fn greedy(backend: &mut dyn Backend, first: u32, n: usize) -> Vec<u32> {
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut out = vec![first];
    while out.len() < n {
        let last = *out.last().unwrap();
        out.push(futures::executor::block_on(backend.forward_sample(&[last], &mut sampler)).unwrap().id);
    }
    out
}

#[test]
fn three_thousand_tokens_through_windowed_layers_match_the_cpu_reference() {
    let Some(ctx) = flint_gpu::testing::context() else { return };
    let file = Arc::new(tiny_gemma3());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(cfg.layers.iter().filter(|l| l.sliding_window == Some(WINDOW)).count(), 5);
    let tokens: Vec<u32> = (0..CONTEXT).map(|i| ((i * 7919 + 13) % N_VOCAB as usize) as u32).collect();

    let mut cpu = futures::executor::block_on(CpuBackend::new(file.clone(), cfg.clone(), 4096)).unwrap();
    let want = futures::executor::block_on(cpu.forward(&tokens)).unwrap();
    // Reuse the shared context's adapter through a fresh device for this model.
    let gpu_ctx = Arc::new(futures::executor::block_on(flint_gpu::GpuContext::with_adapter(Some(&ctx.info.name))).unwrap());
    let mut gpu = futures::executor::block_on(GpuBackend::new(gpu_ctx, &file, cfg.clone(), 4096, None)).unwrap();
    let got = futures::executor::block_on(gpu.forward(&tokens)).unwrap();
    let e = nmse(&got, &want);
    assert!(e <= MAX_NMSE, "3000-token logits NMSE {e:e}");
    eprintln!("3000-token context: GPU vs CPU reference logits NMSE {e:.2e}");

    // Local layers hold a bounded ring; the global layer holds the whole context.
    let kv_row = (HEAD_DIM * 4 * 2) as usize; // K and V, f32
    let n_slots = 4096usize.div_ceil(16) * 16;
    let ring = (WINDOW as usize + 256).div_ceil(16) * 16;
    assert_eq!(gpu.model().kv_bytes() as usize, kv_row * (n_slots + 5 * ring), "local layers must keep only their window");

    // The greedy continuation agrees, position 3000 onwards.
    let first = argmax(&want);
    let cpu_ids = greedy(&mut cpu, first, 8);
    let gpu_ids = greedy(&mut gpu, first, 8);
    assert_eq!(gpu_ids, cpu_ids);

    // A rollback within the ring's slack reuses the cache; one past it cannot.
    let n_past = gpu.n_past();
    assert_eq!(gpu.reusable_prefix(n_past - 100), n_past - 100);
    assert_eq!(gpu.reusable_prefix(n_past - 1000), 0);
    gpu.truncate(n_past - 100);
    cpu.truncate(n_past - 100);
    let redo = &tokens[..3];
    let a = futures::executor::block_on(gpu.forward(redo)).unwrap();
    let b = futures::executor::block_on(cpu.forward(redo)).unwrap();
    assert!(nmse(&a, &b) <= MAX_NMSE);
}
