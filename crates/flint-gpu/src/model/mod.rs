//! The GPU forward pass: weights uploaded once, activations and KV blocks preallocated, and
//! every op (pipeline + bind group) built once at load. A step runs any mix of sequences'
//! tokens (prefill chunks and decodes) in one command submission; its output rows' logits
//! stay on the device, where the sampler draws each row's token, and the step reads back only
//! the sampled ids (and log-probabilities when asked): a few KB, through a buffer mapped in
//! place, whatever the batch size.
//!
//! A model may also be loaded in parts, consecutive layer ranges on several devices (a layer
//! split): the first part embeds, the last holds the head and the sampler, and a step runs
//! through them in turn ([`step::run_parts`]).
//!
//! `graph` builds the ops, `kv_store` holds the KV blocks, `step` runs a step, `profile`
//! times each op of one and `probe` runs the self-test's taps.

pub mod graph;
pub mod kv_store;
mod probe;
mod profile;
mod step;

pub use step::{run_parts, PartFailure, MIN_MICRO_TOKENS};

use std::ops::Range;
use std::sync::Arc;

use flint_core::arch::ModelConfig;
use flint_core::backend::{BackendOptions, StepLimits};
use flint_core::gguf::GgufFile;
use flint_core::kv::KvLayout;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{self, Batch};
use crate::weights::Uploader;

use graph::{Activations, Graph, GraphInputs};
use kv_store::KvStore;

/// Words of the readback buffer per output row: the id, then its log-probability record.
const READBACK_WORDS: usize = 1 + ops::sample::LP_WORDS;

/// Which layers of the model a [`GpuModel`] holds, and whether it embeds (the first part) and
/// holds the head and sampler (the last). A whole model is one part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub layers: Range<usize>,
    pub embed: bool,
    pub head: bool,
}

impl Part {
    pub fn whole(n_layer: usize) -> Part {
        Part { layers: 0..n_layer, embed: true, head: true }
    }

    /// Part `i` of `ranges`, consecutive layer ranges covering the model.
    pub fn of(ranges: &[Range<usize>], i: usize) -> Part {
        Part { layers: ranges[i].clone(), embed: i == 0, head: i + 1 == ranges.len() }
    }
}

/// What the last part holds past its layers: the logit edits, the sampler and the readback.
struct Outputs {
    sampler: ops::sample::Sampler,
    /// Edits the logits in place before the sampler.
    penalize: ops::penalize::Penalize,
    /// MAP_READ: [max_outputs] ids, then [max_outputs, LP_WORDS] log-probability records.
    /// Two, so that a step submitted while the one before is still unread (`submit`) does not
    /// overwrite its draws; a plain step takes the first.
    readback: [wgpu::Buffer; 2],
}

pub struct GpuModel {
    pub ctx: Arc<GpuContext>,
    pub cfg: ModelConfig,
    pub part: Part,
    layout: KvLayout,
    limits: StepLimits,
    /// The step's batch as each KV group's layers see it (the same tokens, their own tables).
    batches: Vec<Batch>,
    /// The head's rows: `tokens` lists the step token of each output row.
    head: Batch,
    acts: Activations,
    graph: Graph,
    /// The last part's (None on the others).
    out: Option<Outputs>,
    kv: KvStore,
    n_ctx: usize,
    pub upload_bytes: u64,
    /// Its matmuls may round activations to 8 bits (`ops::matmul::q8_activations`).
    rounds_activations: bool,
    /// A step has run (the first one runs every kernel for the first time).
    stepped: bool,
    /// Overlapped steps (`submit`): those not collected yet, oldest first; the readback slot
    /// the next one takes; its ticket; and the output rows of the step submitted last (what a
    /// feed may name).
    in_flight: std::collections::VecDeque<step::InFlight>,
    next_slot: usize,
    next_ticket: u64,
    last_rows: usize,
}

impl GpuModel {
    /// Uploads the weights and builds every op once. The context is clamped to the training
    /// context; the KV pool is laid out from `opts` (its budget shared by all sequences).
    /// `max_binding_mb` lowers the per-buffer weight size below the device limit (tests use
    /// it to force multi-way splits).
    pub async fn load(ctx: Arc<GpuContext>, file: &GgufFile, cfg: ModelConfig, opts: &BackendOptions, max_binding_mb: Option<u64>) -> Result<GpuModel> {
        let layout = plan_kv(&cfg, opts, ctx.max_binding())?;
        let part = Part::whole(cfg.n_layer);
        GpuModel::load_part(ctx, file, cfg, opts, max_binding_mb, part, layout).await
    }

