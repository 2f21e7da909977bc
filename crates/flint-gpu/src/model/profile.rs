//! Per-op timings of one step: every op of the body (and of the head, the logit edits and the
//! sampler when the step has output rows) in its own timed compute pass, with GPU timestamp
//! queries. The draws are made (each output's sampler advances) but not read.

use flint_core::backend::{OpTime, StepBatch};

use super::graph::{Encode, Step};
use super::GpuModel;
use crate::error::{GpuError, Result};

impl GpuModel {
    /// Runs `batch` with each op timed; returns each op's label, GPU time and dispatches in
    /// execution order.
    pub async fn profile(&mut self, mut batch: StepBatch<'_>) -> Result<Vec<OpTime>> {
        if !self.ctx.caps.timestamps {
            return Err(GpuError::Unsupported { op: "profile", message: "the adapter has no timestamp queries".into() });
        }
        self.outputs("profile")?;
        let layout = self.write_batch(&batch);
        let n_out = layout.gather.len() as u32;
        let (_, plan) = self.prepare_outputs(&mut batch, &[])?;
        let (head_ops, out) = self.outputs("profile")?;
        let head_ops = head_ops.ops();
        let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("profile") });
        self.kv.encode_copies(&mut enc, batch.copies);
        let body = Step { n_tok: layout.tokens.len() as u32, max_kv_len: layout.max_kv_len };
        let head = Step { n_tok: n_out, ..body };
        let mut ops: Vec<(&dyn Encode, Step)> = self.graph.body().into_iter().map(|op| (op, body)).collect();
        if n_out > 0 {
            ops.extend(head_ops.into_iter().map(|op| (op, head)));
        }
        let mut labels: Vec<String> = ops.iter().map(|(op, _)| op.label()).collect();
        if plan.is_some() {
            labels.extend(["logit edits".to_string(), "sample".to_string()]);
        }
        let n = labels.len() as u32;
        let queries = self.ctx.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile"), ty: wgpu::QueryType::Timestamp, count: 2 * n });
        let resolved = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile_resolve"),
            size: 16 * n as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut dispatches = vec![0u32; n as usize];
        let mut timed = |enc: &mut wgpu::CommandEncoder, i: usize, record: &mut dyn FnMut(&mut wgpu::ComputePass<'_>)| {
            let before = crate::ops::dispatches();
            let i = i as u32;
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("profiled op"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &queries,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                }),
            });
            record(&mut pass);
            dispatches[i as usize] = (crate::ops::dispatches() - before) as u32;
        };
        for (i, (op, step)) in ops.iter().enumerate() {
            timed(&mut enc, i, &mut |pass| op.encode(pass, step));
        }
        if let Some((edits, samples)) = &plan {
            timed(&mut enc, ops.len(), &mut |pass| out.penalize.encode(pass, edits));
            timed(&mut enc, ops.len() + 1, &mut |pass| out.sampler.encode(pass, samples));
        }
        enc.resolve_query_set(&queries, 0..2 * n, &resolved, 0);
        self.ctx.queue.submit([enc.finish()]);
        let bytes = crate::buffer::read(&self.ctx, &resolved, 0, 16 * n as u64).await?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let period = self.ctx.queue.get_timestamp_period() as f64;
        let ns = |i: usize| ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period;
        Ok(labels.into_iter().enumerate().map(|(i, op)| OpTime { op, ns: ns(i), dispatches: dispatches[i] }).collect())
    }
}
