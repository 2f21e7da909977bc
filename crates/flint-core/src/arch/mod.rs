//! Model architectures: a config per family derived from GGUF metadata, and the tensor
//! shapes it implies, checked against the file before any weight is touched.

mod gemma2;
mod gemma3;
mod llama;

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile, Metadata};

#[derive(Debug, Error)]
pub enum ArchError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (supported: llama, mistral, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3)")]
    Unsupported(String),
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("{0} is not supported")]
    UnsupportedFeature(String),
    #[error("tensor {0:?} is not used by this architecture (a file of another variant?): refusing rather than ignoring it")]
    UnusedTensor(String),
    #[error("tensor {tensor:?} has shape {got:?}, the architecture expects {expected:?}")]
    ShapeMismatch { tensor: String, expected: Vec<u64>, got: Vec<u64> },
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
}

/// How RoPE pairs up dimensions: adjacent pairs (llama's GGUF layout) or two halves (NeoX, HF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    Normal,
    Neox,
}

/// The gate activation of the gated feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    GeluTanh,
}

/// A mixture-of-experts feed-forward block (qwen3moe): a router over `n_expert` experts,
/// the `n_used` best of a softmax of its logits, their weights renormalized to sum to 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_used: usize,
    /// Each expert's feed-forward width.
    pub n_ff: usize,
}

/// RoPE scalings beyond a linear one (which `LayerConfig::rope_freq_scale` is), as llama.cpp
/// computes them. Both act through per-pair divisors of the frequencies
/// ([`ModelConfig::rope_divisors`]) and `mscale`, which multiplies every rotation's cos and
/// sin (so a fully rotated q·k by mscale²).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    pub kind: ScalingKind,
    /// `rope.scaling.attn_factor` (1 when absent), times YaRN's 1 + 0.1 ln(factor).
    pub mscale: f32,
}

impl Default for RopeScaling {
    fn default() -> Self {
        RopeScaling { kind: ScalingKind::None, mscale: 1.0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalingKind {
    /// No scaling, or a linear one, or Llama 3's (`rope_freqs.weight`).
    None,
    /// YaRN (`rope.scaling.type = yarn`): pairs whose wavelength the original context covers
    /// many times keep their frequency, long ones are divided by `factor`, a linear ramp
    /// between (β_fast 32, β_slow 1, as llama.cpp for every family but grok and mistral3).
    Yarn { factor: f32, orig_ctx: u32 },
    /// LongRoPE (Phi-3 128k): per-pair divisors `rope_factors_long.weight` when a sequence's
    /// context exceeds `orig_ctx`, else `rope_factors_short.weight`, as llama.cpp chooses.
    LongRope { orig_ctx: u32 },
}

/// What differs between the layers of one model.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    /// Keys at distance ≥ this from the query are masked (local attention); None = global.
    pub sliding_window: Option<u32>,
    pub rope_base: f32,
    /// Multiplies positions before RoPE (1 / linear scaling factor).
    pub rope_freq_scale: f32,
}

/// Everything the forward pass needs to know about a model, with every quirk explicit.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture` as written in the file.
    pub arch: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_style: RopeStyle,
    /// Dimensions of each head that RoPE rotates (the first `rope_dim`).
    pub rope_dim: usize,
    pub layers: Vec<LayerConfig>,
    /// Q, K and V projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (gemma3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before the residual add (gemma3).
    pub post_norms: bool,
    /// Token embeddings are multiplied by this (gemma: sqrt(n_embd)).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Multiplies q·k before the softmax.
    pub attn_scale: f32,
    /// The output projection is the token embedding matrix.
    pub tied_output: bool,
    /// `rope_freqs.weight` holds per-pair divisors of the RoPE frequencies (Llama 3 scaling).
    pub rope_freqs: bool,
    /// YaRN or LongRoPE, and the rotation's magnitude.
    pub rope_scaling: RopeScaling,
    /// The file stores Q, K and V as one `attn_qkv` ([q; k; v] rows, phi3).
    pub fused_qkv: bool,
    /// The file stores the gate and up projections as one `ffn_up` ([gate; up] rows, phi3).
    pub fused_gate_up: bool,
    /// Attention scores (after `attn_scale`) become cap · tanh(score / cap) (gemma2).
    pub attn_softcap: Option<f32>,
    /// The final logits become cap · tanh(logit / cap) (gemma2).
    pub final_softcap: Option<f32>,
    /// Every layer's feed-forward block is a mixture of experts (qwen3moe).
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    /// Derives the config from metadata and checks every tensor's shape against it.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ArchError> {
        let md = &file.metadata;
        let arch = md.str("general.architecture")?.to_string();
        let n_vocab = vocab_size(file)?;
        let tied_output = file.tensor("output.weight").is_none();
        let mut config = match arch.as_str() {
            "llama" | "mistral" | "qwen2" | "qwen3" | "qwen3moe" | "phi3" => llama::config(md, &arch, n_vocab, tied_output)?,
            "gemma2" => gemma2::config(md, n_vocab, tied_output)?,
            "gemma3" => gemma3::config(md, n_vocab, tied_output)?,
            other => return Err(ArchError::Unsupported(other.to_string())),
        };
        // Every family applies the factors in RoPE when the file has them.
        config.rope_freqs = file.tensor(ROPE_FREQS).is_some();
        if file.tensor(ROPE_FACTORS_LONG).is_some() || file.tensor(ROPE_FACTORS_SHORT).is_some() {
            let md = &file.metadata;
            let orig_ctx = opt_count(md, &arch, "rope.scaling.original_context_length", MAX_CTX)?.unwrap_or(config.n_ctx_train) as u32;
            config.rope_scaling = RopeScaling { kind: ScalingKind::LongRope { orig_ctx }, mscale: attn_factor(md, &arch)? };
        }
        config.check_tensors(file)?;
        Ok(config)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// The per-pair divisors tensor RoPE reads for sequences of `n_ctx` positions: Llama 3's
    /// `rope_freqs.weight`, or LongRoPE's long or short factors (long past the original context).
    pub fn rope_factor_tensor(&self, n_ctx: usize) -> Option<&'static str> {
        match self.rope_scaling.kind {
            _ if self.rope_freqs => Some(ROPE_FREQS),
            ScalingKind::LongRope { orig_ctx } if n_ctx > orig_ctx as usize => Some(ROPE_FACTORS_LONG),
            ScalingKind::LongRope { .. } => Some(ROPE_FACTORS_SHORT),
            _ => None,
        }
    }

