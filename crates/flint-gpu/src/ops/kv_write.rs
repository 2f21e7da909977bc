//! The write of a step's K/V rows into one layer's paged caches (`shaders/kv_write.wgsl`),
//! RoPE applied to K on the way, and the copy-on-write block copies a step performs first.

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::Result;
use flint_core::kv::KvType;

use crate::ops::attention::{check_batch, check_cache, kv_type_defs, need, variant_descs, AttentionDesc};
use crate::ops::rope::{RopeSpec, RopeTables};
use crate::ops::{params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

pub const KV_WRITE_WG: u32 = 64;

fn key(desc: &AttentionDesc) -> PipelineKey {
    PipelineKey::new("kv_write.wgsl", "main", RopeSpec::defs(desc.rope.as_ref(), kv_type_defs(desc, ShaderDefs::new().u32("WG", KV_WRITE_WG))))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    variant_descs().iter().map(key).collect()
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    kv_dim: u32,
    v_dim: u32,
    head_dim: u32,
    _pad: u32,
}

/// Copies a step's K `[n_tok, kv_dim]` and V `[n_tok, v_dim]` f32 rows into the paged caches
/// (`[n_slots]` rows stored as `desc.k_type` / `desc.v_type`) at each token's (sequence,
/// position) slot.
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
        let (k_row, v_row) = desc.row_bytes();
        check_cache(ctx, OP, "k_cache", k_cache, k_row, batch.block_size)?;
        check_cache(ctx, OP, "v_cache", v_cache, v_row, batch.block_size)?;
        let key = key(desc);
        let pipeline = cache.get(ctx, &key).await?;
        let p = params(ctx, "kv_write_params", &KvWriteParams { kv_dim, v_dim, head_dim: desc.head_dim, _pad: 0 });
        let rope = desc.rope.as_ref().map(|r| RopeTables::new(ctx, "kv_write", r, desc.head_dim)).transpose()?;
        let mut bufs = vec![&batch.info, &p, &batch.pos, &batch.seq, &batch.block_table, k, v, k_cache, v_cache];
        if let Some(r) = &rope {
            bufs.extend([&r.params, &r.inv_freq]);
        }
        let bind = crate::ops::bind(ctx, &key.label(), &pipeline, &bufs);
        Ok(KvWrite {
            pipeline,
            _rope: rope,
            bind,
            groups_x: (kv_dim / desc.k_type.unit() as u32 + v_dim / desc.v_type.unit() as u32).div_ceil(KV_WRITE_WG),
            max_tokens: batch.max_tokens,
        })
    }

    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>, n_tok: u32) {
        assert!(n_tok <= self.max_tokens, "kv_write: {n_tok} tokens, batch holds {}", self.max_tokens);
        if n_tok == 0 {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        crate::ops::dispatch(pass, self.groups_x, n_tok, 1);
    }
}

/// Encodes a copy-on-write block copy (`flint_core::kv::BlockCopy`) in one cache whose blocks
/// are `block_bytes` long (block_size * a row's stored bytes). WebGPU forbids a copy within one
/// buffer, so it goes through `scratch` (at least `block_bytes`); call it for every layer's K
/// and V cache before the step's `KvWrite`.
pub fn encode_block_copy(enc: &mut wgpu::CommandEncoder, cache: &wgpu::Buffer, scratch: &wgpu::Buffer, block_bytes: u64, src: u32, dst: u32) {
    enc.copy_buffer_to_buffer(cache, src as u64 * block_bytes, scratch, 0, block_bytes);
    enc.copy_buffer_to_buffer(scratch, 0, cache, dst as u64 * block_bytes, block_bytes);
}

/// Rows of heads of `head_dim` (keys: `is_k`) as a cache of type `ty` stores them (the words
/// kv_write writes: q8_0 rotates by [`KvType::rotation`] and rounds as
/// [`flint_core::kv::types::quantize_q8_0`]), for tests and tools that fill or read caches from
/// the host.
pub fn encode_rows(ty: KvType, rows: &[f32], head_dim: usize, is_k: bool) -> Vec<u32> {
    let mut rotated;
    let rows = match ty.rotation(head_dim, is_k) {
        Some(n) => {
            rotated = rows.to_vec();
            rotated.chunks_mut(n).for_each(flint_core::kv::types::hadamard);
            &rotated[..]
        }
        None => rows,
    };
    match ty {
        KvType::F32 => rows.iter().map(|x| x.to_bits()).collect(),
        KvType::F16 => rows.chunks_exact(2).map(|p| half::f16::from_f32(p[0]).to_bits() as u32 | (half::f16::from_f32(p[1]).to_bits() as u32) << 16).collect(),
        KvType::Q8_0 => {
            let mut words = Vec::with_capacity(rows.len() / 32 * 9);
            for block in rows.chunks_exact(32) {
                let (q, d) = flint_core::kv::types::quantize_q8_0(block);
                words.push(d.to_bits());
                words.extend(q.chunks_exact(4).map(|b| u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])));
            }
            words
        }
    }
}

/// The elements a cache of type `ty` holds in `words` (rotated where [`encode_rows`] rotates;
/// its inverse up to the type's rounding).
pub fn decode_rows(ty: KvType, words: &[u32]) -> Vec<f32> {
    match ty {
        KvType::F32 => words.iter().map(|&w| f32::from_bits(w)).collect(),
        KvType::F16 => words.iter().flat_map(|&w| [w as u16, (w >> 16) as u16]).map(|h| half::f16::from_bits(h).to_f32()).collect(),
        KvType::Q8_0 => words
            .chunks_exact(9)
            .flat_map(|b| {
                let d = f32::from_bits(b[0]);
                b[1..].iter().flat_map(|w| w.to_le_bytes()).map(move |q| q as i8 as f32 * d).collect::<Vec<_>>()
            })
            .collect(),
    }
}
