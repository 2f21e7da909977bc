//! The interface every compute backend implements (the CPU reference and the GPU): one
//! batched forward step over several sequences' tokens. Each entry brings its tokens, their
//! first position and its block tables (the KV cache manager's, see [`crate::kv`]); the
//! backend stores their K and V where the tables say, and draws a token for every output row
//! with that row's sampler. The scheduler and every front end are written once above it.
//!
//! `step` is async on every target: the GPU backend awaits its readback, the browser cannot
//! block, and the CPU reference simply completes at once.

use futures::future::LocalBoxFuture;
use thiserror::Error;

use crate::arch::{ArchError, ModelConfig};
use crate::gguf::GgufError;
use crate::kv::{GroupCopy, KvCache, KvError, KvLayout, KvType, PoolRequest, KV_BLOCK_SIZE, NO_BLOCK, WINDOW_SLACK};
use crate::sampling::{Sampled, Sampler};
use crate::selftest::{Probe, Tap};

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to run: the step is empty")]
    EmptyBatch,
    #[error("malformed step: {cause}")]
    BadStep { cause: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Arch(#[from] ArchError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    #[error("the GPU device was lost: {cause}")]
    DeviceLost { cause: String },
    /// The sampler found NaN or infinite logits (a broken model file or GPU driver): the
    /// request ends with this instead of a token.
    #[error("the logits for generated token {token} hold NaN or infinity (on {backend}): the model file or the GPU driver is broken; no token was emitted")]
    NonFiniteLogits { token: usize, backend: String },
    #[error("GPU out of memory: {cause}")]
    OutOfMemory { cause: String },
    #[error("GPU validation error: {cause}")]
    Validation { cause: String },
    #[error("{cause}")]
    Device { cause: String },
    /// An error met on one part of a model split over several devices.
    #[error("part {part} (layers {}..{}, {adapter}): {source}", layers.start, layers.end)]
    OnPart { part: usize, layers: std::ops::Range<usize>, adapter: String, source: Box<BackendError> },
}

impl BackendError {
    /// The error under any context it was wrapped in ([`BackendError::OnPart`]).
    pub fn root(&self) -> &BackendError {
        match self {
            BackendError::OnPart { source, .. } => source.root(),
            e => e,
        }
    }
}

/// How a backend is built: the context, the step's size and the KV pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendOptions {
    /// The most positions one sequence holds (clamped to the model's training context).
    pub n_ctx: usize,
    /// Sequences one step may run.
    pub max_seqs: usize,
    /// Tokens one step may run.
    pub max_batch_tokens: usize,
    /// Output rows one step may sample.
    pub max_outputs: usize,
    /// Bytes for the KV pool, every group together; None = one context plus a quarter.
    pub kv_budget_bytes: Option<u64>,
    /// How K and V elements are stored (`--cache-type-k`, `--cache-type-v`).
    pub cache_k: KvType,
    pub cache_v: KvType,
    /// The exact mode: kernels whose results do not depend on what shares a step (a GPU
    /// backend then never takes its tiled GEMM).
    pub exact: bool,
}

impl BackendOptions {
    /// The KV pool request for a context of `n_ctx` and buffers of at most `max_buffer_bytes`.
    pub fn pool_request(&self, n_ctx: usize, max_buffer_bytes: u64) -> PoolRequest {
        PoolRequest {
            n_ctx,
            max_seqs: self.max_seqs,
            max_batch_tokens: self.max_batch_tokens,
            budget_bytes: self.kv_budget_bytes,
            max_buffer_bytes,
            block_size: KV_BLOCK_SIZE,
            slack: WINDOW_SLACK,
            k_type: self.cache_k,
            v_type: self.cache_v,
        }
    }
}

/// What one step may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimits {
    /// Tokens, all entries together.
    pub max_tokens: usize,
    /// Entries (sequences).
    pub max_seqs: usize,
    /// Output rows, all entries together.
    pub max_outputs: usize,
}

/// One output row: the logits after token `index` of its entry, and the sampler that draws
/// from them (its settings, seed, stream and penalty history).
pub struct OutputRow<'a> {
    pub index: usize,
    pub sampler: &'a mut Sampler,
}

