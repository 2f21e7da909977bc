//! The interface every compute backend implements (the CPU reference here, the GPU next),
//! so the generation loop and every front end are written once.

use futures::future::LocalBoxFuture;
use thiserror::Error;

use crate::arch::{ArchError, ModelConfig};
use crate::sampling::{Sampled, Sampler};
use crate::gguf::GgufError;

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("the context is full: {needed} tokens needed, the context holds {n_ctx}")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to run: the batch is empty")]
    EmptyBatch,
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Arch(#[from] ArchError),
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    #[error("{0}")]
    Device(String),
}

/// A model instance with one sequence's KV cache.
///
/// `forward` is async on every target: the GPU backend awaits its readback, the browser
/// cannot block, and the CPU reference simply completes at once.
pub trait Backend {
    fn config(&self) -> &ModelConfig;
    /// The most positions the KV cache holds.
    fn n_ctx(&self) -> usize;
    /// Positions already in the KV cache.
    fn n_past(&self) -> usize;
    /// Runs `tokens` at positions `n_past()..`, appends them to the KV cache and returns
    /// the logits of the last one (`n_vocab` values).
    fn forward<'a>(&'a mut self, tokens: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>, BackendError>>;
    /// Runs `tokens` like `forward` and draws the next token with `sampler`. Backends that
    /// can sample on the device override this so the logits never leave it.
    fn forward_sample<'a>(
        &'a mut self,
        tokens: &'a [u32],
        sampler: &'a mut Sampler,
    ) -> LocalBoxFuture<'a, Result<Sampled, BackendError>> {
        Box::pin(async move {
            let logits = self.forward(tokens).await?;
            Ok(sampler.sample_full(&logits))
        })
    }
    /// Runs one step of `tokens` with per-op device timings: (op label, nanoseconds).
    fn profile<'a>(&'a mut self, tokens: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<(String, f64)>, BackendError>> {
        let _ = tokens;
        Box::pin(async { Err(BackendError::Device(format!("{} has no per-op profiler", self.name()))) })
    }
    /// How much of an `n`-position cached prefix can be kept when rolling back to it: `n`,
    /// or less where layers keep only a window (a ring cannot give back overwritten positions).
    fn reusable_prefix(&self, n: usize) -> usize {
        n
    }
    /// Drops cached positions from `n` on (0 clears the cache).
    fn truncate(&mut self, n: usize);
    /// Extends the cache from earlier requests' blocks without recomputing them: when the
    /// backend's prefix index holds a longer prefix of `tokens` than the `n_past()` positions
    /// cached now (which must hold `tokens[..n_past()]`), the cache switches to it. Returns the
    /// positions cached after, at most `tokens.len()`. Backends without an index keep what
    /// they have.
    fn restore_prefix(&mut self, tokens: &[u32]) -> usize {
        self.n_past().min(tokens.len())
    }
    /// Records that the cached positions hold `tokens`, so that their full blocks can serve
    /// later requests through [`Backend::restore_prefix`]. A no-op without an index.
    fn commit(&mut self, tokens: &[u32]) {
        let _ = tokens;
    }
    /// Drops every cached position and everything the prefix index holds (a new conversation).
    fn clear_cache(&mut self) {
        self.truncate(0);
    }
    /// A short name for reports: `cpu`, `gpu (llvmpipe)`.
    fn name(&self) -> String;
}

/// Checks a batch against the context and vocabulary before any work is done.
pub fn check_batch(tokens: &[u32], n_past: usize, n_ctx: usize, n_vocab: usize) -> Result<(), BackendError> {
    if tokens.is_empty() {
        return Err(BackendError::EmptyBatch);
    }
    let needed = n_past + tokens.len();
    if needed > n_ctx {
        return Err(BackendError::ContextFull { needed, n_ctx });
    }
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= n_vocab) {
        return Err(BackendError::BadToken { id, n_vocab });
    }
    Ok(())
}
