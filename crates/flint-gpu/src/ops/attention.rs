//! Paged attention over one layer's KV cache (`shaders/attention.wgsl`): causal, GQA,
//! optional sliding window. Long contexts are split over the KV length and merged by a
//! combine pass; each token's split count is a function of its own visible length only, so
//! its result is bit-identical whatever else shares the step (batch invariance). The step's
//! K/V rows are written by `ops::kv_write` first.

use std::sync::Arc;

use flint_core::kv::KvType;

use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::rope::{RopeSpec, RopeTables};
use crate::ops::{params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

/// Invocations of one `split` workgroup; also the positions it scores per tile.
pub const SPLIT_WG: u32 = 256;
pub const COMBINE_WG: u32 = 64;
/// Largest head size (K and V) the kernels take.
pub const MAX_HEAD_DIM: u32 = 256;
/// A token's visible positions are split until about this many `split` workgroups would run
/// for one decode token (enough to fill a large discrete GPU), in splits of at least
/// [`GPU_SPLIT_MIN_POSITIONS`] and at most [`MAX_SPLITS`].
pub const SPLIT_TARGET_GROUPS: u32 = 1024;
/// On CPU-type adapters (the serial kernel) a split takes at least this many positions before
/// the next split gets any.
pub const SPLIT_MIN_POSITIONS: u32 = 64;
/// On GPUs (`split`, `FLINT_TUNE` `split_min`) a split takes at least this many positions
/// before the next split gets any. A second split saves a workgroup a pass over some of the
/// positions (at 256 about a microsecond: 64 dependent V loads a lane) and costs the combine
/// pass, one more dispatch a layer behind a barrier, which on a GPU costs more; so a decode
/// splits from 257 positions, not 65 (at 8,192 either is [`MAX_SPLITS`] splits).
pub const GPU_SPLIT_MIN_POSITIONS: u32 = 256;
/// Most splits of one token; bounds the shared split scratch.
pub const MAX_SPLITS: u32 = 16;
/// Invocations of one `rows` workgroup (the serial kernel for CPU-type adapters): one 8-lane
/// SIMD group, so a decode step's few (token, head) rows still spread over the CPU threads.
pub const ROWS_WG: u32 = 8;
/// On CPU-type adapters a decode token's positions are split until about this many `rows`
/// invocations run.
pub const ROWS_TARGET_INVOCATIONS: u32 = 128;
/// Most positions one serial-kernel invocation walks: llvmpipe ends a loop after 65535
/// iterations, so longer ranges take more splits.
pub const ROWS_MAX_POSITIONS: u32 = 32768;
/// Head sizes the serial kernel is built for (head_dim = head_dim_v); others use `split`.
pub const ROWS_HEAD_DIMS: [u32; 4] = [64, 80, 128, 256];
/// Bindings of `attention.wgsl`: the output rows and the split kernel's partial results
/// (which the tiled kernel does not bind).
const OUT_BINDING: u32 = 8;
const SCRATCH_BINDING: u32 = 9;
/// Tokens of one `tiles` workgroup (the query tile) and positions of each K/V tile it loads.
pub const TILE_TOKENS: u32 = 16;
/// Steps of more than this many tokens take `tiles` where it is built ([`Tiles::OnGpus`]):
/// decode steps keep `split`, whose splits spread a few tokens' long contexts over the GPU.
pub const TILES_MIN_TOKENS: u32 = 16;
/// Grid dimensions are limited to this many workgroups (WebGPU's minimum).
pub(crate) const MAX_GRID_DIM: u32 = 65535;

/// One layer's attention shape. `scale` multiplies q·k (usually 1/√head_dim); `window`
/// limits token p to positions j with p − j < window.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionDesc {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub head_dim_v: u32,
    pub scale: f32,
    pub window: Option<u32>,
    /// RoPE fused into the step: kv_write rotates K rows, attention rotates q as it loads it.
    pub rope: Option<RopeSpec>,
    /// Scores (after `scale`) become softcap · tanh(score / softcap) before the softmax (gemma2).
    pub softcap: Option<f32>,
    /// How the K and V caches store their elements.
    pub k_type: KvType,
    pub v_type: KvType,
}

