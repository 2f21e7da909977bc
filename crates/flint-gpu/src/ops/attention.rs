//! Paged attention over one layer's KV cache (`shaders/attention.wgsl`) and the write of a
//! step's K/V rows into that cache (`shaders/kv_write.wgsl`). Causal, GQA, optional sliding
//! window; long contexts are split over the KV length and merged by a combine pass.

use std::sync::Arc;

use crate::buffer::storage;
use crate::context::GpuContext;
use crate::error::{GpuError, Result};
use crate::ops::{params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::ops::rope::{RopeSpec, RopeTables};
use crate::shader::ShaderDefs;

/// Invocations of one `split` workgroup; also the positions it scores per tile.
pub const SPLIT_WG: u32 = 256;
pub const COMBINE_WG: u32 = 64;
pub const KV_WRITE_WG: u32 = 64;
/// Largest head size (K and V) the kernels take.
pub const MAX_HEAD_DIM: u32 = 256;
/// The KV length is split until about this many `split` workgroups run (enough to fill a
/// large discrete GPU several times over); it bounds the split scratch too.
pub const SPLIT_TARGET_GROUPS: u32 = 1024;
/// A split takes at least this many positions before the next split gets any.
pub const SPLIT_MIN_POSITIONS: u32 = 64;
/// Invocations of one `rows` workgroup (the serial kernel for CPU-type adapters).
pub const ROWS_WG: u32 = 64;
/// On CPU-type adapters the KV length is split until about this many `rows` invocations run
/// (two workgroups' worth, one per CPU thread of a small machine).
pub const ROWS_TARGET_INVOCATIONS: u32 = 2 * ROWS_WG;
/// Most positions one serial-kernel invocation walks: llvmpipe ends a loop after 65535
/// iterations, so longer ranges take more splits.
pub const ROWS_MAX_POSITIONS: u32 = 32768;
/// Head sizes the serial kernel is built for (head_dim = head_dim_v); others use `split`.
pub const ROWS_HEAD_DIMS: [u32; 4] = [64, 80, 128, 256];
/// Grid dimensions are limited to this many workgroups (WebGPU's minimum).
const MAX_GRID_DIM: u32 = 65535;

/// One layer's attention shape. `scale` multiplies q·k (usually 1/√head_dim); `window`
/// limits token p to positions j with p − j < window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDesc {
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub head_dim_v: u32,
    pub scale: f32,
    pub window: Option<u32>,
    /// RoPE fused into the step: kv_write rotates K rows, attention rotates q as it loads it.
    pub rope: Option<RopeSpec>,
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

    fn validate(&self) -> Result<()> {
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
        Ok(())
    }
}

fn kv_write_key(rope: Option<&RopeSpec>) -> PipelineKey {
    PipelineKey::new("kv_write.wgsl", "main", RopeSpec::defs(rope, ShaderDefs::new().u32("WG", KV_WRITE_WG)))
}

fn attention_defs() -> ShaderDefs {
    ShaderDefs::new().u32("WG", SPLIT_WG).u32("WG_COMBINE", COMBINE_WG).u32("MAX_HEAD_DIM", MAX_HEAD_DIM)
}

fn split_key(rope: Option<&RopeSpec>) -> PipelineKey {
    PipelineKey::new("attention.wgsl", "split", RopeSpec::defs(rope, attention_defs()))
}

fn combine_key() -> PipelineKey {
    PipelineKey::new("attention.wgsl", "combine", attention_defs())
}

/// The serial kernel's per-position statements for one head size: ROWS_DOT (q·k) and
/// ROWS_ACC (the output row's update), one line per vec4 so the kernel has no inner loop.
pub fn rows_code(head_dim: u32) -> (String, String) {
    let (mut dot, mut acc) = (String::new(), String::new());
    for k in 0..head_dim / 4 {
        dot += &format!("d4 = fma(qv[{k}], k_cache[krow + {k}u], d4);\n");
        acc += &format!("acc[{k}] = fma(vec4<f32>(pj), v_quad(vrow + {}u), acc[{k}] * alpha);\n", 4 * k);
    }
    (dot, acc)
}

