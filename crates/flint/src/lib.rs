//! Flint's engine: load a model, `submit` requests from any thread, read each request's
//! stream of events. An owned run loop drives the scheduler and the backend, serving every
//! active request in each forward step (continuous batching). Natively the loop runs on the
//! engine's own thread (the backend is not `Send`) fed by a channel; in the browser the same
//! loop runs on the event loop (`Engine::load_local`). The CLI, the server and the wasm
//! bindings use this API and nothing below it.

mod bench;
mod draft;
mod error;
mod handle;
mod maker;
mod memory;
pub mod openai;
mod options;
mod request;
mod runner;
mod selftest;
mod structured;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::channel::{mpsc, oneshot};

pub use bench::{BenchRun, SpecRun, StreamRun};
pub use error::{DraftError, EngineError};
pub use flint_core::arch::{ArchError, ModelConfig, ScalingKind};
pub use flint_core::backend::BackendError;
pub use flint_core::chat::{ChatError, ChatTemplate, KEY_CHAT_TEMPLATE};
pub use flint_core::constrain::{Constrainer, ConstraintError, Grammar};
pub use flint_core::generate::{Event, FinishReason, GenerateError, GenerateParams, Summary, TokenLogprobs};
pub use flint_core::gguf::{GgufError, GgufFile};
pub use flint_core::kv::{KvError, KvType, KV_BLOCK_SIZE};
pub use flint_core::sampling::{SamplingError, SamplingParams};
pub use flint_core::sched::{BlockCounts, Histogram, Overlap, SchedError, SchedStats};
pub use flint_core::selftest::{SelfTestError, TapReport};
pub use flint_core::spec::{SpecConfig, SpecError, SpecKind, DRAFT_MAX, DRAFT_P_MIN};
pub use flint_core::tokenizer::VocabMismatch;
pub use flint_core::tokenizer::{Tokenizer, TokenizerError};
pub use flint_core::tools::{ToolCall, ToolChoice, ToolFormat, Tools};
/// The GPU adapters wgpu finds (native), as `--device` indexes and names them.
#[cfg(not(target_arch = "wasm32"))]
pub use flint_gpu::context::{adapters as gpu_adapters, AdapterEntry};
pub use flint_gpu::pipeline::CompileEvent;
pub use flint_gpu::split::SplitError;
pub use flint_gpu::GpuError;
pub use handle::{Canceller, RequestHandle};
pub use maker::memory_plan;
pub use memory::MemoryPlan;
pub use options::{BackendKind, CompileProgress, LoadOptions, ModelPart, SplitOptions, DEFAULT_CTX, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_SEQS};
pub use request::{Constrained, Input, Request, MAX_N};
pub use runner::{EventResult, OpTimes};
pub use selftest::SelfTestReport;

use flint_core::backend::BackendOptions;
use flint_core::generate::{default_clock, Clock};
use flint_core::kv::KvCache;
use flint_core::sched::{SchedConfig, Scheduler};
use flint_gpu::GpuContext;
#[cfg(not(target_arch = "wasm32"))]
use maker::draft_error;
use maker::{backend_options, file_text, kv_bytes_per_pos, open_draft, weight_bytes, BackendMaker, Made};
use runner::{Command, Runner};

/// What the engine tells about its model, shared by every handle.
pub struct EngineInfo {
    pub config: ModelConfig,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// The most tokens one sequence holds.
    pub n_ctx: usize,
    pub max_seqs: usize,
    /// `gpu (llvmpipe)` or `cpu`.
    pub backend_name: String,
    /// The GPU adapter's description (several joined by ` + ` for a split), or `cpu`.
    pub adapter_name: String,
    /// Where the layers run: one part on one device, or a layer split's parts (empty on
    /// the CPU backend).
    pub parts: Vec<ModelPart>,
    /// `general.architecture` and `general.name` of the file.
    pub architecture: Option<String>,
    pub name: Option<String>,
    /// Bytes of every weight matrix a decode step multiplies by (the embedding table only when
    /// it is also the output).
    pub weight_bytes: u64,
    /// KV bytes per position (every layer, K and V).
    pub kv_bytes_per_position: u64,
    /// What the model allocates, by kind (on the CPU backend: in host memory).
    pub memory: MemoryPlan,
    /// The load-time self-test's result, when it ran.
    pub self_test: Option<SelfTestReport>,
    /// The speculation settings it was loaded with.
    pub spec: SpecConfig,
    /// The devices, in layer order (the copy bandwidth is the first's, measured on request).
    gpus: Vec<Arc<GpuContext>>,
    clock: Clock,
    /// The constraint compiler, built on the first constrained request.
    constrainer: std::sync::OnceLock<Result<Arc<Constrainer>, ConstraintError>>,
}