impl AttentionDesc {
    /// Floats in one token's q row: n_head * head_dim.
    pub fn q_dim(&self) -> u32 {
        self.n_head * self.head_dim
    }
    /// Floats in one K cache row: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> u32 {
        self.n_head_kv * self.head_dim
    }
    /// Floats in one V cache row: n_head_kv * head_dim_v.
    pub fn v_dim(&self) -> u32 {
        self.n_head_kv * self.head_dim_v
    }
    /// Floats in one token's output row: n_head * head_dim_v.
    pub fn out_dim(&self) -> u32 {
        self.n_head * self.head_dim_v
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(GpuError::Unsupported { op: "attention", message });
        if self.n_head_kv == 0 || self.n_head == 0 || self.n_head / self.n_head_kv * self.n_head_kv != self.n_head {
            return bad(format!("n_head {} is not a multiple of n_head_kv {}", self.n_head, self.n_head_kv));
        }
        if self.n_head > MAX_GRID_DIM {
            return bad(format!("n_head {} exceeds {MAX_GRID_DIM}", self.n_head));
        }
        if self.head_dim == 0 || self.head_dim & 3 != 0 || self.head_dim > MAX_HEAD_DIM {
            return bad(format!("head_dim {} must be a positive multiple of 4 up to {MAX_HEAD_DIM}", self.head_dim));
        }
        if self.head_dim_v == 0 || self.head_dim_v > MAX_HEAD_DIM.min(SPLIT_WG) {
            return bad(format!("head_dim_v {} must be in 1..={MAX_HEAD_DIM}", self.head_dim_v));
        }
        if self.window == Some(0) {
            return bad("a sliding window of 0 positions".into());
        }
        if !self.scale.is_finite() {
            return bad(format!("scale {} is not finite", self.scale));
        }
        if let Some(r) = &self.rope {
            r.validate(self.head_dim)?;
        }
        self.k_type.check_head_dim(self.head_dim as usize).and_then(|_| self.v_type.check_head_dim(self.head_dim_v as usize)).or_else(bad)?;
        Ok(())
    }

    /// Bytes of one K cache row and of one V cache row.
    pub fn row_bytes(&self) -> (u64, u64) {
        (self.k_type.row_bytes(self.kv_dim() as usize), self.v_type.row_bytes(self.v_dim() as usize))
    }
}

/// Defines for kernels that read or write the caches of `desc`: K_F16 / K_Q8, V_F16 / V_Q8
/// (f32: none), and K_ROT / V_ROT, the Hadamard group sizes of rotated caches.
pub(crate) fn kv_type_defs(desc: &AttentionDesc, mut defs: ShaderDefs) -> ShaderDefs {
    let (k, v) = (desc.k_type, desc.v_type);
    if let Some(n) = k.rotation(desc.head_dim as usize, true) {
        defs = defs.u32("K_ROT", n as u32);
    }
    if let Some(n) = v.rotation(desc.head_dim_v as usize, false) {
        defs = defs.u32("V_ROT", n as u32);
    }
    defs.flag("K_F16", k == KvType::F16).flag("K_Q8", k == KvType::Q8_0).flag("V_F16", v == KvType::F16).flag("V_Q8", v == KvType::Q8_0)
}

/// The shapes the variant lists cover: each RoPE setting, every (K, V) pair of types, at every
/// head size of the serial kernel and one (96) that q8_0 caches do not rotate.
pub(crate) fn variant_descs() -> Vec<AttentionDesc> {
    let mut v = Vec::new();
    for rope in rope_variants() {
        for k_type in KvType::ALL {
            for v_type in KvType::ALL {
                for head_dim in ROWS_HEAD_DIMS.into_iter().chain([96]) {
                    let rope = rope.clone().map(|r| RopeSpec { rope_dim: head_dim, ..r });
                    v.push(AttentionDesc {
                        n_head: 4,
                        n_head_kv: 1,
                        head_dim,
                        head_dim_v: head_dim,
                        scale: 1.0,
                        window: None,
                        rope,
                        softcap: None,
                        k_type,
                        v_type,
                    });
                }
            }
        }
    }
    v
}

fn attention_defs() -> ShaderDefs {
    ShaderDefs::new().u32("WG", SPLIT_WG).u32("WG_COMBINE", COMBINE_WG).u32("MAX_HEAD_DIM", MAX_HEAD_DIM)
}

