//! Flint's engine facade: load a model, run requests, stream token events. The CLI uses it
//! now; the wasm bindings and the server use the same API.

mod bench;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::stream::{LocalBoxStream, StreamExt};
use thiserror::Error;

pub use flint_core::arch::{ArchError, ModelConfig};
pub use flint_core::backend::{Backend, BackendError};
pub use flint_core::generate::{Event, FinishReason, GenerateError, GenerateParams, Summary, TokenLogprobs};
pub use flint_core::gguf::{GgufError, GgufFile};
pub use flint_core::sampling::{SamplingError, SamplingParams};
pub use flint_core::tokenizer::{Tokenizer, TokenizerError};

use flint_core::generate::{default_clock, Clock, Generation};
use flint_core::reference::CpuBackend;
use flint_core::sampling::Sampler;
use flint_gpu::backend::GpuBackend;
use flint_gpu::GpuContext;

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
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Gpu(#[from] flint_gpu::GpuError),
}

/// Which compute backend runs the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// WGSL kernels through wgpu (`flint-gpu`): the default.
    Gpu,
    /// The plain CPU reference (`flint-core::reference`).
    Cpu,
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    /// Context size in tokens; 0 = the model's training context.
    pub n_ctx: usize,
    /// Caps each GPU weight buffer below the device's binding limit (MB); the
    /// `FLINT_MAX_BINDING_MB` environment variable does the same.
    pub max_binding_mb: Option<u64>,
    /// GPU memory for the KV cache (MB): the context's blocks and, in what is left, earlier
    /// requests' blocks for prefix reuse, evicted least recently used first. Never less than
    /// the context needs; None = the context plus a quarter. The CPU backend ignores it.
    pub kv_budget_mb: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { backend: BackendKind::Gpu, n_ctx: DEFAULT_CTX, max_binding_mb: None, kv_budget_mb: None }
    }
}

/// Timings of one benchmark repetition, in seconds.
pub struct BenchRun {
    pub ttft_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tok_s: f64,
    /// Generated tokens per second of decode.
    pub decode_tok_s: f64,
}

fn host_copy_bandwidth_gbs(clock: Clock) -> f64 {
    const BYTES: usize = 256 << 20;
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    let t0 = clock();
    dst.copy_from_slice(&src);
    let ms = clock() - t0;
    std::hint::black_box(&dst);
    if ms > 0.0 { 2.0 * BYTES as f64 / (ms * 1e6) } else { 0.0 }
}

/// llama.cpp's default context size.
pub const DEFAULT_CTX: usize = 4096;

/// A loaded model ready to run requests.
pub struct Engine {
    gpu: Option<Arc<GpuContext>>,
    file: Arc<GgufFile>,
    tokenizer: Arc<Tokenizer>,
    backend: Box<dyn Backend>,
    /// Tokens whose KV the backend holds, for prefix reuse by the next request.
    cached: Vec<u32>,
    clock: Clock,
}

