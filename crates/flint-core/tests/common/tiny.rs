//! Tiny synthetic models (random F32 weights, no tokenizer) for backend-level tests that need a
//! whole forward pass in milliseconds: a qwen2-style model (QKV biases, GQA) and a gemma3-style
//! one (QK-norm, sandwich norms, sliding-window layers with one global layer in six).
#![allow(dead_code)]

use flint_core::gguf::GgufFile;

use super::gguf_writer::{GgufWriter, TensorSpec, Val};

pub const N_EMBD: u64 = 64;
pub const HEAD_DIM: u64 = 32;
pub const N_HEAD: u64 = 2;
pub const N_FF: u64 = 128;
pub const N_VOCAB: u64 = 256;

fn layer_tensors(i: usize, n_head_kv: u64, extra: &[(&str, Vec<u64>)]) -> Vec<TensorSpec> {
    let q = N_HEAD * HEAD_DIM;
    let kv = n_head_kv * HEAD_DIM;
    let t = |name: &str, dims: &[u64]| TensorSpec::f32_seeded(&format!("blk.{i}.{name}"), dims);
    let mut v = vec![
        t("attn_norm.weight", &[N_EMBD]),
        t("attn_q.weight", &[N_EMBD, q]),
        t("attn_k.weight", &[N_EMBD, kv]),
        t("attn_v.weight", &[N_EMBD, kv]),
        t("attn_output.weight", &[q, N_EMBD]),
        t("ffn_norm.weight", &[N_EMBD]),
        t("ffn_gate.weight", &[N_EMBD, N_FF]),
        t("ffn_up.weight", &[N_EMBD, N_FF]),
        t("ffn_down.weight", &[N_FF, N_EMBD]),
    ];
    v.extend(extra.iter().map(|(name, dims)| t(name, dims)));
    v
}

/// gemma3-style: `n_layer` layers, every sixth global, the others with `window` positions.
pub fn gemma3(n_layer: usize, window: u32) -> GgufFile {
    let a = "gemma3";
    let mut w = GgufWriter::new()
        .kv("general.architecture", Val::string(a))
        .kv(&format!("{a}.context_length"), Val::u32(4096))
        .kv(&format!("{a}.embedding_length"), Val::u32(N_EMBD as u32))
        .kv(&format!("{a}.block_count"), Val::u32(n_layer as u32))
        .kv(&format!("{a}.feed_forward_length"), Val::u32(N_FF as u32))
        .kv(&format!("{a}.attention.head_count"), Val::u32(N_HEAD as u32))
        .kv(&format!("{a}.attention.head_count_kv"), Val::u32(1))
        .kv(&format!("{a}.attention.key_length"), Val::u32(HEAD_DIM as u32))
        .kv(&format!("{a}.attention.value_length"), Val::u32(HEAD_DIM as u32))
        .kv(&format!("{a}.attention.layer_norm_rms_epsilon"), Val::f32(1e-6))
        .kv(&format!("{a}.attention.sliding_window"), Val::u32(window))
        .kv(&format!("{a}.rope.freq_base"), Val::f32(1e6))
        .tensor_spec(TensorSpec::f32_seeded("token_embd.weight", &[N_EMBD, N_VOCAB]))
        .tensor_spec(TensorSpec::f32_seeded("output_norm.weight", &[N_EMBD]));
    let extra = [
        ("attn_q_norm.weight", vec![HEAD_DIM]),
        ("attn_k_norm.weight", vec![HEAD_DIM]),
        ("post_attention_norm.weight", vec![N_EMBD]),
        ("post_ffw_norm.weight", vec![N_EMBD]),
    ];
    for i in 0..n_layer {
        for spec in layer_tensors(i, 1, &extra) {
            w = w.tensor_spec(spec);
        }
    }
    GgufFile::from_bytes(w.finish()).expect("valid synthetic gemma3")
}

/// qwen2-style: `n_layer` layers with QKV biases and two query heads per KV head.
pub fn qwen2(n_layer: usize) -> GgufFile {
    let a = "qwen2";
    let mut w = GgufWriter::new()
        .kv("general.architecture", Val::string(a))
        .kv(&format!("{a}.context_length"), Val::u32(4096))
        .kv(&format!("{a}.embedding_length"), Val::u32(N_EMBD as u32))
        .kv(&format!("{a}.block_count"), Val::u32(n_layer as u32))
        .kv(&format!("{a}.feed_forward_length"), Val::u32(N_FF as u32))
        .kv(&format!("{a}.attention.head_count"), Val::u32(N_HEAD as u32))
        .kv(&format!("{a}.attention.head_count_kv"), Val::u32(1))
        .kv(&format!("{a}.attention.layer_norm_rms_epsilon"), Val::f32(1e-6))
        .kv(&format!("{a}.rope.freq_base"), Val::f32(1e6))
        .tensor_spec(TensorSpec::f32_seeded("token_embd.weight", &[N_EMBD, N_VOCAB]))
        .tensor_spec(TensorSpec::f32_seeded("output_norm.weight", &[N_EMBD]))
        .tensor_spec(TensorSpec::f32_seeded("output.weight", &[N_EMBD, N_VOCAB]));
    let extra = [("attn_q.bias", vec![N_HEAD * HEAD_DIM]), ("attn_k.bias", vec![HEAD_DIM]), ("attn_v.bias", vec![HEAD_DIM])];
    for i in 0..n_layer {
        for spec in layer_tensors(i, 1, &extra) {
            w = w.tensor_spec(spec);
        }
    }
    GgufFile::from_bytes(w.finish()).expect("valid synthetic qwen2")
}

/// Seeded token ids in the tiny vocabulary.
pub fn tokens(seed: usize, n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + seed * 104_729 + 13) % N_VOCAB as usize) as u32).collect()
}
