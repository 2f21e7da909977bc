//! One model split by layers over several devices (llama.cpp's `--split-mode layer`): each
//! device holds a consecutive range of layers, their weights and their share of every KV
//! block (one block manager, one set of block ids); the first embeds, the last holds the head
//! and the sampler. A step runs through the parts in micro-batches, the residual stream
//! crossing from device to device through the host ([`crate::model::run_parts`]).
//!
//! [`plan`] decides the ranges: equal, in given proportions, or from each device's memory
//! budget, which also decides whether the model needs splitting at all.

use std::ops::Range;
use std::sync::Arc;

use futures::future::LocalBoxFuture;

use flint_core::arch::ModelConfig;
use flint_core::backend::{check_step, Backend, BackendError, BackendOptions, StepBatch, StepLimits, StepResult};
use flint_core::gguf::GgufFile;
use flint_core::kv::KvLayout;

use crate::backend::{backend_error, failure};
use crate::context::GpuContext;
use crate::model::{mib, plan_kv, run_parts, GpuModel, Part};

/// How to spread the layers over the devices given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitRule {
    /// Layer proportions per device (`--tensor-split 3,1`); None = equal, or by budget.
    pub proportions: Option<Vec<f32>>,
    /// Each device's memory budget in bytes (`--device-mem-mb`): the model goes on the first
    /// device alone when it fits there, else it is spread over the devices.
    pub budgets: Option<Vec<u64>>,
}

/// What the parts of a split would allocate, in bytes: estimates from the file's tensor sizes
/// and the buffers' shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Per layer: its weights and its share of the KV pool.
    pub layers: Vec<u64>,
    /// The embedding table (first part).
    pub embed: u64,
    /// The output norm and matrix, the logits and the sampler's rows (last part).
    pub head: u64,
    /// What every part allocates whatever its layers: activations and the staging buffer.
    pub each: u64,
    /// Of `layers`, the KV cache (all layers); of `head`, the logits and sampler rows.
    pub kv: u64,
    pub logits: u64,
}

impl Costs {
    pub fn of(file: &GgufFile, cfg: &ModelConfig, layout: &KvLayout, limits: &StepLimits) -> Costs {
        let bytes = |name: &str| file.tensor(name).map_or(0, |t| t.n_bytes);
        let mut layers = vec![0u64; cfg.n_layer];
        for t in &file.tensors {
            let layer = t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|n| n.parse::<usize>().ok());
            if let Some(l) = layer.filter(|&l| l < cfg.n_layer) {
                layers[l] += t.n_bytes;
            }
        }
        // Q, K and V recoded to share a stack's format (`weights::stack_format`) grow.
        for (il, w) in layers.iter_mut().enumerate() {
            let ts: Vec<_> = ["q", "k", "v"].iter().filter_map(|m| file.tensor(&format!("blk.{il}.attn_{m}.weight"))).collect();
            if let Some(ty) = crate::weights::stack_format(&ts.iter().map(|t| t.ty).collect::<Vec<_>>()) {
                *w += ts.iter().filter(|t| t.ty != ty).map(|t| ty.bytes_for(t.n_elems).unwrap_or(0).saturating_sub(t.n_bytes)).sum::<u64>();
            }
        }
        let per_position = flint_core::kv::layout::row_bytes(cfg, layout.k_type, layout.v_type);
        let mut kv = 0;
        for (il, w) in layers.iter_mut().enumerate() {
            let layer_kv = layout.groups[layout.group_of(il)].n_blocks as u64 * layout.block_size as u64 * per_position;
            *w += layer_kv;
            kv += layer_kv;
        }
        let output = if cfg.tied_output || file.tensor("output.weight").is_none() { bytes("token_embd.weight") } else { bytes("output.weight") };
        // The logits and the sampler's working rows, each [max_outputs, n_vocab] f32, and the
        // output rows' hidden states.
        let outputs = limits.max_outputs as u64;
        let logits = 2 * outputs * cfg.n_vocab as u64 * 4 + outputs * cfg.n_embd as u64 * 4;
        let head = output + bytes("output_norm.weight") + logits;
        let c = cfg;
        let t = limits.max_tokens as u64;
        let row = 3 * c.n_embd + c.q_dim() + c.kv_dim() + c.v_dim() + c.n_head * c.head_dim_v + 2 * c.n_ff;
        // Attention's split partials, and a mixture of experts' router and expert rows.
        let scratch = crate::ops::attention::Attention::scratch_bytes(&crate::model::graph::attention_desc(cfg, 0, None), limits.max_tokens as u32);
        let moe = c.moe.map_or(0, |m| (t * m.n_expert as u64 + t * m.n_used as u64 * (2 * m.n_ff + c.n_embd) as u64) * 4);
        Costs { layers, embed: bytes("token_embd.weight"), head, each: t * row as u64 * 4 + scratch + moe, kv, logits }
    }

    /// What layers `range` cost on a part that also embeds (`first`) or holds the head (`last`).
    pub fn part(&self, range: &Range<usize>, first: bool, last: bool) -> u64 {
        self.layers[range.clone()].iter().sum::<u64>() + self.each + if first { self.embed } else { 0 } + if last { self.head } else { 0 }
    }

    /// What the whole model costs on one device.
    pub fn total(&self) -> u64 {
        self.part(&(0..self.layers.len()), true, true)
    }
}