    /// Layer `il`'s per-pair divisors of the RoPE frequencies (rope_dim / 2 of them): the
    /// tensor [`ModelConfig::rope_factor_tensor`] names (`tensor`, as read), or YaRN's.
    pub fn rope_divisors(&self, il: usize, tensor: Option<&[f32]>) -> Option<Vec<f32>> {
        match self.rope_scaling.kind {
            ScalingKind::Yarn { factor, orig_ctx } => Some(yarn_divisors(self.rope_dim, self.layers[il].rope_base, factor, orig_ctx)),
            _ => tensor.map(<[f32]>::to_vec),
        }
    }

    /// Every tensor the forward pass reads, with its ggml shape.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (e, v, ff) = (self.n_embd as u64, self.n_vocab as u64, self.n_ff as u64);
        let (q, kv, vd) = (self.q_dim() as u64, self.kv_dim() as u64, self.v_dim() as u64);
        let o_in = (self.n_head * self.head_dim_v) as u64;
        let mut t = vec![("token_embd.weight".to_string(), vec![e, v]), ("output_norm.weight".to_string(), vec![e])];
        if !self.tied_output {
            t.push(("output.weight".to_string(), vec![e, v]));
        }
        if self.rope_freqs {
            t.push((ROPE_FREQS.to_string(), vec![(self.rope_dim / 2) as u64]));
        }
        if let ScalingKind::LongRope { .. } = self.rope_scaling.kind {
            for name in [ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT] {
                t.push((name.to_string(), vec![(self.rope_dim / 2) as u64]));
            }
        }
        for i in 0..self.n_layer {
            let mut add = |name: &str, shape: Vec<u64>| t.push((format!("blk.{i}.{name}"), shape));
            add("attn_norm.weight", vec![e]);
            if self.fused_qkv {
                add("attn_qkv.weight", vec![e, q + kv + vd]);
            } else {
                add("attn_q.weight", vec![e, q]);
                add("attn_k.weight", vec![e, kv]);
                add("attn_v.weight", vec![e, vd]);
            }
            add("attn_output.weight", vec![o_in, e]);
            add("ffn_norm.weight", vec![e]);
            if let Some(m) = &self.moe {
                let (n, fe) = (m.n_expert as u64, m.n_ff as u64);
                add("ffn_gate_inp.weight", vec![e, n]);
                add("ffn_gate_exps.weight", vec![e, fe, n]);
                add("ffn_up_exps.weight", vec![e, fe, n]);
                add("ffn_down_exps.weight", vec![fe, e, n]);
            } else if self.fused_gate_up {
                add("ffn_up.weight", vec![e, 2 * ff]);
                add("ffn_down.weight", vec![ff, e]);
            } else {
                add("ffn_gate.weight", vec![e, ff]);
                add("ffn_up.weight", vec![e, ff]);
                add("ffn_down.weight", vec![ff, e]);
            }
            if self.qkv_bias {
                add("attn_q.bias", vec![q]);
                add("attn_k.bias", vec![kv]);
                add("attn_v.bias", vec![vd]);
            }
            if self.qk_norm {
                add("attn_q_norm.weight", vec![self.head_dim as u64]);
                add("attn_k_norm.weight", vec![self.head_dim as u64]);
            }
            if self.post_norms {
                add("post_attention_norm.weight", vec![e]);
                add("post_ffw_norm.weight", vec![e]);
            }
        }
        t
    }

    /// The config the backends see, with `file`'s fused projections split into the separate
    /// tensors they read (row ranges of the fused ones, nothing copied).
    pub fn unfuse(&self, file: &mut GgufFile) -> Result<ModelConfig, ArchError> {
        let (q, kv, vd, ff) = (self.q_dim() as u64, self.kv_dim() as u64, self.v_dim() as u64, self.n_ff as u64);
        for i in 0..self.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            if self.fused_qkv {
                file.split_rows(&n("attn_qkv.weight"), &[(n("attn_q.weight"), q), (n("attn_k.weight"), kv), (n("attn_v.weight"), vd)])?;
            }
            if self.fused_gate_up {
                file.split_rows(&n("ffn_up.weight"), &[(n("ffn_gate.weight"), ff), (n("ffn_up.weight"), ff)])?;
            }
        }
        Ok(ModelConfig { fused_qkv: false, fused_gate_up: false, ..self.clone() })
    }

    /// Every expected tensor with its shape, and no other: a tensor the forward pass would
    /// skip (Llama 3's `rope_freqs.weight` once was) means the file is not what we compute.
    fn check_tensors(&self, file: &GgufFile) -> Result<(), ArchError> {
        let expected = self.expected_tensors();
        for (name, shape) in &expected {
            let t = file.tensor(name).ok_or_else(|| ArchError::MissingTensor(name.clone()))?;
            if t.dims != *shape {
                return Err(ArchError::ShapeMismatch { tensor: name.clone(), expected: shape.clone(), got: t.dims.clone() });
            }
        }
        let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(t) = file.tensors.iter().find(|t| !known.contains(t.name.as_str())) {
            return Err(ArchError::UnusedTensor(t.name.clone()));
        }
        Ok(())
    }
}

