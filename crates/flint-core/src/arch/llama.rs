//! The llama family: llama, mistral, qwen2 (Q/K/V biases, NeoX RoPE), qwen3 (no biases,
//! per-head QK-norm before NeoX RoPE) and phi3 (fused QKV and gate/up projections, NeoX RoPE).

use super::{count, opt_count, positive_f32, rope_scaling, shape, Activation, ArchError, LayerConfig, ModelConfig, RopeStyle, Shape};
use super::{MoeConfig, MAX_CTX, MAX_EMBD, MAX_EXPERTS, MAX_FF};
use crate::gguf::Metadata;

/// llama.cpp's default RoPE base when the file has none.
const DEFAULT_ROPE_BASE: f32 = 10_000.0;
const DEFAULT_RMS_EPS: f32 = 1e-5;

pub(super) fn config(md: &Metadata, arch: &str, n_vocab: usize, tied_output: bool) -> Result<ModelConfig, ArchError> {
    let Shape { n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v } = shape(md, arch)?;
    let rope_dim = opt_count(md, arch, "rope.dimension_count", MAX_EMBD)?.unwrap_or(head_dim);
    if rope_dim > head_dim || rope_dim % 2 != 0 {
        return Err(ArchError::Invalid {
            key: format!("{arch}.rope.dimension_count"),
            reason: format!("{rope_dim} must be even and at most the head size {head_dim}"),
        });
    }
    let rope_base = positive_f32(md, arch, "rope.freq_base", Some(DEFAULT_ROPE_BASE))?;
    let n_ctx_train = count(md, arch, "context_length", MAX_CTX)?;
    let (rope_freq_scale, rope_scaling) = rope_scaling(md, arch, n_ctx_train)?;
    let is_qwen2 = arch == "qwen2";
    let is_qwen3 = arch == "qwen3" || arch == "qwen3moe";
    let moe = match arch {
        "qwen3moe" => {
            let n_expert = count(md, arch, "expert_count", MAX_EXPERTS)?;
            let n_used = count(md, arch, "expert_used_count", MAX_EXPERTS)?;
            if n_used > n_expert {
                return Err(ArchError::Invalid { key: format!("{arch}.expert_used_count"), reason: format!("{n_used} experts used of {n_expert}") });
            }
            Some(MoeConfig { n_expert, n_used, n_ff: count(md, arch, "expert_feed_forward_length", MAX_FF)? })
        }
        _ => None,
    };
    let is_phi3 = arch == "phi3";
    Ok(ModelConfig {
        arch: arch.to_string(),
        n_vocab,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        head_dim_v,
        n_ff: count(md, arch, "feed_forward_length", MAX_FF)?,
        n_ctx_train,
        rms_eps: positive_f32(md, arch, "attention.layer_norm_rms_epsilon", Some(DEFAULT_RMS_EPS))?,
        // llama's GGUF conversion permutes Q/K so adjacent pairs rotate; qwen2 keeps HF's halves.
        rope_style: if is_qwen2 || is_qwen3 || is_phi3 { RopeStyle::Neox } else { RopeStyle::Normal },
        rope_dim,
        layers: vec![LayerConfig { sliding_window: None, rope_base, rope_freq_scale }; n_layer],
        qkv_bias: is_qwen2,
        qk_norm: is_qwen3,
        post_norms: false,
        embed_scale: None,
        activation: Activation::Silu,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        tied_output,
        rope_freqs: false,
        rope_scaling,
        fused_qkv: is_phi3,
        fused_gate_up: is_phi3,
        attn_softcap: None,
        final_softcap: None,
        moe,
    })
}
