//! The load-time self-test (`LoadOptions::self_test`): the GPU backend's taps of the fixed
//! probe against the CPU reference's, over the embedding, layer 0 and the head (see
//! `flint_core::selftest`). The reference loads only those tensors.

use std::sync::Arc;

use flint_core::backend::{Backend, BackendOptions};
use flint_core::generate::Clock;
use flint_core::gguf::GgufFile;
use flint_core::reference::CpuBackend;
use flint_core::selftest::{compare, Probe, TapReport};

use crate::{EngineError, ModelConfig};

/// A passed self-test: every tap's NMSE, and how long each side took.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfTestReport {
    pub adapter: String,
    pub taps: Vec<TapReport>,
    /// The NMSE each tap was allowed (`Backend::self_test_bound`).
    pub bound: f64,
    /// The GPU's probe, including kernels it is the first to run (compiled then on lavapipe
    /// and in browsers).
    pub gpu_ms: f64,
    /// The CPU reference's probe, its tensors read included.
    pub cpu_ms: f64,
}

impl SelfTestReport {
    /// The tap that agreed least.
    pub fn worst(&self) -> Option<&TapReport> {
        self.taps.iter().max_by(|a, b| a.nmse.total_cmp(&b.nmse))
    }

    /// `self-test passed on llvmpipe (...): 6 taps within NMSE 1e-5 (worst 9.4e-13: prompt
    /// step: logits); GPU 0.3 s, CPU reference 0.4 s`.
    pub fn summary(&self) -> String {
        let worst = self.worst().map_or_else(String::new, |w| format!(" (worst {:.1e}: {})", w.nmse, w.name));
        let (g, c) = (self.gpu_ms / 1000.0, self.cpu_ms / 1000.0);
        format!("self-test passed on {}: {} taps within NMSE {:.0e}{worst}; GPU {g:.1} s, CPU reference {c:.1} s", self.adapter, self.taps.len(), self.bound)
    }
}

/// Runs the probe on `backend` (before its first step) and on a first-layer CPU reference.
/// `opts`: the backend's options (its KV types and context shape the reference's).
pub async fn run(
    backend: &mut dyn Backend,
    file: Arc<GgufFile>,
    cfg: &ModelConfig,
    opts: &BackendOptions,
    adapter: &str,
    clock: Clock,
) -> Result<SelfTestReport, EngineError> {
    let t0 = clock();
    let limits = backend.limits();
    let probe = Probe::within(cfg.n_vocab, limits.max_tokens, limits.max_outputs);
    let got = backend.probe(&probe).await?;
    let bound = backend.self_test_bound();
    let t1 = clock();
    let want = CpuBackend::first_layer(file, cfg.clone(), &probe, opts).await?.probe(&probe).await?;
    let (gpu_ms, cpu_ms) = (t1 - t0, clock() - t1);
    match compare(&probe, &got, &want, bound) {
        Ok(taps) => Ok(SelfTestReport { adapter: adapter.to_string(), taps, bound, gpu_ms, cpu_ms }),
        Err(error) => Err(EngineError::SelfTest { adapter: adapter.to_string(), error }),
    }
}