/// The vocabulary size: the embedding's row count, which must agree with the tokenizer's list.
fn vocab_size(file: &GgufFile) -> Result<usize, ArchError> {
    let embd = file.tensor("token_embd.weight").ok_or_else(|| ArchError::MissingTensor("token_embd.weight".into()))?;
    if embd.dims.len() != 2 {
        return Err(ArchError::ShapeMismatch { tensor: embd.name.clone(), expected: vec![0, 0], got: embd.dims.clone() });
    }
    let n_vocab = embd.dims[1];
    if let Some(tokens) = file.metadata.opt_str_array("tokenizer.ggml.tokens")? {
        if tokens.len() as u64 != n_vocab {
            return Err(ArchError::Invalid {
                key: "tokenizer.ggml.tokens".into(),
                reason: format!("{} tokens but token_embd.weight has {n_vocab} rows", tokens.len()),
            });
        }
    }
    if n_vocab > MAX_VOCAB {
        return Err(ArchError::Invalid { key: "token_embd.weight".into(), reason: format!("{n_vocab} rows is too many") });
    }
    Ok(n_vocab as usize)
}

/// The attention shape every family reads the same way.
pub(crate) struct Shape {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
}

/// Reads and checks the counts shared by every family: query heads a multiple of KV heads,
/// and, where the file gives no head size, an embedding that divides into the heads.
pub(crate) fn shape(md: &Metadata, arch: &str) -> Result<Shape, ArchError> {
    let n_embd = count(md, arch, "embedding_length", MAX_EMBD)?;
    let n_layer = count(md, arch, "block_count", MAX_LAYERS)?;
    let n_head = count(md, arch, "attention.head_count", MAX_HEADS)?;
    let n_head_kv = opt_count(md, arch, "attention.head_count_kv", MAX_HEADS)?.unwrap_or(n_head);
    if n_head % n_head_kv != 0 {
        return Err(ArchError::Invalid {
            key: format!("{arch}.attention.head_count_kv"),
            reason: format!("{n_head} query heads are not a multiple of {n_head_kv} KV heads"),
        });
    }
    let head_dim = match opt_count(md, arch, "attention.key_length", MAX_EMBD)? {
        Some(d) => d,
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            return Err(ArchError::Invalid {
                key: format!("{arch}.attention.head_count"),
                reason: format!("embedding length {n_embd} is not a multiple of {n_head} heads"),
            })
        }
    };
    let head_dim_v = opt_count(md, arch, "attention.value_length", MAX_EMBD)?.unwrap_or(head_dim);
    Ok(Shape { n_embd, n_layer, n_head, n_head_kv, head_dim, head_dim_v })
}

