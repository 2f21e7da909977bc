//! Soft cap in place (`shaders/softcap.wgsl`): x = cap · tanh(x / cap) over n_tok × n, for
//! gemma2's final logits (before sampling).

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, dispatch_folded, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "softcap.wgsl";
const WG: u32 = 256;

pub struct SoftCap {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n: u32,
    _params: wgpu::Buffer,
}

fn key() -> PipelineKey {
    PipelineKey::new(SHADER, "main", ShaderDefs::new().u32("WG", WG))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    vec![key()]
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n: u32,
    cap: f32,
    _pad: [u32; 2],
}

impl SoftCap {
    /// `x`: [batch.max_tokens, n] f32, capped in place; `cap` finite and positive.
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, batch: &Batch, n: u32, cap: f32, x: &wgpu::Buffer) -> Result<SoftCap> {
        let bad = |message: String| Err(GpuError::Unsupported { op: "softcap", message });
        if !(cap.is_finite() && cap > 0.0) {
            return bad(format!("the cap must be finite and positive, not {cap}"));
        }
        let need = batch.max_tokens as u64 * n as u64 * 4;
        if x.size() < need {
            return bad(format!("x holds {} bytes, needs {need} for [{}, {n}] f32", x.size(), batch.max_tokens));
        }
        let key = key();
        let pipeline = cache.get(ctx, &key).await?;
        let label = key.label();
        let params = params(ctx, &label, &Params { n, cap, _pad: [0; 2] });
        let bind = bind(ctx, &label, &pipeline, &[&batch.info, &params, x]);
        Ok(SoftCap { pipeline, bind, n, _params: params })
    }

    /// Records the dispatch for `n_tok` rows (the shader also bounds by Batch.n_tok).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        dispatch_folded(pass, &self.pipeline, &self.bind, (n_tok * self.n).div_ceil(WG));
    }
}