/// One sequence's share of a step.
pub struct StepEntry<'a> {
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
    /// One block table per KV group (see [`KvLayout`]).
    pub tables: Vec<&'a [u32]>,
    pub outputs: Vec<OutputRow<'a>>,
}

pub struct StepBatch<'a> {
    pub entries: Vec<StepEntry<'a>>,
    /// Copy-on-write block copies, performed before the step's KV writes.
    pub copies: &'a [GroupCopy],
    /// Also return every output row's logits (tests and tools; a full readback).
    pub logits: bool,
}

/// Each output row's allowed-token mask, in output-row order (None: the row's sampler keeps
/// its own), computed while the step's forward pass runs: constrained decoding's masks are
/// CPU work that need not wait for the GPU, nor the GPU for them.
pub type LateMasks<'a> = Box<dyn FnOnce() -> Vec<Option<Vec<u32>>> + 'a>;

/// Puts `masks` (output-row order) into the rows' samplers.
pub fn apply_masks(entries: &mut [StepEntry<'_>], masks: Vec<Option<Vec<u32>>>) {
    let rows = entries.iter_mut().flat_map(|e| e.outputs.iter_mut());
    for (row, mask) in rows.zip(masks) {
        if mask.is_some() {
            row.sampler.set_mask(mask);
        }
    }
}

/// What a step produced, in output-row order (entries in order, rows in order within each).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepResult {
    pub sampled: Vec<Sampled>,
    /// Empty unless the batch asked for logits.
    pub logits: Vec<Vec<f32>>,
}

/// A token of a step whose id is the draw of an output row of the step submitted just before
/// it ([`Backend::submit`]): the device copies it, so the host need not wait for that step's
/// readback before submitting this one (vLLM's async scheduling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feed {
    /// The token's index in the step (entries' tokens in order).
    pub token: usize,
    /// The output row of the step submitted before.
    pub row: usize,
}

/// A step submitted by [`Backend::submit`] whose results are not collected yet.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket(pub u64);

/// One op of a profiled step (`Backend::profile`).
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// What the op is: `rms_norm`, `matmul Q4_K`, ...
    pub op: String,
    /// Device time in nanoseconds.
    pub ns: f64,
    /// Kernel dispatches the op recorded.
    pub dispatches: u32,
}

