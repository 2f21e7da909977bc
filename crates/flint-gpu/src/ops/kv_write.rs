//! The write of a step's K/V rows into one layer's paged caches (`shaders/kv_write.wgsl`),
//! RoPE applied to K on the way, and the copy-on-write block copies a step performs first.

use std::sync::Arc;

use crate::context::GpuContext;
use crate::error::Result;
use crate::ops::attention::{check_batch, check_cache, need, rope_variants, AttentionDesc};
use crate::ops::rope::{RopeSpec, RopeTables};
use crate::ops::{params, Batch};
use crate::pipeline::{PipelineCache, PipelineKey};
use crate::shader::ShaderDefs;

pub const KV_WRITE_WG: u32 = 64;

fn key(rope: Option<&RopeSpec>) -> PipelineKey {
    PipelineKey::new("kv_write.wgsl", "main", RopeSpec::defs(rope, ShaderDefs::new().u32("WG", KV_WRITE_WG)))
}

pub fn variants(_caps: &crate::Caps) -> Vec<PipelineKey> {
    rope_variants().iter().map(|r| key(r.as_ref())).collect()
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
        let key = key(desc.rope.as_ref());
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

/// Encodes a copy-on-write block copy (`flint_core::kv::BlockCopy`) in one cache whose blocks
/// are `block_bytes` long (block_size * row floats * 4). WebGPU forbids a copy within one
/// buffer, so it goes through `scratch` (at least `block_bytes`); call it for every layer's K
/// and V cache before the step's `KvWrite`.
pub fn encode_block_copy(enc: &mut wgpu::CommandEncoder, cache: &wgpu::Buffer, scratch: &wgpu::Buffer, block_bytes: u64, src: u32, dst: u32) {
    enc.copy_buffer_to_buffer(cache, src as u64 * block_bytes, scratch, 0, block_bytes);
    enc.copy_buffer_to_buffer(scratch, 0, cache, dst as u64 * block_bytes, block_bytes);
}
