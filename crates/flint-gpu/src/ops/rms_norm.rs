//! RMSNorm over rows (`shaders/rms_norm.wgsl`): out = x / sqrt(mean(x²) + eps) · w, for
//! every token's rows (n_embd rows, or head_dim rows for QK-norm), or for the rows a list
//! gathers (the head's output rows); or out += that, a residual add in the same pass.

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, fold_groups, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "rms_norm.wgsl";
/// Rows shorter than this get a 64-thread workgroup (QK-norm's head_dim rows).
const SHORT_ROW: u32 = 512;
const WG_SHORT: u32 = 64;
const WG_LONG: u32 = 256;
/// On CPU-type adapters: one 8-lane SIMD group per row. A workgroup runs there as a loop of
/// SIMD groups between barriers, so 256 threads cost 8 barrier stages of 32 groups each for a
/// row of a few hundred values.
const WG_CPU: u32 = 8;

/// Which rows are normalized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Every token's `n` consecutive rows: x is [n_tok, n, row_len], out the same shape.
    PerToken(u32),
    /// The rows the batch's `tokens` list names: x is [src_rows, row_len], out row r is x row
    /// tokens[r] for r < n_tok (the head: the batch counts output rows, before the logits).
    Gather { src_rows: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormDesc {
    pub row_len: u32,
    pub eps: f32,
    pub rows: Rows,
    /// Add the normalized rows to `out` (a residual stream) instead of storing them.
    pub residual: bool,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    row_len: u32,
    rows_per_token: u32,
    eps: f32,
    _pad: u32,
}

pub struct RmsNorm {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    rows: Rows,
    _params: wgpu::Buffer,
}

fn key(caps: &crate::Caps, row_len: u32, in_place: bool, gather: bool, residual: bool) -> PipelineKey {
    let wg = if caps.cpu_like {
        WG_CPU
    } else if row_len < SHORT_ROW {
        WG_SHORT
    } else {
        WG_LONG
    };
    let defs = ShaderDefs::new().u32("WG", wg).flag("IN_PLACE", in_place).flag("GATHER", gather).flag("RESIDUAL", residual);
    PipelineKey::new(SHADER, "main", defs)
}

pub fn variants(caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = Vec::new();
    for row_len in [WG_SHORT, SHORT_ROW] {
        for (in_place, gather, residual) in [(false, false, false), (true, false, false), (false, true, false), (false, false, true)] {
            let k = key(caps, row_len, in_place, gather, residual);
            if !v.contains(&k) {
                v.push(k);
            }
        }
    }
    v
}

fn check(what: &str, buf: &wgpu::Buffer, need_elems: u64) -> Result<()> {
    if buf.size() < need_elems * 4 {
        return Err(GpuError::Unsupported { op: "rms_norm", message: format!("{what} holds {} bytes, needs {} f32", buf.size(), need_elems) });
    }
    Ok(())
}

impl RmsNorm {
    /// `w`: [row_len] f32. `x`: [max_tokens, rows, row_len] f32 ([src_rows, row_len] for
    /// [`Rows::Gather`]). `out`: [max_tokens, rows, row_len]. Passing the same buffer as `x`
    /// and `out` normalizes in place (bound once, as one read-write binding).
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        desc: RmsNormDesc,
        w: &wgpu::Buffer,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<RmsNorm> {
        let in_place = x == out;
        let row = desc.row_len as u64;
        let (rows_per_token, x_rows) = match desc.rows {
            Rows::PerToken(n) => (n, batch.max_tokens as u64 * n as u64),
            Rows::Gather { src_rows } => (1, src_rows as u64),
        };
        let gather = matches!(desc.rows, Rows::Gather { .. });
        if gather && in_place {
            return Err(GpuError::Unsupported { op: "rms_norm", message: "a gathering norm cannot work in place".into() });
        }
        if desc.residual && (gather || in_place) {
            return Err(GpuError::Unsupported { op: "rms_norm", message: "a residual norm adds per token into another buffer".into() });
        }
        check("w", w, row)?;
        check("x", x, x_rows * row)?;
        check("out", out, batch.max_tokens as u64 * rows_per_token as u64 * row)?;
        let key = key(&ctx.caps, desc.row_len, in_place, gather, desc.residual);
        let pipeline = cache.get(ctx, &key).await?;
        let p = Params { row_len: desc.row_len, rows_per_token, eps: desc.eps, _pad: 0 };
        let label = key.label();
        let params = params(ctx, &label, &p);
        let bind = if in_place {
            bind(ctx, &label, &pipeline, &[&batch.info, &params, w, x])
        } else if gather {
            bind(ctx, &label, &pipeline, &[&batch.info, &params, w, x, out, &batch.tokens])
        } else {
            bind(ctx, &label, &pipeline, &[&batch.info, &params, w, x, out])
        };
        Ok(RmsNorm { pipeline, bind, rows: desc.rows, _params: params })
    }

    /// Records the dispatch for `n_tok` tokens (the shader also bounds by Batch.n_tok).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        let n_rows = match self.rows {
            Rows::PerToken(n) => n_tok * n,
            Rows::Gather { .. } => n_tok,
        };
        if n_rows == 0 {
            return;
        }
        let (gx, gy) = fold_groups(n_rows);
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        crate::ops::dispatch(pass, gx, gy, 1);
    }
}
