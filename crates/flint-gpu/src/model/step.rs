//! One forward step on the device: the batch's tokens (any mix of sequences, each with its
//! positions and block tables) through every layer, then the output rows through the head,
//! the logit edits and the sampler, all in one command submission. The sampled ids (and
//! log-probability records) are copied inside that submission into a buffer allocated at
//! load, which is then mapped and read: a few KB a step, whatever the batch size.

use flint_core::backend::{StepBatch, StepResult};
use flint_core::kv::NO_BLOCK;
use flint_core::sampling::Sampled;

use super::graph::Step;
use super::{GpuModel, READBACK_WORDS};
use crate::error::{GpuError, Result};
use crate::ops::penalize::{PenalizePlan, StepEdits};
use crate::ops::sample::{self, SamplePlan, SampleRow, LP_WORDS};
use crate::pipeline::CompileEvent;

/// A step's tokens laid out for the device.
pub(super) struct Layout {
    pub tokens: Vec<u32>,
    pub pos: Vec<u32>,
    /// The entry (sequence slot) of each token.
    pub seq: Vec<u32>,
    /// The step token of each output row.
    pub gather: Vec<u32>,
    /// Positions of the longest sequence after the step.
    pub max_kv_len: u32,
}

impl GpuModel {
    /// Writes the step's batch (every group's tables) and head rows; returns the layout.
    pub(super) fn write_batch(&self, batch: &StepBatch<'_>) -> Layout {
        let mut l = Layout { tokens: Vec::new(), pos: Vec::new(), seq: Vec::new(), gather: Vec::new(), max_kv_len: 0 };
        for (i, e) in batch.entries.iter().enumerate() {
            let base = l.tokens.len() as u32;
            let end = (e.start + e.tokens.len()) as u32;
            l.tokens.extend_from_slice(e.tokens);
            l.pos.extend(e.start as u32..end);
            l.seq.extend(std::iter::repeat_n(i as u32, e.tokens.len()));
            l.gather.extend(e.outputs.iter().map(|o| base + o.index as u32));
            l.max_kv_len = l.max_kv_len.max(end);
        }
        for (g, b) in self.batches.iter().enumerate() {
            // Blocks that fell out of a window are never read; any valid id stands in.
            let tables: Vec<Vec<u32>> =
                batch.entries.iter().map(|e| e.tables[g].iter().map(|&b| if b == NO_BLOCK { 0 } else { b }).collect()).collect();
            let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
            b.write(&self.ctx, &l.tokens, &l.pos, &l.seq, &refs);
        }
        if !l.gather.is_empty() {
            self.head.write_rows(&self.ctx, &l.gather);
        }
        l
    }

    /// Each output row's draw (a fresh counter for its sampler) and logit edits, written for
    /// the next submission; no plans when the step has no outputs.
    pub(super) fn prepare_outputs(&mut self, batch: &mut StepBatch<'_>) -> Result<(Vec<SampleRow>, Option<(PenalizePlan, SamplePlan)>)> {
        let rows: Vec<SampleRow> = batch.entries.iter_mut().flat_map(|e| e.outputs.iter_mut().map(|o| SampleRow::next(o.sampler))).collect();
        if rows.is_empty() {
            return Ok((rows, None));
        }
        let edits: Vec<StepEdits> = batch.entries.iter().flat_map(|e| e.outputs.iter().map(|o| StepEdits::from_sampler(o.sampler))).collect();
        let plan = (self.penalize.prepare(&self.ctx, &edits)?, self.sampler.prepare(&self.ctx, &rows, 1)?);
        Ok((rows, Some(plan)))
    }

