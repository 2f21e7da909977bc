//! The engine's error: what a load, a request or a step can fail with, by variant.

use std::sync::Arc;

use thiserror::Error;

use flint_core::spec::SpecError;
use flint_core::tokenizer::VocabMismatch;
use flint_gpu::split::SplitError;

use crate::{ArchError, BackendError, ChatError, GenerateError, GgufError, SchedError, SelfTestError, TokenizerError};

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
    /// Load options that contradict each other.
    #[error("invalid settings: {0}")]
    Settings(String),
    #[error("invalid settings: {0}")]
    Spec(#[from] SpecError),
    #[error("invalid settings: {0}")]
    Split(#[from] SplitError),
    /// The draft model (`model`: its path, or empty for a file given open) cannot draft here.
    #[error("the draft model{}: {source}", if model.is_empty() { String::new() } else { format!(" {model}") })]
    Draft { model: String, source: DraftError },
    #[error("a prediction needs an engine that verifies drafts (load it with speculation or predictions on)")]
    PredictionNeedsDrafts,
    /// The request's grammar (from its field `field`) does not compile, or could not go on.
    #[error("{field}: {source}")]
    Constraint { field: &'static str, source: flint_core::constrain::ConstraintError },
}

/// Why a draft model cannot draft for its target.
#[derive(Debug, Error)]
pub enum DraftError {
    #[error("--spec-type ngram and a draft model: choose one drafter")]
    TwoDrafters,
    #[error("its path is opened by Engine::load_path; give its file to load_local_with_draft")]
    PathNotOpened,
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Arch(#[from] ArchError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("its vocabulary is not this model's: {0}")]
    Vocabulary(#[from] VocabMismatch),
    #[error("its new backend lays out its KV cache differently")]
    KvLayoutChanged,
}

impl EngineError {
    /// The backend error underneath, if any (a step's or a load's).
    pub fn backend(&self) -> Option<&BackendError> {
        match self {
            EngineError::Backend(b) | EngineError::Generate(GenerateError::Backend(b)) => Some(b.root()),
            EngineError::Step(b) => Some(b.root()),
            _ => None,
        }
    }
}
