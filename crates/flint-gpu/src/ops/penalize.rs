//! Logit edits in place before the sampler (`shaders/penalize.wgsl`), per row of logits: the
//! repetition, presence and frequency penalties and the logit bias of flint_core's
//! [`LogitEdit`] list, then the allowed-token mask. Each step uploads only its lists (16 bytes
//! an entry), its rows' penalty factors and, for rows that set one, their masks, with
//! `queue.write_buffer` into buffers sized at load (the edit list grows when a step needs more).
//! A row whose pending token the host has not read (an overlapped step, the token fed on the
//! device) names where the step's batch holds it: the device counts it in, so penalties need
//! no readback between two steps.

use std::sync::Arc;

use flint_core::sampling::{LogitEdit, Penalties, Sampler as CpuSampler};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::fold_groups;
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "penalize.wgsl";
const WG: u32 = 256;
/// Edit-list entries allocated at load per row; a step with more grows the list.
const EDITS_PER_ROW: u64 = 1024;

/// Binding numbers in penalize.wgsl.
const B_PARAMS: u32 = 0;
const B_LOGITS: u32 = 1;
const B_EDITS: u32 = 2;
const B_ROW_PEN: u32 = 3;
const B_MASK: u32 = 4;
const B_PENDING: u32 = 5;
const B_TOKENS: u32 = 6;
const EDIT_BINDINGS: &[u32] = &[B_PARAMS, B_LOGITS, B_EDITS, B_ROW_PEN, B_PENDING, B_TOKENS];
const ENTRIES: [(&str, &[u32]); 3] = [("edit", EDIT_BINDINGS), ("apply_mask", &[B_PARAMS, B_LOGITS, B_ROW_PEN, B_MASK]), ("edit_pending", EDIT_BINDINGS)];
const EDIT: usize = 0;
const MASK: usize = 1;
const PENDING: usize = 2;
/// `pending` row: no pending token.
const NONE: u32 = u32::MAX;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_vocab: u32,
    n_edits: u32,
    n_rows: u32,
    mask_words: u32,
    neg_inf: f32,
    _pad: [u32; 3],
}

/// One list entry on the device: a [`LogitEdit`] and its row.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct RowEdit {
    id: u32,
    count: u32,
    bias: f32,
    row: u32,
}

/// One row's logit edits, as flint_core's sampler defines them.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEdits<'a> {
    pub penalties: Penalties,
    /// Sorted or not, but each id at most once.
    pub edits: Vec<LogitEdit>,
    /// 1 bit per token, set = allowed; None = every token allowed.
    pub mask: Option<&'a [u32]>,
    /// Where the step's tokens hold the row's pending token, when the host has not read it
    /// (fed on the device); `edits` then leave it out ([`CpuSampler::edits_before_pending`]).
    pub pending: Option<u32>,
}