    /// Loads the layers (and the embedding or head) `part` names, their KV laid out as
    /// `layout` (every part of one model shares one layout: the block manager's).
    pub async fn load_part(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: ModelConfig,
        opts: &BackendOptions,
        max_binding_mb: Option<u64>,
        part: Part,
        layout: KvLayout,
    ) -> Result<GpuModel> {
        let c = &cfg;
        let n_ctx = opts.n_ctx.clamp(1, c.n_ctx_train);
        let limits = StepLimits { max_tokens: opts.max_batch_tokens, max_seqs: opts.max_seqs, max_outputs: opts.max_outputs };
        let to_u32 = |what: &'static str, n: usize| u32::try_from(n).map_err(|_| GpuError::Limit { what, need: n as u64, limit: u32::MAX as u64 });
        let (max_tokens, max_seqs, max_outputs) =
            (to_u32("step tokens", limits.max_tokens)?, to_u32("step sequences", limits.max_seqs)?, to_u32("step outputs", limits.max_outputs)?);
        if max_tokens == 0 || max_seqs == 0 || max_outputs == 0 {
            return Err(GpuError::Unsupported { op: "model", message: "a step must allow tokens, sequences and outputs".into() });
        }
        let batches =
            layout.groups.iter().map(|_| Batch::new(&ctx, max_tokens, max_seqs, layout.max_blocks_per_seq, layout.block_size)).collect::<Result<Vec<_>>>()?;
        let head = Batch::new(&ctx, max_outputs, 1, 1, layout.block_size)?;
        // Every layer has the same head counts and sizes: one shared split scratch.
        let scratch = ops::attention::Attention::scratch_bytes(&graph::attention_desc(c, 0, None), max_tokens);
        // Each part under an out-of-memory scope, so that one the device cannot hold is named.
        let acts = ctx
            .allocating("activations", async { Activations::new(&ctx, c, max_tokens, if part.head { max_outputs } else { 0 }, scratch) }, |a| {
                format!("the activation buffers for steps of {max_tokens} tokens ({})", mib(a.bytes()))
            })
            .await?;
        let blocks: u64 = layout.groups.iter().map(|g| g.n_blocks as u64).sum();
        let kv = ctx
            .allocating("kv", async { KvStore::new(&ctx, c, &layout, part.layers.clone()) }, |kv| {
                format!("the KV cache ({}: {blocks} blocks of {} positions)", mib(kv.bytes()), layout.block_size)
            })
            .await?;
        let max_binding = match max_binding_mb {
            Some(mb) => ctx.max_binding().min(mb << 20),
            None => ctx.max_binding(),
        };
        let cache = ctx.pipelines.clone();
        // Per-pair divisors read from the file (Llama 3's, LongRoPE's for this context).
        let rope_factors = match c.rope_factor_tensor(n_ctx) {
            Some(name) => Some(Arc::from(file.read_f32(name).await.map_err(|e| GpuError::Unsupported { op: "upload", message: e.to_string() })?)),
            None => None,
        };
        let mut up = Uploader::new(&ctx, file, max_binding);
        let inputs = GraphInputs {
            ctx: &ctx,
            cache: &cache,
            cfg: c,
            batches: &batches,
            layer_group: &kv.layer_group,
            head: &head,
            acts: &acts,
            kv: &kv.layers,
            part: &part,
            rope_factors,
            kv_types: (layout.k_type, layout.v_type),
            exact: opts.exact,
        };
        let upload = async {
            let graph = graph::build(&inputs, &mut up).await?;
            up.flush()?;
            Ok((graph, up.uploaded))
        };
        let (graph, upload_bytes) = ctx.allocating("weights", upload, |(_, bytes)| format!("the weights ({})", mib(*bytes))).await?;
        let out = match part.head {
            true => {
                let n_vocab = c.n_vocab as u32;
                let sampler = ops::sample::Sampler::new(&ctx, &cache, n_vocab, max_outputs, 1, &acts.logits).await?;
                // Overlapped steps feed rows' pending tokens into the batch (every group's copy).
                let tokens = batches.first().map(|b| &b.tokens);
                let penalize = ops::penalize::Penalize::new(&ctx, &cache, n_vocab, max_outputs, &acts.logits, tokens).await?;
                let readback = [0, 1].map(|_| {
                    ctx.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("step_readback"),
                        size: (max_outputs as usize * READBACK_WORDS * 4) as u64,
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                });
                Some(Outputs { sampler, penalize, readback })
            }
            false => None,
        };
        ctx.check()?;
        Ok(GpuModel {
            cfg,
            part,
            layout,
            limits,
            batches,
            head,
            acts,
            graph,
            out,
            kv,
            n_ctx,
            upload_bytes,
            rounds_activations: !opts.exact && ops::matmul::q8_activations(&ctx.caps),
            stepped: false,
            in_flight: Default::default(),
            next_slot: 0,
            next_ticket: 0,
            last_rows: 0,
            ctx,
        })
    }