/// Reads `<arch>.<name>` as a positive count no larger than `max`.
pub(crate) fn count(md: &Metadata, arch: &str, name: &str, max: u32) -> Result<usize, ArchError> {
    let key = format!("{arch}.{name}");
    let v = md.u32(&key)?;
    if v == 0 || v > max {
        return Err(ArchError::Invalid { key, reason: format!("{v} is outside 1..={max}") });
    }
    Ok(v as usize)
}

pub(crate) fn opt_count(md: &Metadata, arch: &str, name: &str, max: u32) -> Result<Option<usize>, ArchError> {
    let key = format!("{arch}.{name}");
    match md.opt_u32(&key)? {
        None => Ok(None),
        Some(_) => count(md, arch, name, max).map(Some),
    }
}

/// Reads `<arch>.<name>` as a finite positive float, or `default` when absent.
pub(crate) fn positive_f32(md: &Metadata, arch: &str, name: &str, default: Option<f32>) -> Result<f32, ArchError> {
    let key = format!("{arch}.{name}");
    let v = match (md.opt_f32(&key)?, default) {
        (Some(v), _) => v,
        (None, Some(d)) => d,
        (None, None) => return Err(GgufError::MissingKey(key).into()),
    };
    if !(v.is_finite() && v > 0.0) {
        return Err(ArchError::Invalid { key, reason: format!("{v} must be finite and positive") });
    }
    Ok(v)
}

/// The tensor of per-pair RoPE frequency divisors (Llama 3 scaling).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// RoPE's per-pair inverse frequencies, 1 / base^(2i / rope_dim), each divided by its factor
/// when the model has `rope_freqs.weight` (Llama 3 scaling); both backends rotate with this
/// table.
pub fn rope_inv_freq(rope_dim: usize, base: f32, factors: Option<&[f32]>) -> Vec<f32> {
    (0..rope_dim / 2)
        .map(|i| {
            let f = 1.0 / base.powf((2 * i) as f32 / rope_dim as f32);
            factors.map_or(f, |ff| f / ff[i])
        })
        .collect()
}

/// LongRoPE's per-pair divisors past the original context, and within it.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";

/// Linear RoPE scaling (`rope.scaling.type = linear`, `rope.scaling.factor`) as a position multiplier.
pub(crate) fn rope_freq_scale(md: &Metadata, arch: &str) -> Result<f32, ArchError> {
    match rope_scaling(md, arch, 0)? {
        (scale, RopeScaling { kind: ScalingKind::None, .. }) => Ok(scale),
        _ => Err(ArchError::Invalid { key: format!("{arch}.rope.scaling.type"), reason: "YaRN is not supported for this architecture".into() }),
    }
}