    /// Runs one step (checked by the caller against the limits and the layout).
    pub async fn step(&mut self, mut batch: StepBatch<'_>) -> Result<StepResult> {
        let layout = self.write_batch(&batch);
        let n_tok = layout.tokens.len() as u32;
        let n_out = layout.gather.len();
        let (rows, plan) = self.prepare_outputs(&mut batch)?;
        let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        self.kv.encode_copies(&mut enc, batch.copies);
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("forward"), timestamp_writes: None });
            let step = Step { n_tok, max_kv_len: layout.max_kv_len };
            for op in self.graph.body() {
                op.encode(&mut pass, &step);
            }
            if let Some((edits, samples)) = &plan {
                let head = Step { n_tok: n_out as u32, max_kv_len: layout.max_kv_len };
                for op in self.graph.head.ops() {
                    op.encode(&mut pass, &head);
                }
                self.penalize.encode(&mut pass, edits);
                self.sampler.encode(&mut pass, samples);
            }
        }
        let lp_offset = (self.limits.max_outputs * 4) as u64;
        if let Some((_, samples)) = &plan {
            enc.copy_buffer_to_buffer(self.sampler.out_buffer(), 0, &self.readback, 0, n_out as u64 * 4);
            if samples.logprobs {
                enc.copy_buffer_to_buffer(self.sampler.logprobs_buffer(), 0, &self.readback, lp_offset, (n_out * LP_WORDS * 4) as u64);
            }
        }
        let logits = if batch.logits && n_out > 0 {
            // Tests and tools only: every output row's logits, through a buffer made for it.
            let bytes = (n_out * self.cfg.n_vocab * 4) as u64;
            let staging = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("logits_readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            enc.copy_buffer_to_buffer(&self.acts.logits, 0, &staging, 0, bytes);
            Some((staging, bytes))
        } else {
            None
        };
        // Kernels this step is the first to run may compile inside it, on the device's time:
        // the first step runs every kernel built at load, later ones a matmul's new variants.
        let first_use = self.ctx.pipelines.take_first_use() || !std::mem::replace(&mut self.stepped, true);
        if first_use {
            self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: false });
        }
        let result = self.finish_step(enc, plan.as_ref().map(|p| &p.1), &rows, n_out, logits).await;
        if first_use {
            self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: true });
        }
        result
    }

    /// Submits the step and reads back what it sampled (and its logits when asked).
    async fn finish_step(
        &self,
        enc: wgpu::CommandEncoder,
        samples: Option<&SamplePlan>,
        rows: &[SampleRow],
        n_out: usize,
        logits: Option<(wgpu::Buffer, u64)>,
    ) -> Result<StepResult> {
        let lp_offset = (self.limits.max_outputs * 4) as u64;
        self.ctx.queue.submit([enc.finish()]);
        let mut result = StepResult::default();
        if samples.is_none() {
            // A prompt chunk without outputs: wait for it, so work never piles up unseen.
            self.ctx.work_done().await?;
        }
        if let Some(samples) = samples {
            let words = if samples.logprobs { lp_offset as usize / 4 + n_out * LP_WORDS } else { n_out };
            debug_assert!(words <= self.limits.max_outputs * READBACK_WORDS);
            let bytes = crate::buffer::read_staging(&self.ctx, &self.readback, words as u64 * 4).await?;
            let w: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            let lp = if samples.logprobs { &w[lp_offset as usize / 4..] } else { &[][..] };
            let draws = sample::decode(samples, rows, &w[..n_out], lp);
            result.sampled = draws.into_iter().map(|mut d| d.pop().unwrap_or_default()).collect::<Vec<Sampled>>();
        }
        if let Some((staging, bytes)) = logits {
            let data = crate::buffer::read_staging(&self.ctx, &staging, bytes).await?;
            let all: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
            result.logits = all.chunks_exact(self.cfg.n_vocab).map(|r| r.to_vec()).collect();
        }
        self.ctx.check()?;
        if samples.is_some() && result.sampled.len() != n_out {
            return Err(GpuError::Readback(format!("{} samples for {n_out} output rows", result.sampled.len())));
        }
        Ok(result)
    }
}
