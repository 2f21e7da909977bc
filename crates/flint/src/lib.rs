//! Flint's engine: load a model, `submit` requests from any thread, read each request's
//! stream of events. An owned run loop drives the scheduler and the backend, serving every
//! active request in each forward step (continuous batching). Natively the loop runs on the
//! engine's own thread (the backend is not `Send`) fed by a channel; in the browser the same
//! loop runs on the event loop (`Engine::load_local`). The CLI, the server and the wasm
//! bindings use this API and nothing below it.

mod bench;
mod draft;
pub mod openai;
mod request;
mod runner;
mod selftest;

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::channel::{mpsc, oneshot};
use futures::Stream;
use thiserror::Error;

pub use bench::{BenchRun, SpecRun, StreamRun};
pub use flint_core::arch::{ArchError, ModelConfig};
pub use flint_core::backend::BackendError;
pub use flint_core::chat::{ChatError, ChatTemplate, KEY_CHAT_TEMPLATE};
pub use flint_core::generate::{Event, FinishReason, GenerateError, GenerateParams, Summary, TokenLogprobs};
pub use flint_core::gguf::{GgufError, GgufFile};
pub use flint_core::kv::KvError;
pub use flint_core::sampling::{SamplingError, SamplingParams};
pub use flint_core::sched::{BlockCounts, Histogram, SchedError, SchedStats};
pub use flint_core::selftest::{SelfTestError, TapReport};
pub use flint_core::tokenizer::{Tokenizer, TokenizerError};
/// The GPU adapters wgpu finds (native), as `--device` indexes and names them.
#[cfg(not(target_arch = "wasm32"))]
pub use flint_gpu::context::{adapters as gpu_adapters, AdapterEntry};
pub use flint_gpu::pipeline::CompileEvent;
pub use flint_gpu::GpuError;
pub use request::{Input, Request, MAX_N};
pub use runner::{EventResult, OpTimes};
pub use selftest::SelfTestReport;

use flint_core::backend::{Backend, BackendOptions};
use flint_core::generate::{default_clock, Clock};
use flint_core::kv::KvCache;
use flint_core::reference::CpuBackend;
use flint_core::sched::{SchedConfig, Scheduler};
pub use flint_core::spec::{SpecConfig, SpecKind, DRAFT_MAX, DRAFT_P_MIN};
use flint_gpu::backend::GpuBackend;
use flint_gpu::split::{split_layout, Costs, SplitBackend, SplitRule};
use flint_gpu::GpuContext;
use runner::{Command, Runner};

#[derive(Debug, Error)]
pub enum EngineError {
    #[error("malformed model file: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported or inconsistent model: {0}")]
    Arch(#[from] ArchError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A forward step failed; every request running then gets this (device lost, ...).
    #[error("{0}")]
    Step(Arc<BackendError>),
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error("this model has no chat template (a base model): give a prompt instead, or a chat template")]
    NoChatTemplate,
    #[error(transparent)]
    Gpu(#[from] flint_gpu::GpuError),
    /// The load-time self-test found the GPU computing differently from the CPU reference.
    #[error("the GPU self-test failed on {adapter}: {error}; this adapter's driver computes the model wrongly")]
    SelfTest { adapter: String, error: SelfTestError },
    #[error("the engine has stopped")]
    Closed,
    #[error("invalid settings: {0}")]
    Config(String),
}

impl EngineError {
    /// The backend error underneath, if any (a step's or a load's).
    pub fn backend(&self) -> Option<&BackendError> {
        match self {
            EngineError::Backend(b) | EngineError::Generate(GenerateError::Backend(b)) => Some(b),
            EngineError::Step(b) => Some(b),
            _ => None,
        }
    }
}

/// Which compute backend runs the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// WGSL kernels through wgpu (`flint-gpu`): the default.
    Gpu,
    /// The plain CPU reference (`flint-core::reference`).
    Cpu,
}

