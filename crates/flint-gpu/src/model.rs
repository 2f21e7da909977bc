//! The GPU forward pass: weights uploaded once, activations and KV cache preallocated, and
//! every op (pipeline + bind group) built once at load. A step writes the batch, records
//! every dispatch into one compute pass and submits once; decoding reads back only the
//! sampled token id.

use std::sync::Arc;

use flint_core::arch::ModelConfig;
use flint_core::gguf::GgufFile;
use flint_core::kv::{BlockCopy, BlockManager, KvConfig, PrefixIndex, SeqKv};
use flint_core::sampling::Sampled;

use crate::buffer::storage;
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{self, Batch};
use crate::pipeline::PipelineCache;
use crate::weights::{GpuMatrix, Uploader};

/// Tokens per prefill submission: long prompts run in chunks so no submission runs long.
pub const PREFILL_CHUNK: u32 = 256;
/// Positions per KV block.
pub const KV_BLOCK: u32 = 16;
/// Without a configured KV budget the block pool holds the context plus this share of it
/// (1/4) for the prefix index.
const DEFAULT_SPARE_DIVISOR: u32 = 4;

/// Anything that records dispatches for a step of `n_tok` tokens.
trait Encode {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step);
    /// What the op is, for profiles: `rms_norm`, `matmul Q4_K`, ...
    fn label(&self) -> String;
}

/// What a recorded step needs to size its dispatches.
pub struct Step {
    pub n_tok: u32,
    /// Longest sequence (in positions) after this step; sizes attention's KV splits.
    pub max_kv_len: u32,
}

macro_rules! encode_with_n_tok {
    ($($t:ty => $name:literal),*) => {$(
        impl Encode for $t {
            fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
                <$t>::encode(self, pass, step.n_tok)
            }
            fn label(&self) -> String {
                $name.to_string()
            }
        }
    )*};
}
encode_with_n_tok!(
    ops::embed::Embed => "embed",
    ops::attention::KvWrite => "kv_write",
    ops::rms_norm::RmsNorm => "rms_norm",
    ops::glu::Glu => "glu",
    ops::add::Add => "add"
);

impl Encode for ops::attention::Attention {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
        self.encode_kv(pass, step.n_tok, step.max_kv_len)
    }
    fn label(&self) -> String {
        "attention".to_string()
    }
}

/// A matmul with the weight format it reads, for profiles.
struct TypedMatmul {
    ty: flint_core::quant::QuantType,
    op: ops::matmul::Matmul,
}

impl Encode for TypedMatmul {
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, step: &Step) {
        self.op.encode(pass, step.n_tok)
    }
    fn label(&self) -> String {
        format!("matmul {}", self.ty.name())
    }
}

/// What the last submission of a step produces.
pub enum Output<'a> {
    /// Logits stay in the logits buffer.
    Logits,
    /// The greedy token (argmax on the device).
    Greedy,
    /// The logit edits (penalties, bias, mask) in place, then the greedy token or a draw on
    /// the device as the step says, with log-probabilities when it asks for them.
    Sample(ops::argmax::SampleStep, ops::penalize::StepEdits<'a>),
}

/// Sliding-window layers' KV: a ring of `blocks` blocks reached through a repeating table.
struct Ring {
    batch: Batch,
    table: Vec<u32>,
    /// Positions the ring holds beyond the window: how far a cached sequence can roll back.
    slack: usize,
}

/// Activation buffers sized for [`PREFILL_CHUNK`] tokens.
struct Activations {
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    attn: wgpu::Buffer,
    o: wgpu::Buffer,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    last: wgpu::Buffer,
    logits: wgpu::Buffer,
}