fn rows_key(head_dim: u32, rope: Option<&RopeSpec>) -> PipelineKey {
    let (dot, acc) = rows_code(head_dim);
    let defs = attention_defs()
        .u32("HEAD_DIM", head_dim)
        .u32("HEAD_DIM_V", head_dim)
        .u32("WG_ROWS", ROWS_WG)
        .code("ROWS_DOT", dot)
        .code("ROWS_ACC", acc);
    PipelineKey::new("attention.wgsl", "rows", RopeSpec::defs(rope, defs))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = vec![combine_key()];
    let spec = |style| RopeSpec { rope_dim: 64, style, base: 10000.0, freq_scale: 1.0 };
    let ropes = [None, Some(spec(flint_core::arch::RopeStyle::Normal)), Some(spec(flint_core::arch::RopeStyle::Neox))];
    for rope in &ropes {
        v.push(kv_write_key(rope.as_ref()));
        v.push(split_key(rope.as_ref()));
        v.extend(ROWS_HEAD_DIMS.map(|hd| rows_key(hd, rope.as_ref())));
    }
    v
}

fn need(op: &'static str, what: &str, buf: &wgpu::Buffer, bytes: u64) -> Result<()> {
    if buf.size() < bytes {
        return Err(GpuError::Unsupported { op, message: format!("{what} holds {} bytes, needs {bytes}", buf.size()) });
    }
    Ok(())
}

fn check_cache(ctx: &GpuContext, op: &'static str, what: &str, buf: &wgpu::Buffer, row: u32, block_size: u32) -> Result<()> {
    need(op, what, buf, row as u64 * 4 * block_size as u64)?;
    if buf.size() > ctx.max_binding() {
        return Err(GpuError::Limit { what: "KV cache binding", need: buf.size(), limit: ctx.max_binding() });
    }
    Ok(())
}

fn check_batch(batch: &Batch, op: &'static str) -> Result<()> {
    if batch.max_tokens > MAX_GRID_DIM {
        return Err(GpuError::Unsupported { op, message: format!("max_tokens {} exceeds {MAX_GRID_DIM}", batch.max_tokens) });
    }
    Ok(())
}

/// Binds `(binding, buffer)` pairs in group 0 (entries that use only some bindings).
fn bind_at(ctx: &GpuContext, label: &str, pipeline: &wgpu::ComputePipeline, buffers: &[(u32, &wgpu::Buffer)]) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> =
        buffers.iter().map(|&(binding, b)| wgpu::BindGroupEntry { binding, resource: b.as_entire_binding() }).collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    kv_dim: u32,
    v_dim: u32,
    head_dim: u32,
    _pad: u32,
}

/// Copies a step's K `[n_tok, kv_dim]` and V `[n_tok, v_dim]` rows into the paged caches
/// `[n_slots, kv_dim]` / `[n_slots, v_dim]` at each token's (sequence, position) slot.
pub struct KvWrite {
    pipeline: Arc<wgpu::ComputePipeline>,
    _rope: Option<RopeTables>,
    bind: wgpu::BindGroup,
    groups_x: u32,
    max_tokens: u32,
}

impl KvWrite {
    #[allow(clippy::too_many_arguments)]
    pub async fn new(
        ctx: &GpuContext,
        cache: &PipelineCache,
        batch: &Batch,
        desc: &AttentionDesc,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        k_cache: &wgpu::Buffer,
        v_cache: &wgpu::Buffer,
    ) -> Result<Self> {
        const OP: &str = "kv_write";
        desc.validate()?;
        check_batch(batch, OP)?;
        let (kv_dim, v_dim) = (desc.kv_dim(), desc.v_dim());
        need(OP, "k", k, batch.max_tokens as u64 * kv_dim as u64 * 4)?;
        need(OP, "v", v, batch.max_tokens as u64 * v_dim as u64 * 4)?;
        check_cache(ctx, OP, "k_cache", k_cache, kv_dim, batch.block_size)?;
        check_cache(ctx, OP, "v_cache", v_cache, v_dim, batch.block_size)?;
        let key = kv_write_key(desc.rope.as_ref());
        let pipeline = cache.get(ctx, &key).await?;
        let p = params(ctx, "kv_write_params", &KvWriteParams { kv_dim, v_dim, head_dim: desc.head_dim, _pad: 0 });
        let rope = desc.rope.as_ref().map(|r| RopeTables::new(ctx, "kv_write", r, desc.head_dim)).transpose()?;
        let mut bufs = vec![&batch.info, &p, &batch.pos, &batch.seq, &batch.block_table, k, v, k_cache, v_cache];
        if let Some(r) = &rope {
            bufs.extend([&r.params, &r.inv_freq]);
        }
        let bind = crate::ops::bind(ctx, &key.label(), &pipeline, &bufs);
        Ok(KvWrite { pipeline, _rope: rope, bind, groups_x: (kv_dim + v_dim).div_ceil(KV_WRITE_WG), max_tokens: batch.max_tokens })
    }

    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        assert!(n_tok <= self.max_tokens, "kv_write: {n_tok} tokens, batch holds {}", self.max_tokens);
        if n_tok == 0 {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.groups_x, n_tok, 1);
    }
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
    split_min: u32,
    scale: f32,
    part_cap: u32,
    _pad: [u32; 2],
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
    split_bind: wgpu::BindGroup,
    combine_bind: wgpu::BindGroup,
    /// Split partials: [part_cap, head_dim_v] then [part_cap, 2] f32.
    part: wgpu::Buffer,
    _rope: Option<RopeTables>,
    n_head: u32,
    max_tokens: u32,
    max_ctx: u32,
}