/// llama.cpp's default context size.
pub const DEFAULT_CTX: usize = 4096;
/// Sequences running at once, natively and in the browser.
#[cfg(not(target_arch = "wasm32"))]
pub const DEFAULT_MAX_SEQS: usize = 8;
#[cfg(target_arch = "wasm32")]
pub const DEFAULT_MAX_SEQS: usize = 4;
/// Tokens one step runs, all sequences together.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 256;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    /// The GPU adapter (native): an index or a case-insensitive name substring, as
    /// `flint devices` lists them; None = `FLINT_ADAPTER`, else the best adapter. Several,
    /// comma-separated (`0,1`; one adapter may be named twice), split the model's layers over
    /// them as `split` says.
    pub device: Option<String>,
    /// How a model is split over several devices (native).
    pub split: SplitOptions,
    /// The most tokens one sequence holds; 0 = the model's training context.
    pub n_ctx: usize,
    /// Caps each GPU weight buffer below the device's binding limit (MB); the
    /// `FLINT_MAX_BINDING_MB` environment variable does the same.
    pub max_binding_mb: Option<u64>,
    /// KV memory (MB) shared by every sequence: running ones and cached prefixes of earlier
    /// ones (evicted least recently used first). It must hold one whole context (an error
    /// otherwise); None = one context plus a quarter.
    pub kv_budget_mb: Option<u64>,
    /// KV memory as a number of positions of every layer (an alternative to `kv_budget_mb`,
    /// which wins when both are set).
    pub kv_budget_positions: Option<usize>,
    /// Sequences running at once (requests' choices included).
    pub max_seqs: usize,
    /// Tokens one step runs, decodes and prompt chunks together.
    pub max_batch_tokens: usize,
    /// A Jinja chat template to use instead of the model's.
    pub chat_template: Option<String>,
    /// Where chat templates read the time (`strftime_now`); wasm has no system clock.
    pub template_clock: Option<flint_core::chat::Clock>,
    /// Milliseconds from any fixed origin, for timings (TTFT, tok/s) and the benchmark; None =
    /// the process's monotonic clock (on wasm, which has none, every timing reads 0).
    pub clock: Option<Clock>,
    /// Told of every GPU kernel compile from the load on (the device's pipeline cache is
    /// shared, so the last engine loaded sets it): a first run on a device compiles for long.
    pub compile_observer: Option<CompileProgress>,
    /// Runs the self-test at load (GPU backend): a short fixed input through layer 0 and the
    /// head on the GPU and on the CPU reference; a mismatch fails the load.
    pub self_test: bool,
    /// Speculative decoding (`--spec-type ngram`): drafts verified in the batched step; the
    /// tokens are exactly those of decoding without it, greedy or seeded.
    pub spec: SpecConfig,
    /// A draft model (`--model-draft`, native): a smaller model with this one's vocabulary,
    /// loaded on the same device, drafts for every request (speculation kind `Draft`).
    pub draft_model: Option<std::path::PathBuf>,
    /// The draft model stops drafting where its top probability falls below this.
    pub draft_p_min: f32,
}

/// How a model named on several devices runs (llama.cpp's `-sm`, `-ts`; `--device-mem-mb`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitOptions {
    /// `-sm none`: only the first device named runs the model.
    pub none: bool,
    /// Layer proportions per device (`-ts 3,1`); None = equal, or by the budgets.
    pub tensor_split: Option<Vec<f32>>,
    /// Each device's memory budget in MB (wgpu reports no memory size): the model goes on
    /// the first device when it fits there, else its layers are spread over the devices; a
    /// model that fits none of them together is refused with what it needs.
    pub device_mem_mb: Option<Vec<u64>>,
}

/// A range of a model's layers and the device it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPart {
    pub adapter: String,
    pub layers: std::ops::Range<usize>,
}

/// A [`CompileObserver`](flint_gpu::pipeline::CompileObserver) in [`LoadOptions`].
#[derive(Clone)]
pub struct CompileProgress(pub flint_gpu::pipeline::CompileObserver);

impl std::fmt::Debug for CompileProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompileProgress")
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: BackendKind::Gpu,
            device: None,
            split: SplitOptions::default(),
            n_ctx: DEFAULT_CTX,
            max_binding_mb: None,
            kv_budget_mb: None,
            kv_budget_positions: None,
            max_seqs: DEFAULT_MAX_SEQS,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            chat_template: None,
            template_clock: None,
            clock: None,
            compile_observer: None,
            self_test: false,
            spec: SpecConfig::default(),
            draft_model: None,
            draft_p_min: DRAFT_P_MIN,
        }
    }
}

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
    /// The load-time self-test's result, when it ran.
    pub self_test: Option<SelfTestReport>,
    /// The speculation settings it was loaded with.
    pub spec: SpecConfig,
    /// The devices, in layer order (the copy bandwidth is the first's, measured on request).
    gpus: Vec<Arc<GpuContext>>,
    clock: Clock,
}