impl EngineInfo {
    /// Bytes wgpu's allocator holds on this engine's devices now, where the backend reports
    /// it (Vulkan, DX12): the check on [`EngineInfo::memory`]. Devices are shared by the
    /// models of a process, so this counts every model on them.
    pub fn allocated_bytes(&self) -> Option<u64> {
        if self.gpus.is_empty() {
            return None;
        }
        self.gpus.iter().map(|g| g.device.generate_allocator_report().map(|r| r.total_allocated_bytes)).sum()
    }

    /// The model's constraint compiler (its tokenizer as llguidance's), built once.
    pub fn constrainer(&self) -> Result<Arc<Constrainer>, ConstraintError> {
        self.constrainer.get_or_init(|| Constrainer::new(self.tokenizer.clone()).map(Arc::new)).clone()
    }
}

/// A loaded model. Cheap to share (`Arc`); requests may come from any thread.
pub struct Engine {
    commands: mpsc::UnboundedSender<Command>,
    info: Arc<EngineInfo>,
    next_id: AtomicU64,
    #[cfg(not(target_arch = "wasm32"))]
    thread: Option<std::thread::JoinHandle<()>>,
}

// Natively, callers on any thread submit to one engine.
#[cfg(not(target_arch = "wasm32"))]
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Engine>();
    shared::<Canceller>();
};

/// The run loop of an engine made with [`Engine::load_local`]: drive it on the thread or
/// event loop that loaded the engine; it ends when the engine is dropped.
pub type RunLoop = futures::future::LocalBoxFuture<'static, ()>;

