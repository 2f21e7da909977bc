//! One forward step on the device: the batch's tokens (any mix of sequences, each with its
//! positions and block tables) through every layer, then the output rows through the head,
//! the logit edits and the sampler, all in one command submission. The sampled ids (and
//! log-probability records) are copied inside that submission into a buffer allocated at
//! load, which is then mapped and read: a few KB a step, whatever the batch size.
//!
//! A model split by layers over several devices runs the same step part by part: each part's
//! submission ends by copying the residual stream ([n_tok, n_embd] f32) into a staging buffer
//! allocated at load, the host reads it and writes it into the next part's stream. The step's
//! sequences are cut into micro-batches that move through the parts as a wavefront (part 1
//! runs micro-batch 0 while part 0 runs micro-batch 1), so the devices work at once.

use flint_core::backend::{apply_masks, Feed, LateMasks, StepBatch, StepEntry, StepResult};
use flint_core::kv::{GroupCopy, NO_BLOCK};

use super::graph::{Encode, Step};
use super::{GpuModel, READBACK_WORDS};
use crate::error::{GpuError, Result};
use crate::ops::penalize::{PenalizePlan, StepEdits};
use crate::ops::sample::{self, SamplePlan, SampleRow, LP_WORDS};
use crate::pipeline::CompileEvent;

/// A step's output plans: the logit edits, then the draws.
pub(super) type OutputPlans = (PenalizePlan, SamplePlan);

/// A step that failed on part `part` (its device is the one to ask whether it was lost).
#[derive(Debug)]
pub struct PartFailure {
    pub part: usize,
    pub error: GpuError,
}

fn on(part: usize) -> impl Fn(GpuError) -> PartFailure {
    move |error| PartFailure { part, error }
}

/// A micro-batch's draws on the last part: where its rows' results lie in the readback.
struct Drawn {
    rows: Vec<SampleRow>,
    plan: SamplePlan,
    /// Its first output row's index in the step.
    base: usize,
}

