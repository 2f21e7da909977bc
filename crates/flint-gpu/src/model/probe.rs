//! The self-test's probe on the device (see `flint_core::selftest`): each probe step runs the
//! embedding, layer 0 and the head, with the residual stream copied out after layer 0's
//! attention block and after its feed-forward block, and the logits after the head: one
//! submission and one readback a step. The kernels are the ones requests use, built at load.
//! A model split over several devices runs the embedding and layer 0 on the first and the
//! head on the last, the residual stream after layer 0 carried across by the host.

use flint_core::backend::{OutputRow, StepBatch, StepEntry};
use flint_core::sampling::{Sampler, SamplingParams};
use flint_core::selftest::{Probe, Tap, TapPoint};

use super::graph::{Encode, Step};
use super::GpuModel;
use crate::error::{GpuError, Result};
use crate::pipeline::CompileEvent;

impl GpuModel {
    /// Runs `probe` and returns its taps. Only before the first step: it writes KV blocks 0..
    /// of every group, which no sequence holds yet. `last`: the last part of a split model
    /// whose first part this is (None: a whole model).
    pub async fn probe(&mut self, mut last: Option<&mut GpuModel>, probe: &Probe) -> Result<Vec<Tap>> {
        let bad = |message: String| Err(GpuError::Unsupported { op: "self-test", message });
        if self.stepped || last.as_ref().is_some_and(|l| l.stepped) {
            return bad("the probe runs only before the first step".into());
        }
        let head = last.as_deref().unwrap_or(self);
        if !self.part.embed || !self.part.layers.contains(&0) || !head.part.head {
            return bad("the probe needs the embedding and layer 0 on the first device and the head on the last".into());
        }
        let table = probe.table(self.layout.block_size as usize);
        if self.layout.groups.iter().any(|g| table.len() > g.n_blocks as usize) || table.len() > self.layout.max_blocks_per_seq as usize {
            return bad(format!("the probe needs {} KV blocks a group", table.len()));
        }
        let (max_tokens, max_outputs) = probe.max_step();
        if max_tokens > self.limits.max_tokens || max_outputs > self.limits.max_outputs {
            return bad(format!("a probe step of {max_tokens} tokens and {max_outputs} outputs exceeds the step limits"));
        }
        self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: false });
        let mut taps = Vec::new();
        for (i, s) in probe.steps.iter().enumerate() {
            taps.extend(self.probe_step(last.as_deref_mut(), i, &table, &s.tokens, s.start, &s.outputs).await?);
        }
        self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: true });
        Ok(taps)
    }

    async fn probe_step(
        &mut self,
        last: Option<&mut GpuModel>,
        step: usize,
        table: &[u32],
        tokens: &[u32],
        start: usize,
        outputs: &[usize],
    ) -> Result<Vec<Tap>> {
        let n_vocab = self.cfg.n_vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(GpuError::Unsupported { op: "self-test", message: format!("token {id} is outside the vocabulary of {n_vocab}") });
        }
        if outputs.iter().any(|&o| o >= tokens.len()) {
            return Err(GpuError::Unsupported { op: "self-test", message: "an output row past the step's tokens".into() });
        }
        // The head's rows are written as a step's are; nothing is sampled.
        let mut samplers = Vec::new();
        for _ in outputs {
            samplers.push(Sampler::new(SamplingParams::greedy()).map_err(|e| GpuError::Unsupported { op: "self-test", message: e.to_string() })?);
        }
        let rows = outputs.iter().zip(samplers.iter_mut()).map(|(&index, sampler)| OutputRow { index, sampler }).collect();
        let tables = self.layout.groups.iter().map(|_| table).collect();
        let batch = StepBatch { entries: vec![StepEntry { tokens, start, tables, outputs: rows }], copies: &[], logits: false };
        let layout = self.write_batch(&batch);
        let body = Step { n_tok: tokens.len() as u32, max_kv_len: layout.max_kv_len };
        let head = Step { n_tok: outputs.len() as u32, ..body };
        let residual = (tokens.len() * self.cfg.n_embd * 4) as u64;
        let logits = (outputs.len() * n_vocab * 4) as u64;
        let layer = &self.graph.layers[0];
        let embed: Vec<&dyn Encode> = self.graph.embed.iter().map(|e| e as &dyn Encode).collect();
        let mut passes: Vec<TapPass> =
            vec![([embed, layer.attention_ops()].concat(), body, &self.acts.x, 0, residual), (layer.ffn_ops(), body, &self.acts.x, residual, residual)];
        if last.is_none() {
            passes.push((self.outputs("self-test")?.0.ops(), head, &self.acts.logits, 2 * residual, logits));
        }
        let taps_bytes = 2 * residual + if last.is_none() { logits } else { 0 };
        let mut data = record_taps(self, &passes, taps_bytes).await?;
        if let Some(last) = last {
            // The head on the last device, over the stream after layer 0 carried across.
            last.write_batch(&batch);
            last.ctx.queue.write_buffer(&last.acts.x, 0, &data[residual as usize..]);
            let passes = vec![(last.outputs("self-test")?.0.ops(), head, &last.acts.logits, 0, logits)];
            data.extend(record_taps(last, &passes, logits).await?);
        }
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
        let r = residual as usize / 4;
        Ok(vec![
            Tap { step, point: TapPoint::Attention, values: all[..r].to_vec() },
            Tap { step, point: TapPoint::FeedForward, values: all[r..2 * r].to_vec() },
            Tap { step, point: TapPoint::Logits, values: all[2 * r..].to_vec() },
        ])
    }
}

/// A pass of ops with the step they run, and its tap: the buffer, where the tap goes in the
/// staging buffer, and its bytes.
type TapPass<'a> = (Vec<&'a dyn Encode>, Step, &'a wgpu::Buffer, u64, u64);

/// Runs `passes` on `model`'s device in one submission, each followed by a copy of its tap
/// (`bytes` of a buffer, to an offset of one staging buffer), and reads the taps back.
async fn record_taps(model: &GpuModel, passes: &[TapPass<'_>], size: u64) -> Result<Vec<u8>> {
    let staging = model.ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("self_test_taps"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = model.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("self_test") });
    for (ops, step, src, offset, bytes) in passes {
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("self_test"), timestamp_writes: None });
            for op in ops {
                op.encode(&mut pass, step);
            }
        }
        enc.copy_buffer_to_buffer(src, 0, &staging, *offset, *bytes);
    }
    model.ctx.queue.submit([enc.finish()]);
    crate::buffer::read_staging(&model.ctx, &staging, size).await
}