impl Engine {
    /// Opens a model file on disk (memory-mapped) on a new engine thread, builds the backend
    /// there and returns once it is loaded.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_path(path: &std::path::Path, opts: &LoadOptions) -> Result<Engine, EngineError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (path, opts) = (path.to_path_buf(), opts.clone());
        let thread = std::thread::Builder::new()
            .name("flint-engine".into())
            .spawn(move || {
                let loaded = GgufFile::open(&path).map_err(EngineError::from).and_then(|file| {
                    let draft = match &opts.draft_model {
                        Some(p) => Some(GgufFile::open(p).map_err(|e| draft_error(p, e))?),
                        None => None,
                    };
                    futures::executor::block_on(Self::build(file, draft, &opts))
                });
                match loaded {
                    Ok((engine, run)) => {
                        let _ = ready_tx.send(Ok(engine));
                        futures::executor::block_on(run);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| EngineError::Backend(BackendError::Device { cause: format!("cannot start the engine thread: {e}") }))?;
        let mut engine = ready_rx.recv().map_err(|_| EngineError::Closed)??;
        engine.thread = Some(thread);
        Ok(engine)
    }

    /// What loading `file` with `opts` would allocate, refused as the load refuses it before
    /// any weight is read: the model, tokenizer and chat template must parse, and on the GPU
    /// the plan must fit `split.device_mem_mb` and the KV cache the adapter's buffers. Reads
    /// the header alone: the browser runs it on a model read by HTTP ranges before it downloads
    /// the model into its cache.
    #[allow(clippy::arc_with_non_send_sync)]
    pub async fn check(mut file: GgufFile, opts: &LoadOptions) -> Result<MemoryPlan, EngineError> {
        opts.validate()?;
        let config = ModelConfig::from_gguf(&file)?.unfuse(&mut file)?;
        let tokenizer = Tokenizer::from_metadata(&file.metadata)?;
        chat_template(&file, &tokenizer, opts)?;
        let spec = opts.spec;
        spec.validate()?;
        let bopts = backend_options(&config, opts, &spec);
        let file = Arc::new(file);
        let clock = opts.clock.unwrap_or(default_clock);
        let maker = BackendMaker { file: file.clone(), config: config.clone(), bopts: bopts.clone(), opts: opts.clone(), clock };
        let layout = maker.check().await?;
        Ok(MemoryPlan::of(&file, &config, &bopts, &layout))
    }

    /// Loads a parsed file on this thread and returns the engine with its run loop, which the
    /// caller drives (the browser: `spawn_local`).
    pub async fn load_local(file: GgufFile, opts: &LoadOptions) -> Result<(Engine, RunLoop), EngineError> {
        Self::build(file, None, opts).await
    }

    /// [`Engine::load_local`] with a draft model's parsed file (the browser's `draftModel`).
    pub async fn load_local_with_draft(file: GgufFile, draft: GgufFile, opts: &LoadOptions) -> Result<(Engine, RunLoop), EngineError> {
        Self::build(file, Some(draft), opts).await
    }

    // The file is shared with the backend but never crosses threads: in the browser its bytes
    // come through JS (not `Sync`), natively the run loop's thread owns it.
    #[allow(clippy::arc_with_non_send_sync)]
    async fn build(mut file: GgufFile, draft: Option<GgufFile>, opts: &LoadOptions) -> Result<(Engine, RunLoop), EngineError> {
        opts.validate()?;
        let config = ModelConfig::from_gguf(&file)?.unfuse(&mut file)?;
        let tokenizer = Arc::new(Tokenizer::from_metadata(&file.metadata)?);
        let template = chat_template(&file, &tokenizer, opts)?;
        let kv_bytes_per_position = kv_bytes_per_pos(&config, opts);
        let mut spec = opts.spec;
        spec.validate()?;
        // A draft model's file and vocabulary are checked before any weight is loaded.
        let model = opts.draft_model.as_ref().map_or_else(String::new, |p| p.display().to_string());
        let draft_file = match draft {
            Some(file) => Some(open_draft(file, &model, &tokenizer, &mut spec)?),
            None if opts.draft_model.is_some() => return Err(EngineError::Draft { model, source: DraftError::PathNotOpened }),
            None => None,
        };
        let bopts = backend_options(&config, opts, &spec);
        let BackendOptions { n_ctx, max_seqs, kv_budget_bytes, .. } = bopts;
        let draft_rows = spec.draft_rows(max_seqs);
        let file = Arc::new(file);
        let clock = opts.clock.unwrap_or(default_clock);
        let maker = BackendMaker { file: file.clone(), config: config.clone(), bopts: bopts.clone(), opts: opts.clone(), clock };
        let Made { mut backend, gpus, parts, self_test } = maker.make().await?;
        let sched_cfg = SchedConfig { max_batch_tokens: bopts.max_batch_tokens, max_seqs, n_ctx };
        let draft = match draft_file {
            Some((draft_file, draft_config)) => {
                // Its KV pool holds as many positions as the target's.
                let kv_budget_bytes = kv_budget_bytes.map(|b| b / kv_bytes_per_position.max(1) * kv_bytes_per_pos(&draft_config, opts));
                let bopts = BackendOptions { max_outputs: max_seqs, kv_budget_bytes, ..bopts.clone() };
                // On the first device named, whole.
                let device = opts.device.as_ref().and_then(|d| d.split(',').next()).map(|d| d.trim().to_string());
                let draft_opts = LoadOptions { self_test: false, device, split: SplitOptions::default(), ..opts.clone() };
                let maker = BackendMaker { file: Arc::new(draft_file), config: draft_config, bopts, opts: draft_opts, clock };
                let draft_backend = maker.make().await?.backend;
                let rebuild: draft::RebuildDraft = Box::new(move || {
                    let maker = maker.clone();
                    Box::pin(async move { maker.make().await.map(|m| m.backend) })
                });
                let mut model = draft::DraftModel::new(draft_backend, sched_cfg, config.n_vocab, opts.draft_p_min, rebuild)?;
                model.link(backend.as_mut(), max_seqs, spec.draft_max).await?;
                Some(model)
            }
            None => None,
        };
        let adapter_name = if gpus.is_empty() { "cpu".to_string() } else { gpus.iter().map(|g| g.adapter_name()).collect::<Vec<_>>().join(" + ") };
        let memory = MemoryPlan::of(&file, &config, &bopts, backend.kv_layout());
        let mut sched = Scheduler::new(sched_cfg, KvCache::new(backend.kv_layout().clone()))?;
        sched.set_draft_rows(draft_rows);
        let info = EngineInfo {
            tokenizer: tokenizer.clone(),
            template,
            n_ctx,
            max_seqs,
            backend_name: backend.name(),
            adapter_name,
            parts,
            architecture: file_text(&file, "general.architecture"),
            name: file_text(&file, "general.name"),
            weight_bytes: weight_bytes(&file, &config),
            kv_bytes_per_position,
            memory,
            config,
            self_test,
            gpus: gpus.clone(),
            clock,
            spec,
            constrainer: Default::default(),
        };
        let (tx, rx) = mpsc::unbounded();
        // The loop keeps the file (and its memory map) alive with the backend.
        // After a lost device the loop opens a new one and loads the weights again.
        let rebuild: runner::Rebuild = Box::new(move || {
            let maker = maker.clone();
            Box::pin(async move { maker.make().await.map(|m| (m.backend, m.gpus)) })
        });
        let mut runner = Runner::new(backend, gpus, rebuild, sched, tokenizer, info.clock, n_ctx, spec, draft);
        runner.overlap = opts.overlap;
        let run: RunLoop = Box::pin(async move {
            let _file = file;
            runner.run(rx).await;
        });
        let engine = Engine {
            commands: tx,
            info: Arc::new(info),
            next_id: AtomicU64::new(1),
            #[cfg(not(target_arch = "wasm32"))]
            thread: None,
        };
        Ok((engine, run))
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }
    pub fn config(&self) -> &ModelConfig {
        &self.info.config
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.info.tokenizer
    }
    /// The tokenizer, for callers that decode on their own.
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        self.info.tokenizer.clone()
    }
    pub fn has_chat_template(&self) -> bool {
        self.info.template.is_some()
    }
    pub fn backend_name(&self) -> String {
        self.info.backend_name.clone()
    }
    pub fn adapter_name(&self) -> String {
        self.info.adapter_name.clone()
    }
    pub fn n_ctx(&self) -> usize {
        self.info.n_ctx
    }

    /// Tokenizes a raw prompt: special tokens parsed, BOS as the model's metadata says.
    pub fn tokenize_raw(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let t = &self.info.tokenizer;
        Ok(t.encode(text, t.add_bos_default(), true)?)
    }

    /// Renders chat messages with the chat template (ending with the assistant's turn) and
    /// tokenizes them, as a chat request would.
    pub fn tokenize_chat(&self, messages: &[serde_json::Value]) -> Result<Vec<u32>, EngineError> {
        request::chat_tokens(&self.info.tokenizer, self.info.template.as_ref(), messages, true)
    }

    /// Renders chat messages with the chat template, as a request would.
    pub fn apply_chat_template(&self, messages: &[serde_json::Value], add_generation_prompt: bool) -> Result<String, EngineError> {
        request::render(self.info.template.as_ref(), messages, add_generation_prompt)
    }

    /// Validates `req`, queues it and returns its stream of events (one `Done` per choice
    /// ends it). Dropping the handle cancels the request.
    pub fn submit(&self, req: Request) -> Result<RequestHandle, EngineError> {
        let now = (self.info.clock)();
        let sizes = (self.info.n_ctx, self.info.config.n_vocab);
        let prepared = request::prepare(req, &self.info, sizes, self.info.spec.drafts(), now)?;
        let n_choices = prepared.choices.len();
        let prompt_tokens = prepared.prompt.len();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded();
        self.commands.unbounded_send(Command::Submit { id, prepared, events: tx }).map_err(|_| EngineError::Closed)?;
        Ok(RequestHandle::new(id, rx, self.commands.clone(), n_choices, prompt_tokens))
    }

    /// Ends every running request with `finish_reason: abort`.
    pub fn cancel_all(&self) {
        let _ = self.commands.unbounded_send(Command::CancelAll);
    }

    /// Drops every cached prefix that no running request holds (a new conversation).
    /// Compiles `c`'s grammar for this model without running anything: a front end that
    /// holds every reply to one grammar refuses a bad one before the first request.
    pub fn check_constraint(&self, c: &Constrained) -> Result<(), EngineError> {
        let fail = |source| EngineError::Constraint { field: c.field, source };
        self.info.constrainer().map_err(fail)?.constraint(&c.grammar, self.info.config.n_vocab).map_err(fail).map(drop)
    }

    pub fn clear_cache(&self) {
        let _ = self.commands.unbounded_send(Command::ClearCache);
    }

    /// The scheduler's counters (steps, preemptions, running and waiting sequences).
    pub async fn stats(&self) -> Result<SchedStats, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands.unbounded_send(Command::Stats(tx)).map_err(|_| EngineError::Closed)?;
        rx.await.map_err(|_| EngineError::Closed)
    }