/// Which prompt steps take the query-tiled kernel (`tiles` in attention.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiles {
    /// Never: the exact mode (a token's sums would depend on where its run of the tile
    /// starts, so its bits on the step).
    Off,
    /// Steps of more than [`TILES_MIN_TOKENS`] tokens on GPUs (not CPU-type adapters).
    OnGpus,
    /// Every step, on any adapter (tests of the kernel).
    Always,
}

/// Whether `tiles` is built for `desc`: head_dim a multiple of 32, head_dim_v of 64, caches
/// stored unrotated.
pub fn tiles_fit(desc: &AttentionDesc) -> bool {
    let rotated = desc.k_type.rotation(desc.head_dim as usize, true).is_some() || desc.v_type.rotation(desc.head_dim_v as usize, false).is_some();
    desc.head_dim.is_multiple_of(32) && desc.head_dim_v.is_multiple_of(64) && !rotated
}

fn tiles_key(desc: &AttentionDesc) -> PipelineKey {
    PipelineKey::new("attention.wgsl", "tiles", RopeSpec::defs(desc.rope.as_ref(), kv_type_defs(desc, attention_defs()).flag("TILES", true)))
}

fn split_key(desc: &AttentionDesc) -> PipelineKey {
    PipelineKey::new("attention.wgsl", "split", RopeSpec::defs(desc.rope.as_ref(), kv_type_defs(desc, attention_defs())))
}

fn combine_key() -> PipelineKey {
    PipelineKey::new("attention.wgsl", "combine", attention_defs())
}

/// The serial kernel's per-position statements for one head size: ROWS_DOT (q·k) and
/// ROWS_ACC (the output row's update), one line per vec4 so the kernel has no inner loop.
pub fn rows_code(head_dim: u32) -> (String, String) {
    let (mut dot, mut acc) = (String::new(), String::new());
    for k in 0..head_dim / 4 {
        dot += &format!("d4 = fma(qv[{k}], k4(krow, {k}u), d4);\n");
        acc += &format!("acc[{k}] = fma(vec4<f32>(pj), v4(vrow, {k}u), acc[{k}] * alpha);\n");
    }
    (dot, acc)
}

fn rows_key(desc: &AttentionDesc) -> PipelineKey {
    let head_dim = desc.head_dim;
    let (dot, acc) = rows_code(head_dim);
    let defs = kv_type_defs(desc, attention_defs())
        .u32("HEAD_DIM", head_dim)
        .u32("HEAD_DIM_V", head_dim)
        .u32("WG_ROWS", ROWS_WG)
        .code("ROWS_DOT", dot)
        .code("ROWS_ACC", acc);
    PipelineKey::new("attention.wgsl", "rows", RopeSpec::defs(desc.rope.as_ref(), defs))
}

/// The RoPE settings the variant lists cover (one of each style; the tables are bindings).
pub(crate) fn rope_variants() -> [Option<RopeSpec>; 3] {
    let spec = |style| RopeSpec { rope_dim: 64, style, base: 10000.0, freq_scale: 1.0, mscale: 1.0, freq_factors: None };
    [None, Some(spec(flint_core::arch::RopeStyle::Normal)), Some(spec(flint_core::arch::RopeStyle::Neox))]
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = vec![combine_key()];
    for desc in variant_descs() {
        v.push(split_key(&desc));
        if ROWS_HEAD_DIMS.contains(&desc.head_dim) {
            v.push(rows_key(&desc));
        }
        if tiles_fit(&desc) {
            v.push(tiles_key(&desc));
        }
    }
    v
}

pub(crate) fn need(op: &'static str, what: &str, buf: &wgpu::Buffer, bytes: u64) -> Result<()> {
    if buf.size() < bytes {
        return Err(GpuError::Unsupported { op, message: format!("{what} holds {} bytes, needs {bytes}", buf.size()) });
    }
    Ok(())
}