pub struct GpuModel {
    pub ctx: Arc<GpuContext>,
    pub cfg: ModelConfig,
    batch: Batch,
    /// The batch as sliding-window layers see it: their block table maps logical block i to
    /// ring block i mod ring_blocks, so they keep only their window (plus one chunk).
    ring: Option<Ring>,
    acts: Activations,
    /// Ops of the transformer body, in order.
    body: Vec<Box<dyn Encode>>,
    /// Final norm of the last token and the logits projection.
    head: Vec<Box<dyn Encode>>,
    sampler: ops::argmax::Sampler,
    /// Edits the logits in place before the sampler.
    penalize: ops::penalize::Penalize,
    /// [1] u32: the sampled token id.
    sampled: wgpu::Buffer,
    /// Per layer K and V caches, [n_blocks · KV_BLOCK, kv_dim] f32.
    kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    /// One block of one layer's K or V: copy-on-write copies go through it.
    kv_scratch: wgpu::Buffer,
    blocks: BlockManager,
    seq: SeqKv,
    /// Full blocks of earlier requests by the tokens they hold. None with sliding-window
    /// rings: a ring is overwritten as its sequence grows, so its blocks cannot be shared.
    index: Option<PrefixIndex>,
    n_ctx: usize,
    pub upload_bytes: u64,
}

#[allow(clippy::too_many_arguments)]
fn matmul_ops<'a>(
    ctx: &'a GpuContext,
    cache: &'a PipelineCache,
    batch: &'a Batch,
    m: &'a GpuMatrix,
    x: &'a wgpu::Buffer,
    y: &'a wgpu::Buffer,
    bias: Option<&'a wgpu::Buffer>,
    tokens: ops::matmul::TokenCount,
    accumulate: bool,
) -> impl std::future::Future<Output = Result<Vec<Box<dyn Encode>>>> + 'a {
    let parts: Vec<_> = m
        .parts
        .iter()
        .map(|p| {
            let label = format!("{}@{}", m.name, p.row_offset);
            (label, p.rows, p.row_offset, &p.buffer)
        })
        .collect();
    let (ty, n_in, y_stride) = (m.ty, m.n_in, m.n_rows);
    async move {
        let mut out: Vec<Box<dyn Encode>> = Vec::new();
        for (label, rows, row_offset, w) in parts {
            let desc = ops::matmul::MatmulDesc { label: &label, ty, n_in, n_rows: rows, row_offset, y_stride, tokens, accumulate };
            // A bias covers all rows; it is only supported unsplit.
            let b = if row_offset == 0 { bias } else { None };
            out.push(Box::new(TypedMatmul { ty, op: ops::matmul::Matmul::new(ctx, cache, batch, &desc, w, x, y, b).await? }));
        }
        Ok(out)
    }
}

#[allow(clippy::too_many_arguments)]
async fn norm(
    ctx: &GpuContext,
    cache: &PipelineCache,
    batch: &Batch,
    eps: f32,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    out: &wgpu::Buffer,
    row_len: usize,
    rows: ops::rms_norm::Rows,
) -> Result<ops::rms_norm::RmsNorm> {
    let desc = ops::rms_norm::RmsNormDesc { row_len: row_len as u32, eps, rows };
    ops::rms_norm::RmsNorm::new(ctx, cache, batch, desc, w, x, out).await
}

