//! In-place adds (`shaders/add.wgsl`): the residual x[t, i] += y[t, i] over n_tok × n, and
//! the bias x[t, i] += b[i] (one [n] vector added to every token's row).

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, dispatch_folded, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "add.wgsl";
const WG: u32 = 256;

/// What is added to x: [n_tok, n].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddKind {
    /// y: [n_tok, n], element by element (residual).
    Residual,
    /// y: [n], added to every row (bias).
    Bias,
}

pub struct Add {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n: u32,
    _params: wgpu::Buffer,
}

fn key(kind: AddKind) -> PipelineKey {
    PipelineKey::new(SHADER, "main", ShaderDefs::new().u32("WG", WG).flag("BIAS", kind == AddKind::Bias))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    vec![key(AddKind::Residual), key(AddKind::Bias)]
}

impl Add {
    /// `x`: [max_tokens, n] f32, updated in place; `y` as `kind` says; `x` ≠ `y`.
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, batch: &Batch, kind: AddKind, n: u32, x: &wgpu::Buffer, y: &wgpu::Buffer) -> Result<Add> {
        let bad = |message: String| Err(GpuError::Unsupported { op: "add", message });
        if x == y {
            return bad("x and y must be different buffers".into());
        }
        let x_need = batch.max_tokens as u64 * n as u64 * 4;
        let y_need = if kind == AddKind::Bias { n as u64 * 4 } else { x_need };
        if x.size() < x_need || y.size() < y_need {
            return bad(format!("x/y hold {}/{} bytes, need {x_need}/{y_need} ({kind:?}, n {n})", x.size(), y.size()));
        }
        let key = key(kind);
        let pipeline = cache.get(ctx, &key).await?;
        let label = key.label();
        let params = params(ctx, &label, &[n, 0, 0, 0]);
        let bind = bind(ctx, &label, &pipeline, &[&batch.info, &params, y, x]);
        Ok(Add { pipeline, bind, n, _params: params })
    }

    /// Records the dispatch for `n_tok` tokens (the shader also bounds by Batch.n_tok).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        dispatch_folded(pass, &self.pipeline, &self.bind, (n_tok * self.n).div_ceil(WG));
    }
}
