//! Building a model's backend: the devices `LoadOptions` name opened, the layers planned over
//! them, the backend made and self-tested (at load, and again after a lost device); and the
//! facts of a model file the load reads before any weight.

use std::sync::Arc;

use flint_core::backend::{Backend, BackendError, BackendOptions};
use flint_core::generate::Clock;
use flint_core::kv::KvLayout;
use flint_core::reference::CpuBackend;
use flint_gpu::backend::GpuBackend;
use flint_gpu::split::{split_layout, Costs, SplitBackend, SplitRule};
use flint_gpu::GpuContext;

use crate::error::DraftError;
#[cfg(not(target_arch = "wasm32"))]
use crate::GgufError;
use crate::{selftest, BackendKind, EngineError, GgufFile, LoadOptions, ModelConfig, ModelPart, SelfTestReport, SpecConfig, SpecKind, Tokenizer};

/// Builds the backend `LoadOptions` ask for: at load, and again after the device is lost.
#[derive(Clone)]
pub(crate) struct BackendMaker {
    pub(crate) file: Arc<GgufFile>,
    pub(crate) config: ModelConfig,
    pub(crate) bopts: BackendOptions,
    pub(crate) opts: LoadOptions,
    pub(crate) clock: Clock,
}

pub(crate) struct Made {
    pub(crate) backend: Box<dyn Backend>,
    /// Its devices, in layer order.
    pub(crate) gpus: Vec<Arc<GpuContext>>,
    pub(crate) parts: Vec<ModelPart>,
    pub(crate) self_test: Option<SelfTestReport>,
}

impl BackendMaker {
    /// The backend on the process's device (opened again if it was lost), self-tested when
    /// asked.
    pub(crate) async fn make(&self) -> Result<Made, EngineError> {
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
                Some(selftest::run(backend.as_mut(), file.clone(), config, &self.bopts, &adapter, self.clock).await?)
            }
            _ => None,
        };
        Ok(Made { backend, gpus, parts, self_test })
    }

    /// The KV layout [`BackendMaker::make`] would build, refused as it refuses it, without a
    /// weight read: on the GPU the devices open, the plan fits their budgets and the KV cache
    /// their buffers.
    pub(crate) async fn check(&self) -> Result<KvLayout, EngineError> {
        let n_ctx = self.bopts.n_ctx.clamp(1, self.config.n_ctx_train);
        match self.opts.backend {
            BackendKind::Cpu => Ok(KvLayout::plan(&self.config, &self.bopts.pool_request(n_ctx, u64::MAX)).map_err(BackendError::from)?),
            BackendKind::Gpu => {
                let ctxs = self.open_devices().await?;
                let used: Vec<Arc<GpuContext>> = self.plan(&ctxs)?.iter().map(|(d, _)| ctxs[*d].clone()).collect();
                // The layout the loaders plan: for the devices' smallest binding.
                Ok(split_layout(&used, &self.config, &self.bopts)?)
            }
        }
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
        Ok(flint_gpu::split::plan(&costs, ctxs.len(), &rule)?)
    }
}

pub(crate) fn file_text(file: &GgufFile, key: &str) -> Option<String> {
    file.metadata.opt_str(key).ok().flatten().map(str::to_string)
}

/// Checks that the draft model `file` (`model`: its path, or empty) may draft for a model of
/// `tokenizer`: its architecture and its vocabulary (llama.cpp's rules), before any weight is
/// loaded. Speculation becomes the draft model's.
pub(crate) fn open_draft(mut file: GgufFile, model: &str, tokenizer: &Tokenizer, spec: &mut SpecConfig) -> Result<(GgufFile, ModelConfig), EngineError> {
    let checked = (|| {
        if spec.kind == SpecKind::Ngram {
            return Err(DraftError::TwoDrafters);
        }
        let config = ModelConfig::from_gguf(&file).and_then(|c| c.unfuse(&mut file))?;
        let draft = Tokenizer::from_metadata(&file.metadata)?;
        tokenizer.draft_compatible(&draft)?;
        Ok(config)
    })();
    let config = checked.map_err(|source| EngineError::Draft { model: model.to_string(), source })?;
    spec.kind = SpecKind::Draft;
    Ok((file, config))
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn draft_error(path: &std::path::Path, e: GgufError) -> EngineError {
    EngineError::Draft { model: path.display().to_string(), source: DraftError::Gguf(e) }
}

/// The backend options a load with `opts` gives a model of `config` speculating as `spec`.
pub(crate) fn backend_options(config: &ModelConfig, opts: &LoadOptions, spec: &SpecConfig) -> BackendOptions {
    let n_ctx = if opts.n_ctx == 0 { config.n_ctx_train } else { opts.n_ctx }.clamp(1, config.n_ctx_train);
    let kv_budget_bytes = match (opts.kv_budget_mb, opts.kv_budget_positions) {
        (Some(mb), _) => Some(mb.saturating_mul(1 << 20)),
        (None, Some(p)) => Some((p as u64).saturating_mul(kv_bytes_per_pos(config, opts))),
        (None, None) => None,
    };
    let max_seqs = opts.max_seqs.max(1);
    // An output row per drafted token a step may verify.
    let max_outputs = max_seqs + spec.draft_rows(max_seqs);
    BackendOptions {
        n_ctx,
        max_seqs,
        max_batch_tokens: opts.max_batch_tokens.max(1),
        max_outputs,
        kv_budget_bytes,
        cache_k: opts.cache_k,
        cache_v: opts.cache_v,
        exact: opts.exact,
    }
}

/// What `file` would allocate loaded with `opts`, from its header alone (`flint info`): the
/// KV pool laid out for buffers of at most `--max-binding-mb` (default: unbounded), a draft
/// model's memory not included.
pub fn memory_plan(file: &GgufFile, opts: &LoadOptions) -> Result<crate::MemoryPlan, EngineError> {
    let config = ModelConfig::from_gguf(file)?;
    let bopts = backend_options(&config, opts, &opts.spec);
    let max_binding = opts.max_binding_mb.map_or(u64::MAX, |mb| mb.saturating_mul(1 << 20));
    let layout = flint_gpu::model::plan_kv(&config, &bopts, max_binding)?;
    Ok(crate::MemoryPlan::of(file, &config, &bopts, &layout))
}

/// KV bytes per position: every layer's K and V, stored as `opts` says.
pub(crate) fn kv_bytes_per_pos(cfg: &ModelConfig, opts: &LoadOptions) -> u64 {
    cfg.n_layer as u64 * flint_core::kv::layout::row_bytes(cfg, opts.cache_k, opts.cache_v)
}

pub(crate) fn weight_bytes(file: &GgufFile, cfg: &ModelConfig) -> u64 {
    file.tensors.iter().filter(|t| t.name != "token_embd.weight" || cfg.tied_output).map(|t| t.n_bytes).sum()
}
