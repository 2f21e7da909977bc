//! gemma3: QK-norm, sandwich norms, GELU-tanh gated FFN, scaled embeddings, tied output,
//! and local sliding-window layers interleaved with global ones.

use super::{count, positive_f32, rope_freq_scale, shape, Activation, ArchError, LayerConfig, ModelConfig, RopeStyle, Shape};
use super::{MAX_CTX, MAX_FF};
use crate::gguf::Metadata;

const ARCH: &str = "gemma3";
/// Every sixth layer is global; the other five use the sliding window (llama.cpp's default).
const GLOBAL_EVERY: usize = 6;
/// RoPE base of the local layers when the file does not say (llama.cpp's default).
const LOCAL_ROPE_BASE: f32 = 10_000.0;
const DEFAULT_ROPE_BASE: f32 = 1_000_000.0;
const DEFAULT_SLIDING_WINDOW: u32 = 512;

pub(super) fn config(md: &Metadata, n_vocab: usize, tied_output: bool) -> Result<ModelConfig, ArchError> {
    let Shape { n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v } = shape(md, ARCH)?;
    if head_dim % 2 != 0 {
        return Err(ArchError::Invalid { key: format!("{ARCH}.attention.key_length"), reason: "must be even".into() });
    }
    let global_base = positive_f32(md, ARCH, "rope.freq_base", Some(DEFAULT_ROPE_BASE))?;
    let local_base = positive_f32(md, ARCH, "rope.freq_base_swa", Some(LOCAL_ROPE_BASE))?;
    let global_scale = rope_freq_scale(md, ARCH)?;
    let window = md.opt_u32(&format!("{ARCH}.attention.sliding_window"))?.unwrap_or(DEFAULT_SLIDING_WINDOW);
    if window == 0 {
        return Err(ArchError::Invalid { key: format!("{ARCH}.attention.sliding_window"), reason: "must be positive".into() });
    }
    let layers = (0..n_layer)
        .map(|i| {
            if (i + 1) % GLOBAL_EVERY == 0 {
                LayerConfig { sliding_window: None, rope_base: global_base, rope_freq_scale: global_scale }
            } else {
                LayerConfig { sliding_window: Some(window), rope_base: local_base, rope_freq_scale: 1.0 }
            }
        })
        .collect();
    Ok(ModelConfig {
        arch: ARCH.to_string(),
        n_vocab,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        head_dim_v,
        n_ff: count(md, ARCH, "feed_forward_length", MAX_FF)?,
        n_ctx_train: count(md, ARCH, "context_length", MAX_CTX)?,
        rms_eps: positive_f32(md, ARCH, "attention.layer_norm_rms_epsilon", Some(1e-6))?,
        rope_style: RopeStyle::Neox,
        rope_dim: head_dim,
        layers,
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
        embed_scale: Some((n_embd as f32).sqrt()),
        activation: Activation::GeluTanh,
        // gemma3 scales by query_pre_attn_scalar^-1/2, which equals the head size for these models.
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        // GGUF gemma3 files usually carry no output.weight: the embedding is the output projection.
        tied_output,
        rope_freqs: false,
        rope_scaling: Default::default(),
        fused_qkv: false,
        fused_gate_up: false,
        attn_softcap: None,
        final_softcap: None,
        moe: None,
    })
}
