//! The GPU sampler: greedy argmax and exact sampling over rows of logits, each row with its
//! own settings (`shaders/sample_argmax.wgsl`, `sample_threshold.wgsl`, `sample_logprobs.wgsl`).
//! The CPU reads back token ids (4 bytes a row), never the logits.
//!
//! A sampled row reproduces `flint_core::sampling::Sampler::distribution` (top-k, then top-p
//! and min-p on the untempered softmax of the top-k set, then temperature) with an exact
//! threshold search (radix select over (logit, index) keys) and Gumbel-max over the
//! survivors. Its random numbers are keyed by (seed, stream, step, token), so a row's draw
//! depends only on its own logits and settings, never on the other rows of the step.
//!
//! Speculative decoding with a sampled draft (`shaders/sample_spec.wgsl`, once a q store is
//! attached with [`Sampler::attach_q`]): a draft model's sampler records each drafted row's
//! distribution q in the store, and the target's sampler verifies a drafted token against it
//! with the rule of Leviathan et al. (keep it with probability min(1, p/q), else draw from
//! norm(max(0, p − q))), so the row's token follows p exactly.
//!
//! Log-probabilities (`n_logprobs` > 0) are the log-softmax at temperature 1 of the logits as
//! they are in the buffer (after `ops::penalize`), of the chosen token and the top n (≤ 20),
//! as `flint_core::sampling::log_softmax_top` defines them: one record of [`LP_WORDS`] words
//! per row.

use std::sync::Arc;

use flint_core::sampling::{DraftLink, Sampled, Sampler as CpuSampler, SamplingParams, MAX_LOGPROBS};

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

/// Threads per workgroup; the histogram kernels need exactly one per radix bucket.
const WG: u32 = 256;
const RADIX: u64 = 256;
/// Logits each thread scans in the partial passes before more workgroups are used. A GPU
/// wants many workgroups per row to fill its SMs; a CPU-type adapter runs a workgroup's 256
/// threads as loops of SIMD lanes between its barriers, so it wants few, long workgroups —
/// still more per row than it has threads (gemma's 262,144 logits: 16 per row on lavapipe,
/// 256 on a GPU). Only the partials' count changes; each pass reads the same logits.
const ITEMS_PER_THREAD: u32 = 4;
const CPU_ITEMS_PER_THREAD: u32 = 64;
/// Most workgroups per row, so the final pass reduces them in one workgroup.
const MAX_GROUPS: u32 = WG;
/// Most rows, and most draws per row (grid dimensions).
pub const MAX_ROWS: u32 = 65535;
pub const MAX_DRAWS: u32 = 65535;

/// Word offsets in each row's state (mirrors sample_common.wgsl), for tests and taps.
pub mod state {
    /// f32 bits of the largest logit.
    pub const MAX_BITS: usize = 0;
    pub const MAX_ID: usize = 1;
    /// Survivors are the tokens whose key (order_key(logit), n_vocab−1−index) is ≥ this.
    pub const THR_V: usize = 2;
    pub const THR_I: usize = 3;
    /// sample_spec.wgsl: Σ exp((logit − max)/T) over the survivors, p(draft), q(draft) (f32).
    pub const MASS_BITS: usize = 28;
    pub const PX_BITS: usize = 29;
    pub const QX_BITS: usize = 30;
    pub const WORDS: usize = 32;
}

/// Words of one row's log-probability record: chosen id, its log-probability (f32 bits), the
/// number n of alternatives, then n × (id, log-probability bits).
pub const LP_WORDS: usize = 3 + 2 * MAX_LOGPROBS;
const LP_STRIDE: u64 = 1 + MAX_LOGPROBS as u64;

/// Binding numbers in sample_common.wgsl.
const B_PARAMS: u32 = 0;
const B_LOGITS: u32 = 1;
const B_PARTIALS: u32 = 2;
const B_STATE: u32 = 3;
const B_HIST: u32 = 4;
const B_OUT: u32 = 5;
const B_LP_PART: u32 = 6;
const B_LP: u32 = 7;
const B_ROWS: u32 = 8;
const B_Q: u32 = 9;