/// A model instance whose KV storage is laid out as [`Backend::kv_layout`] says.
pub trait Backend {
    fn config(&self) -> &ModelConfig;
    /// The block groups the backend stores; the KV cache manager hands out their ids.
    fn kv_layout(&self) -> &KvLayout;
    fn limits(&self) -> StepLimits;
    /// Runs one step (see the module docs).
    fn step<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>>;
    /// Runs one step whose output rows' masks come from `masks`, called once: where the
    /// backend can, after the forward pass is submitted and before the sampler's (two
    /// submissions), so the masks are computed while the device works; otherwise first.
    fn step_with_masks<'a>(&'a mut self, mut batch: StepBatch<'a>, masks: LateMasks<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        apply_masks(&mut batch.entries, masks());
        self.step(batch)
    }
    /// Whether [`Backend::submit`] returns before the step's results are read, so that the
    /// next step can be submitted while this one runs.
    fn overlaps(&self) -> bool {
        false
    }
    /// Submits one step and returns before its results are read; [`Backend::collect`] reads
    /// them, in the order submitted. At most two steps are outstanding, and [`Backend::step`]
    /// waits for none. `feeds` name tokens whose ids are draws of the step submitted before
    /// (their ids in `batch` are stand-ins). `masks`, if any, as [`Backend::step_with_masks`]
    /// takes them. Only where [`Backend::overlaps`]; no logits.
    fn submit<'a>(&'a mut self, batch: StepBatch<'a>, feeds: &'a [Feed], masks: Option<LateMasks<'a>>) -> LocalBoxFuture<'a, Result<Ticket, BackendError>> {
        let _ = (batch, feeds, masks);
        Box::pin(async { Err(BackendError::Device { cause: format!("{} does not overlap steps", self.name()) }) })
    }
    /// The results of a submitted step (the oldest outstanding).
    fn collect<'a>(&'a mut self, ticket: Ticket) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        let _ = ticket;
        Box::pin(async { Err(BackendError::Device { cause: format!("{} does not overlap steps", self.name()) }) })
    }
    /// Runs one step with per-op device timings. Nothing is sampled.
    fn profile<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<Vec<OpTime>, BackendError>> {
        let _ = batch;
        Box::pin(async { Err(BackendError::Device { cause: format!("{} has no per-op profiler", self.name()) }) })
    }
    /// Runs the self-test's probe (see [`crate::selftest`]) through the embedding, layer 0 and
    /// the head, returning every tap. Only before the first step: it writes KV blocks 0...
    fn probe<'a>(&'a mut self, probe: &'a Probe) -> LocalBoxFuture<'a, Result<Vec<Tap>, BackendError>> {
        let _ = probe;
        Box::pin(async { Err(BackendError::Device { cause: format!("{} has no self-test taps", self.name()) }) })
    }
    /// The NMSE the self-test allows this backend's taps against the CPU reference:
    /// [`crate::selftest::MAX_NMSE`] (f32-faithful kernels), or
    /// [`crate::selftest::MAX_NMSE_Q8`] where its kernels round activations to 8 bits.
    fn self_test_bound(&self) -> f64 {
        crate::selftest::MAX_NMSE
    }
    /// A short name for reports: `cpu`, `gpu (llvmpipe)`.
    fn name(&self) -> String;
    /// Entry sizes a verify step should round down to (speculative decoding; see
    /// [`crate::spec::fit_draft`]): where a step's cost grows with the token block its size
    /// falls in, as on CPU-type adapters, drafts that spill into a larger block cost more than
    /// they are likely to return. Empty: any size.
    fn verify_sizes(&self) -> &'static [usize] {
        &[]
    }
    /// Whether a step of `tokens` tokens (one sequence, one output) runs on kernels already
    /// built; false where it would first compile some (a GPU builds a token count's matmul
    /// kernels at its first step of that size).
    fn step_ready(&self, tokens: usize) -> bool {
        let _ = tokens;
        true
    }
    /// The backend as `Any`, for engines that join two backends of one kind (a draft model's
    /// device store); None where that is not offered.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

/// Checks a step against the limits, the layout and the vocabulary before any work is done:
/// every position an entry writes or its attention reads must lie in a block it holds.
pub fn check_step(batch: &StepBatch, limits: &StepLimits, layout: &KvLayout, n_vocab: usize) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::BadStep { cause: m });
    if batch.entries.is_empty() {
        return Err(BackendError::EmptyBatch);
    }
    let n_tok: usize = batch.entries.iter().map(|e| e.tokens.len()).sum();
    let n_out: usize = batch.entries.iter().map(|e| e.outputs.len()).sum();
    if n_tok > limits.max_tokens || batch.entries.len() > limits.max_seqs || n_out > limits.max_outputs {
        return bad(format!(
            "{n_tok} tokens, {} entries, {n_out} outputs; the backend takes {} / {} / {}",
            batch.entries.len(),
            limits.max_tokens,
            limits.max_seqs,
            limits.max_outputs
        ));
    }
    let bs = layout.block_size as usize;
    for (i, e) in batch.entries.iter().enumerate() {
        if e.tokens.is_empty() {
            return bad(format!("entry {i} has no tokens"));
        }
        if let Some(&id) = e.tokens.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(BackendError::BadToken { id, n_vocab });
        }
        if e.tables.len() != layout.groups.len() {
            return bad(format!("entry {i} has {} block tables, the layout {} groups", e.tables.len(), layout.groups.len()));
        }
        let end = e.start + e.tokens.len();
        for (g, (table, spec)) in e.tables.iter().zip(&layout.groups).enumerate() {
            if table.len() > layout.max_blocks_per_seq as usize || table.len() * bs < end {
                return bad(format!("entry {i}: group {g}'s table of {} blocks cannot hold {end} positions", table.len()));
            }
            // The earliest position a query of this step sees.
            let first = spec.window.map_or(0, |w| (e.start + 1).saturating_sub(w as usize));
            if let Some(&b) = table[first / bs..end.div_ceil(bs)].iter().find(|&&b| b == NO_BLOCK || b >= spec.n_blocks) {
                return bad(format!("entry {i}: group {g} lists block {b}, outside its pool of {}", spec.n_blocks));
            }
        }
        for o in &e.outputs {
            if o.index >= e.tokens.len() {
                return bad(format!("entry {i}: output row at token {} of {}", o.index, e.tokens.len()));
            }
            o.sampler.check_vocab(n_vocab)?;
        }
    }
    for c in batch.copies {
        let Some(spec) = layout.groups.get(c.group) else { return bad(format!("copy in group {}", c.group)) };
        if c.src >= spec.n_blocks || c.dst >= spec.n_blocks {
            return bad(format!("copy {} → {} outside group {}'s pool of {}", c.src, c.dst, c.group, spec.n_blocks));
        }
    }
    Ok(())
}

