//! Token embedding lookup from one row-part of a (possibly quantized) table:
//! `x[t, :] = dequant(table[tokens[t]]) * scale` for the tokens whose id falls in the part,
//! mirroring `shaders/embed.wgsl`. A table over the binding limit is split by rows into
//! parts, one `Embed` each; together they write every token.

use std::sync::Arc;

use flint_core::quant::QuantType;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, params, Batch, MAX_GROUPS_X};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "embed.wgsl";
const OP: &str = "embed";
/// Elements per dequantization chunk (one invocation each).
pub const CHUNK: u32 = 32;
/// Invocations per workgroup: chunks of one token.
pub const WG: u32 = 32;

/// Uniform parameters, laid out as `Params` in `shaders/embed.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_embd: u32,
    part_rows: u32,
    row_offset: u32,
    row_bytes: u32,
    scale: f32,
    _pad: [u32; 3],
}

fn key(ty: QuantType) -> PipelineKey {
    PipelineKey::new(SHADER, "main", ShaderDefs::new().quant(ty).u32("WG", WG))
}

/// Every variant: one per table format.
pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    QuantType::ALL.into_iter().map(key).collect()
}

/// One table part's lookup, built once; `encode` only records the dispatch.
pub struct Embed {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    groups_x: u32,
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: OP, message }
}

impl Embed {
    /// `table_part` holds rows `row_offset .. row_offset + part_rows` of an `[n_vocab, n_embd]`
    /// table of `ty`; `x` is `[max_tokens, n_embd]` f32.
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        ty: QuantType,
        n_embd: u32,
        part_rows: u32,
        row_offset: u32,
        table_part: &wgpu::Buffer,
        x: &wgpu::Buffer,
        scale: f32,
    ) -> Result<Embed> {
        let block = ty.block_elems() as u32;
        if n_embd == 0 || !n_embd.is_multiple_of(CHUNK) || !n_embd.is_multiple_of(block) {
            return Err(unsupported(format!("n_embd {n_embd} of {ty} is not a multiple of {}", CHUNK.max(block))));
        }
        if batch.max_tokens > MAX_GROUPS_X {
            return Err(GpuError::Limit { what: "embed tokens per step", need: batch.max_tokens as u64, limit: MAX_GROUPS_X as u64 });
        }
        let row_bytes = crate::weights::layout::row_bytes(ty, n_embd as u64).unwrap_or(u64::MAX);
        let table_bytes = row_bytes.saturating_mul(part_rows as u64);
        if table_bytes > u32::MAX as u64 {
            // The shader addresses table bytes with u32.
            return Err(GpuError::Limit { what: "embed table part bytes", need: table_bytes, limit: u32::MAX as u64 });
        }
        let need = [("embed table bytes", table_part, table_bytes), ("embed x bytes", x, batch.max_tokens as u64 * n_embd as u64 * 4)];
        for (what, buf, need) in need {
            if buf.size() < need {
                return Err(GpuError::Limit { what, need, limit: buf.size() });
            }
            let limit = ctx.limits.max_storage_buffer_binding_size;
            if buf.size() > limit {
                return Err(GpuError::Limit { what: "storage binding size", need: buf.size(), limit });
            }
        }
        let p = Params { n_embd, part_rows, row_offset, row_bytes: row_bytes as u32, scale, _pad: [0; 3] };
        let label = format!("embed_{}_rows{}+{}", ty.name(), row_offset, part_rows);
        let pbuf = params(ctx, &format!("{label}.params"), &p);
        let key = key(ty);
        let pipeline = cache.get(ctx, &key).await?;
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = bind(ctx, &label, &pipeline, &[&pbuf, &batch.info, &batch.tokens, table_part, x]);
        if let Some(e) = scope.pop().await {
            return Err(GpuError::Shader { shader: key.label(), message: e.to_string() });
        }
        Ok(Embed { pipeline, bind, groups_x: (n_embd / CHUNK).div_ceil(WG) })
    }

    /// Records the lookup of the step's `n_tok` tokens.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        if n_tok == 0 {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        crate::ops::dispatch(pass, self.groups_x, n_tok, 1);
    }
}