    /// Resolves once no request runs or waits (benchmarks wait for traffic to end).
    pub async fn when_idle(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands.unbounded_send(Command::WhenIdle(tx)).map_err(|_| EngineError::Closed)?;
        rx.await.map_err(|_| EngineError::Closed)
    }

    /// Last-position logits after `prompt` (tests and tools; a full readback).
    pub async fn prompt_logits(&self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let params = GenerateParams { max_tokens: Some(1), sampling: SamplingParams::greedy(), ignore_eos: true, ..Default::default() };
        let mut req = Request::new(Input::Tokens(prompt.to_vec()), params);
        req.logits = true;
        let mut h = self.submit(req)?;
        while let Some(ev) = futures::StreamExt::next(&mut h).await {
            if let Event::Token { logits: Some(l), .. } = ev? {
                return Ok(l);
            }
        }
        Err(EngineError::Closed)
    }

    /// Per-op GPU timings (label, ns) of a prefill step of `prompt` and of decode steps of
    /// each size in `decode_sizes` (that many sequences), run once the engine is idle.
    pub async fn profile(&self, prompt: &[u32], decode_sizes: &[usize]) -> Result<(OpTimes, Vec<OpTimes>), EngineError> {
        let (tx, rx) = oneshot::channel();
        let cmd = Command::Profile { prompt: prompt.to_vec(), decode_sizes: decode_sizes.to_vec(), reply: tx };
        self.commands.unbounded_send(cmd).map_err(|_| EngineError::Closed)?;
        rx.await.map_err(|_| EngineError::Closed)?
    }

