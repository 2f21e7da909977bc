//! A mixture of experts' routing and combination (`shaders/moe.wgsl`), around the matmuls
//! by expert (`ops::matmul` with [`MatmulIds`](crate::ops::matmul::MatmulIds)):
//!
//! - [`MoeRoute`]: each token's `n_used` best experts by router logit and their renormalized
//!   softmax weights (`flint_core::reference::ops::moe_route`), then every expert's list of
//!   the entries (`token · n_used + slot`) routed to it, which the matmuls by expert read.
//! - [`MoeCombine`]: each token's weighted sum of its slots' expert outputs.
//!
//! The grids are sized for the step's tokens; nothing is read back.

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, dispatch_folded, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "moe.wgsl";
/// Invocations per token of the routing kernel.
const ROUTE_WG: u32 = 64;
/// Invocations of the one grouping workgroup.
const GROUP_WG: u32 = 256;
const COMBINE_WG: u32 = 256;
/// The most experts a router may have (a multiple of [`GROUP_WG`]; the routing kernel holds
/// a token's logits in workgroup memory). The GGUF loader allows no more.
pub const MAX_EXPERTS: u32 = 1024;
/// The most experts a token may be routed to.
pub const MAX_USED: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Route,
    Group,
    Combine { accumulate: bool },
}

fn key(k: Kernel) -> PipelineKey {
    let defs = ShaderDefs::new().u32("MAX_EXPERTS", MAX_EXPERTS).u32("MAX_USED", MAX_USED);
    let defs = match k {
        Kernel::Route => defs.flag("ROUTE", true).u32("WG", ROUTE_WG),
        Kernel::Group => defs.flag("GROUP", true).u32("WG", GROUP_WG),
        Kernel::Combine { accumulate } => defs.flag("COMBINE", true).flag("ACCUMULATE", accumulate).u32("WG", COMBINE_WG),
    };
    PipelineKey::new(SHADER, "main", defs)
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    vec![key(Kernel::Route), key(Kernel::Group), key(Kernel::Combine { accumulate: false }), key(Kernel::Combine { accumulate: true })]
}

/// The routing's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDesc {
    pub n_expert: u32,
    pub n_used: u32,
}

/// What the routing writes, sized for a batch's most tokens.
pub struct MoeRoutes {
    /// [max_tokens, n_used] u32: each slot's expert, best first.
    pub ids: wgpu::Buffer,
    /// [max_tokens, n_used] f32: each slot's weight.
    pub weights: wgpu::Buffer,
    /// [n_expert] u32: entries routed to each expert this step.
    pub count: wgpu::Buffer,
    /// [n_expert, max_tokens] u32: each expert's entries, in token order.
    pub rows: wgpu::Buffer,
}

impl MoeRoutes {
    pub fn new(ctx: &GpuContext, desc: MoeDesc, max_tokens: u32) -> Result<MoeRoutes> {
        let s = |label: &str, words: u64| crate::buffer::storage(ctx, label, words * 4);
        let slots = max_tokens as u64 * desc.n_used as u64;
        Ok(MoeRoutes {
            ids: s("moe_ids", slots)?,
            weights: s("moe_weights", slots)?,
            count: s("moe_count", desc.n_expert as u64)?,
            rows: s("moe_rows", desc.n_expert as u64 * max_tokens as u64)?,
        })
    }
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: "moe", message }
}

/// Routes the step's tokens: ids and weights per slot, then the per-expert entry lists.
pub struct MoeRoute {
    route: (Arc<wgpu::ComputePipeline>, wgpu::BindGroup),
    group: (Arc<wgpu::ComputePipeline>, wgpu::BindGroup),
    _params: wgpu::Buffer,
}

impl MoeRoute {
    /// `logits`: [max_tokens, n_expert] f32, the router's output.
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, batch: &Batch, desc: MoeDesc, logits: &wgpu::Buffer, out: &MoeRoutes) -> Result<MoeRoute> {
        let MoeDesc { n_expert, n_used } = desc;
        if n_expert == 0 || n_expert > MAX_EXPERTS || n_used == 0 || n_used > MAX_USED.min(n_expert) {
            return Err(unsupported(format!("{n_used} of {n_expert} experts (at most {MAX_USED} of {MAX_EXPERTS})")));
        }
        let t = batch.max_tokens as u64;
        let slots = t * n_used as u64 * 4;
        for (name, b, need) in [
            ("logits", logits, t * n_expert as u64 * 4),
            ("ids", &out.ids, slots),
            ("weights", &out.weights, slots),
            ("count", &out.count, n_expert as u64 * 4),
            ("rows", &out.rows, n_expert as u64 * t * 4),
        ] {
            if b.size() < need {
                return Err(unsupported(format!("{name} holds {} bytes, needs {need}", b.size())));
            }
        }
        let params = params(ctx, "moe_route", &[n_expert, n_used, batch.max_tokens, 0]);
        let route = cache.get(ctx, &key(Kernel::Route)).await?;
        let group = cache.get(ctx, &key(Kernel::Group)).await?;
        let rb = bind(ctx, "moe_route", &route, &[&batch.info, &params, logits, &out.ids, &out.weights]);
        let gb = bind(ctx, "moe_group", &group, &[&batch.info, &params, &out.ids, &out.count, &out.rows]);
        Ok(MoeRoute { route: (route, rb), group: (group, gb), _params: params })
    }

    /// Records both kernels for `n_tok` tokens.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        if n_tok == 0 {
            return;
        }
        dispatch_folded(pass, &self.route.0, &self.route.1, n_tok);
        dispatch_folded(pass, &self.group.0, &self.group.1, 1);
    }
}

/// out[t] (+)= Σ_s weights[t, s] · y[t · n_used + s] over [n_tok, n].
pub struct MoeCombine {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n: u32,
    _params: wgpu::Buffer,
}

impl MoeCombine {
    /// `y`: [max_tokens · n_used, n] f32; `out`: [max_tokens, n] f32, added to with
    /// `accumulate` (a fused residual), else overwritten.
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        n: u32,
        n_used: u32,
        accumulate: bool,
        routes: &MoeRoutes,
        y: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<MoeCombine> {
        let t = batch.max_tokens as u64;
        for (name, b, need) in [("y", y, t * n_used as u64 * n as u64 * 4), ("out", out, t * n as u64 * 4), ("weights", &routes.weights, t * n_used as u64 * 4)]
        {
            if b.size() < need {
                return Err(unsupported(format!("{name} holds {} bytes, needs {need}", b.size())));
            }
        }
        if n == 0 || n_used == 0 || y == out {
            return Err(unsupported(format!("combine of {n_used} slots of {n} (y and out must differ)")));
        }
        let key = key(Kernel::Combine { accumulate });
        let pipeline = cache.get(ctx, &key).await?;
        let params = params(ctx, "moe_combine", &[n, n_used, 0, 0]);
        let bind = bind(ctx, "moe_combine", &pipeline, &[&batch.info, &params, &routes.weights, y, out]);
        Ok(MoeCombine { pipeline, bind, n, _params: params })
    }

    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        dispatch_folded(pass, &self.pipeline, &self.bind, (n_tok * self.n).div_ceil(COMBINE_WG));
    }
}