/// Every kernel: its shader, entry point and the bindings it uses (its auto layout).
const ENTRIES: [(&str, &str, &[u32]); 11] = [
    ("sample_argmax.wgsl", "argmax_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE, B_ROWS]),
    ("sample_argmax.wgsl", "argmax_final", &[B_PARAMS, B_PARTIALS, B_STATE, B_OUT, B_ROWS]),
    ("sample_argmax.wgsl", "gumbel_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE, B_ROWS]),
    ("sample_argmax.wgsl", "gumbel_final", &[B_PARAMS, B_PARTIALS, B_STATE, B_OUT, B_ROWS]),
    ("sample_threshold.wgsl", "init", &[B_PARAMS, B_STATE, B_HIST, B_ROWS]),
    ("sample_threshold.wgsl", "topk_hist", &[B_PARAMS, B_LOGITS, B_STATE, B_HIST]),
    ("sample_threshold.wgsl", "topk_select", &[B_PARAMS, B_STATE, B_HIST]),
    ("sample_threshold.wgsl", "topp_hist", &[B_PARAMS, B_LOGITS, B_STATE, B_HIST]),
    ("sample_threshold.wgsl", "topp_select", &[B_PARAMS, B_STATE, B_HIST, B_ROWS]),
    ("sample_logprobs.wgsl", "logprob_partial", &[B_PARAMS, B_LOGITS, B_STATE, B_LP_PART, B_ROWS]),
    ("sample_logprobs.wgsl", "logprob_final", &[B_PARAMS, B_LOGITS, B_STATE, B_OUT, B_LP_PART, B_LP, B_ROWS]),
];
/// The speculative kernels (sample_spec.wgsl), built once a q store is attached.
const SPEC_ENTRIES: [(&str, &str, &[u32]); 5] = [
    ("sample_spec.wgsl", "mass_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE, B_ROWS]),
    ("sample_spec.wgsl", "mass_final", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE, B_ROWS, B_Q]),
    ("sample_spec.wgsl", "q_write", &[B_PARAMS, B_LOGITS, B_STATE, B_ROWS, B_Q]),
    ("sample_spec.wgsl", "residual_partial", &[B_PARAMS, B_LOGITS, B_PARTIALS, B_STATE, B_ROWS, B_Q]),
    ("sample_spec.wgsl", "verify_final", &[B_PARAMS, B_PARTIALS, B_STATE, B_OUT, B_ROWS]),
];
const MASS_PARTIAL: usize = 0;
const MASS_FINAL: usize = 1;
const Q_WRITE: usize = 2;
const RESIDUAL_PARTIAL: usize = 3;
const VERIFY_FINAL: usize = 4;
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
    n_rows: u32,
    n_draws: u32,
    q_stride: u32,
}

/// One row's settings on the device (`Row` in sample_common.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct RowParams {
    top_k: u32,
    top_p: f32,
    log_min_p: f32,
    inv_temp: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    n_top: u32,
    greedy: u32,
    draft: u32,
    q_row: u32,
    _pad: u32,
}

/// One row's settings for one step. Draw d of a row uses the counter `step + d`; the same
/// (seed, stream, step) always draws the same token from the same logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleRow {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 or −1 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    pub seed: u64,
    /// The random stream of the seed (a request's choice index).
    pub stream: u32,
    pub step: u32,
    /// Log-probabilities of the chosen token and this many alternatives (0 = none, ≤ 20).
    pub n_logprobs: u32,
    /// Speculative decoding with a sampled draft (sampled rows only; see the module docs).
    pub link: Option<DraftLink>,
}

impl SampleRow {
    /// Step `step` of a generation with `params`, on stream `stream` of `seed`.
    pub fn new(params: &SamplingParams, seed: u64, stream: u32, step: u32) -> SampleRow {
        SampleRow {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            seed,
            stream,
            step,
            n_logprobs: params.n_logprobs as u32,
            link: None,
        }
    }

    /// The next draw of `sampler`: its settings, seed and stream, and a fresh counter unless
    /// it is greedy.
    pub fn next(sampler: &mut CpuSampler) -> SampleRow {
        let step = if sampler.params().temperature > 0.0 { sampler.next_step() } else { 0 };
        SampleRow { link: sampler.link(), ..SampleRow::new(sampler.params(), sampler.seed(), sampler.stream(), step) }
    }

    fn greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    fn device(&self, n_vocab: u32) -> RowParams {
        let greedy = self.greedy();
        let top_k = self.top_k > 0 && (self.top_k as u32) < n_vocab;
        let (draft, q_row) = match self.link.filter(|_| !greedy) {
            Some(DraftLink::Record { q_row }) => (u32::MAX, q_row),
            Some(DraftLink::Verify { token, q_row }) => (token, q_row),
            None => (u32::MAX, u32::MAX),
        };
        RowParams {
            top_k: if top_k { self.top_k as u32 } else { 0 },
            top_p: self.top_p,
            log_min_p: if self.min_p > 0.0 { (self.min_p as f64).ln() as f32 } else { -f32::MAX },
            inv_temp: if greedy { 1.0 } else { 1.0 / self.temperature },
            seed_lo: self.seed as u32,
            // Stream 0 is the seed itself; others move the hash input to another key.
            seed_hi: (self.seed >> 32) as u32 ^ self.stream.wrapping_mul(0x9E37_79B9),
            step: self.step,
            n_top: self.n_logprobs,
            greedy: greedy as u32,
            draft,
            q_row,
            _pad: 0,
        }
    }
}

