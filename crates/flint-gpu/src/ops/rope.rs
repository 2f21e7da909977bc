//! RoPE in place (`shaders/rope.wgsl`) on [n_tok, n_heads, head_dim] at each token's
//! Batch position; Normal (adjacent pairs) or Neox (halves) style, base and freq_scale per op.
//! The model fuses the same rotation into kv_write (K) and attention (q) through
//! [`RopeSpec`] and [`RopeTables`] (`shaders/rope_common.wgsl`); this op is the standalone form.

use std::sync::Arc;

use flint_core::arch::RopeStyle;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, dispatch_folded, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "rope.wgsl";
const WG: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeDesc {
    pub n_heads: u32,
    pub head_dim: u32,
    /// Rotated dimensions of each head (the first `rope_dim`); even, ≤ head_dim.
    pub rope_dim: u32,
    pub style: RopeStyle,
    pub base: f32,
    /// Multiplies positions (1 / linear scaling factor).
    pub freq_scale: f32,
}

/// The rotation a fused kernel applies to each head of the rows it copies.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    /// Rotated dimensions of each head (the first `rope_dim`); even, ≤ head_dim.
    pub rope_dim: u32,
    pub style: RopeStyle,
    pub base: f32,
    /// Multiplies positions (1 / linear scaling factor).
    pub freq_scale: f32,
    /// Per-pair divisors of the frequencies (`ModelConfig::rope_divisors`: Llama 3's
    /// `rope_freqs.weight`, LongRoPE's factors, YaRN's ramp), rope_dim / 2.
    pub freq_factors: Option<Arc<[f32]>>,
    /// Multiplies every rotation's cos and sin (YaRN's and LongRoPE's attention factor; 1 = none).
    pub mscale: f32,
}

impl RopeSpec {
    pub fn validate(&self, head_dim: u32) -> Result<()> {
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim == 0 || self.rope_dim > head_dim {
            return Err(GpuError::Unsupported { op: "rope", message: format!("rope_dim {} must be even, nonzero and ≤ head_dim {head_dim}", self.rope_dim) });
        }
        if self.freq_factors.as_ref().is_some_and(|f| f.len() != self.rope_dim as usize / 2) {
            return Err(GpuError::Unsupported { op: "rope", message: format!("freq_factors must hold rope_dim / 2 = {} values", self.rope_dim / 2) });
        }
        Ok(())
    }

    /// Defines for a fused kernel: ROPE, and NEOX for half-split pairs.
    pub fn defs(spec: Option<&RopeSpec>, defs: ShaderDefs) -> ShaderDefs {
        defs.flag("ROPE", spec.is_some()).flag("NEOX", spec.is_some_and(|s| s.style == RopeStyle::Neox))
    }
}

/// `RopeParams` (uniform) and `inv_freq` (storage) of `shaders/rope_common.wgsl`.
pub struct RopeTables {
    pub params: wgpu::Buffer,
    pub inv_freq: wgpu::Buffer,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FusedParams {
    n_pairs: u32,
    freq_scale: f32,
    mscale: f32,
    _pad: u32,
}

impl RopeTables {
    pub fn new(ctx: &GpuContext, label: &str, spec: &RopeSpec, head_dim: u32) -> Result<RopeTables> {
        spec.validate(head_dim)?;
        let p = FusedParams { n_pairs: spec.rope_dim / 2, freq_scale: spec.freq_scale, mscale: spec.mscale, _pad: 0 };
        let params = params(ctx, &format!("{label}.rope"), &p);
        let freqs = flint_core::arch::rope_inv_freq(spec.rope_dim as usize, spec.base, spec.freq_factors.as_deref());
        let inv_freq = crate::buffer::storage_init(ctx, &format!("{label}.inv_freq"), bytemuck::cast_slice(&freqs))?;
        Ok(RopeTables { params, inv_freq })
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_heads: u32,
    head_dim: u32,
    n_pairs: u32,
    freq_scale: f32,
}

pub struct Rope {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    pairs_per_token: u32,
    _params: wgpu::Buffer,
    _inv_freq: wgpu::Buffer,
}

fn key(style: RopeStyle) -> PipelineKey {
    PipelineKey::new(SHADER, "main", ShaderDefs::new().u32("WG", WG).flag("NEOX", style == RopeStyle::Neox))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    vec![key(RopeStyle::Normal), key(RopeStyle::Neox)]
}

impl Rope {
    /// `x`: [max_tokens, n_heads, head_dim] f32, rotated in place at `batch.pos`.
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, batch: &Batch, desc: RopeDesc, x: &wgpu::Buffer) -> Result<Rope> {
        let bad = |message: String| Err(GpuError::Unsupported { op: "rope", message });
        RopeSpec { rope_dim: desc.rope_dim, style: desc.style, base: desc.base, freq_scale: desc.freq_scale, mscale: 1.0, freq_factors: None }
            .validate(desc.head_dim)?;
        let need = batch.max_tokens as u64 * desc.n_heads as u64 * desc.head_dim as u64 * 4;
        if x.size() < need {
            return bad(format!("x holds {} bytes, needs {need} for [{}, {}, {}] f32", x.size(), batch.max_tokens, desc.n_heads, desc.head_dim));
        }
        let key = key(desc.style);
        let pipeline = cache.get(ctx, &key).await?;
        let label = key.label();
        let n_pairs = desc.rope_dim / 2;
        let p = Params { n_heads: desc.n_heads, head_dim: desc.head_dim, n_pairs, freq_scale: desc.freq_scale };
        let params = params(ctx, &label, &p);
        let freqs = crate::buffer::storage_init(
            ctx,
            &format!("{label}.inv_freq"),
            bytemuck::cast_slice(&flint_core::arch::rope_inv_freq(desc.rope_dim as usize, desc.base, None)),
        )?;
        let bind = bind(ctx, &label, &pipeline, &[&batch.info, &params, &batch.pos, &freqs, x]);
        Ok(Rope { pipeline, bind, pairs_per_token: desc.n_heads * n_pairs, _params: params, _inv_freq: freqs })
    }

    /// Records the dispatch for `n_tok` tokens (the shader also bounds by Batch.n_tok).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        dispatch_folded(pass, &self.pipeline, &self.bind, (n_tok * self.pairs_per_token).div_ceil(WG));
    }
}