impl GpuModel {
    /// Uploads the weights and builds every op once. `n_ctx` is clamped to the training context.
    /// `max_binding_mb` lowers the per-buffer weight size below the device limit (tests use it
    /// to force multi-way splits). `kv_budget` (bytes) sizes the KV block pool, see
    /// [`kv_pool_size`].
    pub async fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: ModelConfig,
        n_ctx: usize,
        max_binding_mb: Option<u64>,
        kv_budget: Option<u64>,
    ) -> Result<GpuModel> {
        let c = &cfg;
        let n_ctx = n_ctx.clamp(1, c.n_ctx_train);
        let cache = PipelineCache::new();
        let max_blocks = (n_ctx as u32).div_ceil(KV_BLOCK);
        let batch = Batch::new(&ctx, PREFILL_CHUNK, 1, max_blocks, KV_BLOCK)?;
        let t = PREFILL_CHUNK as u64;
        let f = 4u64;
        let acts = Activations {
            x: storage(&ctx, "x", t * c.n_embd as u64 * f)?,
            h: storage(&ctx, "h", t * c.n_embd as u64 * f)?,
            q: storage(&ctx, "q", t * c.q_dim() as u64 * f)?,
            k: storage(&ctx, "k", t * c.kv_dim() as u64 * f)?,
            v: storage(&ctx, "v", t * c.v_dim() as u64 * f)?,
            attn: storage(&ctx, "attn", t * (c.n_head * c.head_dim_v) as u64 * f)?,
            o: storage(&ctx, "o", t * c.n_embd as u64 * f)?,
            gate: storage(&ctx, "gate", t * c.n_ff as u64 * f)?,
            up: storage(&ctx, "up", t * c.n_ff as u64 * f)?,
            last: storage(&ctx, "last", c.n_embd as u64 * f)?,
            logits: storage(&ctx, "logits", c.n_vocab as u64 * f)?,
        };
        // Local layers need their window plus the positions one chunk writes before reading.
        let window = c.layers.iter().filter_map(|l| l.sliding_window).max();
        let ring = match window {
            Some(w) => {
                let blocks = (w + PREFILL_CHUNK).div_ceil(KV_BLOCK);
                if blocks < max_blocks {
                    let table: Vec<u32> = (0..max_blocks).map(|i| i % blocks).collect();
                    let batch = Batch::new(&ctx, PREFILL_CHUNK, 1, max_blocks, KV_BLOCK)?;
                    Some(Ring { batch, table, slack: (blocks * KV_BLOCK - w) as usize })
                } else {
                    None
                }
            }
            None => None,
        };
        let pool = if ring.is_some() { max_blocks } else { kv_pool_size(&ctx, c, max_blocks, kv_budget) };
        let n_slots = pool as u64 * KV_BLOCK as u64;
        let ring_slots = ring.as_ref().map(|r| r.table.iter().max().map_or(1, |m| m + 1) as u64 * KV_BLOCK as u64);
        let mut kv = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let slots = match (c.layers[il].sliding_window, ring_slots) {
                (Some(_), Some(r)) => r,
                _ => n_slots,
            };
            kv.push((
                storage(&ctx, &format!("k_cache.{il}"), slots * c.kv_dim() as u64 * f)?,
                storage(&ctx, &format!("v_cache.{il}"), slots * c.v_dim() as u64 * f)?,
            ));
        }

        let max_binding = match max_binding_mb {
            Some(mb) => ctx.max_binding().min(mb << 20),
            None => ctx.max_binding(),
        };
        let mut up = Uploader::new(&ctx, file, max_binding);
        let mut body: Vec<Box<dyn Encode>> = Vec::new();
        use ops::matmul::TokenCount::{Batch as PerToken, One};
        let a = &acts;

        let embd = up.matrix("token_embd.weight").await?;
        for p in &embd.parts {
            body.push(Box::new(
                ops::embed::Embed::new(&ctx, &cache, &batch, embd.ty, c.n_embd as u32, p.rows, p.row_offset, &p.buffer, &a.x, c.embed_scale.unwrap_or(1.0)).await?,
            ));
        }
        let eps = c.rms_eps;
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let lc = &c.layers[il];
            let attn_norm = up.vector(&n("attn_norm.weight")).await?;
            body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.x, &attn_norm, &a.h, c.n_embd, ops::rms_norm::Rows::PerToken(1)).await?));
            let (qb, kb, vb) = if c.qkv_bias {
                (Some(up.vector(&n("attn_q.bias")).await?), Some(up.vector(&n("attn_k.bias")).await?), Some(up.vector(&n("attn_v.bias")).await?))
            } else {
                (None, None, None)
            };
            for (w, out, bias) in [("attn_q.weight", &a.q, &qb), ("attn_k.weight", &a.k, &kb), ("attn_v.weight", &a.v, &vb)] {
                let m = up.matrix(&n(w)).await?;
                body.extend(matmul_ops(&ctx, &cache, &batch, &m, &a.h, out, bias.as_ref(), PerToken, false).await?);
            }
            if c.qk_norm {
                let qn = up.vector(&n("attn_q_norm.weight")).await?;
                let kn = up.vector(&n("attn_k_norm.weight")).await?;
                body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.q, &qn, &a.q, c.head_dim, ops::rms_norm::Rows::PerToken(c.n_head as u32)).await?));
                body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.k, &kn, &a.k, c.head_dim, ops::rms_norm::Rows::PerToken(c.n_head_kv as u32)).await?));
            }
            let desc = ops::attention::AttentionDesc {
                n_head: c.n_head as u32,
                n_head_kv: c.n_head_kv as u32,
                head_dim: c.head_dim as u32,
                head_dim_v: c.head_dim_v as u32,
                scale: c.attn_scale,
                window: lc.sliding_window,
                // RoPE is fused: kv_write rotates K, attention rotates q as it loads it.
                rope: Some(ops::rope::RopeSpec {
                    rope_dim: c.rope_dim as u32,
                    style: c.rope_style,
                    base: lc.rope_base,
                    freq_scale: lc.rope_freq_scale,
                }),
            };
            let (kc, vc) = &kv[il];
            let kv_batch = match (&ring, lc.sliding_window) {
                (Some(r), Some(_)) => &r.batch,
                _ => &batch,
            };
            body.push(Box::new(ops::attention::KvWrite::new(&ctx, &cache, kv_batch, &desc, &a.k, &a.v, kc, vc).await?));
            body.push(Box::new(ops::attention::Attention::new(&ctx, &cache, kv_batch, &desc, &a.q, kc, vc, &a.attn).await?));
            let wo = up.matrix(&n("attn_output.weight")).await?;
            if c.post_norms {
                body.extend(matmul_ops(&ctx, &cache, &batch, &wo, &a.attn, &a.o, None, PerToken, false).await?);
                let pn = up.vector(&n("post_attention_norm.weight")).await?;
                body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.o, &pn, &a.o, c.n_embd, ops::rms_norm::Rows::PerToken(1)).await?));
                body.push(Box::new(ops::add::Add::new(&ctx, &cache, &batch, ops::add::AddKind::Residual, c.n_embd as u32, &a.x, &a.o).await?));
            } else {
                // The residual add is fused into the projection.
                body.extend(matmul_ops(&ctx, &cache, &batch, &wo, &a.attn, &a.x, None, PerToken, true).await?);
            }
            let ffn_norm = up.vector(&n("ffn_norm.weight")).await?;
            body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.x, &ffn_norm, &a.h, c.n_embd, ops::rms_norm::Rows::PerToken(1)).await?));
            let wg = up.matrix(&n("ffn_gate.weight")).await?;
            body.extend(matmul_ops(&ctx, &cache, &batch, &wg, &a.h, &a.gate, None, PerToken, false).await?);
            let wu = up.matrix(&n("ffn_up.weight")).await?;
            body.extend(matmul_ops(&ctx, &cache, &batch, &wu, &a.h, &a.up, None, PerToken, false).await?);
            body.push(Box::new(ops::glu::Glu::new(&ctx, &cache, &batch, ops::glu::GluDesc { act: c.activation, n_ff: c.n_ff as u32 }, &a.gate, &a.up, &a.gate).await?));
            let wd = up.matrix(&n("ffn_down.weight")).await?;
            if c.post_norms {
                body.extend(matmul_ops(&ctx, &cache, &batch, &wd, &a.gate, &a.o, None, PerToken, false).await?);
                let pn = up.vector(&n("post_ffw_norm.weight")).await?;
                body.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.o, &pn, &a.o, c.n_embd, ops::rms_norm::Rows::PerToken(1)).await?));
                body.push(Box::new(ops::add::Add::new(&ctx, &cache, &batch, ops::add::AddKind::Residual, c.n_embd as u32, &a.x, &a.o).await?));
            } else {
                body.extend(matmul_ops(&ctx, &cache, &batch, &wd, &a.gate, &a.x, None, PerToken, true).await?);
            }
        }
        let mut head: Vec<Box<dyn Encode>> = Vec::new();
        let out_norm = up.vector("output_norm.weight").await?;
        head.push(Box::new(norm(&ctx, &cache, &batch, eps, &a.x, &out_norm, &a.last, c.n_embd, ops::rms_norm::Rows::LastToken).await?));
        let output = if c.tied_output { embd } else { up.matrix("output.weight").await? };
        head.extend(matmul_ops(&ctx, &cache, &batch, &output, &a.last, &a.logits, None, One, false).await?);
        let sampled = storage(&ctx, "sampled", 4)?;
        let sampler = ops::argmax::Sampler::new(&ctx, &cache, c.n_vocab as u32, &a.logits, &sampled).await?;
        // Edits list each id at most once, so n_vocab entries always suffice.
        let penalize = ops::penalize::Penalize::new(&ctx, &cache, c.n_vocab as u32, c.n_vocab as u32, &a.logits).await?;
        up.flush()?;
        let upload_bytes = up.uploaded;
        let kv_scratch = storage(&ctx, "kv_scratch", KV_BLOCK as u64 * c.kv_dim().max(c.v_dim()) as u64 * f)?;
        let blocks = BlockManager::new(pool, KV_BLOCK);
        let index = ring.is_none().then(|| PrefixIndex::new(KV_BLOCK));
        Ok(GpuModel {
            cfg,
            batch,
            ring,
            acts,
            body,
            head,
            sampler,
            penalize,
            sampled,
            kv,
            kv_scratch,
            blocks,
            seq: SeqKv::new(),
            index,
            n_ctx,
            upload_bytes,
            ctx,
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Writes this step's batch for the global layers and, with its ring table, the local ones.
    fn write_batch(&self, tokens: &[u32], pos: &[u32], seq: &[u32]) {
        self.batch.write(&self.ctx, tokens, pos, seq, &[self.seq.table()]);
        if let Some(r) = &self.ring {
            r.batch.write(&self.ctx, tokens, pos, seq, &[&r.table]);
        }
    }

    /// How much of an `n`-position prefix survives a rollback: local layers' rings have
    /// overwritten the positions before `n` once more than `slack` positions followed it.
    pub fn reusable_prefix(&self, n: usize) -> usize {
        match &self.ring {
            Some(r) if self.seq.len().saturating_sub(n) > r.slack => 0,
            _ => n,
        }
    }

    /// Bytes of KV cache allocated (all layers, K and V).
    pub fn kv_bytes(&self) -> u64 {
        self.kv.iter().map(|(k, v)| k.size() + v.size()).sum()
    }

    /// Blocks in the KV pool (the live sequence's and the prefix index's).
    pub fn kv_pool_blocks(&self) -> u32 {
        self.blocks.n_blocks()
    }

    /// Blocks the prefix index holds (0 without an index).
    pub fn indexed_blocks(&self) -> usize {
        self.index.as_ref().map_or(0, |ix| ix.len())
    }

    /// Switches the sequence to the longest prefix of `tokens` the index holds when that is
    /// longer than the cached positions (which hold `tokens[..n_past]`); returns n_past after.
    /// Without an index (sliding-window rings) only the live sequence is reused.
    pub fn restore_prefix(&mut self, tokens: &[u32]) -> usize {
        self.truncate(tokens.len());
        match &mut self.index {
            Some(ix) => ix.restore(&mut self.blocks, &mut self.seq, tokens),
            None => self.seq.len(),
        }
    }

    /// Indexes the sequence's full blocks, whose positions hold `tokens`.
    pub fn commit(&mut self, tokens: &[u32]) {
        if let Some(ix) = &mut self.index {
            ix.insert(&mut self.blocks, &self.seq, tokens);
        }
    }

    /// Drops the sequence and every indexed block.
    pub fn clear_cache(&mut self) {
        self.blocks.release(&mut self.seq);
        if let Some(ix) = &mut self.index {
            ix.clear(&mut self.blocks);
        }
    }

    /// Grows the sequence to `end` positions, evicting least recently used indexed blocks when
    /// the pool is short, and records a copy-on-write copy into `enc` ahead of the KV writes.
    fn reserve(&mut self, end: usize, enc: &mut wgpu::CommandEncoder) -> Result<()> {
        let r = match &mut self.index {
            Some(ix) => ix.reserve(&mut self.blocks, &mut self.seq, end),
            None => self.blocks.reserve(&mut self.seq, end),
        };
        let r = r.map_err(|e| GpuError::Unsupported { op: "kv", message: e.to_string() })?;
        if let Some(copy) = r.copy {
            self.encode_block_copy(enc, copy);
        }
        Ok(())
    }

    /// Copies one block in every layer's K and V cache (only shared blocks are copied, and
    /// only without rings, so every layer's cache is laid out by the sequence's table).
    fn encode_block_copy(&self, enc: &mut wgpu::CommandEncoder, copy: BlockCopy) {
        let bytes = |dim: usize| KV_BLOCK as u64 * dim as u64 * 4;
        for (k, v) in &self.kv {
            ops::attention::encode_block_copy(enc, k, &self.kv_scratch, bytes(self.cfg.kv_dim()), copy.src, copy.dst);
            ops::attention::encode_block_copy(enc, v, &self.kv_scratch, bytes(self.cfg.v_dim()), copy.src, copy.dst);
        }
    }

    pub fn n_past(&self) -> usize {
        self.seq.len()
    }

    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.seq.len());
        self.blocks.truncate(&mut self.seq, n);
    }

    /// Runs `tokens` (in chunks of at most [`PREFILL_CHUNK`], one submission each) and
    /// produces `output` from the last one. On failure the cache is rolled back.
    async fn run(&mut self, tokens: &[u32], output: &Output<'_>) -> Result<Option<Sampled>> {
        let start = self.seq.len();
        let r = self.run_chunks(tokens, output).await;
        if r.is_err() {
            self.truncate(start);
        }
        r
    }

    async fn run_chunks(&mut self, tokens: &[u32], output: &Output<'_>) -> Result<Option<Sampled>> {
        let mut result = None;
        let chunks: Vec<&[u32]> = tokens.chunks(PREFILL_CHUNK as usize).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let start = self.seq.len();
            let end = start + chunk.len();
            let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
            self.reserve(end, &mut enc)?;
            let pos: Vec<u32> = (start as u32..end as u32).collect();
            let seq = vec![0u32; chunk.len()];
            self.write_batch(chunk, &pos, &seq);
            let plan = match (last, output) {
                (true, Output::Sample(step, edits)) => Some((self.penalize.prepare(&self.ctx, edits)?, self.sampler.prepare(&self.ctx, step, 1)?)),
                _ => None,
            };
            let step = Step { n_tok: chunk.len() as u32, max_kv_len: end as u32 };
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("forward"), timestamp_writes: None });
                for op in &self.body {
                    op.encode(&mut pass, &step);
                }
                if last {
                    for op in &self.head {
                        op.encode(&mut pass, &step);
                    }
                    match (output, &plan) {
                        (Output::Greedy, _) => self.sampler.encode_argmax(&mut pass),
                        (Output::Sample(..), Some((edits, plan))) => {
                            self.penalize.encode(&mut pass, edits);
                            self.sampler.encode_sample(&mut pass, plan);
                        }
                        _ => {}
                    }
                }
            }
            self.ctx.queue.submit([enc.finish()]);
            if last && !matches!(output, Output::Logits) {
                // The only readback of a decode step: one token id, or with log-probabilities
                // their record (172 bytes).
                result = Some(match &plan {
                    Some((_, p)) if p.n_logprobs > 0 => self.sampler.read_logprobs(&self.ctx).await?,
                    _ => Sampled { id: crate::buffer::read_u32(&self.ctx, &self.sampled, 0, 1).await?[0], ..Default::default() },
                });
            } else {
                self.ctx.poll_wait()?;
            }
            self.ctx.check()?;
        }
        Ok(result)
    }

    /// The next token after `tokens`, chosen on the device: one submission per decode step
    /// and 4 bytes read back (172 with log-probabilities).
    pub async fn forward_token(&mut self, tokens: &[u32], output: Output<'_>) -> Result<Sampled> {
        self.run(tokens, &output).await?.ok_or_else(|| GpuError::Readback("no token".into()))
    }

    /// Runs one step of `tokens` with every op in its own timed pass and returns
    /// (op label, GPU nanoseconds) in execution order. Needs timestamp queries.
    pub async fn profile_step(&mut self, tokens: &[u32]) -> Result<Vec<(String, f64)>> {
        if !self.ctx.caps.timestamps {
            return Err(GpuError::Unsupported { op: "profile", message: "the adapter has no timestamp queries".into() });
        }
        if tokens.is_empty() || tokens.len() > PREFILL_CHUNK as usize {
            return Err(GpuError::Unsupported { op: "profile", message: format!("1..={PREFILL_CHUNK} tokens per profiled step") });
        }
        let start = self.seq.len();
        let end = start + tokens.len();
        let mut enc = self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("profile") });
        self.reserve(end, &mut enc)?;
        let pos: Vec<u32> = (start as u32..end as u32).collect();
        self.write_batch(tokens, &pos, &vec![0u32; tokens.len()]);
        let step = Step { n_tok: tokens.len() as u32, max_kv_len: end as u32 };
        let ops: Vec<&dyn Encode> = self.body.iter().chain(self.head.iter()).map(|b| b.as_ref()).collect();
        let n = ops.len() as u32;
        let queries = self.ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * n,
        });
        let resolved = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile_resolve"),
            size: 16 * n as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        for (i, op) in ops.iter().enumerate() {
            let i = i as u32;
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("profiled op"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &queries,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                }),
            });
            op.encode(&mut pass, &step);
        }
        enc.resolve_query_set(&queries, 0..2 * n, &resolved, 0);
        self.ctx.queue.submit([enc.finish()]);
        let bytes = crate::buffer::read(&self.ctx, &resolved, 0, 16 * n as u64).await?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let period = self.ctx.queue.get_timestamp_period() as f64;
        Ok(ops
            .iter()
            .enumerate()
            .map(|(i, op)| (op.label(), ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period))
            .collect())
    }

    /// Last-position logits after `tokens` (tests and tools; reads the whole vector back).
    pub async fn forward_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, &Output::Logits).await?;
        crate::buffer::read_f32(&self.ctx, &self.acts.logits, 0, self.cfg.n_vocab).await
    }
}

/// Blocks in the KV pool: as many as `budget` bytes hold (default: the context plus a quarter
/// more for the prefix index), never fewer than the context's blocks plus one (the room a
/// copy-on-write needs with a full context), never more than one binding holds.
pub fn kv_pool_size(ctx: &GpuContext, c: &ModelConfig, max_blocks: u32, budget: Option<u64>) -> u32 {
    let f = 4u64;
    let row = c.kv_dim().max(c.v_dim()) as u64 * f;
    let per_pos = c.n_layer as u64 * (c.kv_dim() + c.v_dim()) as u64 * f;
    let by_binding = (ctx.max_binding() / (row * KV_BLOCK as u64).max(1)).min(u32::MAX as u64) as u32;
    let min = max_blocks.saturating_add(1).min(by_binding).max(max_blocks);
    let default_blocks = min as u64 + max_blocks.div_ceil(DEFAULT_SPARE_DIVISOR) as u64;
    let budget = budget.unwrap_or(default_blocks * KV_BLOCK as u64 * per_pos);
    match KvConfig::from_budget(budget, per_pos, KV_BLOCK, ctx.max_binding(), row) {
        Ok(k) => k.n_blocks.max(min),
        Err(_) => min,
    }
}