impl Attention {
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
    ) -> Result<Self> {
        const OP: &str = "attention";
        desc.validate()?;
        check_batch(batch, OP)?;
        let mt = batch.max_tokens as u64;
        need(OP, "q", q, mt * desc.q_dim() as u64 * 4)?;
        need(OP, "out", out, mt * desc.out_dim() as u64 * 4)?;
        check_cache(ctx, OP, "k_cache", k_cache, desc.kv_dim(), batch.block_size)?;
        check_cache(ctx, OP, "v_cache", v_cache, desc.v_dim(), batch.block_size)?;
        let (split_key, combine_key) = (split_key(desc.rope.as_ref()), combine_key());
        let split = cache.get(ctx, &split_key).await?;
        let combine = cache.get(ctx, &combine_key).await?;
        let part_cap = SPLIT_TARGET_GROUPS;
        let part = storage(ctx, "attention_partials", part_cap as u64 * (desc.head_dim_v as u64 + 2) * 4)?;
        let p = params(
            ctx,
            "attention_params",
            &AttnParams {
                n_head: desc.n_head,
                group: desc.n_head / desc.n_head_kv,
                head_dim: desc.head_dim,
                head_dim_v: desc.head_dim_v,
                kv_dim: desc.kv_dim(),
                v_dim: desc.v_dim(),
                window: desc.window.unwrap_or(0),
                split_min: SPLIT_MIN_POSITIONS,
                scale: desc.scale,
                part_cap,
                _pad: [0; 2],
            },
        );
        let rope = desc.rope.as_ref().map(|r| RopeTables::new(ctx, "attention", r, desc.head_dim)).transpose()?;
        let mut bufs = vec![&batch.info, &p, &batch.pos, &batch.seq, &batch.block_table, q, k_cache, v_cache, out, &part];
        if let Some(r) = &rope {
            bufs.extend([&r.params, &r.inv_freq]);
        }
        let split_bind = crate::ops::bind(ctx, &split_key.label(), &split, &bufs);
        let combine_bind = bind_at(ctx, &combine_key.label(), &combine, &[(0, &batch.info), (1, &p), (8, out), (9, &part)]);
        let rows_grid = (batch.max_tokens as u64 * desc.n_head as u64).div_ceil(ROWS_WG as u64);
        let serial = ctx.caps.cpu_like && desc.head_dim == desc.head_dim_v && ROWS_HEAD_DIMS.contains(&desc.head_dim);
        let rows = if serial && rows_grid <= MAX_GRID_DIM as u64 {
            let key = rows_key(desc.head_dim, desc.rope.as_ref());
            let pipeline = cache.get(ctx, &key).await?;
            let bind = crate::ops::bind(ctx, &key.label(), &pipeline, &bufs);
            Some((pipeline, bind))
        } else {
            None
        };
        Ok(Attention {
            split,
            rows,
            combine,
            split_bind,
            combine_bind,
            part,
            _rope: rope,
            n_head: desc.n_head,
            max_tokens: batch.max_tokens,
            max_ctx: batch.max_blocks.saturating_mul(batch.block_size),
        })
    }

    /// Whether the serial kernel (CPU-type adapters) runs instead of `split`.
    pub fn serial(&self) -> bool {
        self.rows.is_some()
    }

    /// Runs `split` even where the serial kernel was chosen (tests of both kernels).
    pub fn force_split(&mut self) {
        self.rows = None;
    }

    /// The split count for `n_tok` tokens whose longest visible context is `max_kv_len`:
    /// enough workgroups (serial kernel: invocations) to fill the device, no split shorter than
    /// the minimum, and for the serial kernel none longer than [`ROWS_MAX_POSITIONS`].
    pub fn n_splits(&self, n_tok: u32, max_kv_len: u32) -> u32 {
        self.splits_for(self.rows.is_some(), n_tok, max_kv_len)
    }

    fn splits_for(&self, serial: bool, n_tok: u32, max_kv_len: u32) -> u32 {
        let rows = n_tok.max(1) * self.n_head;
        let target = if serial { ROWS_TARGET_INVOCATIONS } else { SPLIT_TARGET_GROUPS };
        let n = (target / rows).min(max_kv_len.div_ceil(SPLIT_MIN_POSITIONS)).max(1);
        if serial {
            n.max(max_kv_len.div_ceil(ROWS_MAX_POSITIONS))
        } else {
            n
        }
    }

    /// Whether `n_split` splits of `n_tok` tokens fit the split scratch.
    fn fits(&self, n_tok: u32, n_split: u32) -> bool {
        n_split == 1 || n_split as u64 * n_tok as u64 * self.n_head as u64 <= SPLIT_TARGET_GROUPS as u64
    }

    /// Encodes attention for `n_tok` tokens, splitting for the longest context the batch allows.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        self.encode_kv(pass, n_tok, self.max_ctx);
    }

    /// Like [`encode`](Self::encode) when the caller knows no token sees more than
    /// `max_kv_len` positions (e.g. n_past + n_tok), which avoids empty splits.
    pub fn encode_kv(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32, max_kv_len: u32) {
        let serial = self.rows.is_some();
        let n = self.splits_for(serial, n_tok, max_kv_len);
        if serial && !self.fits(n_tok, n) {
            // Too long for the serial kernel's scratch (a context past ROWS_MAX_POSITIONS
            // with many tokens): the split kernel.
            self.encode_with(pass, n_tok, self.splits_for(false, n_tok, max_kv_len), false);
        } else {
            self.encode_with(pass, n_tok, n, serial);
        }
    }

    /// Encodes with an explicit split count (tests and tuning); `n_split * n_tok * n_head`
    /// must fit the scratch when `n_split > 1`.
    pub fn encode_splits(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32, n_split: u32) {
        self.encode_with(pass, n_tok, n_split, self.rows.is_some());
    }

    fn encode_with(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32, n_split: u32, serial: bool) {
        assert!(n_tok <= self.max_tokens, "attention: {n_tok} tokens, batch holds {}", self.max_tokens);
        let n_split = n_split.max(1);
        assert!(self.fits(n_tok, n_split), "attention: {n_split} splits of {n_tok} tokens overflow the split scratch");
        if n_tok == 0 {
            return;
        }
        match (&self.rows, serial) {
            (Some((rows, bind)), true) => {
                pass.set_pipeline(rows);
                pass.set_bind_group(0, bind, &[]);
                pass.dispatch_workgroups((n_tok * self.n_head).div_ceil(ROWS_WG), n_split, 1);
            }
            _ => {
                pass.set_pipeline(&self.split);
                pass.set_bind_group(0, &self.split_bind, &[]);
                pass.dispatch_workgroups(n_split, self.n_head, n_tok);
            }
        }
        if n_split > 1 {
            pass.set_pipeline(&self.combine);
            pass.set_bind_group(0, &self.combine_bind, &[]);
            pass.dispatch_workgroups(n_split, self.n_head, n_tok);
        }
    }

    /// Bytes of split scratch this layer holds.
    pub fn scratch_bytes(&self) -> u64 {
        self.part.size()
    }
}

/// Encodes a copy-on-write block copy (`flint_core::kv::BlockCopy`) in one cache whose blocks
/// are `block_bytes` long (block_size * row floats * 4). WebGPU forbids a copy within one
/// buffer, so it goes through `scratch` (at least `block_bytes`); call it for every layer's K
/// and V cache before the step's `KvWrite`.
pub fn encode_block_copy(
    enc: &mut wgpu::CommandEncoder,
    cache: &wgpu::Buffer,
    scratch: &wgpu::Buffer,
    block_bytes: u64,
    src: u32,
    dst: u32,
) {
    enc.copy_buffer_to_buffer(cache, src as u64 * block_bytes, scratch, 0, block_bytes);
    enc.copy_buffer_to_buffer(scratch, 0, cache, dst as u64 * block_bytes, block_bytes);
}
