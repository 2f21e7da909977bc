//! Greedy argmax and exact sampling over one row of logits on the GPU
//! (`shaders/argmax.wgsl`): the CPU reads back token ids (4 bytes a draw), never the logits.
//!
//! Sampling reproduces `flint_core::sampling::Sampler::distribution` (top-k, then top-p and
//! min-p on the untempered softmax of the top-k set, then temperature) with an exact
//! threshold search (radix select over (logit, index) keys) and Gumbel-max over the
//! survivors; see the shader header for the passes.
//!
//! Log-probabilities (`SampleStep::n_logprobs` > 0) are the log-softmax at temperature 1 of
//! the logits as they are in the buffer (after `ops::penalize`), of the chosen token and
//! the top n (≤ 20), computed on the device and read back as one record of
//! [`LP_WORDS`] words, as `flint_core::sampling::log_softmax_top` defines them.

use std::sync::Arc;

use flint_core::sampling::{Sampled, SamplingParams, MAX_LOGPROBS};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::fold_groups;
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

const SHADER: &str = "argmax.wgsl";
/// Threads per workgroup; the histogram kernels need exactly one per radix bucket.
const WG: u32 = 256;
const RADIX: u64 = 256;
/// Logits each thread scans in the partial passes before more workgroups are used.
const ITEMS_PER_THREAD: u32 = 4;
/// Most workgroups per row, so the final pass reduces them in one workgroup.
const MAX_GROUPS: u32 = WG;
/// Most draws one `encode_sample` can batch (one workgroup row each).
pub const MAX_DRAWS: u32 = 65535;

/// Word offsets in the sampler's state buffer (mirrors argmax.wgsl), for tests and taps.
pub mod state {
    /// f32 bits of the largest logit.
    pub const MAX_BITS: usize = 0;
    pub const MAX_ID: usize = 1;
    /// Survivors are the tokens whose key (order_key(logit), n_vocab−1−index) is ≥ this.
    pub const THR_V: usize = 2;
    pub const THR_I: usize = 3;
    pub const WORDS: usize = 32;
}

/// Words of the log-probability record: chosen id, its log-probability (f32 bits), the
/// number n of alternatives, then n × (id, log-probability bits).
pub const LP_WORDS: usize = 3 + 2 * MAX_LOGPROBS;

/// Binding numbers in argmax.wgsl.
const B_PARAMS: u32 = 0;
const B_LOGITS: u32 = 1;
const B_PARTIALS: u32 = 2;
const B_STATE: u32 = 3;
const B_HIST: u32 = 4;
const B_OUT: u32 = 5;
const B_LP_PART: u32 = 6;
const B_LP: u32 = 7;

/// Every entry point and the bindings it uses (its auto layout).
const ENTRIES: [(&str, &[u32]); 11] = [
    ("argmax_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE]),
    ("argmax_final", &[B_PARAMS, B_PARTIALS, B_STATE, B_OUT]),
    ("gumbel_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE]),
    ("gumbel_final", &[B_PARAMS, B_PARTIALS, B_STATE, B_OUT]),
    ("init", &[B_PARAMS, B_STATE, B_HIST]),
    ("topk_hist", &[B_PARAMS, B_LOGITS, B_STATE, B_HIST]),
    ("topk_select", &[B_PARAMS, B_STATE, B_HIST]),
    ("topp_hist", &[B_PARAMS, B_LOGITS, B_STATE, B_HIST]),
    ("topp_select", &[B_PARAMS, B_STATE, B_HIST]),
    ("logprob_partial", &[B_PARAMS, B_LOGITS, B_STATE, B_LP_PART]),
    ("logprob_final", &[B_PARAMS, B_LOGITS, B_STATE, B_OUT, B_LP_PART, B_LP]),
];
const ARGMAX_PARTIAL: usize = 0;
const ARGMAX_FINAL: usize = 1;
const GUMBEL_PARTIAL: usize = 2;
const GUMBEL_FINAL: usize = 3;
const INIT: usize = 4;
const TOPK_HIST: usize = 5;
const TOPK_SELECT: usize = 6;
const TOPP_HIST: usize = 7;
const TOPP_SELECT: usize = 8;
const LOGPROB_PARTIAL: usize = 9;
const LOGPROB_FINAL: usize = 10;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    n_vocab: u32,
    n_groups: u32,
    chunk: u32,
    index_bits: u32,
    n_levels: u32,
    top_k: u32,
    top_p: f32,
    log_min_p: f32,
    inv_temp: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    n_top: u32,
    _pad: [u32; 3],
}

/// One step's sampling settings. Draw d of a batch uses the counter `step + d`; the same
/// (seed, step) always draws the same token from the same logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleStep {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 or −1 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    pub seed: u64,
    pub step: u32,
    /// Log-probabilities of the chosen token and this many alternatives (0 = none, ≤ 20).
    pub n_logprobs: u32,
}