impl Engine {
    /// Opens a model file on disk (memory-mapped) and builds the backend.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_path(path: &std::path::Path, opts: &LoadOptions) -> Result<Engine, EngineError> {
        let file = GgufFile::open(path)?;
        futures::executor::block_on(Self::load(file, opts))
    }

    /// Validates a parsed file (architecture, tensor shapes, tokenizer) and builds the backend.
    pub async fn load(file: GgufFile, opts: &LoadOptions) -> Result<Engine, EngineError> {
        let config = ModelConfig::from_gguf(&file)?;
        let tokenizer = Arc::new(Tokenizer::from_metadata(&file.metadata)?);
        let file = Arc::new(file);
        let n_ctx = if opts.n_ctx == 0 { config.n_ctx_train } else { opts.n_ctx };
        let (backend, gpu): (Box<dyn Backend>, _) = match opts.backend {
            BackendKind::Cpu => (Box::new(CpuBackend::new(file.clone(), config, n_ctx).await?), None),
            BackendKind::Gpu => {
                let ctx = Arc::new(GpuContext::new().await?);
                let kv_budget = opts.kv_budget_mb.map(|mb| mb.saturating_mul(1 << 20));
                let gpu = GpuBackend::with_kv_budget(ctx.clone(), &file, config, n_ctx, opts.max_binding_mb, kv_budget).await?;
                (Box::new(gpu), Some(ctx))
            }
        };
        Ok(Engine { gpu, file, tokenizer, backend, cached: Vec::new(), clock: default_clock })
    }

    /// Replaces the clock used for timings (wasm passes `performance.now`).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }
    pub fn config(&self) -> &ModelConfig {
        self.backend.config()
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// The tokenizer, for callers that decode while a request holds the engine.
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        self.tokenizer.clone()
    }
    /// The backend itself, for tools and tests that drive it step by step.
    pub fn backend_mut(&mut self) -> &mut dyn Backend {
        // Whatever the caller runs, the record of cached tokens no longer holds.
        self.cached.clear();
        self.backend.as_mut()
    }

    /// Drops every cached position, the prefix index's blocks included, so their memory is
    /// free again (a new conversation; `resetChat`, `/clear`).
    pub fn reset(&mut self) {
        self.cached.clear();
        self.backend.clear_cache();
    }

    pub fn backend_name(&self) -> String {
        self.backend.name()
    }
    pub fn n_ctx(&self) -> usize {
        self.backend.n_ctx()
    }

    /// The GPU adapter's description, or `cpu`.
    pub fn adapter_name(&self) -> String {
        self.gpu.as_ref().map_or_else(|| "cpu".to_string(), |g| g.adapter_name())
    }

    /// One benchmark repetition from an empty cache: prefill `prompt`, then `n_gen` greedy
    /// decode steps (end-of-generation tokens are not honoured, so every rep does equal work).
    pub async fn bench_once(&mut self, prompt: &[u32], n_gen: usize) -> Result<BenchRun, EngineError> {
        let clock = self.clock;
        let mut sampler = Sampler::new(SamplingParams::greedy()).map_err(GenerateError::from)?;
        self.reset();
        let t0 = clock();
        let mut tok = self.backend.forward_sample(prompt, &mut sampler).await?.id;
        let t1 = clock();
        for _ in 0..n_gen {
            tok = self.backend.forward_sample(std::slice::from_ref(&tok), &mut sampler).await?.id;
        }
        let t2 = clock();
        let (prefill_s, decode_s) = ((t1 - t0) / 1e3, (t2 - t1) / 1e3);
        Ok(BenchRun {
            ttft_s: prefill_s,
            prefill_s,
            decode_s,
            prefill_tok_s: prompt.len() as f64 / prefill_s,
            decode_tok_s: n_gen as f64 / decode_s,
        })
    }

    /// The device's buffer-copy bandwidth (GB/s, bytes read + written), measured now.
    pub async fn copy_bandwidth_gbs(&self) -> Result<f64, EngineError> {
        match &self.gpu {
            Some(ctx) => Ok(flint_gpu::bench::copy_bandwidth_gbs(ctx, self.clock).await?),
            None => Ok(host_copy_bandwidth_gbs(self.clock)),
        }
    }

    /// Bytes a decode step must read at context length `n_ctx`: every weight matrix the step
    /// multiplies by (the embedding table only when it is also the output) plus the KV cache.
    pub fn bytes_per_decode_token(&self, n_ctx: usize) -> u64 {
        let cfg = self.config();
        let mut bytes = 0;
        for t in &self.file.tensors {
            let embd_lookup_only = t.name == "token_embd.weight" && !cfg.tied_output;
            if !embd_lookup_only {
                bytes += t.n_bytes;
            }
        }
        let kv_per_pos = (cfg.kv_dim() + cfg.v_dim()) as u64 * 4 * cfg.n_layer as u64;
        bytes + kv_per_pos * n_ctx as u64
    }

    /// Tokenizes a raw prompt: special tokens parsed, BOS as the model's metadata says.
    pub fn tokenize_raw(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode(text, self.tokenizer.add_bos_default(), true)?)
    }

    /// Logits of the last prompt position (for tests and tools), from an empty cache.
    pub async fn prompt_logits(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.reset();
        Ok(self.backend.forward(prompt).await?)
    }

    /// Streams the completion of `prompt`; fails before any work if the request cannot run.
    pub fn generate(
        &mut self,
        prompt: Vec<u32>,
        params: GenerateParams,
        abort: Arc<AtomicBool>,
    ) -> Result<LocalBoxStream<'_, Result<Event, GenerateError>>, EngineError> {
        let generation =
            Generation::new(self.backend.as_mut(), &self.tokenizer, &mut self.cached, prompt, params, abort, self.clock)?;
        Ok(futures::stream::unfold(generation, |mut g| async move { g.next_event().await.map(|e| (e, g)) }).boxed_local())
    }
}