    /// The head, logit edits and sampler, which only the last part (or a whole model) has.
    fn outputs(&self, op: &'static str) -> Result<(&graph::Head, &Outputs)> {
        match (&self.graph.head, &self.out) {
            (Some(h), Some(o)) => Ok((h, o)),
            _ => Err(self.not_last(op)),
        }
    }

    fn not_last(&self, op: &'static str) -> GpuError {
        GpuError::Unsupported { op, message: format!("layers {:?} are not the model's last part", self.part.layers) }
    }

    /// The NMSE the self-test allows this model's taps (`Backend::self_test_bound`).
    pub fn self_test_bound(&self) -> f64 {
        match self.rounds_activations {
            true => flint_core::selftest::MAX_NMSE_Q8,
            false => flint_core::selftest::MAX_NMSE,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn limits(&self) -> StepLimits {
        self.limits
    }

    /// Opens a store of up to `rows` rows of this model's vocabulary (fewer where the
    /// device's binding limit is lower) for draft distributions, attached to this model's
    /// sampler, which then verifies drafts against it ([`ops::sample::Sampler::attach_q`]).
    pub async fn open_q_store(&mut self, rows: u32) -> Result<wgpu::Buffer> {
        let row_bytes = self.cfg.n_vocab as u64 * 4;
        let rows = (rows as u64).min(self.ctx.max_binding() / row_bytes.max(1));
        if rows == 0 {
            return Err(GpuError::Unsupported { op: "sampler", message: "no row of draft distributions fits a buffer binding".into() });
        }
        let q = self
            .ctx
            .allocating("draft distributions", async { crate::buffer::storage(&self.ctx, "sampler.q", rows * row_bytes) }, |_| {
                format!("the draft distributions ({})", mib(rows * row_bytes))
            })
            .await?;
        self.attach_q(&q, self.cfg.n_vocab as u32).await?;
        Ok(q)
    }

    /// Attaches another model's store of draft distributions (rows of `stride` f32, its
    /// vocabulary) to this model's sampler, which records into it.
    pub async fn attach_q(&mut self, q: &wgpu::Buffer, stride: u32) -> Result<()> {
        let cache = self.ctx.pipelines.clone();
        let Some(out) = &mut self.out else { return Err(self.not_last("sampler")) };
        out.sampler.attach_q(&self.ctx, &cache, q, stride).await
    }

    /// Rows of the attached store of draft distributions (0: none).
    pub fn q_rows(&self) -> u32 {
        self.out.as_ref().map_or(0, |o| o.sampler.q_rows())
    }

    /// Bytes of KV cache allocated (all layers, K and V).
    pub fn kv_bytes(&self) -> u64 {
        self.kv.bytes()
    }
}

/// The KV layout of `cfg` under `opts`, each layer's K or V pool within `max_binding` bytes.
pub fn plan_kv(cfg: &ModelConfig, opts: &BackendOptions, max_binding: u64) -> Result<KvLayout> {
    let n_ctx = opts.n_ctx.clamp(1, cfg.n_ctx_train);
    Ok(KvLayout::plan(cfg, &opts.pool_request(n_ctx, max_binding))?)
}

/// `123.4 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