/// A step submitted by [`GpuModel::submit`] whose draws are not read yet.
pub(super) struct InFlight {
    ticket: u64,
    /// Its submission (the last, with late masks): collecting it waits for this one only,
    /// not for the step submitted after it.
    index: wgpu::SubmissionIndex,
    /// Its draws and their readback slot (None: a step without outputs).
    drawn: Option<(Drawn, usize)>,
    /// It was the first step to run some kernels (compile progress is told when it ends).
    first_use: bool,
}

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
            let tables: Vec<Vec<u32>> = batch.entries.iter().map(|e| e.tables[g].iter().map(|&b| if b == NO_BLOCK { 0 } else { b }).collect()).collect();
            let refs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
            b.write(&self.ctx, &l.tokens, &l.pos, &l.seq, &refs);
        }
        if !l.gather.is_empty() {
            self.head.write_rows(&self.ctx, &l.gather);
        }
        l
    }

    /// Each output row's draw (a fresh counter for its sampler) and logit edits, written for
    /// the next submission; no plans when the step has no outputs. `pending[r]`: the step's
    /// token that is row r's pending token, fed on the device and not yet accepted by its
    /// sampler (overlapped steps; empty: none).
    pub(super) fn prepare_outputs(&mut self, batch: &mut StepBatch<'_>, pending: &[Option<u32>]) -> Result<(Vec<SampleRow>, Option<OutputPlans>)> {
        let rows: Vec<SampleRow> = batch.entries.iter_mut().flat_map(|e| e.outputs.iter_mut().map(|o| SampleRow::next(o.sampler))).collect();
        if rows.is_empty() {
            return Ok((rows, None));
        }
        let samplers = batch.entries.iter().flat_map(|e| e.outputs.iter().map(|o| &*o.sampler));
        let edits: Vec<StepEdits> = samplers
            .enumerate()
            .map(|(r, sampler)| match pending.get(r).copied().flatten() {
                Some(at) => StepEdits::with_pending(sampler, at),
                None => StepEdits::from_sampler(sampler),
            })
            .collect();
        let Some(out) = &mut self.out else { return Err(self.not_last("step")) };
        let plan = (out.penalize.prepare(&self.ctx, &edits)?, out.sampler.prepare(&self.ctx, &rows, 1)?);
        Ok((rows, Some(plan)))
    }

    /// A step's ops in order, each with the step it records: the body's with `step`, then
    /// (when `head_rows` is given and this part holds the head) the head's with that many rows.
    fn step_ops(&self, step: Step, head_rows: Option<u32>) -> Vec<(&dyn Encode, Step)> {
        let mut ops: Vec<(&dyn Encode, Step)> = self.graph.body().into_iter().map(|op| (op, step)).collect();
        if let (Some(n_tok), Some(head)) = (head_rows, &self.graph.head) {
            let rows = Step { n_tok, ..step };
            ops.extend(head.ops().into_iter().map(|op| (op, rows)));
        }
        ops
    }

    /// The kernels `ops` would build at their first step of these sizes (a matmul's variant
    /// for a new token count).
    fn unbuilt(ops: &[(&dyn Encode, Step)]) -> Vec<crate::pipeline::PipelineKey> {
        let mut keys = Vec::new();
        for (op, step) in ops {
            op.unbuilt(step, &mut keys);
        }
        keys
    }

    /// Whether a step of `tokens` tokens with one output row runs on built kernels only
    /// (another model on the device may have built them).
    pub fn step_ready(&self, tokens: u32) -> bool {
        let ops = self.step_ops(Step { n_tok: tokens, max_kv_len: tokens }, Some(1));
        Self::unbuilt(&ops).iter().all(|k| self.ctx.pipelines.contains(k))
    }

    /// Records the block copies, then one compute pass: the embedding (first part), the
    /// part's layers, with `head` the head over the output rows, and with `plan` the logit
    /// edits and the sampler. The kernels this step is the first to need are compiled
    /// together before recording: natively on several threads, since a driver compiling on
    /// the CPU (lavapipe) takes seconds for each.
    fn encode_step(&self, enc: &mut wgpu::CommandEncoder, copies: &[GroupCopy], layout: &Layout, head: bool, plan: Option<&OutputPlans>) {
        self.kv.encode_copies(enc, copies);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("forward"), timestamp_writes: None });
        let step = Step { n_tok: layout.tokens.len() as u32, max_kv_len: layout.max_kv_len };
        let ops = self.step_ops(step, head.then_some(layout.gather.len() as u32));
        self.ctx.pipelines.build_all(&self.ctx.device, Self::unbuilt(&ops));
        for (op, step) in &ops {
            op.encode(&mut pass, step);
        }
        if let Some(plan) = plan {
            self.encode_outputs(&mut pass, plan);
        }
    }

    /// The first of a step's two submissions where its masks come late: the forward pass
    /// through the head goes now, so the masks are computed while it runs; `enc` becomes the
    /// second's encoder (the logit edits and the draws: [`GpuModel::encode_outputs_pass`]).
    fn submit_through_head(&self, enc: &mut wgpu::CommandEncoder, copies: &[GroupCopy], layout: &Layout) {
        self.encode_step(enc, copies, layout, true, None);
        let sample = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sample") });
        self.ctx.queue.submit([std::mem::replace(enc, sample).finish()]);
    }

    /// The logit edits and the draws of `plan` in a compute pass of their own.
    fn encode_outputs_pass(&self, enc: &mut wgpu::CommandEncoder, plan: &OutputPlans) {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("sample"), timestamp_writes: None });
        self.encode_outputs(&mut pass, plan);
    }

    /// The logit edits and the draws over the head's logits.
    fn encode_outputs(&self, pass: &mut wgpu::ComputePass<'_>, (edits, samples): &OutputPlans) {
        if let Ok((_, out)) = self.outputs("step") {
            out.penalize.encode(pass, edits);
            out.sampler.encode(pass, samples);
        }
    }

    /// Copies the drawn ids (and log-probability records) of `n_out` rows into readback
    /// `slot`, from row `base` on.
    fn encode_readback(&self, enc: &mut wgpu::CommandEncoder, samples: &SamplePlan, base: usize, n_out: usize, slot: usize) {
        let Ok((_, out)) = self.outputs("step") else { return };
        let lp_offset = (self.limits.max_outputs * 4) as u64;
        let readback = &out.readback[slot];
        enc.copy_buffer_to_buffer(out.sampler.out_buffer(), 0, readback, base as u64 * 4, n_out as u64 * 4);
        if samples.logprobs {
            let lp = (LP_WORDS * 4) as u64;
            enc.copy_buffer_to_buffer(out.sampler.logprobs_buffer(), 0, readback, lp_offset + base as u64 * lp, n_out as u64 * lp);
        }
    }

    /// Copies each fed token's id, the previous step's draw for its row, into the batch
    /// (every group's copy), in runs of consecutive tokens and rows.
    fn encode_feeds(&self, enc: &mut wgpu::CommandEncoder, feeds: &[Feed]) {
        let Ok((_, out)) = self.outputs("step") else { return };
        let mut feeds = feeds.to_vec();
        feeds.sort_by_key(|f| f.token);
        let mut i = 0;
        while i < feeds.len() {
            let mut n = 1;
            while i + n < feeds.len() && feeds[i + n].token == feeds[i].token + n && feeds[i + n].row == feeds[i].row + n {
                n += 1;
            }
            for b in &self.batches {
                enc.copy_buffer_to_buffer(out.sampler.out_buffer(), feeds[i].row as u64 * 4, &b.tokens, feeds[i].token as u64 * 4, n as u64 * 4);
            }
            i += n;
        }
    }

    /// Whether the step about to be submitted is the first to run kernels (the first step
    /// runs every kernel built at load, later ones a matmul's new variants: they may compile
    /// inside it, on the device's time); says so to the compile listener.
    fn begin_first_use(&mut self) -> bool {
        let first = self.ctx.pipelines.take_first_use() || !std::mem::replace(&mut self.stepped, true);
        if first {
            self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: false });
        }
        first
    }

    /// The end of a step [`GpuModel::begin_first_use`] said was a first use.
    fn end_first_use(&self, first: bool) {
        if first {
            self.ctx.pipelines.notify(&CompileEvent::FirstUse { done: true });
        }
    }

    /// Submits one step of a whole model without waiting for its draws (read by
    /// [`GpuModel::collect`]); `feeds` take tokens from the draws of the step submitted before,
    /// on the device. At most two steps are outstanding, each with its own readback. With
    /// `masks` (constrained rows), the forward pass through the head is submitted first and
    /// the masks computed while it runs, then the edits, the draws and the readback: two
    /// submissions, as [`run_parts`] makes on one part.
    pub fn submit(&mut self, mut batch: StepBatch<'_>, feeds: &[Feed], masks: Option<LateMasks<'_>>) -> Result<u64> {
        let bad = |message: String| GpuError::Unsupported { op: "submit", message };
        self.outputs("submit")?;
        if !self.part.embed {
            return Err(bad("a part without the embedding takes no fed tokens".into()));
        }
        if self.in_flight.len() >= 2 {
            return Err(bad("two steps are already outstanding: collect one first".into()));
        }
        if batch.logits {
            return Err(bad("an overlapped step reads back no logits".into()));
        }
        let n_tok: usize = batch.entries.iter().map(|e| e.tokens.len()).sum();
        let mut fed: Vec<usize> = feeds.iter().map(|f| f.token).collect();
        fed.sort_unstable();
        fed.dedup();
        if fed.len() != feeds.len() || feeds.iter().any(|f| f.token >= n_tok || f.row >= self.last_rows) {
            return Err(bad(format!("feeds {feeds:?} for a step of {n_tok} tokens after a step of {} output rows", self.last_rows)));
        }
        let first_use = self.begin_first_use();
        let layout = self.write_batch(&batch);
        // A fed row's token is its pending one: its sampler has not accepted it (penalties).
        let pending: Vec<Option<u32>> = layout.gather.iter().map(|&t| feeds.iter().any(|f| f.token == t as usize).then_some(t)).collect();
        let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        self.encode_feeds(&mut enc, feeds);
        let (rows, plan) = match masks.filter(|_| !layout.gather.is_empty()) {
            Some(masks) => {
                self.submit_through_head(&mut enc, batch.copies, &layout);
                apply_masks(&mut batch.entries, masks());
                let (rows, plan) = self.prepare_outputs(&mut batch, &pending)?;
                if let Some(plan) = &plan {
                    self.encode_outputs_pass(&mut enc, plan);
                }
                (rows, plan)
            }
            None => {
                let (rows, plan) = self.prepare_outputs(&mut batch, &pending)?;
                self.encode_step(&mut enc, batch.copies, &layout, plan.is_some(), plan.as_ref());
                (rows, plan)
            }
        };
        let slot = self.next_slot;
        let drawn = plan.map(|(_, samples)| {
            self.encode_readback(&mut enc, &samples, 0, layout.gather.len(), slot);
            (Drawn { rows, plan: samples, base: 0 }, slot)
        });
        let index = self.ctx.queue.submit([enc.finish()]);
        self.next_slot ^= 1;
        self.last_rows = layout.gather.len();
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.in_flight.push_back(InFlight { ticket, index, drawn, first_use });
        Ok(ticket)
    }

    /// The results of submitted step `ticket`, the oldest outstanding.
    pub async fn collect(&mut self, ticket: u64) -> Result<StepResult> {
        if self.in_flight.front().map(|f| f.ticket) != Some(ticket) {
            return Err(GpuError::Unsupported { op: "collect", message: format!("step {ticket} is not the oldest outstanding") });
        }
        let f = self.in_flight.pop_front().expect("checked");
        let mut result = StepResult::default();
        let read = match &f.drawn {
            None => self.ctx.work_done_through(Some(f.index)).await,
            Some((d, slot)) => self.read_draws(std::slice::from_ref(d), d.rows.len(), *slot, Some(f.index)).await.map(|s| result.sampled = s),
        };
        self.end_first_use(f.first_use);
        read?;
        self.ctx.check()?;
        Ok(result)
    }

    /// Runs one step (checked by the caller against the limits and the layout); `masks`, if
    /// any, are computed once the forward pass is submitted (see [`run_parts`]).
    pub async fn step(&mut self, batch: StepBatch<'_>, masks: Option<LateMasks<'_>>) -> Result<StepResult> {
        if !self.in_flight.is_empty() {
            return Err(GpuError::Unsupported { op: "step", message: "overlapped steps are outstanding: collect them first".into() });
        }
        let rows = batch.entries.iter().map(|e| e.outputs.len()).sum();
        let r = run_parts(std::slice::from_mut(self), &[], batch, 1, masks).await.map_err(|f| f.error);
        self.last_rows = rows;
        r
    }

    /// Reads back the draws of a step's micro-batches, `n_out` rows in all, from readback
    /// `slot`, filled by submission `filled_by` (None: the latest).
    async fn read_draws(
        &self,
        drawn: &[Drawn],
        n_out: usize,
        slot: usize,
        filled_by: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<flint_core::sampling::Sampled>> {
        let (_, out) = self.outputs("step")?;
        let lp_words = self.limits.max_outputs;
        let logprobs = drawn.iter().any(|d| d.plan.logprobs);
        let words = if logprobs { lp_words + n_out * LP_WORDS } else { n_out };
        debug_assert!(words <= self.limits.max_outputs * READBACK_WORDS);
        let bytes = crate::buffer::read_staging_after(&self.ctx, &out.readback[slot], words as u64 * 4, filled_by).await?;
        let w: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        let mut sampled = Vec::with_capacity(n_out);
        for d in drawn {
            let ids = &w[d.base..d.base + d.rows.len()];
            let lp = if d.plan.logprobs { &w[lp_words + d.base * LP_WORDS..] } else { &[][..] };
            sampled.extend(sample::decode(&d.plan, &d.rows, ids, lp).into_iter().map(|mut v| v.pop().unwrap_or_default()));
        }
        if sampled.len() != n_out {
            return Err(GpuError::Readback { cause: format!("{} samples for {n_out} output rows", sampled.len()) });
        }
        Ok(sampled)
    }
}