/// Consecutive layer ranges over `n` devices in `weights`' proportions (rounded at each
/// cumulative boundary, as llama.cpp's tensor split).
fn proportional(n_layer: usize, weights: &[f64]) -> Vec<Range<usize>> {
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    let mut start = 0;
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            acc += w;
            let end = if i + 1 == weights.len() { n_layer } else { ((acc / total * n_layer as f64).round() as usize).clamp(start, n_layer) };
            let r = start..end;
            start = end;
            r
        })
        .collect()
}

/// The parts of a split over `n_dev` devices: (device index, layers), in layer order, every
/// layer in one; devices that would hold no layer (and neither embed nor the head) are left
/// out. With budgets, one device when the whole model fits the first; otherwise layers in
/// the given proportions (or the budgets'), checked against every budget, else filled device
/// by device; an error says what is needed and what there is.
pub fn plan(costs: &Costs, n_dev: usize, rule: &SplitRule) -> Result<Vec<(usize, Range<usize>)>, SplitError> {
    let n_layer = costs.layers.len();
    if n_dev == 0 {
        return Err(SplitError::NoDevice);
    }
    if let Some(p) = &rule.proportions {
        if p.len() != n_dev || p.iter().any(|w| !w.is_finite() || *w < 0.0) || p.iter().sum::<f32>() <= 0.0 {
            return Err(SplitError::Proportions { n_dev, got: p.clone() });
        }
    }
    let weights: Vec<f64> = match (&rule.proportions, &rule.budgets) {
        (Some(p), _) => p.iter().map(|&w| w as f64).collect(),
        (None, Some(b)) => b.iter().map(|&m| m as f64).collect(),
        (None, None) => vec![1.0; n_dev],
    };
    let keep = |ranges: Vec<Range<usize>>| -> Vec<(usize, Range<usize>)> {
        let last = ranges.len() - 1;
        ranges.into_iter().enumerate().filter(|(i, r)| !r.is_empty() || *i == 0 || *i == last).collect()
    };
    let Some(budgets) = &rule.budgets else { return Ok(keep(proportional(n_layer, &weights))) };
    if budgets.len() != n_dev {
        return Err(SplitError::Budgets { n_dev, got: budgets.len() });
    }
    let need = costs.total();
    if need <= budgets[0] {
        return Ok(vec![(0, 0..n_layer)]);
    }
    let fits = |parts: &[(usize, Range<usize>)]| {
        let last = parts.len() - 1;
        parts.iter().enumerate().all(|(k, (d, r))| costs.part(r, k == 0, k == last) <= budgets[*d])
    };
    let parts = keep(proportional(n_layer, &weights));
    if parts.len() > 1 && fits(&parts) {
        return Ok(parts);
    }
    // Fill each device in turn; the last takes what is left, and the head.
    let mut ranges = Vec::with_capacity(n_dev);
    let mut start = 0;
    for (d, &budget) in budgets.iter().enumerate() {
        let mut end = start;
        if d + 1 == n_dev {
            end = n_layer;
        } else {
            while end < n_layer && costs.part(&(start..end + 1), d == 0, false) <= budget {
                end += 1;
            }
        }
        ranges.push(start..end);
        start = end;
    }
    let parts = keep(ranges);
    if fits(&parts) {
        return Ok(parts);
    }
    Err(SplitError::DoesNotFit { need, layers: costs.layers.iter().sum(), embed: costs.embed, head: costs.head, each: costs.each, budgets: budgets.clone() })
}

