//! The memory plan: what a model will allocate on its device, from its file and the load
//! options, known before any weight is read (`flint info`, the server's start-up log, the npm
//! engine's `info.memory`). wgpu reports no device memory size: `--device-mem-mb` (npm
//! `deviceMemoryMB`) gives one, and a load whose plan does not fit is refused with these figures.

use flint_core::arch::ModelConfig;
use flint_core::backend::{BackendOptions, StepLimits};
use flint_core::gguf::GgufFile;
use flint_core::kv::{KvLayout, KvType};
use flint_gpu::model::mib;
use flint_gpu::split::Costs;

/// Bytes a model allocates on its device(s), by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Every tensor of the file, as uploaded (the blocks as they are).
    pub weights: u64,
    /// The KV cache: every layer's K and V for `kv_positions` positions.
    pub kv_cache: u64,
    pub kv_positions: u64,
    /// How K and V are stored.
    pub cache_k: KvType,
    pub cache_v: KvType,
    /// A step's activations at its largest (`max_batch_tokens` tokens).
    pub activations: u64,
    /// The logits and the sampler's rows, one per output row a step may draw.
    pub logits: u64,
}

impl MemoryPlan {
    /// The plan of `file` (whose model is `cfg`) loaded with `bopts`, its KV pool laid out as
    /// `layout`.
    pub(crate) fn of(file: &GgufFile, cfg: &ModelConfig, bopts: &BackendOptions, layout: &KvLayout) -> MemoryPlan {
        let limits = StepLimits { max_tokens: bopts.max_batch_tokens, max_seqs: bopts.max_seqs, max_outputs: bopts.max_outputs };
        let costs = Costs::of(file, cfg, layout, &limits);
        MemoryPlan {
            weights: file.tensors.iter().map(|t| t.n_bytes).sum(),
            kv_cache: costs.kv,
            kv_positions: layout.groups.iter().map(|g| g.n_blocks as u64 * layout.block_size as u64).max().unwrap_or(0),
            cache_k: layout.k_type,
            cache_v: layout.v_type,
            activations: costs.each,
            logits: costs.logits,
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.activations + self.logits
    }

    /// The plan as lines of text; `budget`: the device's memory, when known.
    pub fn describe(&self, budget: Option<u64>) -> String {
        let total = match budget {
            Some(b) => format!("{} of {} given", mib(self.total()), mib(b)),
            None => format!("{} (unchecked: wgpu reports no memory size; --device-mem-mb checks it)", mib(self.total())),
        };
        format!(
            "weights       {}\nKV cache      {} ({} positions, K {}, V {})\nactivations   {}\nlogits        {}\ntotal         {total}",
            mib(self.weights),
            mib(self.kv_cache),
            self.kv_positions,
            self.cache_k,
            self.cache_v,
            mib(self.activations),
            mib(self.logits),
        )
    }

    /// OpenAI-style JSON for the npm package's `info.memory`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "kv_positions": self.kv_positions,
            "cache_type_k": self.cache_k.name(),
            "cache_type_v": self.cache_v.name(),
            "activations": self.activations,
            "logits": self.logits,
            "total": self.total(),
        })
    }
}
