//! Logit edits in place before the sampler (`shaders/penalize.wgsl`): the repetition,
//! presence and frequency penalties and the logit bias of flint_core's [`LogitEdit`] list,
//! then the allowed-token mask. Each step uploads only its list (12 bytes an entry) and,
//! when set, the mask with `queue.write_buffer` into buffers sized at load.

use std::sync::Arc;

use flint_core::sampling::{LogitEdit, Penalties, Sampler as CpuSampler};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::fold_groups;
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "penalize.wgsl";
const WG: u32 = 256;

/// Binding numbers in penalize.wgsl.
const B_PARAMS: u32 = 0;
const B_LOGITS: u32 = 1;
const B_EDITS: u32 = 2;
const B_MASK: u32 = 3;
const ENTRIES: [(&str, &[u32]); 2] = [("edit", &[B_PARAMS, B_LOGITS, B_EDITS]), ("apply_mask", &[B_PARAMS, B_LOGITS, B_MASK])];

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_vocab: u32,
    n_edits: u32,
    repeat: f32,
    presence: f32,
    frequency: f32,
    neg_inf: f32,
    _pad: [u32; 2],
}

/// One step's logit edits, as flint_core's sampler defines them.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEdits<'a> {
    pub penalties: Penalties,
    /// Sorted or not, but each id at most once.
    pub edits: Vec<LogitEdit>,
    /// 1 bit per token, set = allowed; None = every token allowed.
    pub mask: Option<&'a [u32]>,
}

impl<'a> StepEdits<'a> {
    /// The edits `sampler` applies at this step (its penalty window, bias and mask).
    pub fn from_sampler(sampler: &'a CpuSampler) -> StepEdits<'a> {
        StepEdits { penalties: sampler.params().penalties(), edits: sampler.edits(), mask: sampler.mask() }
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty() && self.mask.is_none()
    }
}

/// What one prepared step records; from [`Penalize::prepare`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PenalizePlan {
    pub n_edits: u32,
    pub mask: bool,
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
}

pub struct Penalize {
    n_vocab: u32,
    max_edits: u32,
    params: wgpu::Buffer,
    edits: wgpu::Buffer,
    mask: wgpu::Buffer,
    kernels: Vec<Kernel>,
}

fn key(entry: &'static str) -> PipelineKey {
    PipelineKey::new(SHADER, entry, ShaderDefs::new().u32("WG", WG))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    ENTRIES.iter().map(|(e, _)| key(e)).collect()
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: "penalize", message }
}

/// Words of a mask over `n_vocab` tokens.
pub fn mask_words(n_vocab: u32) -> usize {
    n_vocab.div_ceil(32) as usize
}

impl Penalize {
    /// Edits `logits` ([n_vocab] f32) in place; up to `max_edits` entries a step (the union
    /// of penalized and biased ids, so `n_vocab` always suffices).
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, n_vocab: u32, max_edits: u32, logits: &wgpu::Buffer) -> Result<Penalize> {
        if n_vocab == 0 || max_edits == 0 {
            return Err(unsupported(format!("n_vocab {n_vocab} and max_edits {max_edits} must be > 0")));
        }
        if logits.size() < n_vocab as u64 * 4 {
            return Err(unsupported(format!("logits holds {} bytes, needs [{n_vocab}] f32", logits.size())));
        }
        let base = Params { n_vocab, neg_inf: f32::NEG_INFINITY, repeat: 1.0, ..Default::default() };
        let params = crate::buffer::uniform_init(ctx, "penalize.params", bytemuck::bytes_of(&base));
        let edits = crate::buffer::storage(ctx, "penalize.edits", max_edits as u64 * size_of::<LogitEdit>() as u64)?;
        let mask = crate::buffer::storage(ctx, "penalize.mask", mask_words(n_vocab) as u64 * 4)?;
        let buffers: [&wgpu::Buffer; 4] = [&params, logits, &edits, &mask];
        let mut kernels = Vec::with_capacity(ENTRIES.len());
        for (entry, bindings) in ENTRIES {
            let key = key(entry);
            let pipeline = cache.get(ctx, &key).await?;
            let layout = pipeline.get_bind_group_layout(0);
            let entries: Vec<wgpu::BindGroupEntry> =
                bindings.iter().map(|&b| wgpu::BindGroupEntry { binding: b, resource: buffers[b as usize].as_entire_binding() }).collect();
            let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&key.label()), layout: &layout, entries: &entries });
            kernels.push(Kernel { pipeline, bind });
        }
        Ok(Penalize { n_vocab, max_edits, params, edits, mask, kernels })
    }

    pub fn max_edits(&self) -> u32 {
        self.max_edits
    }

    /// Uploads one step's edits (queued before the next submission) and returns what
    /// [`Penalize::encode`] records. One prepared step per submission.
    pub fn prepare(&self, ctx: &GpuContext, step: &StepEdits<'_>) -> Result<PenalizePlan> {
        let n = step.edits.len();
        if n > self.max_edits as usize {
            return Err(unsupported(format!("{n} edits, the buffer holds {}", self.max_edits)));
        }
        if let Some(e) = step.edits.iter().find(|e| e.id >= self.n_vocab) {
            return Err(unsupported(format!("edit for token {} outside the vocabulary of {}", e.id, self.n_vocab)));
        }
        if let Some(m) = step.mask.filter(|m| m.len() != mask_words(self.n_vocab)) {
            return Err(unsupported(format!("mask of {} words, [{}] u32 needed for {} tokens", m.len(), mask_words(self.n_vocab), self.n_vocab)));
        }
        let plan = PenalizePlan { n_edits: n as u32, mask: step.mask.is_some() };
        if plan == PenalizePlan::default() {
            return Ok(plan);
        }
        let p = &step.penalties;
        let params = Params {
            n_vocab: self.n_vocab,
            n_edits: plan.n_edits,
            repeat: p.repeat,
            presence: p.presence,
            frequency: p.frequency,
            neg_inf: f32::NEG_INFINITY,
            _pad: [0; 2],
        };
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&params));
        if n > 0 {
            ctx.queue.write_buffer(&self.edits, 0, bytemuck::cast_slice(&step.edits));
        }
        if let Some(m) = step.mask {
            ctx.queue.write_buffer(&self.mask, 0, bytemuck::cast_slice(m));
        }
        Ok(plan)
    }

    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, k: usize, n: u32) {
        let (x, y) = fold_groups(n.div_ceil(WG));
        let k = &self.kernels[k];
        pass.set_pipeline(&k.pipeline);
        pass.set_bind_group(0, &k.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
    }

    /// Records a prepared step: the edit list, then the mask (it overrides every edit).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, plan: &PenalizePlan) {
        if plan.n_edits > 0 {
            self.dispatch(pass, 0, plan.n_edits);
        }
        if plan.mask {
            self.dispatch(pass, 1, self.n_vocab);
        }
    }
}