/// A layer split that cannot be made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SplitError {
    #[error("no device to load the model on")]
    NoDevice,
    #[error("--tensor-split needs {n_dev} non-negative proportions, not all zero (got {got:?})")]
    Proportions { n_dev: usize, got: Vec<f32> },
    #[error("--device-mem-mb needs one budget per device: {n_dev} devices, {got} budgets")]
    Budgets { n_dev: usize, got: usize },
    /// Bytes: what the model needs in all and by part, and each device's budget.
    #[error(
        "the model needs about {} (layers' weights and KV cache {}, embedding {}, head {}, {} of buffers per device) and does not fit the devices' budgets ({} in all: {})",
        mib(*need), mib(*layers), mib(*embed), mib(*head), mib(*each), mib(budgets.iter().sum()),
        budgets.iter().map(|&b| mib(b)).collect::<Vec<_>>().join(", ")
    )]
    DoesNotFit { need: u64, layers: u64, embed: u64, head: u64, each: u64, budgets: Vec<u64> },
}

/// A model whose layers are split over several devices, behind the `Backend` interface.
pub struct SplitBackend {
    parts: Vec<GpuModel>,
    /// MAP_READ staging on part i's device carrying the residual stream to part i + 1.
    links: Vec<wgpu::Buffer>,
    cfg: ModelConfig,
    layout: KvLayout,
    limits: StepLimits,
}