impl<'a> StepEdits<'a> {
    /// The edits `sampler` applies at this step (its penalty window, bias and mask).
    pub fn from_sampler(sampler: &'a CpuSampler) -> StepEdits<'a> {
        StepEdits { penalties: sampler.params().penalties(), edits: sampler.edits(), mask: sampler.mask(), pending: None }
    }

    /// The edits `sampler` applies at a step whose token `at` (fed on the device) is the
    /// row's pending token, which `sampler` has not accepted yet. Rows without penalties need
    /// no count of it.
    pub fn with_pending(sampler: &'a CpuSampler, at: u32) -> StepEdits<'a> {
        match sampler.params().penalties_on() {
            true => StepEdits { edits: sampler.edits_before_pending(), pending: Some(at), ..Self::from_sampler(sampler) },
            false => Self::from_sampler(sampler),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty() && self.mask.is_none() && self.pending.is_none()
    }
}

/// What one prepared step records; from [`Penalize::prepare`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PenalizePlan {
    pub n_rows: u32,
    pub n_edits: u32,
    pub mask: bool,
    /// Some row has a pending token.
    pub pending: bool,
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
}

pub struct Penalize {
    n_vocab: u32,
    max_rows: u32,
    params: wgpu::Buffer,
    edits: wgpu::Buffer,
    row_pen: wgpu::Buffer,
    mask: wgpu::Buffer,
    /// [max_rows] (token index or NONE, first entry, end, 0).
    pending: wgpu::Buffer,
    /// The step's token ids, or a small unused buffer.
    tokens: wgpu::Buffer,
    /// Token ids `tokens` holds (0: no row may have a pending token).
    n_tokens: u32,
    logits: wgpu::Buffer,
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
    /// Edits `logits` ([max_rows, n_vocab] f32) in place; `tokens`, the step's token ids,
    /// holds rows' pending tokens (None: no row has one).
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        n_vocab: u32,
        max_rows: u32,
        logits: &wgpu::Buffer,
        tokens: Option<&wgpu::Buffer>,
    ) -> Result<Penalize> {
        if n_vocab == 0 || max_rows == 0 {
            return Err(unsupported(format!("n_vocab {n_vocab} and max_rows {max_rows} must be > 0")));
        }
        if logits.size() < max_rows as u64 * n_vocab as u64 * 4 {
            return Err(unsupported(format!("logits holds {} bytes, needs [{max_rows}, {n_vocab}] f32", logits.size())));
        }
        let base = Params { n_vocab, neg_inf: f32::NEG_INFINITY, mask_words: mask_words(n_vocab) as u32, ..Default::default() };
        let params = crate::buffer::uniform_init(ctx, "penalize.params", bytemuck::bytes_of(&base));
        let rows = max_rows as u64;
        let edits = crate::buffer::storage(ctx, "penalize.edits", rows * EDITS_PER_ROW * size_of::<RowEdit>() as u64)?;
        let row_pen = crate::buffer::storage(ctx, "penalize.row_pen", rows * 16)?;
        let mask = crate::buffer::storage(ctx, "penalize.mask", rows * mask_words(n_vocab) as u64 * 4)?;
        let pending = crate::buffer::storage(ctx, "penalize.pending", rows * 16)?;
        let (tokens, n_tokens) = match tokens {
            Some(t) => (t.clone(), (t.size() / 4).min(NONE as u64) as u32),
            None => (crate::buffer::storage(ctx, "penalize.no_tokens", 16)?, 0),
        };
        let mut p = Penalize { n_vocab, max_rows, params, edits, row_pen, mask, pending, tokens, n_tokens, logits: logits.clone(), kernels: Vec::new() };
        for (entry, _) in ENTRIES {
            let pipeline = cache.get(ctx, &key(entry)).await?;
            let bind = p.bind(ctx, entry, &pipeline);
            p.kernels.push(Kernel { pipeline, bind });
        }
        Ok(p)
    }

    fn bind(&self, ctx: &GpuContext, entry: &str, pipeline: &wgpu::ComputePipeline) -> wgpu::BindGroup {
        let buffers: [&wgpu::Buffer; 7] = [&self.params, &self.logits, &self.edits, &self.row_pen, &self.mask, &self.pending, &self.tokens];
        let bindings = ENTRIES.iter().find(|(e, _)| *e == entry).map_or(&[][..], |(_, b)| *b);
        let entries: Vec<wgpu::BindGroupEntry> =
            bindings.iter().map(|&b| wgpu::BindGroupEntry { binding: b, resource: buffers[b as usize].as_entire_binding() }).collect();
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(entry), layout: &pipeline.get_bind_group_layout(0), entries: &entries })
    }

    /// Uploads one step's edits, row `r` of the logits edited as `rows[r]` says (queued
    /// before the next submission), and returns what [`Penalize::encode`] records. One
    /// prepared step per submission.
    pub fn prepare(&mut self, ctx: &GpuContext, rows: &[StepEdits<'_>]) -> Result<PenalizePlan> {
        if rows.len() > self.max_rows as usize {
            return Err(unsupported(format!("{} rows, the buffers hold {}", rows.len(), self.max_rows)));
        }
        let words = mask_words(self.n_vocab);
        let mut list = Vec::new();
        let mut pen = Vec::with_capacity(rows.len());
        let mut pending = Vec::with_capacity(rows.len());
        for (r, step) in rows.iter().enumerate() {
            if let Some(e) = step.edits.iter().find(|e| e.id >= self.n_vocab) {
                return Err(unsupported(format!("edit for token {} outside the vocabulary of {}", e.id, self.n_vocab)));
            }
            if let Some(m) = step.mask.filter(|m| m.len() != words) {
                return Err(unsupported(format!("mask of {} words, [{words}] u32 needed for {} tokens", m.len(), self.n_vocab)));
            }
            if let Some(at) = step.pending.filter(|&at| at >= self.n_tokens) {
                return Err(unsupported(format!("pending token at {at}, the step holds {} tokens", self.n_tokens)));
            }
            let first = list.len() as u32;
            list.extend(step.edits.iter().map(|e| RowEdit { id: e.id, count: e.count, bias: e.bias, row: r as u32 }));
            pending.push([step.pending.unwrap_or(NONE), first, list.len() as u32, 0]);
            let p = &step.penalties;
            pen.push([p.repeat, p.presence, p.frequency, if step.mask.is_some() { 1.0 } else { 0.0 }]);
        }
        let plan = PenalizePlan {
            n_rows: rows.len() as u32,
            n_edits: list.len() as u32,
            mask: rows.iter().any(|r| r.mask.is_some()),
            pending: rows.iter().any(|r| r.pending.is_some()),
        };
        if plan.n_edits == 0 && !plan.mask && !plan.pending {
            return Ok(plan);
        }
        let need = list.len() as u64 * size_of::<RowEdit>() as u64;
        if need > self.edits.size() {
            // A long penalty window or a large bias map: grow the list (rare), rebind.
            self.edits = crate::buffer::storage(ctx, "penalize.edits", need.next_power_of_two())?;
            for (k, entry) in [(EDIT, "edit"), (PENDING, "edit_pending")] {
                let pipeline = self.kernels[k].pipeline.clone();
                self.kernels[k].bind = self.bind(ctx, entry, &pipeline);
            }
        }
        let params =
            Params { n_vocab: self.n_vocab, n_edits: plan.n_edits, n_rows: plan.n_rows, mask_words: words as u32, neg_inf: f32::NEG_INFINITY, _pad: [0; 3] };
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&params));
        ctx.queue.write_buffer(&self.row_pen, 0, bytemuck::cast_slice(&pen));
        ctx.queue.write_buffer(&self.pending, 0, bytemuck::cast_slice(&pending));
        if !list.is_empty() {
            ctx.queue.write_buffer(&self.edits, 0, bytemuck::cast_slice(&list));
        }
        for (r, step) in rows.iter().enumerate() {
            if let Some(m) = step.mask {
                ctx.queue.write_buffer(&self.mask, (r * words * 4) as u64, bytemuck::cast_slice(m));
            }
        }
        Ok(plan)
    }

    /// Records a prepared step: the edit list and the pending tokens, then the masks (they
    /// override every edit).
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, plan: &PenalizePlan) {
        if plan.n_edits > 0 {
            let (x, y) = fold_groups(plan.n_edits.div_ceil(WG));
            let k = &self.kernels[EDIT];
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &k.bind, &[]);
            crate::ops::dispatch(pass, x, y, 1);
        }
        if plan.pending {
            // Touches only logits no list entry names, so it needs no order with `edit`.
            let k = &self.kernels[PENDING];
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &k.bind, &[]);
            crate::ops::dispatch(pass, plan.n_rows.div_ceil(WG), 1, 1);
        }
        if plan.mask {
            let k = &self.kernels[MASK];
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &k.bind, &[]);
            crate::ops::dispatch(pass, self.n_vocab.div_ceil(WG), plan.n_rows, 1);
        }
    }
}
