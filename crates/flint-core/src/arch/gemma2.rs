//! gemma2: soft-capped attention scores and final logits, sandwich norms, GELU-tanh gated FFN,
//! scaled embeddings, tied output, and sliding-window layers alternating with global ones.
//!
//! Two things the GGUF does not say, taken as llama.cpp takes them: the sliding window is on
//! every other layer starting with layer 0, and queries are scaled by 1/√(n_embd / n_head)
//! when the model has 46 layers (Gemma-2-27B's query_pre_attn_scalar) and by 1/√head_dim
//! otherwise.

use super::{count, positive_f32, shape, Activation, ArchError, LayerConfig, ModelConfig, RopeStyle, Shape};
use super::{MAX_CTX, MAX_FF};
use crate::gguf::Metadata;

const ARCH: &str = "gemma2";
const DEFAULT_ROPE_BASE: f32 = 10_000.0;
const DEFAULT_SLIDING_WINDOW: u32 = 4096;
/// Gemma-2-27B's depth, the one llama.cpp gives the n_embd / n_head query scale.
const LAYERS_27B: usize = 46;

/// `<arch>.<name>` as a soft cap: absent or 0 means none; otherwise finite and positive.
fn softcap(md: &Metadata, name: &str) -> Result<Option<f32>, ArchError> {
    let key = format!("{ARCH}.{name}");
    match md.opt_f32(&key)? {
        None => Ok(None),
        Some(0.0) => Ok(None),
        Some(v) if v.is_finite() && v > 0.0 => Ok(Some(v)),
        Some(v) => Err(ArchError::Invalid { key, reason: format!("{v} must be finite and positive") }),
    }
}

pub(super) fn config(md: &Metadata, n_vocab: usize, tied_output: bool) -> Result<ModelConfig, ArchError> {
    let Shape { n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v } = shape(md, ARCH)?;
    if head_dim % 2 != 0 {
        return Err(ArchError::Invalid { key: format!("{ARCH}.attention.key_length"), reason: "must be even".into() });
    }
    let rope_base = positive_f32(md, ARCH, "rope.freq_base", Some(DEFAULT_ROPE_BASE))?;
    let window = md.opt_u32(&format!("{ARCH}.attention.sliding_window"))?.unwrap_or(DEFAULT_SLIDING_WINDOW);
    if window == 0 {
        return Err(ArchError::Invalid { key: format!("{ARCH}.attention.sliding_window"), reason: "must be positive".into() });
    }
    let layers = (0..n_layer).map(|i| LayerConfig { sliding_window: (i % 2 == 0).then_some(window), rope_base, rope_freq_scale: 1.0 }).collect();
    let query_scale_dim = if n_layer == LAYERS_27B { n_embd / n_head } else { head_dim };
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
        qk_norm: false,
        post_norms: true,
        embed_scale: Some((n_embd as f32).sqrt()),
        activation: Activation::GeluTanh,
        attn_scale: 1.0 / (query_scale_dim as f32).sqrt(),
        tied_output,
        rope_freqs: false,
        rope_scaling: Default::default(),
        fused_qkv: false,
        fused_gate_up: false,
        attn_softcap: softcap(md, "attn_logit_softcapping")?,
        final_softcap: softcap(md, "final_logit_softcapping")?,
        moe: None,
    })
}