    /// Runs, once idle, one step of each kind traffic will (a prompt, decodes of 1 to
    /// `max_seqs` sequences), so that kernels an adapter compiles at first use (lavapipe and
    /// browsers do) are compiled before the first request waits on them.
    pub async fn warm_up(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands.unbounded_send(Command::WarmUp(tx)).map_err(|_| EngineError::Closed)?;
        rx.await.map_err(|_| EngineError::Closed)?
    }

    /// Fault injection (tests, drills): destroys the GPU device between two steps, as a driver
    /// reset would. Running requests end with the typed device-lost error; the next request
    /// opens a new device and loads the weights again. Nothing happens on the CPU backend.
    pub fn lose_device(&self) {
        self.lose_device_of(0);
    }

    /// [`Engine::lose_device`] for the device of part `part` of a model split over several
    /// (see [`EngineInfo::parts`]).
    pub fn lose_device_of(&self, part: usize) {
        let _ = self.commands.unbounded_send(Command::LoseDevice(part));
    }

    /// Once no request runs or waits: a new backend (on a new device when the old one was
    /// lost) with the weights loaded again. After a lost device the next request does this by
    /// itself; `reload` does it now.
    pub async fn reload(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands.unbounded_send(Command::Reload(tx)).map_err(|_| EngineError::Closed)?;
        rx.await.map_err(|_| EngineError::Closed)?
    }

    /// The device's buffer-copy bandwidth (GB/s, bytes read + written), measured now.
    pub async fn copy_bandwidth_gbs(&self) -> Result<f64, EngineError> {
        match self.info.gpus.first() {
            Some(ctx) => Ok(flint_gpu::bench::copy_bandwidth_gbs(ctx, self.info.clock).await?),
            None => Ok(bench::host_copy_bandwidth_gbs(self.info.clock)),
        }
    }

    /// What each boundary of a layer split costs the host for a micro-batch of `rows`
    /// tokens (milliseconds, median of `reps`; see [`flint_gpu::bench::boundary_copy_ms`]),
    /// one figure per boundary; empty when the model runs on one device.
    pub async fn boundary_copy_ms(&self, rows: usize, reps: usize) -> Result<Vec<f64>, EngineError> {
        let bytes = (rows * self.info.config.n_embd * 4) as u64;
        let mut out = Vec::new();
        for pair in self.info.gpus.windows(2) {
            out.push(flint_gpu::bench::boundary_copy_ms(&pair[0], &pair[1], bytes, reps, self.info.clock).await?);
        }
        Ok(out)
    }

    /// Bytes a decode step must read at context length `n_ctx`: every weight matrix the step
    /// multiplies by plus the KV cache.
    pub fn bytes_per_decode_token(&self, n_ctx: usize) -> u64 {
        self.info.weight_bytes + self.info.kv_bytes_per_position * n_ctx as u64
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the channel ends the loop once its requests are gone.
        self.commands.close_channel();
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The chat template a load with `opts` uses: `opts.chat_template`, else the file's.
fn chat_template(file: &GgufFile, tokenizer: &Tokenizer, opts: &LoadOptions) -> Result<Option<ChatTemplate>, EngineError> {
    let bos = tokenizer.bos_id().and_then(|id| tokenizer.token_text(id)).unwrap_or("").to_string();
    let eos = tokenizer.eos_id().and_then(|id| tokenizer.token_text(id)).unwrap_or("").to_string();
    let template = match &opts.chat_template {
        Some(src) => Some(ChatTemplate::new(src, &bos, &eos)?),
        None => ChatTemplate::from_metadata(&file.metadata, tokenizer)?,
    };
    Ok(template.map(|t| match opts.template_clock {
        Some(c) => t.with_clock(c),
        None => t,
    }))
}