/// Which passes one step records; returned by [`Sampler::prepare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplePlan {
    pub n_rows: u32,
    pub n_draws: u32,
    /// A row draws (not greedy).
    pub sampled: bool,
    pub top_k: bool,
    pub top_p: bool,
    /// A row asks for log-probabilities.
    pub logprobs: bool,
    /// A row records its distribution in the q store (a draft model's row).
    pub record: bool,
    /// A row verifies a drafted token against the q store.
    pub verify: bool,
}

struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
}

pub struct Sampler {
    n_vocab: u32,
    max_rows: u32,
    max_draws: u32,
    base: Params,
    params: wgpu::Buffer,
    rows: wgpu::Buffer,
    state: wgpu::Buffer,
    out: wgpu::Buffer,
    lp: wgpu::Buffer,
    kernels: Vec<Kernel>,
    partials: wgpu::Buffer,
    hist: wgpu::Buffer,
    lp_part: wgpu::Buffer,
    logits: wgpu::Buffer,
    /// The q store's kernels, and its rows; none until one is attached.
    spec: Vec<Kernel>,
    q_rows: u32,
}

fn key(shader: &'static str, entry: &'static str) -> PipelineKey {
    PipelineKey::new(shader, entry, ShaderDefs::new().u32("WG", WG).u32("MAX_TOP", MAX_LOGPROBS as u32))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    ENTRIES.iter().chain(&SPEC_ENTRIES).map(|(s, e, _)| key(s, e)).collect()
}

/// Builds each kernel of `entries` with a bind group over `buffers` (indexed by binding).
async fn kernels(ctx: &GpuContext, cache: &PipelineCache, entries: &[(&'static str, &'static str, &[u32])], buffers: &[&wgpu::Buffer]) -> Result<Vec<Kernel>> {
    let mut kernels = Vec::with_capacity(entries.len());
    for &(shader, entry, bindings) in entries {
        let key = key(shader, entry);
        let pipeline = cache.get(ctx, &key).await?;
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry> =
            bindings.iter().map(|&b| wgpu::BindGroupEntry { binding: b, resource: buffers[b as usize].as_entire_binding() }).collect();
        let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(&key.label()), layout: &layout, entries: &entries });
        kernels.push(Kernel { pipeline, bind });
    }
    Ok(kernels)
}

fn unsupported(message: String) -> GpuError {
    GpuError::Unsupported { op: "sampler", message }
}

impl Sampler {
    /// A sampler over `logits` ([max_rows, n_vocab] f32), up to `max_rows` rows a step and
    /// `max_draws` draws a row (more than one only in tests: draw d uses counter step + d).
    pub async fn new(ctx: &GpuContext, cache: &PipelineCache, n_vocab: u32, max_rows: u32, max_draws: u32, logits: &wgpu::Buffer) -> Result<Sampler> {
        if n_vocab == 0 || !(1..=MAX_ROWS).contains(&max_rows) || !(1..=MAX_DRAWS).contains(&max_draws) {
            return Err(unsupported(format!("n_vocab {n_vocab} must be > 0, max_rows {max_rows} in 1..={MAX_ROWS}, max_draws {max_draws} in 1..={MAX_DRAWS}")));
        }
        let rows64 = max_rows as u64;
        if logits.size() < rows64 * n_vocab as u64 * 4 {
            return Err(unsupported(format!("logits holds {} bytes, needs [{max_rows}, {n_vocab}] f32", logits.size())));
        }
        let items = if ctx.caps.cpu_like { CPU_ITEMS_PER_THREAD } else { ITEMS_PER_THREAD };
        let n_groups = n_vocab.div_ceil(WG * items).clamp(1, MAX_GROUPS);
        let index_bits = (32 - (n_vocab - 1).leading_zeros()).max(1);
        let base = Params { n_vocab, n_groups, chunk: n_vocab.div_ceil(n_groups), index_bits, n_levels: 4 + index_bits.div_ceil(8), ..Default::default() };
        let storage = |label: &str, bytes: u64| crate::buffer::storage(ctx, label, bytes);
        let params = crate::buffer::uniform_init(ctx, "sampler.params", bytemuck::bytes_of(&base));
        let rows = storage("sampler.rows", rows64 * size_of::<RowParams>() as u64)?;
        let state = storage("sampler.state", rows64 * state::WORDS as u64 * 4)?;
        let hist = storage("sampler.hist", rows64 * RADIX * 3 * 4)?;
        let partials = storage("sampler.partials", rows64 * max_draws as u64 * n_groups as u64 * 8)?;
        let out = storage("sampler.out", rows64 * max_draws as u64 * 4)?;
        let lp_part = storage("sampler.lp_part", rows64 * n_groups as u64 * LP_STRIDE * 8)?;
        let lp = storage("sampler.lp", rows64 * LP_WORDS as u64 * 4)?;
        let kernels = kernels(ctx, cache, &ENTRIES, &[&params, logits, &partials, &state, &hist, &out, &lp_part, &lp, &rows]).await?;
        Ok(Sampler {
            n_vocab,
            max_rows,
            max_draws,
            base,
            params,
            rows,
            state,
            out,
            lp,
            kernels,
            partials,
            hist,
            lp_part,
            logits: logits.clone(),
            spec: Vec::new(),
            q_rows: 0,
        })
    }