/// Builds the backend `LoadOptions` ask for: at load, and again after the device is lost.
#[derive(Clone)]
struct BackendMaker {
    file: Arc<GgufFile>,
    config: ModelConfig,
    bopts: BackendOptions,
    opts: LoadOptions,
    clock: Clock,
}

struct Made {
    backend: Box<dyn Backend>,
    /// Its devices, in layer order.
    gpus: Vec<Arc<GpuContext>>,
    parts: Vec<ModelPart>,
    self_test: Option<SelfTestReport>,
}

impl BackendMaker {
    /// The backend on the process's device (opened again if it was lost), self-tested when
    /// asked.
    async fn make(&self) -> Result<Made, EngineError> {
        let (file, config, opts) = (&self.file, &self.config, &self.opts);
        let (mut backend, gpus, parts): (Box<dyn Backend>, _, _) = match opts.backend {
            BackendKind::Cpu => (Box::new(CpuBackend::new(file.clone(), config.clone(), &self.bopts).await?), Vec::new(), Vec::new()),
            BackendKind::Gpu => {
                let ctxs = self.open_devices().await?;
                let plan = self.plan(&ctxs)?;
                let ctxs: Vec<Arc<GpuContext>> = plan.iter().map(|(d, _)| ctxs[*d].clone()).collect();
                let ranges: Vec<std::ops::Range<usize>> = plan.into_iter().map(|(_, r)| r).collect();
                let parts = ctxs.iter().zip(&ranges).map(|(c, r)| ModelPart { adapter: c.adapter_name(), layers: r.clone() }).collect();
                let backend: Box<dyn Backend> = match ctxs.len() {
                    1 => Box::new(GpuBackend::new(ctxs[0].clone(), file, config.clone(), &self.bopts, opts.max_binding_mb).await?),
                    _ => Box::new(SplitBackend::new(&ctxs, file, config.clone(), &self.bopts, opts.max_binding_mb, &ranges).await?),
                };
                (backend, ctxs, parts)
            }
        };
        let self_test = match (opts.self_test, gpus.is_empty()) {
            (true, false) => {
                let adapter = gpus.iter().map(|g| g.adapter_name()).collect::<Vec<_>>().join(" + ");
                Some(selftest::run(backend.as_mut(), file.clone(), config, &adapter, self.clock).await?)
            }
            _ => None,
        };
        Ok(Made { backend, gpus, parts, self_test })
    }

    /// The devices `opts.device` names (one adapter named twice: two devices of it), each
    /// kept for the process; in the browser, a device of its own.
    async fn open_devices(&self) -> Result<Vec<Arc<GpuContext>>, EngineError> {
        let opts = &self.opts;
        #[cfg(not(target_arch = "wasm32"))]
        let ctxs = {
            let names: Vec<Option<&str>> = match &opts.device {
                Some(d) => d.split(',').map(|n| Some(n.trim())).collect(),
                None => vec![None],
            };
            let names = if opts.split.none { &names[..1] } else { &names[..] };
            let mut ctxs = Vec::with_capacity(names.len());
            for (i, n) in names.iter().enumerate() {
                let nth = names[..i].iter().filter(|m| *m == n).count();
                ctxs.push(GpuContext::shared_nth(*n, nth).await?);
            }
            ctxs
        };
        #[cfg(target_arch = "wasm32")]
        let ctxs = vec![Arc::new(GpuContext::new().await?)];
        for ctx in &ctxs {
            ctx.pipelines.set_observer(opts.compile_observer.as_ref().map(|o| o.0.clone()));
        }
        Ok(ctxs)
    }