/// `row_bytes`: one position's row as stored.
pub(crate) fn check_cache(ctx: &GpuContext, op: &'static str, what: &str, buf: &wgpu::Buffer, row_bytes: u64, block_size: u32) -> Result<()> {
    need(op, what, buf, row_bytes * block_size as u64)?;
    if buf.size() > ctx.max_binding() {
        return Err(GpuError::Limit { what: "KV cache binding", need: buf.size(), limit: ctx.max_binding() });
    }
    Ok(())
}

pub(crate) fn check_batch(batch: &Batch, op: &'static str) -> Result<()> {
    if batch.max_tokens > MAX_GRID_DIM {
        return Err(GpuError::Unsupported { op, message: format!("max_tokens {} exceeds {MAX_GRID_DIM}", batch.max_tokens) });
    }
    Ok(())
}

/// Binds `(binding, buffer)` pairs in group 0 (entries that use only some bindings).
fn bind_at(ctx: &GpuContext, label: &str, pipeline: &wgpu::ComputePipeline, buffers: &[(u32, &wgpu::Buffer)]) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = buffers.iter().map(|&(binding, b)| wgpu::BindGroupEntry { binding, resource: b.as_entire_binding() }).collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &pipeline.get_bind_group_layout(0), entries: &entries })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AttnParams {
    n_head: u32,
    group: u32,
    head_dim: u32,
    head_dim_v: u32,
    kv_dim: u32,
    v_dim: u32,
    window: u32,
    scale: f32,
    /// The split policy (see [`SplitPolicy`]), evaluated per token in the shader.
    split_len: u32,
    max_split: u32,
    max_positions: u32,
    /// Splits every token takes regardless of the policy; 0 = the policy (tests).
    fixed_split: u32,
    /// Split records of one (token, head) in the scratch: MAX_SPLITS.
    split_stride: u32,
    /// Split records the scratch holds.
    part_cap: u32,
    /// > 0: the soft cap of the scores.
    softcap: f32,
    _pad: u32,
}

/// How a token's visible positions are split: `ceil(len / split_len)` splits, at most
/// `max_split`, and at least enough that no split walks more than `max_positions` (0 = no
/// bound). A function of the token's own length, never of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPolicy {
    pub split_len: u32,
    pub max_split: u32,
    pub max_positions: u32,
}

impl SplitPolicy {
    /// The split count for a token that sees `len` positions (mirrors attention.wgsl).
    pub fn splits(&self, len: u32) -> u32 {
        let mut n = len.div_ceil(self.split_len).clamp(1, self.max_split);
        if self.max_positions > 0 {
            n = n.max(len.div_ceil(self.max_positions));
        }
        n.min(MAX_SPLITS)
    }
}

/// `out[t, h * head_dim_v ..] = softmax(scale · q[t, h] · K) V` over the positions of token
/// t's sequence it may see, K and V read through the block table. q: `[n_tok, n_head *
/// head_dim]`, out: `[n_tok, n_head * head_dim_v]`, both f32.
pub struct Attention {
    split: Arc<wgpu::ComputePipeline>,
    /// The serial kernel and its bindings, on CPU-type adapters for the head sizes it is built
    /// for; it replaces `split`.
    rows: Option<(Arc<wgpu::ComputePipeline>, wgpu::BindGroup)>,
    combine: Arc<wgpu::ComputePipeline>,
    /// The query-tiled kernel, its bindings and the fewest tokens a step takes it at.
    tiles: Option<(Arc<wgpu::ComputePipeline>, wgpu::BindGroup, u32)>,
    split_bind: wgpu::BindGroup,
    combine_bind: wgpu::BindGroup,
    params: wgpu::Buffer,
    base: AttnParams,
    _rope: Option<RopeTables>,
    n_head: u32,
    max_tokens: u32,
    window: Option<u32>,
}

impl Attention {
    /// Bytes of split scratch a layer of `desc` needs for steps of `max_tokens` tokens: one
    /// scratch may serve every layer of a model (they run one after another).
    pub fn scratch_bytes(desc: &AttentionDesc, max_tokens: u32) -> u64 {
        let records = max_tokens as u64 * desc.n_head as u64 * MAX_SPLITS as u64;
        records * (desc.head_dim_v as u64 + 2) * 4
    }