    /// Attaches a q store for speculative decoding with a sampled draft: `q` holds rows of
    /// `q_stride` f32 (the target's vocabulary size). A draft model's sampler records rows
    /// into it ([`DraftLink::Record`]), the target's verifies against them
    /// ([`DraftLink::Verify`]); both are attached to the same buffer.
    pub async fn attach_q(&mut self, ctx: &GpuContext, cache: &PipelineCache, q: &wgpu::Buffer, q_stride: u32) -> Result<()> {
        let q_rows = if q_stride == 0 { 0 } else { q.size() / (q_stride as u64 * 4) };
        if q_rows == 0 || q_rows > u32::MAX as u64 {
            return Err(unsupported(format!("a q store of {} bytes cannot hold rows of {q_stride} f32", q.size())));
        }
        let buffers = [&self.params, &self.logits, &self.partials, &self.state, &self.hist, &self.out, &self.lp_part, &self.lp, &self.rows, q];
        self.spec = kernels(ctx, cache, &SPEC_ENTRIES, &buffers).await?;
        self.q_rows = q_rows as u32;
        self.base.q_stride = q_stride;
        Ok(())
    }

    /// Rows of the attached q store (0: none).
    pub fn q_rows(&self) -> u32 {
        self.q_rows
    }

    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }

    /// The rows' internal state ([max_rows, state::WORDS] u32): the max logit and the
    /// survivors' threshold.
    pub fn state_buffer(&self) -> &wgpu::Buffer {
        &self.state
    }

    /// Token ids: [max_rows, n_draws] u32 (row r's draw d at r · n_draws + d).
    pub fn out_buffer(&self) -> &wgpu::Buffer {
        &self.out
    }

    /// Log-probability records: [max_rows, LP_WORDS] u32.
    pub fn logprobs_buffer(&self) -> &wgpu::Buffer {
        &self.lp
    }

    /// Writes one step's settings (queued before the next submission) and returns which
    /// passes [`Sampler::encode`] records. One prepared step per submission: a second
    /// `prepare` before the submit overwrites the first.
    pub fn prepare(&self, ctx: &GpuContext, rows: &[SampleRow], n_draws: u32) -> Result<SamplePlan> {
        if rows.is_empty() || rows.len() > self.max_rows as usize {
            return Err(unsupported(format!("{} rows, the sampler takes 1..={}", rows.len(), self.max_rows)));
        }
        if !(1..=self.max_draws).contains(&n_draws) {
            return Err(unsupported(format!("n_draws {n_draws} not in 1..={}", self.max_draws)));
        }
        for r in rows {
            let sp = SamplingParams {
                temperature: r.temperature,
                top_k: r.top_k,
                top_p: r.top_p,
                min_p: r.min_p,
                n_logprobs: r.n_logprobs as usize,
                ..Default::default()
            };
            sp.validate().map_err(|e| unsupported(e.to_string()))?;
            if let Some(DraftLink::Record { q_row } | DraftLink::Verify { q_row, .. }) = r.link {
                if q_row >= self.q_rows {
                    return Err(unsupported(format!("q row {q_row}, the store holds {}", self.q_rows)));
                }
            }
        }
        let dev: Vec<RowParams> = rows.iter().map(|r| r.device(self.n_vocab)).collect();
        let p = Params { n_rows: rows.len() as u32, n_draws, ..self.base };
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&p));
        ctx.queue.write_buffer(&self.rows, 0, bytemuck::cast_slice(&dev));
        let sampled: Vec<&RowParams> = dev.iter().filter(|r| r.greedy == 0).collect();
        Ok(SamplePlan {
            n_rows: rows.len() as u32,
            n_draws,
            sampled: !sampled.is_empty(),
            top_k: sampled.iter().any(|r| r.top_k > 0),
            top_p: sampled.iter().any(|r| r.top_p < 1.0),
            logprobs: dev.iter().any(|r| r.n_top > 0),
            record: sampled.iter().any(|r| r.q_row != u32::MAX && r.draft == u32::MAX),
            verify: sampled.iter().any(|r| r.q_row != u32::MAX && r.draft != u32::MAX),
        })
    }

    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, k: usize, x: u32, y: u32, z: u32) {
        run(pass, &self.kernels[k], x, y, z);
    }

    /// Records one prepared step: row r's draws go to out[r · n_draws ..], its
    /// log-probability record (for its first draw) to lp[r · LP_WORDS ..].
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, plan: &SamplePlan) {
        let (g, rows) = (self.base.n_groups, plan.n_rows);
        if plan.sampled {
            self.dispatch(pass, INIT, 1, rows, 1);
        }
        self.dispatch(pass, ARGMAX_PARTIAL, g, rows, 1);
        self.dispatch(pass, ARGMAX_FINAL, 1, rows, 1);
        for (on, hist, select) in [(plan.top_k, TOPK_HIST, TOPK_SELECT), (plan.top_p, TOPP_HIST, TOPP_SELECT)] {
            if on {
                for _ in 0..self.base.n_levels {
                    self.dispatch(pass, hist, g, rows, 1);
                    self.dispatch(pass, select, 1, rows, 1);
                }
            }
        }
        if plan.sampled {
            self.dispatch(pass, GUMBEL_PARTIAL, g, rows, plan.n_draws);
            self.dispatch(pass, GUMBEL_FINAL, plan.n_draws, rows, 1);
        }
        // Before the log-probabilities, which report the row's final token.
        if plan.record || plan.verify {
            run(pass, &self.spec[MASS_PARTIAL], g, rows, 1);
            run(pass, &self.spec[MASS_FINAL], 1, rows, 1);
        }
        if plan.record {
            run(pass, &self.spec[Q_WRITE], g, rows, 1);
        }
        if plan.verify {
            run(pass, &self.spec[RESIDUAL_PARTIAL], g, rows, plan.n_draws);
            run(pass, &self.spec[VERIFY_FINAL], plan.n_draws, rows, 1);
        }
        if plan.logprobs {
            self.dispatch(pass, LOGPROB_PARTIAL, g, rows, 1);
            self.dispatch(pass, LOGPROB_FINAL, 1, rows, 1);
        }
    }

    /// Reads the step's results back (tests and tools; the model copies them into its own
    /// readback buffer instead): every row's draws, and its record when it asked for one.
    pub async fn read(&self, ctx: &GpuContext, plan: &SamplePlan, rows: &[SampleRow]) -> Result<Vec<Vec<Sampled>>> {
        let n = (plan.n_rows * plan.n_draws) as usize;
        let out = crate::buffer::read_u32(ctx, &self.out, 0, n).await?;
        let lp = if plan.logprobs { crate::buffer::read_u32(ctx, &self.lp, 0, plan.n_rows as usize * LP_WORDS).await? } else { Vec::new() };
        Ok(decode(plan, rows, &out, &lp))
    }
}

fn run(pass: &mut wgpu::ComputePass<'_>, k: &Kernel, x: u32, y: u32, z: u32) {
    pass.set_pipeline(&k.pipeline);
    pass.set_bind_group(0, &k.bind, &[]);
    crate::ops::dispatch(pass, x, y, z);
}

/// A step's results from the `out` words ([n_rows, n_draws]) and the `lp` records
/// ([n_rows, LP_WORDS], empty without log-probabilities): per row its draws, the first with
/// log-probabilities when the row asked for them.
pub fn decode(plan: &SamplePlan, rows: &[SampleRow], out: &[u32], lp: &[u32]) -> Vec<Vec<Sampled>> {
    let d = plan.n_draws as usize;
    rows.iter()
        .enumerate()
        .map(|(r, row)| {
            let mut draws: Vec<Sampled> = out[r * d..(r + 1) * d].iter().map(|&id| Sampled { id, ..Default::default() }).collect();
            if row.n_logprobs > 0 {
                draws[0] = decode_logprobs(&lp[r * LP_WORDS..(r + 1) * LP_WORDS]);
            }
            draws
        })
        .collect()
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