/// One sequence driven straight on a backend, without a scheduler: for tests and tools. It
/// keeps its own KV cache manager over the backend's layout, so it must not share a backend
/// with an engine.
pub struct Solo {
    kv: KvCache,
    tokens: Vec<u32>,
}

const SOLO: u64 = 1;

impl Solo {
    pub fn new(backend: &dyn Backend) -> Solo {
        let mut kv = KvCache::new(backend.kv_layout().clone());
        kv.open(SOLO);
        Solo { kv, tokens: Vec::new() }
    }

    /// Positions in the cache.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Runs `tokens` after the cached positions, in steps of at most the backend's limit, and
    /// samples after the last with `sampler`; with `logits`, also returns the last logits.
    pub async fn run(
        &mut self,
        backend: &mut dyn Backend,
        tokens: &[u32],
        sampler: &mut Sampler,
        logits: bool,
    ) -> Result<(Sampled, Option<Vec<f32>>), BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::EmptyBatch);
        }
        let chunks: Vec<&[u32]> = tokens.chunks(backend.limits().max_tokens).collect();
        let mut last = None;
        for (i, chunk) in chunks.iter().enumerate() {
            let start = self.tokens.len();
            let copies = self.kv.reserve(SOLO, start + chunk.len())?;
            let final_chunk = i + 1 == chunks.len();
            let outputs = if final_chunk { vec![OutputRow { index: chunk.len() - 1, sampler: &mut *sampler }] } else { Vec::new() };
            let entry = StepEntry { tokens: chunk, start, tables: self.kv.tables(SOLO), outputs };
            let batch = StepBatch { entries: vec![entry], copies: &copies, logits: logits && final_chunk };
            let r = backend.step(batch).await;
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    self.kv.truncate(SOLO, start)?;
                    return Err(e);
                }
            };
            self.tokens.extend_from_slice(chunk);
            self.kv.commit(SOLO, &self.tokens);
            self.kv.slide(SOLO);
            last = Some(r);
        }
        let mut r = last.expect("at least one chunk");
        let sampled = r.sampled.pop().ok_or_else(|| BackendError::Device { cause: "the step returned no sample".into() })?;
        Ok((sampled, r.logits.pop()))
    }

    /// The last position's logits after `tokens` (a full readback).
    pub async fn forward(&mut self, backend: &mut dyn Backend, tokens: &[u32]) -> Result<Vec<f32>, BackendError> {
        let mut greedy = Sampler::new(crate::sampling::SamplingParams::greedy())?;
        let (_, logits) = self.run(backend, tokens, &mut greedy, true).await?;
        logits.ok_or_else(|| BackendError::Device { cause: "the step returned no logits".into() })
    }

    /// The token `sampler` draws after `tokens`.
    pub async fn forward_sample(&mut self, backend: &mut dyn Backend, tokens: &[u32], sampler: &mut Sampler) -> Result<Sampled, BackendError> {
        Ok(self.run(backend, tokens, sampler, false).await?.0)
    }

    /// Rolls back to `n` positions (0 clears the sequence).
    pub fn truncate(&mut self, n: usize) -> Result<(), BackendError> {
        if n == 0 {
            self.kv.reset(SOLO);
        } else {
            self.kv.truncate(SOLO, n)?;
        }
        self.tokens.truncate(n);
        Ok(())
    }
}
