//! Flint's engine facade: load a model, run requests, stream token events. The CLI uses it
//! now; the wasm bindings and the server use the same API.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use futures::stream::{LocalBoxStream, StreamExt};
use thiserror::Error;

pub use flint_core::arch::{ArchError, ModelConfig};
pub use flint_core::backend::{Backend, BackendError};
pub use flint_core::generate::{Event, FinishReason, GenerateError, GenerateParams, Summary};
pub use flint_core::gguf::{GgufError, GgufFile};
pub use flint_core::sampling::{SamplingError, SamplingParams};
pub use flint_core::tokenizer::{Tokenizer, TokenizerError};

use flint_core::generate::{default_clock, Clock, Generation};
use flint_core::reference::CpuBackend;

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
}

/// Which compute backend runs the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The plain CPU reference (`flint-core::reference`).
    Cpu,
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    /// Context size in tokens; 0 = the model's training context.
    pub n_ctx: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { backend: BackendKind::Cpu, n_ctx: DEFAULT_CTX }
    }
}

/// llama.cpp's default context size.
pub const DEFAULT_CTX: usize = 4096;

/// A loaded model ready to run requests.
pub struct Engine {
    file: Arc<GgufFile>,
    tokenizer: Tokenizer,
    backend: Box<dyn Backend>,
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
        let tokenizer = Tokenizer::from_metadata(&file.metadata)?;
        let file = Arc::new(file);
        let n_ctx = if opts.n_ctx == 0 { config.n_ctx_train } else { opts.n_ctx };
        let backend: Box<dyn Backend> = match opts.backend {
            BackendKind::Cpu => Box::new(CpuBackend::new(file.clone(), config, n_ctx).await?),
        };
        Ok(Engine { file, tokenizer, backend, clock: default_clock })
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
    pub fn backend_name(&self) -> String {
        self.backend.name()
    }
    pub fn n_ctx(&self) -> usize {
        self.backend.n_ctx()
    }

    /// Tokenizes a raw prompt: special tokens parsed, BOS as the model's metadata says.
    pub fn tokenize_raw(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode(text, self.tokenizer.add_bos_default(), true)?)
    }

    /// Logits of the last prompt position (for tests and tools), from an empty cache.
    pub async fn prompt_logits(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.backend.truncate(0);
        Ok(self.backend.forward(prompt).await?)
    }

    /// Streams the completion of `prompt`; fails before any work if the request cannot run.
    pub fn generate(
        &mut self,
        prompt: Vec<u32>,
        params: GenerateParams,
        abort: Arc<AtomicBool>,
    ) -> Result<LocalBoxStream<'_, Result<Event, GenerateError>>, EngineError> {
        let generation = Generation::new(self.backend.as_mut(), &self.tokenizer, prompt, params, abort, self.clock)?;
        Ok(futures::stream::unfold(generation, |mut g| async move { g.next_event().await.map(|e| (e, g)) }).boxed_local())
    }
}
