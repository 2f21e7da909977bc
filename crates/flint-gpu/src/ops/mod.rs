//! The kernels, one module per op, each mirroring `shaders/<op>.wgsl` and
//! `tests/ops_<op>.rs`. Every op builds its pipeline and bind group once and then only
//! encodes dispatches.

pub mod add;
pub mod attention;
pub mod embed;
pub mod glu;
pub mod kv_write;
pub mod matmul;
pub mod moe;
pub mod penalize;
pub mod rms_norm;
pub mod rope;
pub mod sample;
pub mod softcap;

use crate::context::GpuContext;
use crate::error::Result;
use crate::pipeline::PipelineKey;

/// Every shader variant the engine can ask for on an adapter with `caps`; the naga test
/// preprocesses and validates each one without a GPU.
pub fn all_variants(caps: &crate::Caps) -> Vec<PipelineKey> {
    let mut v = Vec::new();
    v.extend(add::variants(caps));
    v.extend(attention::variants(caps));
    v.extend(embed::variants(caps));
    v.extend(glu::variants(caps));
    v.extend(kv_write::variants(caps));
    v.extend(matmul::variants(caps));
    v.extend(moe::variants(caps));
    v.extend(penalize::variants(caps));
    v.extend(rms_norm::variants(caps));
    v.extend(rope::variants(caps));
    v.extend(softcap::variants(caps));
    v.extend(sample::variants(caps));
    v
}

/// Most workgroups in one grid dimension (WebGPU's guaranteed minimum limit).
pub const MAX_GROUPS_X: u32 = 65535;

/// Splits `n` workgroups into an (x, y) grid within the per-dimension limit; shaders
/// recover the linear id with `linear_group(workgroup_id, x)` and skip ids ≥ n.
pub fn fold_groups(n: u32) -> (u32, u32) {
    if n <= MAX_GROUPS_X {
        (n.max(1), 1)
    } else {
        let y = n.div_ceil(MAX_GROUPS_X);
        (n.div_ceil(y), y)
    }
}

std::thread_local! {
    /// Dispatches this thread has recorded (see [`dispatch`]).
    static DISPATCHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Records a dispatch of x × y × z workgroups; every op records through here, so that a
/// profile can count each op's dispatches ([`dispatches`]).
pub fn dispatch(pass: &mut wgpu::ComputePass<'_>, x: u32, y: u32, z: u32) {
    DISPATCHES.with(|d| d.set(d.get() + 1));
    pass.dispatch_workgroups(x, y, z);
}

/// Dispatches recorded on this thread so far.
pub fn dispatches() -> u64 {
    DISPATCHES.with(|d| d.get())
}

/// Records `groups` workgroups of `pipeline` (folded into a 2-D grid), or nothing for 0.
pub fn dispatch_folded(pass: &mut wgpu::ComputePass<'_>, pipeline: &wgpu::ComputePipeline, bind: &wgpu::BindGroup, groups: u32) {
    if groups == 0 {
        return;
    }
    let (gx, gy) = fold_groups(groups);
    pass.set_pipeline(pipeline);
    pass.set_bind_group(0, bind, &[]);
    dispatch(pass, gx, gy, 1);
}

/// The per-step batch description shared by every op: `BatchInfo` (uniform) and the
/// per-token ids, positions and sequence ids plus the block table (storage).
pub struct Batch {
    pub max_tokens: u32,
    pub max_seqs: u32,
    pub max_blocks: u32,
    pub block_size: u32,
    /// BatchInfo { n_tok, n_seq, max_blocks, block_size }.
    pub info: wgpu::Buffer,
    /// [max_tokens] u32 token ids.
    pub tokens: wgpu::Buffer,
    /// [max_tokens] u32 positions.
    pub pos: wgpu::Buffer,
    /// [max_tokens] u32 sequence index of each token.
    pub seq: wgpu::Buffer,
    /// [max_seqs, max_blocks] u32 block ids.
    pub block_table: wgpu::Buffer,
}

impl Batch {
    pub fn new(ctx: &GpuContext, max_tokens: u32, max_seqs: u32, max_blocks: u32, block_size: u32) -> Result<Batch> {
        use crate::buffer::storage;
        let info = crate::buffer::uniform_init(ctx, "batch_info", bytemuck::cast_slice(&[0u32, 0, max_blocks, block_size]));
        Ok(Batch {
            max_tokens,
            max_seqs,
            max_blocks,
            block_size,
            info,
            tokens: storage(ctx, "batch_tokens", max_tokens as u64 * 4)?,
            pos: storage(ctx, "batch_pos", max_tokens as u64 * 4)?,
            seq: storage(ctx, "batch_seq", max_tokens as u64 * 4)?,
            block_table: storage(ctx, "block_table", max_seqs as u64 * max_blocks as u64 * 4)?,
        })
    }

    /// Writes one step's batch: `tokens[i]` of sequence `seq[i]` at `pos[i]`; `tables[s]`
    /// are the block ids of sequence s. Writes are queued before the step's submission.
    pub fn write(&self, ctx: &GpuContext, tokens: &[u32], pos: &[u32], seq: &[u32], tables: &[&[u32]]) {
        assert!(tokens.len() <= self.max_tokens as usize && tokens.len() == pos.len() && pos.len() == seq.len());
        assert!(tables.len() <= self.max_seqs as usize);
        let q = &ctx.queue;
        q.write_buffer(&self.info, 0, bytemuck::cast_slice(&[tokens.len() as u32, tables.len() as u32, self.max_blocks, self.block_size]));
        q.write_buffer(&self.tokens, 0, bytemuck::cast_slice(tokens));
        q.write_buffer(&self.pos, 0, bytemuck::cast_slice(pos));
        q.write_buffer(&self.seq, 0, bytemuck::cast_slice(seq));
        let mut table = vec![0u32; tables.len() * self.max_blocks as usize];
        for (s, t) in tables.iter().enumerate() {
            assert!(t.len() <= self.max_blocks as usize);
            table[s * self.max_blocks as usize..][..t.len()].copy_from_slice(t);
        }
        if !table.is_empty() {
            q.write_buffer(&self.block_table, 0, bytemuck::cast_slice(&table));
        }
    }

    /// Writes a list of rows as the batch's tokens (`n_tok` = its length): the head's
    /// output rows, each the step token it gathers.
    pub fn write_rows(&self, ctx: &GpuContext, rows: &[u32]) {
        assert!(rows.len() <= self.max_tokens as usize);
        let q = &ctx.queue;
        q.write_buffer(&self.info, 0, bytemuck::cast_slice(&[rows.len() as u32, 1, self.max_blocks, self.block_size]));
        q.write_buffer(&self.tokens, 0, bytemuck::cast_slice(rows));
    }
}

/// A uniform buffer holding one op's static parameters (a `#[repr(C)]` Pod struct).
pub fn params<T: bytemuck::Pod>(ctx: &GpuContext, label: &str, p: &T) -> wgpu::Buffer {
    crate::buffer::uniform_init(ctx, label, bytemuck::bytes_of(p))
}

/// Binds `buffers` in order at bindings 0.. of group 0 of `pipeline`.
pub fn bind(ctx: &GpuContext, label: &str, pipeline: &wgpu::ComputePipeline, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
    let layout = pipeline.get_bind_group_layout(0);
    let entries: Vec<wgpu::BindGroupEntry> =
        buffers.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &layout, entries: &entries })
}