impl SampleStep {
    /// The step `step` of a generation with `params` (its seed resolved to `seed`).
    pub fn new(params: &SamplingParams, seed: u64, step: u32) -> SampleStep {
        SampleStep {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            seed,
            step,
            n_logprobs: params.n_logprobs as u32,
        }
    }
}

/// Which passes one step records; returned by [`Sampler::prepare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplePlan {
    pub greedy: bool,
    pub top_k: bool,
    pub top_p: bool,
    pub n_draws: u32,
    /// Alternatives in the log-probability record; 0 = no record.
    pub n_logprobs: u32,
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
}

pub struct Sampler {
    n_vocab: u32,
    max_draws: u32,
    base: Params,
    params: wgpu::Buffer,
    state: wgpu::Buffer,
    kernels: Vec<Kernel>,
    lp: wgpu::Buffer,
    _partials: wgpu::Buffer,
    _hist: wgpu::Buffer,
    _lp_part: wgpu::Buffer,
}

fn key(entry: &'static str) -> PipelineKey {
    PipelineKey::new(SHADER, entry, ShaderDefs::new().u32("WG", WG))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    ENTRIES.iter().map(|(e, _)| key(e)).collect()
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: "sampler", message }
}

impl Sampler {
    /// A sampler over `logits` ([n_vocab] f32) writing token ids to `out` ([1] u32).
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, n_vocab: u32, logits: &wgpu::Buffer, out: &wgpu::Buffer) -> Result<Sampler> {
        Self::with_max_draws(ctx, cache, n_vocab, 1, logits, out).await
    }

    /// As [`Sampler::new`], able to batch up to `max_draws` draws (`out`: [max_draws] u32).
    pub async fn with_max_draws(
        ctx: &GpuContext,
        cache: &PipelineCache,
        n_vocab: u32,
        max_draws: u32,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<Sampler> {
        if n_vocab == 0 || !(1..=MAX_DRAWS).contains(&max_draws) {
            return Err(unsupported(format!("n_vocab {n_vocab} must be > 0 and max_draws {max_draws} in 1..={MAX_DRAWS}")));
        }
        if logits.size() < n_vocab as u64 * 4 || out.size() < max_draws as u64 * 4 {
            return Err(unsupported(format!(
                "logits holds {} bytes (needs [{n_vocab}] f32), out {} bytes (needs [{max_draws}] u32)",
                logits.size(),
                out.size()
            )));
        }
        let n_groups = n_vocab.div_ceil(WG * ITEMS_PER_THREAD).clamp(1, MAX_GROUPS);
        let index_bits = (32 - (n_vocab - 1).leading_zeros()).max(1);
        let base = Params {
            n_vocab,
            n_groups,
            chunk: n_vocab.div_ceil(n_groups),
            index_bits,
            n_levels: 4 + index_bits.div_ceil(8),
            log_min_p: -f32::MAX,
            inv_temp: 1.0,
            top_p: 1.0,
            ..Default::default()
        };
        let params = crate::buffer::uniform_init(ctx, "sampler.params", bytemuck::bytes_of(&base));
        let state = crate::buffer::storage(ctx, "sampler.state", state::WORDS as u64 * 4)?;
        let hist = crate::buffer::storage(ctx, "sampler.hist", RADIX * 3 * 4)?;
        let partials = crate::buffer::storage(ctx, "sampler.partials", max_draws as u64 * n_groups as u64 * 8)?;
        let lp_part = crate::buffer::storage(ctx, "sampler.lp_part", n_groups as u64 * (MAX_LOGPROBS as u64 + 1) * 8)?;
        let lp = crate::buffer::storage(ctx, "sampler.lp", LP_WORDS as u64 * 4)?;
        let buffers: [&wgpu::Buffer; 8] = [&params, logits, &partials, &state, &hist, out, &lp_part, &lp];
        let mut kernels = Vec::with_capacity(ENTRIES.len());
        for (entry, bindings) in ENTRIES {
            let key = key(entry);
            let pipeline = cache.get(ctx, &key).await?;
            let layout = pipeline.get_bind_group_layout(0);
            let entries: Vec<wgpu::BindGroupEntry> =
                bindings.iter().map(|&b| wgpu::BindGroupEntry { binding: b, resource: buffers[b as usize].as_entire_binding() }).collect();
            let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&key.label()), layout: &layout, entries: &entries });
            kernels.push(Kernel { pipeline, bind });
        }
        Ok(Sampler { n_vocab, max_draws, base, params, state, kernels, lp, _partials: partials, _hist: hist, _lp_part: lp_part })
    }

    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }

    /// The internal state (layout in [`state`]): the max logit and the survivors' threshold.
    pub fn state_buffer(&self) -> &wgpu::Buffer {
        &self.state
    }

    /// The log-probability record of the last step that asked for one ([`LP_WORDS`] u32).
    pub fn logprobs_buffer(&self) -> &wgpu::Buffer {
        &self.lp
    }

    /// Reads the record back (172 bytes): the chosen id and the log-probabilities.
    pub async fn read_logprobs(&self, ctx: &GpuContext) -> Result<Sampled> {
        Ok(decode_logprobs(&crate::buffer::read_u32(ctx, &self.lp, 0, LP_WORDS).await?))
    }

    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, k: usize, x: u32, y: u32) {
        let k = &self.kernels[k];
        pass.set_pipeline(&k.pipeline);
        pass.set_bind_group(0, &k.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
    }

    /// Records greedy decoding: out[0] = the index of the largest logit (lowest on ties).
    pub fn encode_argmax(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.dispatch(pass, ARGMAX_PARTIAL, self.base.n_groups, 1);
        self.dispatch(pass, ARGMAX_FINAL, 1, 1);
    }

    /// Writes one step's settings (queued before the next submission) and returns which
    /// passes [`Sampler::encode_sample`] records. One prepared step per submission: a
    /// second `prepare` before the submit overwrites the first.
    pub fn prepare(&self, ctx: &GpuContext, step: &SampleStep, n_draws: u32) -> Result<SamplePlan> {
        let sp = SamplingParams {
            temperature: step.temperature,
            top_k: step.top_k,
            top_p: step.top_p,
            min_p: step.min_p,
            seed: Some(step.seed),
            n_logprobs: step.n_logprobs as usize,
            ..Default::default()
        };
        sp.validate().map_err(|e| unsupported(e.to_string()))?;
        if !(1..=self.max_draws).contains(&n_draws) {
            return Err(unsupported(format!("n_draws {n_draws} not in 1..={}", self.max_draws)));
        }
        let greedy = step.temperature <= 0.0;
        let top_k = step.top_k > 0 && (step.top_k as u32) < self.n_vocab;
        let top_p = step.top_p < 1.0;
        let p = Params {
            top_k: if top_k { step.top_k as u32 } else { 0 },
            top_p: step.top_p,
            log_min_p: if step.min_p > 0.0 { (step.min_p as f64).ln() as f32 } else { -f32::MAX },
            inv_temp: if greedy { 1.0 } else { 1.0 / step.temperature },
            seed_lo: step.seed as u32,
            seed_hi: (step.seed >> 32) as u32,
            step: step.step,
            n_top: step.n_logprobs,
            ..self.base
        };
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&p));
        Ok(SamplePlan { greedy, top_k, top_p, n_draws: if greedy { 1 } else { n_draws }, n_logprobs: step.n_logprobs })
    }

    /// Records one prepared step: greedy writes out[0]; otherwise draw d writes out[d].
    /// With log-probabilities, the record for out[0] follows.
    pub fn encode_sample(&self, pass: &mut wgpu::ComputePass<'_>, plan: &SamplePlan) {
        if plan.greedy {
            self.encode_argmax(pass);
        } else {
            self.encode_draws(pass, plan);
        }
        if plan.n_logprobs > 0 {
            self.dispatch(pass, LOGPROB_PARTIAL, self.base.n_groups, 1);
            self.dispatch(pass, LOGPROB_FINAL, 1, 1);
        }
    }

    fn encode_draws(&self, pass: &mut wgpu::ComputePass<'_>, plan: &SamplePlan) {
        let g = self.base.n_groups;
        self.dispatch(pass, INIT, 1, 1);
        self.encode_argmax(pass);
        for (on, hist, select) in [(plan.top_k, TOPK_HIST, TOPK_SELECT), (plan.top_p, TOPP_HIST, TOPP_SELECT)] {
            if on {
                for _ in 0..self.base.n_levels {
                    self.dispatch(pass, hist, g, 1);
                    self.dispatch(pass, select, 1, 1);
                }
            }
        }
        self.dispatch(pass, GUMBEL_PARTIAL, g, plan.n_draws);
        let (x, y) = fold_groups(plan.n_draws);
        self.dispatch(pass, GUMBEL_FINAL, x, y);
    }
}

/// A log-probability record ([`LP_WORDS`] u32) as a [`Sampled`].
pub fn decode_logprobs(words: &[u32]) -> Sampled {
    let n = (words[2] as usize).min(MAX_LOGPROBS);
    Sampled {
        id: words[0],
        logprob: Some(f32::from_bits(words[1])),
        top_logprobs: (0..n).map(|k| (words[3 + 2 * k], f32::from_bits(words[4 + 2 * k]))).collect(),
    }
}