impl SplitBackend {
    /// Loads layers `ranges[i]` on `ctxs[i]`; the KV layout is the one every device can hold
    /// (each layer's pool within the smallest binding limit).
    pub async fn new(
        ctxs: &[Arc<GpuContext>],
        file: &GgufFile,
        cfg: ModelConfig,
        opts: &BackendOptions,
        max_binding_mb: Option<u64>,
        ranges: &[Range<usize>],
    ) -> Result<SplitBackend, BackendError> {
        let layout = split_layout(ctxs, &cfg, opts)?;
        let mut parts = Vec::with_capacity(ranges.len());
        for (i, ctx) in ctxs.iter().enumerate() {
            let part = GpuModel::load_part(ctx.clone(), file, cfg.clone(), opts, max_binding_mb, Part::of(ranges, i), layout.clone()).await;
            parts.push(part.map_err(|e| with_part(backend_error(e), i, &ranges[i], ctx))?);
        }
        let bytes = (parts[0].limits().max_tokens * cfg.n_embd * 4) as u64;
        let links = parts[..parts.len() - 1]
            .iter()
            .map(|p| {
                p.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("split_residual"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .collect();
        let limits = parts[0].limits();
        Ok(SplitBackend { parts, links, cfg, layout, limits })
    }

    /// Each part's device and layers.
    pub fn parts(&self) -> impl Iterator<Item = (&Arc<GpuContext>, &Range<usize>)> {
        self.parts.iter().map(|p| (&p.ctx, &p.part.layers))
    }
}

/// The KV layout every one of `ctxs` can hold.
pub fn split_layout(ctxs: &[Arc<GpuContext>], cfg: &ModelConfig, opts: &BackendOptions) -> Result<KvLayout, BackendError> {
    let binding = ctxs.iter().map(|c| c.max_binding()).min().unwrap_or(0);
    plan_kv(cfg, opts, binding).map_err(backend_error)
}

/// Names the part a device error met, by wrapping it.
fn with_part(e: BackendError, i: usize, layers: &Range<usize>, ctx: &GpuContext) -> BackendError {
    match e {
        BackendError::DeviceLost { .. } | BackendError::OutOfMemory { .. } | BackendError::Validation { .. } | BackendError::Device { .. } => {
            BackendError::OnPart { part: i, layers: layers.clone(), adapter: ctx.info.name.clone(), source: Box::new(e) }
        }
        e => e,
    }
}

impl Backend for SplitBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }
    fn limits(&self) -> StepLimits {
        self.limits
    }
    fn step<'a>(&'a mut self, batch: StepBatch<'a>) -> LocalBoxFuture<'a, Result<StepResult, BackendError>> {
        Box::pin(async move {
            check_step(&batch, &self.limits, &self.layout, self.cfg.n_vocab)?;
            // One micro-batch in flight per device.
            let micro = self.parts.len();
            run_parts(&mut self.parts, &self.links, batch, micro, None).await.map_err(|f| {
                let p = &self.parts[f.part];
                with_part(failure(&p.ctx, f.error), f.part, &p.part.layers, &p.ctx)
            })
        })
    }
    /// The embedding and layer 0 on the first device, the head on the last.
    fn probe<'a>(&'a mut self, probe: &'a flint_core::selftest::Probe) -> LocalBoxFuture<'a, Result<Vec<flint_core::selftest::Tap>, BackendError>> {
        Box::pin(async move {
            let (first, rest) = self.parts.split_first_mut().expect("a split has parts");
            let r = first.probe(rest.last_mut(), probe).await;
            r.map_err(|e| {
                // A lost device is the one that reports it.
                let lost = self.parts.iter().find(|p| p.ctx.is_lost()).unwrap_or(&self.parts[0]);
                failure(&lost.ctx, e)
            })
        })
    }
    /// The loosest of the parts' bounds (the taps run through the first and the last).
    fn self_test_bound(&self) -> f64 {
        self.parts.iter().map(|p| p.self_test_bound()).fold(flint_core::selftest::MAX_NMSE, f64::max)
    }
    fn name(&self) -> String {
        let parts: Vec<String> = self.parts.iter().map(|p| format!("{} {}..{}", p.ctx.info.name, p.part.layers.start, p.part.layers.end)).collect();
        format!("gpu split ({})", parts.join(" | "))
    }
    fn step_ready(&self, tokens: usize) -> bool {
        self.parts.iter().all(|p| p.step_ready(tokens as u32))
    }
    /// As [`crate::backend::GpuBackend`]'s, when any part runs on a CPU-type adapter.
    fn verify_sizes(&self) -> &'static [usize] {
        if self.parts.iter().any(|p| p.ctx.caps.cpu_like) {
            &[4, 8, 16]
        } else {
            &[]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten layers of 10 bytes; embedding 5, head 7, 3 a part whatever its layers.
    fn costs() -> Costs {
        Costs { layers: vec![10; 10], embed: 5, head: 7, each: 3, kv: 0, logits: 0 }
    }

    fn ranges(parts: &[(usize, Range<usize>)]) -> Vec<Range<usize>> {
        parts.iter().map(|(_, r)| r.clone()).collect()
    }

    #[test]
    fn layers_split_equally_or_in_proportions() {
        let equal = plan(&costs(), 2, &SplitRule::default()).unwrap();
        assert_eq!(equal, vec![(0, 0..5), (1, 5..10)]);
        let three = plan(&costs(), 3, &SplitRule::default()).unwrap();
        assert_eq!(ranges(&three), vec![0..3, 3..7, 7..10]);
        let ts = SplitRule { proportions: Some(vec![3.0, 1.0]), budgets: None };
        assert_eq!(ranges(&plan(&costs(), 2, &ts).unwrap()), vec![0..8, 8..10]);
        // A middle device given no layer is left out; the first and last stay (embedding, head).
        let ts = SplitRule { proportions: Some(vec![1.0, 0.0, 1.0]), budgets: None };
        assert_eq!(plan(&costs(), 3, &ts).unwrap(), vec![(0, 0..5), (2, 5..10)]);
        for bad in [vec![1.0], vec![0.0, 0.0], vec![1.0, -1.0], vec![f32::NAN, 1.0]] {
            let rule = SplitRule { proportions: Some(bad.clone()), budgets: None };
            assert!(plan(&costs(), 2, &rule).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn budgets_decide_whether_and_how_to_split() {
        let rule = |b: &[u64]| SplitRule { proportions: None, budgets: Some(b.to_vec()) };
        // The whole model costs 100 + 5 + 7 + 3 = 115.
        assert_eq!(plan(&costs(), 2, &rule(&[115, 1])).unwrap(), vec![(0, 0..10)], "fits the first device");
        assert_eq!(ranges(&plan(&costs(), 2, &rule(&[100, 100])).unwrap()), vec![0..5, 5..10]);
        assert_eq!(ranges(&plan(&costs(), 2, &rule(&[90, 30])).unwrap()), vec![0..8, 8..10], "in the budgets' proportions");
        // Proportions that overflow a budget give way to filling each device in turn:
        // 1:1 would put 5 layers (60) on the second; the first takes 8 (88), the second 2 (30).
        let tight = SplitRule { proportions: Some(vec![1.0, 1.0]), budgets: Some(vec![90, 30]) };
        assert_eq!(ranges(&plan(&costs(), 2, &tight).unwrap()), vec![0..8, 8..10]);
        let err = plan(&costs(), 2, &rule(&[50, 50])).unwrap_err();
        assert!(matches!(err, SplitError::DoesNotFit { need: 115, .. }), "{err:?}");
        assert!(err.to_string().contains("does not fit"), "{err}");
        assert_eq!(plan(&costs(), 2, &rule(&[200])), Err(SplitError::Budgets { n_dev: 2, got: 1 }), "one budget for two devices");
        assert!(matches!(plan(&costs(), 1, &rule(&[114])), Err(SplitError::DoesNotFit { .. })), "one device too small");
    }
}