    /// The parts the model runs in: (device index in `ctxs`, layers). One part on the
    /// first device unless several are named or budgets are given.
    fn plan(&self, ctxs: &[Arc<GpuContext>]) -> Result<Vec<(usize, std::ops::Range<usize>)>, EngineError> {
        let split = &self.opts.split;
        if ctxs.len() == 1 && split.device_mem_mb.is_none() {
            return Ok(vec![(0, 0..self.config.n_layer)]);
        }
        let budgets = split.device_mem_mb.as_ref().map(|v| v.iter().map(|mb| mb.saturating_mul(1 << 20)).collect());
        let rule = SplitRule { proportions: split.tensor_split.clone(), budgets };
        let layout = split_layout(ctxs, &self.config, &self.bopts)?;
        let b = &self.bopts;
        let limits = flint_core::backend::StepLimits { max_tokens: b.max_batch_tokens, max_seqs: b.max_seqs, max_outputs: b.max_outputs };
        let costs = Costs::of(&self.file, &self.config, &layout, &limits);
        flint_gpu::split::plan(&costs, ctxs.len(), &rule).map_err(EngineError::Config)
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

fn file_text(file: &GgufFile, key: &str) -> Option<String> {
    file.metadata.opt_str(key).ok().flatten().map(str::to_string)
}

/// Checks that the draft model `file` (" PATH" or nothing in messages) may draft for a model of
/// `tokenizer`: its architecture and its vocabulary (llama.cpp's rules), before any weight is
/// loaded. Speculation becomes the draft model's.
fn open_draft(mut file: GgufFile, label: &str, tokenizer: &Tokenizer, spec: &mut SpecConfig) -> Result<(GgufFile, ModelConfig), EngineError> {
    if spec.kind == SpecKind::Ngram {
        return Err(EngineError::Config("--spec-type ngram and a draft model: choose one drafter".into()));
    }
    spec.kind = SpecKind::Draft;
    let bad = |e: String| EngineError::Config(format!("the draft model{label}: {e}"));
    let config = ModelConfig::from_gguf(&file).and_then(|c| c.unfuse(&mut file)).map_err(|e| bad(e.to_string()))?;
    let draft = Tokenizer::from_metadata(&file.metadata).map_err(|e| bad(e.to_string()))?;
    tokenizer.draft_compatible(&draft).map_err(|e| bad(format!("its vocabulary is not this model's: {e}")))?;
    Ok((file, config))
}

#[cfg(not(target_arch = "wasm32"))]
fn draft_error(path: &std::path::Path, e: GgufError) -> EngineError {
    EngineError::Config(format!("the draft model {}: {e}", path.display()))
}

/// KV bytes per position: every layer's K and V, f32.
fn kv_bytes_per_pos(cfg: &ModelConfig) -> u64 {
    (cfg.n_layer * (cfg.kv_dim() + cfg.v_dim()) * 4) as u64
}

fn weight_bytes(file: &GgufFile, cfg: &ModelConfig) -> u64 {
    file.tensors.iter().filter(|t| t.name != "token_embd.weight" || cfg.tied_output).map(|t| t.n_bytes).sum()
}

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
            .map_err(|e| EngineError::Backend(BackendError::Device(format!("cannot start the engine thread: {e}"))))?;
        let mut engine = ready_rx.recv().map_err(|_| EngineError::Closed)??;
        engine.thread = Some(thread);
        Ok(engine)
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
        let config = ModelConfig::from_gguf(&file)?.unfuse(&mut file)?;
        let tokenizer = Arc::new(Tokenizer::from_metadata(&file.metadata)?);
        let bos = tokenizer.bos_id().and_then(|id| tokenizer.token_text(id)).unwrap_or("").to_string();
        let eos = tokenizer.eos_id().and_then(|id| tokenizer.token_text(id)).unwrap_or("").to_string();
        let template = match &opts.chat_template {
            Some(src) => Some(ChatTemplate::new(src, &bos, &eos)?),
            None => ChatTemplate::from_metadata(&file.metadata, &tokenizer)?,
        };
        let template = template.map(|t| match opts.template_clock {
            Some(c) => t.with_clock(c),
            None => t,
        });
        let n_ctx = if opts.n_ctx == 0 { config.n_ctx_train } else { opts.n_ctx }.clamp(1, config.n_ctx_train);
        let kv_bytes_per_position = kv_bytes_per_pos(&config);
        let kv_budget_bytes = match (opts.kv_budget_mb, opts.kv_budget_positions) {
            (Some(mb), _) => Some(mb.saturating_mul(1 << 20)),
            (None, Some(p)) => Some((p as u64).saturating_mul(kv_bytes_per_position)),
            (None, None) => None,
        };
        let max_seqs = opts.max_seqs.max(1);
        let mut spec = opts.spec;
        spec.validate().map_err(EngineError::Config)?;
        // A draft model's file and vocabulary are checked before any weight is loaded.
        let label = opts.draft_model.as_ref().map_or_else(String::new, |p| format!(" {}", p.display()));
        let draft_file = match draft {
            Some(file) => Some(open_draft(file, &label, &tokenizer, &mut spec)?),
            None if opts.draft_model.is_some() => {
                return Err(EngineError::Config("a draft model path is opened by Engine::load_path; give its file to load_local_with_draft".into()))
            }
            None => None,
        };
        // An output row per drafted token a step may verify.
        let draft_rows = spec.draft_rows(max_seqs);
        let max_outputs = max_seqs + draft_rows;
        let bopts = BackendOptions { n_ctx, max_seqs, max_batch_tokens: opts.max_batch_tokens.max(1), max_outputs, kv_budget_bytes };
        let file = Arc::new(file);
        let clock = opts.clock.unwrap_or(default_clock);
        let maker = BackendMaker { file: file.clone(), config: config.clone(), bopts: bopts.clone(), opts: opts.clone(), clock };
        let Made { mut backend, gpus, parts, self_test } = maker.make().await?;
        let sched_cfg = SchedConfig { max_batch_tokens: bopts.max_batch_tokens, max_seqs, n_ctx };
        let draft = match draft_file {
            Some((draft_file, draft_config)) => {
                // Its KV pool holds as many positions as the target's.
                let kv_budget_bytes = kv_budget_bytes.map(|b| b / kv_bytes_per_position.max(1) * kv_bytes_per_pos(&draft_config));
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
            config,
            self_test,
            gpus: gpus.clone(),
            clock,
            spec,
        };
        let (tx, rx) = mpsc::unbounded();
        // The loop keeps the file (and its memory map) alive with the backend.
        // After a lost device the loop opens a new one and loads the weights again.
        let rebuild: runner::Rebuild = Box::new(move || {
            let maker = maker.clone();
            Box::pin(async move { maker.make().await.map(|m| (m.backend, m.gpus)) })
        });
        let runner = Runner::new(backend, gpus, rebuild, sched, tokenizer, info.clock, n_ctx, spec, draft);
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
        let prepared = request::prepare(req, &self.info.tokenizer, self.info.template.as_ref(), sizes, self.info.spec.drafts(), now)?;
        let n_choices = prepared.choices.len();
        let prompt_tokens = prepared.prompt.len();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded();
        self.commands.unbounded_send(Command::Submit { id, prepared, events: tx }).map_err(|_| EngineError::Closed)?;
        Ok(RequestHandle { id, events: rx, commands: self.commands.clone(), remaining: n_choices, prompt_tokens, finished: false })
    }

    /// Ends every running request with `finish_reason: abort`.
    pub fn cancel_all(&self) {
        let _ = self.commands.unbounded_send(Command::CancelAll);
    }

    /// Drops every cached prefix that no running request holds (a new conversation).
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

/// One submitted request: a stream of its events (every choice's tokens, then a `Done` per
/// choice), and its cancellation. Dropping it cancels the request.
pub struct RequestHandle {
    id: u64,
    events: mpsc::UnboundedReceiver<EventResult>,
    commands: mpsc::UnboundedSender<Command>,
    remaining: usize,
    prompt_tokens: usize,
    finished: bool,
}

impl RequestHandle {
    /// Stops the request within one step: its choices end with `abort`, its blocks are freed.
    pub fn cancel(&self) {
        let _ = self.commands.unbounded_send(Command::Cancel(self.id));
    }

    /// A handle that cancels its request from elsewhere (a Ctrl-C handler, a disconnect).
    pub fn canceller(&self) -> Canceller {
        Canceller { id: self.id, commands: self.commands.clone() }
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }
}

/// Cancels one request; cloneable and `Send`.
#[derive(Clone)]
pub struct Canceller {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
}

impl Canceller {
    pub fn cancel(&self) {
        let _ = self.commands.unbounded_send(Command::Cancel(self.id));
    }
}

impl Stream for RequestHandle {
    type Item = EventResult;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<EventResult>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.events).poll_next(cx) {
            Poll::Ready(Some(ev)) => {
                match &ev {
                    Ok(Event::Done { .. }) => {
                        self.remaining = self.remaining.saturating_sub(1);
                        self.finished = self.remaining == 0;
                    }
                    Err(_) => self.finished = true,
                    _ => {}
                }
                Poll::Ready(Some(ev))
            }
            Poll::Ready(None) => {
                self.finished = true;
                Poll::Ready((self.remaining > 0).then_some(Err(EngineError::Closed)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.finished {
            self.cancel();
        }
    }
}