/// The fewest tokens a split step's micro-batch holds. A step of few tokens is bound by
/// reading the weights, which every micro-batch reads again: cut in two on two devices it
/// takes three half-model reads' time instead of two, so decode steps go through whole.
/// Past a few dozen tokens the matmuls' arithmetic dominates, and micro-batches let the
/// devices overlap (two micro-batches on two devices: three ticks of a quarter step each).
pub const MIN_MICRO_TOKENS: usize = 32;

/// Cuts a step's entries into at most `n` consecutive micro-batches of about equal tokens
/// and at least [`MIN_MICRO_TOKENS`] each (entries keep their order, so output rows do too).
fn micro_batches(entries: Vec<StepEntry<'_>>, n: usize) -> Vec<Vec<StepEntry<'_>>> {
    let total: usize = entries.iter().map(|e| e.tokens.len()).sum();
    let n = n.min(total / MIN_MICRO_TOKENS).clamp(1, entries.len().max(1));
    let mut left = entries.len();
    let (mut chunks, mut cur, mut acc) = (Vec::with_capacity(n), Vec::new(), 0);
    for e in entries {
        acc += e.tokens.len();
        cur.push(e);
        left -= 1;
        let k = chunks.len() + 1;
        // Cut once this chunk's share is reached, or when each later chunk needs an entry left.
        if k < n && left >= n - k && (acc * n >= k * total || left == n - k) {
            chunks.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() || chunks.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// Runs one step through `parts`, consecutive layer ranges of one model in order (one part:
/// the whole model on one device), in up to `micro` micro-batches. `links[i]` carries the
/// residual stream from part `i` to part `i + 1`: a MAP_READ buffer of part `i`'s device
/// holding a step's most tokens. A failure names the part it met.
///
/// `masks` (constrained decoding's per-row masks): on one part and one micro-batch the step
/// is submitted in two parts, the forward pass through the head and then the logit edits and
/// the sampler, and `masks` runs between them, while the device works on the first; otherwise
/// it runs first and the step is one submission per part as usual.
pub async fn run_parts(
    parts: &mut [GpuModel],
    links: &[wgpu::Buffer],
    batch: StepBatch<'_>,
    micro: usize,
    masks: Option<LateMasks<'_>>,
) -> std::result::Result<StepResult, PartFailure> {
    debug_assert_eq!(links.len() + 1, parts.len());
    let first_use: Vec<bool> = parts.iter_mut().map(GpuModel::begin_first_use).collect();
    let result = run_micro_batches(parts, links, batch, micro, masks).await;
    for (p, &f) in parts.iter().zip(&first_use) {
        p.end_first_use(f);
    }
    let result = result?;
    for (i, p) in parts.iter().enumerate() {
        p.ctx.check().map_err(on(i))?;
    }
    Ok(result)
}

async fn run_micro_batches(
    parts: &mut [GpuModel],
    links: &[wgpu::Buffer],
    batch: StepBatch<'_>,
    micro: usize,
    masks: Option<LateMasks<'_>>,
) -> std::result::Result<StepResult, PartFailure> {
    let last = parts.len() - 1;
    let StepBatch { mut entries, copies, logits } = batch;
    // Masks late only on one part, whose step is one micro-batch, one submission.
    let mut late = None;
    if let Some(masks) = masks {
        if last == 0 {
            late = Some(masks);
        } else {
            apply_masks(&mut entries, masks());
        }
    }
    let mut subs: Vec<StepBatch<'_>> = micro_batches(entries, if last == 0 { 1 } else { micro })
        .into_iter()
        .enumerate()
        .map(|(m, entries)| StepBatch { entries, copies: if m == 0 { copies } else { &[] }, logits })
        .collect();
    let n_micro = subs.len();
    let mut bases = Vec::with_capacity(n_micro);
    let mut n_out = 0;
    for b in &subs {
        bases.push(n_out);
        n_out += b.entries.iter().map(|e| e.outputs.len()).sum::<usize>();
    }
    let mut hidden: Vec<Option<Vec<u8>>> = (0..n_micro).map(|_| None).collect();
    let mut drawn: Vec<Drawn> = Vec::new();
    let mut logit_reads: Vec<(wgpu::Buffer, u64)> = Vec::new();
    // Tick t: part s runs micro-batch t - s; then the host carries each part's output on.
    for t in 0..parts.len() + n_micro - 1 {
        let mut reads = Vec::new();
        for (s, part) in parts.iter_mut().enumerate() {
            let Some(m) = t.checked_sub(s).filter(|&m| m < n_micro) else { continue };
            let sub = &mut subs[m];
            let layout = part.write_batch(sub);
            if let Some(x) = hidden[m].take() {
                part.ctx.queue.write_buffer(&part.acts.x, 0, &x);
            }
            let mut enc = part.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
            let late_now = late.take().filter(|_| s == last && !layout.gather.is_empty());
            let split = late_now.is_some();
            if let Some(masks) = late_now {
                part.submit_through_head(&mut enc, sub.copies, &layout);
                apply_masks(&mut sub.entries, masks());
            }
            let (rows, plan) = if s == last { part.prepare_outputs(sub, &[]).map_err(on(s))? } else { (Vec::new(), None) };
            match (&plan, split) {
                (Some(plan), true) => part.encode_outputs_pass(&mut enc, plan),
                _ => part.encode_step(&mut enc, sub.copies, &layout, plan.is_some(), plan.as_ref()),
            }
            let residual = (layout.tokens.len() * part.cfg.n_embd * 4) as u64;
            if s < last {
                enc.copy_buffer_to_buffer(&part.acts.x, 0, &links[s], 0, residual);
                reads.push((s, m, residual));
            } else if let Some((_, samples)) = plan {
                let rows_out = layout.gather.len();
                part.encode_readback(&mut enc, &samples, bases[m], rows_out, 0);
                if logits {
                    // Tests and tools only: every output row's logits, through a buffer made for it.
                    let bytes = (rows_out * part.cfg.n_vocab * 4) as u64;
                    let staging = part.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("logits_readback"),
                        size: bytes,
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    enc.copy_buffer_to_buffer(&part.acts.logits, 0, &staging, 0, bytes);
                    logit_reads.push((staging, bytes));
                }
                drawn.push(Drawn { rows, plan: samples, base: bases[m] });
            }
            part.ctx.queue.submit([enc.finish()]);
        }
        for (s, m, bytes) in reads {
            let x = if bytes == 0 { Vec::new() } else { crate::buffer::read_staging(&parts[s].ctx, &links[s], bytes).await.map_err(on(s))? };
            hidden[m] = Some(x);
        }
    }
    let tail = &parts[last];
    let mut result = StepResult::default();
    if drawn.is_empty() {
        // A prompt chunk without outputs: wait for it, so work never piles up unseen.
        tail.ctx.work_done().await.map_err(on(last))?;
    } else {
        result.sampled = tail.read_draws(&drawn, n_out, 0, None).await.map_err(on(last))?;
    }
    for (staging, bytes) in logit_reads {
        let data = crate::buffer::read_staging(&tail.ctx, &staging, bytes).await.map_err(on(last))?;
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
        result.logits.extend(all.chunks_exact(tail.cfg.n_vocab).map(|r| r.to_vec()));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_keep_order_and_balance_tokens() {
        let sizes = |lens: &[usize], n: usize| {
            let toks: Vec<Vec<u32>> = lens.iter().map(|&n| vec![0; n]).collect();
            let entries = toks.iter().map(|t| StepEntry { tokens: t, start: 0, tables: Vec::new(), outputs: Vec::new() }).collect();
            micro_batches(entries, n).iter().map(|c| c.iter().map(|e| e.tokens.len()).collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        let prompts = [80, 10, 10, 10, 10, 40];
        assert_eq!(sizes(&prompts, 1), vec![prompts.to_vec()]);
        assert_eq!(sizes(&prompts, 2), vec![vec![80], vec![10, 10, 10, 10, 40]]);
        assert_eq!(sizes(&prompts, 3), vec![vec![80], vec![10, 10, 10], vec![10, 40]]);
        // Never more micro-batches than entries, none empty.
        assert_eq!(sizes(&[200, 200, 200], 9).len(), 3);
        assert_eq!(sizes(&[300], 4), vec![vec![300]]);
        // Decode steps (a token or a few per sequence) go through whole.
        assert_eq!(sizes(&[1; 8], 2).len(), 1);
        assert_eq!(sizes(&[5; 8], 2).len(), 1, "40 tokens: not two micro-batches of 32");
        assert_eq!(sizes(&[8; 8], 2), vec![vec![8; 4], vec![8; 4]]);
    }
}
