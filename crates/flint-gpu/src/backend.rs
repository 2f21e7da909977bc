//! The GPU backend behind flint-core's `Backend` interface: the logits never leave the
//! device. Penalties, bias and the allowed-token mask edit them in place, greedy argmax or
//! Gumbel-max sampling picks the token, and a decode step reads back 4 bytes (172 with
//! log-probabilities).

use std::sync::Arc;

use futures::future::LocalBoxFuture;

use flint_core::arch::ModelConfig;
use flint_core::backend::{check_batch, Backend, BackendError};
use flint_core::gguf::GgufFile;
use flint_core::sampling::{Sampled, Sampler, SamplingError};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::model::{GpuModel, Output};
use crate::ops::argmax::SampleStep;
use crate::ops::penalize::StepEdits;

pub struct GpuBackend {
    model: GpuModel,
}

fn device(e: GpuError) -> BackendError {
    BackendError::Device(e.to_string())
}

fn sampling(e: SamplingError) -> BackendError {
    match e {
        SamplingError::OutOfVocab { id, n_vocab, .. } => BackendError::BadToken { id, n_vocab },
        e => BackendError::Device(e.to_string()),
    }
}

impl GpuBackend {
    pub async fn new(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: ModelConfig,
        n_ctx: usize,
        max_binding_mb: Option<u64>,
    ) -> Result<GpuBackend, BackendError> {
        Self::with_kv_budget(ctx, file, cfg, n_ctx, max_binding_mb, None).await
    }

    /// Like `new`, with the KV block pool sized by `kv_budget` bytes (see
    /// [`crate::model::kv_pool_size`]): what the context does not use holds the prefix index.
    pub async fn with_kv_budget(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: ModelConfig,
        n_ctx: usize,
        max_binding_mb: Option<u64>,
        kv_budget: Option<u64>,
    ) -> Result<GpuBackend, BackendError> {
        let model = GpuModel::load(ctx, file, cfg, n_ctx, max_binding_mb, kv_budget).await.map_err(device)?;
        Ok(GpuBackend { model })
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    fn check(&self, tokens: &[u32]) -> Result<(), BackendError> {
        check_batch(tokens, self.model.n_past(), self.model.n_ctx(), self.model.cfg.n_vocab)
    }
}

impl Backend for GpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }
    fn n_ctx(&self) -> usize {
        self.model.n_ctx()
    }
    fn n_past(&self) -> usize {
        self.model.n_past()
    }
    fn forward<'a>(&'a mut self, tokens: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<f32>, BackendError>> {
        Box::pin(async move {
            self.check(tokens)?;
            self.model.forward_logits(tokens).await.map_err(device)
        })
    }
    fn forward_sample<'a>(&'a mut self, tokens: &'a [u32], sampler: &'a mut Sampler) -> LocalBoxFuture<'a, Result<Sampled, BackendError>> {
        Box::pin(async move {
            self.check(tokens)?;
            sampler.check_vocab(self.model.cfg.n_vocab).map_err(sampling)?;
            let p = sampler.params();
            let greedy = p.temperature <= 0.0;
            if greedy && p.n_logprobs == 0 && !sampler.has_edits() {
                // The fast path: argmax only.
                return self.model.forward_token(tokens, Output::Greedy).await.map_err(device);
            }
            let step = if greedy { 0 } else { sampler.next_step() };
            let sampler = &*sampler;
            let output = Output::Sample(SampleStep::new(sampler.params(), sampler.seed(), step), StepEdits::from_sampler(sampler));
            self.model.forward_token(tokens, output).await.map_err(device)
        })
    }
    fn profile<'a>(&'a mut self, tokens: &'a [u32]) -> LocalBoxFuture<'a, Result<Vec<(String, f64)>, BackendError>> {
        Box::pin(async move {
            self.check(tokens)?;
            self.model.profile_step(tokens).await.map_err(device)
        })
    }
    fn reusable_prefix(&self, n: usize) -> usize {
        self.model.reusable_prefix(n)
    }
    fn truncate(&mut self, n: usize) {
        self.model.truncate(n);
    }
    /// Any earlier request's full blocks, except with gemma3-style sliding-window rings, which
    /// cannot be shared: there only the live sequence is reused (`reusable_prefix`).
    fn restore_prefix(&mut self, tokens: &[u32]) -> usize {
        self.model.restore_prefix(tokens)
    }
    fn commit(&mut self, tokens: &[u32]) {
        self.model.commit(tokens);
    }
    fn clear_cache(&mut self) {
        self.model.clear_cache();
    }
    fn name(&self) -> String {
        format!("gpu ({})", self.model.ctx.info.name)
    }
}
