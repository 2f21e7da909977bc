//! How a model is loaded: the backend, devices and split, the context and KV budget, batching
//! limits, templates, clocks, the self-test and speculation.

use flint_core::generate::Clock;
use flint_core::kv::KvType;

use crate::{SpecConfig, DRAFT_P_MIN};

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
    /// How K and V are stored (`-ctk`, `-ctv`: f32, f16, q8_0). f16, the default as in
    /// llama.cpp, halves f32's memory and rounds each stored value to f16; q8_0 takes 9/32
    /// of f32's and rounds more. The exact mode keeps f32.
    pub cache_k: KvType,
    pub cache_v: KvType,
    /// The exact mode (`--exact`, npm `exact: true`): every result f32-faithful (within
    /// NMSE 1e-5 of the f32 reference) and batch-invariant (a sequence's logits the same bits
    /// whatever shares its step). It keeps the KV cache in f32 ([`LoadOptions::exact`]); a
    /// load asking for both the exact mode and another cache type is refused. On GPUs it also
    /// keeps steps of more than 16 tokens off the tiled GEMM (its sums run in another order,
    /// so a token's bits would depend on the size of its step).
    pub exact: bool,
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
    /// Overlapped steps (the default, where the backend offers them): a decode step is
    /// submitted before the one before it is read, its tokens fed on the device, while no
    /// request needs the host between the two (drafts, a grammar, penalties, logits); stops
    /// apply one step late and the overrun token is dropped. The tokens are the same either
    /// way; false runs every step after the one before is read (`FLINT_NO_OVERLAP=1` in the
    /// CLI).
    pub overlap: bool,
}

impl LoadOptions {
    /// The defaults of the exact mode: f32 keys and values.
    pub fn exact() -> Self {
        LoadOptions { exact: true, cache_k: KvType::F32, cache_v: KvType::F32, ..LoadOptions::default() }
    }

    /// Whether the exact mode is asked for with a KV cache type other than f32, which it
    /// refuses (the CLI and npm say so in their own words before a load does).
    pub fn exact_with_rounded_kv(&self) -> bool {
        self.exact && (self.cache_k != KvType::F32 || self.cache_v != KvType::F32)
    }

    /// Refuses settings that contradict each other.
    pub(crate) fn validate(&self) -> Result<(), crate::EngineError> {
        if self.exact_with_rounded_kv() {
            return Err(crate::EngineError::Settings(format!(
                "the exact mode keeps the KV cache in f32, not K {} and V {}: drop the exact mode or the cache types",
                self.cache_k.name(),
                self.cache_v.name()
            )));
        }
        Ok(())
    }
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
            cache_k: KvType::F16,
            cache_v: KvType::F16,
            exact: false,
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
            overlap: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_mode_refuses_a_rounded_kv_cache() {
        assert!(LoadOptions::exact().validate().is_ok());
        assert!(LoadOptions::default().validate().is_ok());
        let mixed = LoadOptions { cache_v: KvType::Q8_0, ..LoadOptions::exact() };
        let e = mixed.validate().unwrap_err().to_string();
        assert!(e.contains("exact mode") && e.contains("q8_0"), "{e}");
    }
}