    /// `scratch`: split partials, at least [`Attention::scratch_bytes`] (shared by layers).
    /// `tiles`: which prompt steps take the query-tiled kernel, where it fits `desc`.
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        desc: &AttentionDesc,
        q: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
        out: &wgpu::Buffer,
        scratch: &wgpu::Buffer,
        tiles: Tiles,
    ) -> Result<Self> {
        const OP: &str = "attention";
        desc.validate()?;
        check_batch(batch, OP)?;
        let mt = batch.max_tokens as u64;
        need(OP, "q", q, mt * desc.q_dim() as u64 * 4)?;
        need(OP, "out", out, mt * desc.out_dim() as u64 * 4)?;
        need(OP, "split scratch", scratch, Self::scratch_bytes(desc, batch.max_tokens))?;
        let (k_row, v_row) = desc.row_bytes();
        check_cache(ctx, OP, "k_cache", k_cache, k_row, batch.block_size)?;
        check_cache(ctx, OP, "v_cache", v_cache, v_row, batch.block_size)?;
        let serial = ctx.caps.cpu_like && desc.head_dim == desc.head_dim_v && ROWS_HEAD_DIMS.contains(&desc.head_dim);
        let rows_grid = (batch.max_tokens as u64 * desc.n_head as u64).div_ceil(ROWS_WG as u64);
        let serial = serial && rows_grid <= MAX_GRID_DIM as u64;
        let policy = Self::policy_for(serial, desc.n_head, &ctx.caps.tune);
        let base = AttnParams {
            n_head: desc.n_head,
            group: desc.n_head / desc.n_head_kv,
            head_dim: desc.head_dim,
            head_dim_v: desc.head_dim_v,
            kv_dim: desc.kv_dim(),
            v_dim: desc.v_dim(),
            window: desc.window.unwrap_or(0),
            scale: desc.scale,
            split_len: policy.split_len,
            max_split: policy.max_split,
            max_positions: policy.max_positions,
            fixed_split: 0,
            split_stride: MAX_SPLITS,
            part_cap: (mt * desc.n_head as u64 * MAX_SPLITS as u64) as u32,
            softcap: desc.softcap.unwrap_or(0.0),
            _pad: 0,
        };
        let p = params(ctx, "attention_params", &base);
        let (split_key, combine_key) = (split_key(desc), combine_key());
        let split = cache.get(ctx, &split_key).await?;
        let combine = cache.get(ctx, &combine_key).await?;
        let rope = desc.rope.as_ref().map(|r| RopeTables::new(ctx, "attention", r, desc.head_dim)).transpose()?;
        // Binding i is bufs[i] (`attention.wgsl`).
        let mut bufs = vec![&batch.info, &p, &batch.pos, &batch.seq, &batch.block_table, q, k_cache, v_cache, out, scratch];
        if let Some(r) = &rope {
            bufs.extend([&r.params, &r.inv_freq]);
        }
        let split_bind = crate::ops::bind(ctx, &split_key.label(), &split, &bufs);
        let combine_bind =
            bind_at(ctx, &combine_key.label(), &combine, &[(0, &batch.info), (1, &p), (2, &batch.pos), (OUT_BINDING, out), (SCRATCH_BINDING, scratch)]);
        let rows = if serial {
            let key = rows_key(desc);
            let pipeline = cache.get(ctx, &key).await?;
            let bind = crate::ops::bind(ctx, &key.label(), &pipeline, &bufs);
            Some((pipeline, bind))
        } else {
            None
        };
        let tiles_from = match tiles {
            Tiles::Off => None,
            Tiles::OnGpus => ctx.caps.tune.tiles_from.filter(|_| !ctx.caps.cpu_like).map(|n| n + 1),
            Tiles::Always => Some(1),
        };
        let tiles = match tiles_from.filter(|_| tiles_fit(desc)) {
            Some(from) => {
                let key = tiles_key(desc);
                let pipeline = cache.get(ctx, &key).await?;
                // Every binding but the split scratch, which it does not use.
                let at: Vec<(u32, &wgpu::Buffer)> = (0..).zip(bufs.iter().copied()).filter(|&(i, _)| i != SCRATCH_BINDING).collect();
                let bind = bind_at(ctx, &key.label(), &pipeline, &at);
                Some((pipeline, bind, from))
            }
            None => None,
        };
        Ok(Attention {
            split,
            rows,
            combine,
            tiles,
            split_bind,
            combine_bind,
            params: p,
            base,
            _rope: rope,
            n_head: desc.n_head,
            max_tokens: batch.max_tokens,
            window: desc.window,
        })
    }

    /// The serial kernel's policy, or `split`'s from the tuning (`tune.rs`; by default
    /// [`SPLIT_TARGET_GROUPS`] and [`GPU_SPLIT_MIN_POSITIONS`]).
    fn policy_for(serial: bool, n_head: u32, tune: &crate::tune::Tuning) -> SplitPolicy {
        let (target, split_len) = if serial { (ROWS_TARGET_INVOCATIONS, SPLIT_MIN_POSITIONS) } else { (tune.split_groups, tune.split_min) };
        let max_split = (target / n_head.max(1)).clamp(1, MAX_SPLITS);
        SplitPolicy { split_len, max_split, max_positions: if serial { ROWS_MAX_POSITIONS } else { 0 } }
    }

    /// Whether the serial kernel (CPU-type adapters) runs instead of `split`.
    pub fn serial(&self) -> bool {
        self.rows.is_some()
    }

    /// The policy this layer splits tokens with.
    pub fn policy(&self) -> SplitPolicy {
        SplitPolicy { split_len: self.base.split_len, max_split: self.base.max_split, max_positions: self.base.max_positions }
    }

    /// Whether steps of `n_tok` tokens take the query-tiled kernel.
    pub fn tiled(&self, n_tok: u32) -> bool {
        self.base.fixed_split == 0 && self.tiles.as_ref().is_some_and(|&(_, _, from)| n_tok >= from)
    }

    /// Runs `split` even where the serial or the tiled kernel was chosen (tests of each kernel).
    pub fn force_split(&mut self, ctx: &GpuContext) {
        self.rows = None;
        self.tiles = None;
        let policy = Self::policy_for(false, self.n_head, &ctx.caps.tune);
        self.base = AttnParams { split_len: policy.split_len, max_split: policy.max_split, max_positions: 0, ..self.base };
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&self.base));
    }

    /// Makes every token take `n` splits (None: the policy again); tests of the combine pass.
    pub fn fix_splits(&mut self, ctx: &GpuContext, n: Option<u32>) {
        self.base.fixed_split = n.map_or(0, |n| n.clamp(1, MAX_SPLITS));
        ctx.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&self.base));
    }

    /// Visible positions of the token that sees the most, given the longest sequence length.
    fn visible(&self, max_kv_len: u32) -> u32 {
        self.window.map_or(max_kv_len, |w| w.min(max_kv_len))
    }

    /// Encodes attention for `n_tok` tokens, none of which sees more than `max_kv_len`
    /// positions; the grid covers the most splits a token may take, each token uses its own.
    pub fn encode_kv(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32, max_kv_len: u32) {
        assert!(n_tok <= self.max_tokens, "attention: {n_tok} tokens, batch holds {}", self.max_tokens);
        if n_tok == 0 {
            return;
        }
        if let Some((tiles, bind, _)) = self.tiles.as_ref().filter(|_| self.tiled(n_tok)) {
            pass.set_pipeline(tiles);
            pass.set_bind_group(0, bind, &[]);
            crate::ops::dispatch(pass, n_tok.div_ceil(TILE_TOKENS), self.n_head, 1);
            return;
        }
        let n_split = match self.base.fixed_split {
            0 => self.policy().splits(self.visible(max_kv_len).max(1)),
            n => n,
        };
        match &self.rows {
            Some((rows, bind)) => {
                pass.set_pipeline(rows);
                pass.set_bind_group(0, bind, &[]);
                crate::ops::dispatch(pass, (n_tok * self.n_head).div_ceil(ROWS_WG), n_split, 1);
            }
            None => {
                pass.set_pipeline(&self.split);
                pass.set_bind_group(0, &self.split_bind, &[]);
                crate::ops::dispatch(pass, n_split, self.n_head, n_tok);
            }
        }
        if n_split > 1 {
            pass.set_pipeline(&self.combine);
            pass.set_bind_group(0, &self.combine_bind, &[]);
            crate::ops::dispatch(pass, n_split, self.n_head, n_tok);
        }
    }
}