/// The RoPE scaling the metadata names: a linear one as a position multiplier, or YaRN (whose
/// original context defaults to `n_ctx_train`), with the magnitude `rope.scaling.attn_factor`.
pub(crate) fn rope_scaling(md: &Metadata, arch: &str, n_ctx_train: usize) -> Result<(f32, RopeScaling), ArchError> {
    let ty = md.opt_str(&format!("{arch}.rope.scaling.type"))?;
    let factor = md.opt_f32(&format!("{arch}.rope.scaling.factor"))?;
    let bad = |reason: String| Err(ArchError::Invalid { key: format!("{arch}.rope.scaling"), reason });
    let mscale = attn_factor(md, arch)?;
    match (ty, factor) {
        (Some("none") | None, _) | (Some("linear"), None) => Ok((1.0, RopeScaling { kind: ScalingKind::None, mscale })),
        (Some("linear"), Some(f)) if f.is_finite() && f >= 1.0 => Ok((1.0 / f, RopeScaling { kind: ScalingKind::None, mscale })),
        (Some("yarn"), Some(f)) if (1.0..=1e6).contains(&f) => {
            let orig_ctx = opt_count(md, arch, "rope.scaling.original_context_length", MAX_CTX)?.unwrap_or(n_ctx_train) as u32;
            // ggml multiplies cos and sin by 1 + 0.1 ln(1 / freq_scale) whenever YaRN extrapolates.
            let kind = ScalingKind::Yarn { factor: f, orig_ctx };
            Ok((1.0, RopeScaling { kind, mscale: mscale * (1.0 + 0.1 * f.ln()) }))
        }
        (Some(t), f) => bad(format!("unsupported RoPE scaling {t:?} with factor {f:?}")),
    }
}

/// `rope.scaling.attn_factor`: 1 when absent; finite and positive.
fn attn_factor(md: &Metadata, arch: &str) -> Result<f32, ArchError> {
    let key = format!("{arch}.rope.scaling.attn_factor");
    match md.opt_f32(&key)? {
        None => Ok(1.0),
        Some(v) if v.is_finite() && v > 0.0 && v <= 1e3 => Ok(v),
        Some(v) => Err(ArchError::Invalid { key, reason: format!("{v} must be finite and positive") }),
    }
}

/// YaRN's per-pair divisors of the frequencies for `rope_dim` rotated dimensions at `base`:
/// 1 / ((1 − r)/factor + r), r the ramp over the pair index between the pairs that turn
/// β_slow = 1 and β_fast = 32 times within the original context (ggml's
/// `ggml_rope_yarn_corr_dims`, floor and ceil as it rounds them, in f32 as it computes).
pub fn yarn_divisors(rope_dim: usize, base: f32, factor: f32, orig_ctx: u32) -> Vec<f32> {
    let n_dims = rope_dim as f32;
    let corr_dim = |n_rot: f32| n_dims * (orig_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    let low = corr_dim(32.0).floor().max(0.0);
    let high = corr_dim(1.0).ceil().min(n_dims - 1.0);
    (0..rope_dim / 2)
        .map(|i| {
            let y = (i as f32 - low) / (high - low).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            1.0 / ((1.0 - ramp) / factor + ramp)
        })
        .collect()
}

/// Upper bounds that keep a hostile file from sizing allocations (far above any real model).
pub(crate) const MAX_EMBD: u32 = 1 << 16;
pub(crate) const MAX_LAYERS: u32 = 1024;
pub(crate) const MAX_HEADS: u32 = 1024;
pub(crate) const MAX_FF: u32 = 1 << 20;
pub(crate) const MAX_EXPERTS: u32 = 1024;
pub(crate) const MAX_CTX: u32 = 1 << 24;
pub(crate) const MAX_VOCAB: u64 = 1 << 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_keeps_fast_pairs_and_divides_slow_ones() {
        // tests/data/rope/yarn: 32 rotated dims, base 1e4, original context 64, factor 4:
        // low 0, high 5 (transformers and llama.cpp agree).
        let d = yarn_divisors(32, 1e4, 4.0, 64);
        assert_eq!(d[0], 1.0);
        assert!((d[1] - 1.0 / (0.2 / 4.0 + 0.8)).abs() < 1e-6, "{d:?}");
        assert!(d[5..].iter().all(|&x| x == 4.0), "{d:?}");
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn longrope_picks_long_factors_past_the_original_context() {
        let mut c = crate::kv::layout::tests::cfg(&[None]);
        c.rope_scaling = RopeScaling { kind: ScalingKind::LongRope { orig_ctx: 64 }, mscale: 1.15 };
        assert_eq!(c.rope_factor_tensor(64), Some(ROPE_FACTORS_SHORT));
        assert_eq!(c.rope_factor_tensor(65), Some(ROPE_FACTORS_LONG));
        assert_eq!(c.rope_divisors(0, Some(&[2.0; 16])), Some(vec![2.0; 16]));
        c.rope_scaling = RopeScaling::default();
        assert_eq!(c.rope_factor_tensor(4096), None);
        assert_eq!(c.rope_divisors(0, None), None);
    }
}
