//! The GPU backend behind flint-core's `Backend` interface: a batched step whose logits never
//! leave the device. Penalties, bias and allowed-token masks edit each output row in place,
//! greedy argmax or Gumbel-max sampling picks each row's token, and a step reads back 4 bytes
//! an output row (172 with log-probabilities).

use std::sync::Arc;

use futures::future::LocalBoxFuture;

use flint_core::arch::ModelConfig;
use flint_core::backend::{check_step, Backend, BackendError, BackendOptions, LateMasks, StepBatch, StepLimits, StepResult};
use flint_core::gguf::GgufFile;
use flint_core::kv::KvLayout;
use flint_core::selftest::{Probe, Tap};

use crate::context::GpuContext;
use crate::error::GpuError;
use crate::model::GpuModel;

pub struct GpuBackend {
    model: GpuModel,
}

/// A GPU error as the engine sees it: device loss, out of memory and validation keep their
/// kind, so callers branch on variants, never on message text.
pub fn backend_error(e: GpuError) -> BackendError {
    match e {
        GpuError::DeviceLost { cause: m } => BackendError::DeviceLost { cause: m },
        GpuError::OutOfMemory { what, device, cause } => {
            BackendError::OutOfMemory { cause: format!("{what} did not fit on {device}{}", cause.map_or(String::new(), |c| format!(": {c}"))) }
        }
        GpuError::Validation { cause: m } => BackendError::Validation { cause: m },
        GpuError::Kv(k) => BackendError::Kv(k),
        e => BackendError::Device { cause: e.to_string() },
    }
}

/// A failure of work on the device `ctx`: once wgpu has reported the device lost, whatever
/// failed (a readback, a submission) is the loss. A readback that fails is one too: the
/// device cannot give results back, and a browser may report the loss itself (the
/// `GPUDevice.lost` promise) only after the mapping it broke has failed.
pub fn failure(ctx: &GpuContext, e: GpuError) -> BackendError {
    match (ctx.lost_reason(), e) {
        (Some(reason), _) => BackendError::DeviceLost { cause: reason },
        (None, GpuError::Readback { cause: m }) => {
            BackendError::DeviceLost { cause: format!("reading results back failed ({m}); the device is treated as lost") }
        }
        (None, e) => backend_error(e),
    }
}

impl GpuBackend {
    /// Loads the model with the context, step limits and KV pool `opts` describe;
    /// `max_binding_mb` caps each weight buffer below the device's binding limit.
    pub async fn new(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: ModelConfig,
        opts: &BackendOptions,
        max_binding_mb: Option<u64>,
    ) -> Result<GpuBackend, BackendError> {
        let model = GpuModel::load(ctx, file, cfg, opts, max_binding_mb).await.map_err(backend_error)?;
        Ok(GpuBackend { model })
    }

    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// Joins a draft model's backend to this one (same device) for speculative decoding with
    /// sampled drafts: this model opens a store of up to `rows` draft distributions, which the
    /// draft's sampler records into and this one's verifies against. Returns the rows the
    /// store holds: none when the two run on different devices (the browser opens a device
    /// per model), where sampled requests are drafted greedily.
    pub async fn link_draft(&mut self, draft: &mut GpuBackend, rows: u32) -> Result<u32, BackendError> {
        if !Arc::ptr_eq(&self.model.ctx, &draft.model.ctx) {
            return Ok(0);
        }
        let q = self.model.open_q_store(rows).await.map_err(backend_error)?;
        draft.model.attach_q(&q, self.model.cfg.n_vocab as u32).await.map_err(backend_error)?;
        Ok(self.model.q_rows())
    }

    fn failed(&self, e: GpuError) -> BackendError {
        failure(&self.model.ctx, e)
    }

    fn check(&self, batch: &StepBatch<'_>) -> Result<(), BackendError> {
        check_step(batch, &self.model.limits(), self.model.layout(), self.model.cfg.n_vocab)
    }
}

impl Backend for GpuBackend {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }
    fn kv_layout(&self) -> &KvLayout {
        self.model.layout()
    }
    fn limits(&self) -> StepLimits {
        self.model.limits()
    }
    fn step<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        Box::pin(async move {
            self.check(&batch)?;
            let r = self.model.step(batch, None).await;
            r.map_err(|e| self.failed(e))
        })
    }
    fn step_with_masks<'a>(&'a mut self, batch: StepBatch<'a>, masks: LateMasks<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        Box::pin(async move {
            self.check(&batch)?;
            let r = self.model.step(batch, Some(masks)).await;
            r.map_err(|e| self.failed(e))
        })
    }
    fn overlaps(&self) -> bool {
        true
    }
    fn submit<'a>(
        &'a mut self,
        batch: StepBatch<'a>,
        feeds: &'a [flint_core::backend::Feed],
        masks: Option<LateMasks<'a>>,
    ) -> LocalBoxFuture<'a, Result<flint_core::backend::Ticket, BackendError>> {
        Box::pin(async move {
            self.check(&batch)?;
            let r = self.model.submit(batch, feeds, masks);
            r.map(flint_core::backend::Ticket).map_err(|e| self.failed(e))
        })
    }
    fn collect<'a>(&'a mut self, ticket: flint_core::backend::Ticket) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        Box::pin(async move {
            let r = self.model.collect(ticket.0).await;
            r.map_err(|e| self.failed(e))
        })
    }
    fn profile<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<Vec<flint_core::backend::OpTime>, BackendError>> {
        Box::pin(async move {
            self.check(&batch)?;
            let r = self.model.profile(batch).await;
            r.map_err(|e| self.failed(e))
        })
    }
    fn probe<'a>(&'a mut self, probe: &'a Probe) -> LocalBoxFuture<'a, Result<Vec<Tap>, BackendError>> {
        Box::pin(async move {
            let r = self.model.probe(None, probe).await;
            r.map_err(|e| self.failed(e))
        })
    }
    fn self_test_bound(&self) -> f64 {
        self.model.self_test_bound()
    }
    fn name(&self) -> String {
        format!("gpu ({})", self.model.ctx.info.name)
    }
    /// CPU-type adapters compute a step's matmuls in blocks of 4, 8 or 16 tokens, each dearer
    /// than the last (lavapipe, qwen2.5-coder-0.5b: 8 tokens 579 ms, 9 tokens 1249 ms); on a GPU
    /// a decode step is bound by reading the weights, whatever the block.
    fn step_ready(&self, tokens: usize) -> bool {
        self.model.step_ready(tokens as u32)
    }
    fn verify_sizes(&self) -> &'static [usize] {
        if self.model.ctx.caps.cpu_like {
            &[4, 8, 16]
        } else {
            &[]
        }
    }
}
