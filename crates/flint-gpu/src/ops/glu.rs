//! Gated activation (`shaders/glu.wgsl`): out[t, i] = act(gate[t, i]) · up[t, i] over
//! n_tok × n_ff, with act = SiLU or GELU-tanh (the model's `Activation`).

use std::sync::Arc;

use flint_core::arch::Activation;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{bind, dispatch_folded, params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "glu.wgsl";
const WG: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GluDesc {
    pub act: Activation,
    pub n_ff: u32,
}

pub struct Glu {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n_ff: u32,
    _params: wgpu::Buffer,
}

/// `wrong`: the test-only wrong variant (see [`GpuContext::wrong_kernel`]).
fn key(act: Activation, in_place: bool, wrong: bool) -> PipelineKey {
    let defs = ShaderDefs::new().u32("WG", WG).flag("GELU_TANH", act == Activation::GeluTanh).flag("IN_PLACE", in_place).flag("WRONG", wrong);
    PipelineKey::new(SHADER, "main", defs)
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = Vec::new();
    for act in [Activation::Silu, Activation::GeluTanh] {
        for in_place in [false, true] {
            v.push(key(act, in_place, false));
        }
    }
    v.push(key(Activation::Silu, true, true));
    v
}

impl Glu {
    /// `gate`, `up`, `out`: [max_tokens, n_ff] f32. `out` may be `gate` (written in place,
    /// bound once); it may not be `up`.
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        desc: GluDesc,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<Glu> {
        let GluDesc { act, n_ff } = desc;
        let bad = |message: String| Err(GpuError::Unsupported { op: "glu", message });
        if out == up {
            return bad("out may alias gate but not up".into());
        }
        let need = batch.max_tokens as u64 * n_ff as u64 * 4;
        for (name, b) in [("gate", gate), ("up", up), ("out", out)] {
            if b.size() < need {
                return bad(format!("{name} holds {} bytes, needs {need} for [{}, {n_ff}] f32", b.size(), batch.max_tokens));
            }
        }
        let in_place = gate == out;
        let key = key(act, in_place, ctx.wrong("glu"));
        let pipeline = cache.get(ctx, &key).await?;
        let label = key.label();
        let params = params(ctx, &label, &[n_ff, 0, 0, 0]);
        let bind = if in_place {
            bind(ctx, &label, &pipeline, &[&batch.info, &params, up, gate])
        } else {
            bind(ctx, &label, &pipeline, &[&batch.info, &params, up, gate, out])
        };
        Ok(Glu { pipeline, bind, n_ff, _params: params })
    }

    /// Records the dispatch for `n_tok` tokens (the shader also bounds by Batch.n_tok).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        dispatch_folded(pass, &self.pipeline, &self.bind, (n_tok * self.n_ff).div_ceil(WG));
    }
}
